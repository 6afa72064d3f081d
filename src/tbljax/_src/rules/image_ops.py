"""The per-image op classes of issue 47 beside `RandAugment`: `TrivialAugment` (torchvision v2's
``TrivialAugmentWide``), `ColorJitter` (torchvision's), `ThreeAugment` (DeiT III's
``three_augment``, timm's ``"3a"`` policy) and the single ops `Grayscale`, `Solarize` and
`GaussianBlur`. Each turns its random words into op codes and integer arguments
(`pixel_ops.CODES`) with `draw`; `randaug.decide` gives every class its counters
(policy i, slot j, word t: ``0x40 i + 4 j + t``), so the decisions are keyed by
(seed, epoch, index, repeat) like RandAugment's.

All follow the peer applied to a **PIL image** (what DeiT III and timm's ``create_transform``
feed them), so the pixels are Pillow's rules in `pixel_ops`:

- Which op / permutation: ``((w >> 16) * n) >> 16``; apply: the top 24 bits against
  ``round(p * 2**24)``; a sign: the top bit (torchvision negates with probability 1/2).
- Uniform factors and radii: 4096 float32 quantiles of U(lo, hi) (`quantiles.uniform_table`;
  torchvision draws float32 too), passed as float32 bits.
- TrivialAugmentWide: 14 ops (Identity included) uniformly, a bin uniformly of
  ``num_magnitude_bins``, torchvision's magnitudes (``torch.linspace`` in float32: each value
  ``fma(step, i, start)``, the upper half from the end), signed ops negated with probability
  1/2; Brightness/Color/Contrast/Sharpness blend with ``1 + m``, Posterize keeps ``int(m)``
  bits, Solarize's threshold ``255 m`` is the LUT threshold ``ceil(255 m)``; nearest
  resampling, fill 0 (torchvision's PIL defaults).

>>> import numpy as np
>>> TrivialAugment().arg_table().shape
(14, 2, 31)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import ClassVar

import numpy as np

from tbljax._src.rules import contract, pixel_ops, quantiles

__all__ = [
    "CLASSES",
    "TA_SPACE",
    "ColorJitter",
    "GaussianBlur",
    "Grayscale",
    "Solarize",
    "ThreeAugment",
    "TrivialAugment",
    "applied",
    "choice",
    "integer",
    "number",
    "tv_linspace",
]

PROB_BITS = 24
_C = pixel_ops.CODES
# torchvision v2 TrivialAugmentWide._AUGMENTATION_SPACE, in its order: (name, our code, linspace or None, signed).
TA_SPACE = (
    ("Identity", 0, None, False),
    ("ShearX", _C["TvShearX"], (0.0, 0.99), True),
    ("ShearY", _C["TvShearY"], (0.0, 0.99), True),
    ("TranslateX", _C["TvTranslateX"], (0.0, 32.0), True),
    ("TranslateY", _C["TvTranslateY"], (0.0, 32.0), True),
    ("Rotate", _C["TvRotate"], (0.0, 135.0), True),
    ("Brightness", _C["Brightness"], (0.0, 0.99), True),
    ("Color", _C["Color"], (0.0, 0.99), True),
    ("Contrast", _C["Contrast"], (0.0, 0.99), True),
    ("Sharpness", _C["Sharpness"], (0.0, 0.99), True),
    ("Posterize", _C["Posterize"], "posterize", False),
    ("Solarize", _C["Solarize"], (1.0, 0.0), False),
    ("AutoContrast", _C["AutoContrast"], None, False),
    ("Equalize", _C["Equalize"], None, False),
)
# ColorJitter's adjustments (index = torchvision's fn_id), the six orders of three and, with hue, the 24 of four.
_JITTER_CODES = (_C["Brightness"], _C["Contrast"], _C["Color"], _C["Hue"])
_ORDERS = np.array(list(itertools.permutations(range(3))), np.int32)
_ORDERS_HUE = np.array(list(itertools.permutations(range(4))), np.int32)


def number(name, v, lo, hi):
    """`v` as a float in [lo, hi], else a ValueError naming it."""
    if not contract.is_real(v) or not lo <= v <= hi:
        raise ValueError(f"{name} must be a number in [{lo}, {hi}], got {v!r}")
    return float(v)


def integer(name, v, lo, hi):
    """`v` as an int in [lo, hi], else a ValueError naming it."""
    if not contract.is_integer(v) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return int(v)


def choice(word, n: int, xp):
    """A uniform index in [0, n) from a uint32 word: ``((w >> 16) * n) >> 16``."""
    return (((word >> 16) * xp.uint32(n)) >> 16).astype(xp.int32)


def applied(word, p: float, xp):
    """True with probability `p`: the word's top 24 bits against ``round(p * 2**24)``."""
    return (word >> (32 - PROB_BITS)) < xp.uint32(round(p * (1 << PROB_BITS)))


def tv_linspace(start: float, end: float, n: int) -> np.ndarray:
    """float32 ``torch.linspace(start, end, n)`` as torch computes it: step in float32, values
    ``fma(step, i, start)`` below n // 2 and ``fma(-step, n - 1 - i, end)`` from there."""
    f = np.float32
    if n == 1:
        return np.array([start], f)
    step = float(f((f(end) - f(start)) / f(n - 1)))
    i = np.arange(n)  # a float32 step times an int < 2**24, plus a float32, is exact in float64: one rounding
    return np.where(i < n // 2, float(f(start)) + step * i, float(f(end)) - step * (n - 1 - i)).astype(f)


def _fill(v):
    if not (isinstance(v, (tuple, list)) and len(v) == 3 and all(contract.is_integer(x) and 0 <= x <= 255 for x in v)):
        raise ValueError(f"fill must be three integers in [0, 255], got {v!r}")
    return tuple(int(x) for x in v)


def _prob_op(draw_one):
    """`draw` for a single op applied with probability p: (code, arg) from the slot's words."""

    def draw(self, u, xp):
        code, arg = draw_one(self, u[:, 0], xp)
        on = applied(u[:, 0, 1], self.p, xp)
        return (
            xp.where(on, code, xp.uint8(0))[:, None].astype(xp.uint8),
            xp.where(on, arg, 0)[:, None].astype(xp.int32),
        )

    return draw


def _table(values) -> np.ndarray:
    t = np.array([pixel_ops.f32_arg(v) for v in np.asarray(values, np.float32).tolist()], np.int32)
    t.setflags(write=False)
    return t


@dataclasses.dataclass(frozen=True)
class TrivialAugment:
    """torchvision v2 ``TrivialAugmentWide(num_magnitude_bins=31)`` on a PIL image: one op of 14
    (Identity, ShearX/Y, TranslateX/Y, Rotate, Brightness, Color, Contrast, Sharpness,
    Posterize, Solarize, AutoContrast, Equalize) uniformly per image, a magnitude bin
    uniformly, a random sign; nearest resampling, `fill` (torchvision's None is 0) outside.

    >>> TrivialAugment().num_magnitude_bins
    31
    """

    num_magnitude_bins: int = 31
    fill: tuple[int, int, int] = (0, 0, 0)
    num_slots: ClassVar[int] = 1
    interpolation: ClassVar[str] = "nearest"

    def __post_init__(self):
        object.__setattr__(self, "num_magnitude_bins", integer("num_magnitude_bins", self.num_magnitude_bins, 2, 4096))
        object.__setattr__(self, "fill", _fill(self.fill))

    def arg_table(self) -> np.ndarray:
        """int32 (14, 2, bins): op k's argument for (sign: 0 plus, 1 minus, bin)."""
        return _ta_table(self.num_magnitude_bins)

    def draw(self, u, xp):
        """(codes (B, 1) uint8, args (B, 1) int32) from words u (B, 1, 4): op, -, bin, sign."""
        which = choice(u[:, 0, 0], len(TA_SPACE), xp)
        codes = xp.asarray(np.array([s[1] for s in TA_SPACE], np.uint8))
        arg = xp.asarray(self.arg_table())[
            which, (u[:, 0, 3] >> 31).astype(xp.int32), choice(u[:, 0, 2], self.num_magnitude_bins, xp)
        ]
        return codes[which][:, None], arg[:, None].astype(xp.int32)


@functools.lru_cache(maxsize=8)
def _ta_table(n: int) -> np.ndarray:
    """int32 (14, 2, n): TrivialAugmentWide's op arguments per (sign, bin)."""
    rows = []
    for _, code, space, signed in TA_SPACE:
        if space is None:
            rows.append(np.zeros((2, n), np.int64))
            continue
        if space == "posterize":  # torchvision: (8 - arange(n) / ((n - 1) / 6)).round().int()
            mags = np.rint(np.float32(8) - np.arange(n, dtype=np.float32) / np.float32((n - 1) / 6))
        else:
            mags = tv_linspace(*space, n)
        row = []
        for sign in (1.0, -1.0) if signed else (1.0, 1.0):
            m = [sign * float(v) for v in mags]
            if code in (_C["TvTranslateX"], _C["TvTranslateY"], _C["Posterize"]):
                row.append([int(v) for v in m])
            elif code == _C["Solarize"]:
                row.append([math.ceil(255.0 * v) for v in m])  # i < 255 m  <=>  i < ceil(255 m)
            elif code in pixel_ops.TV_AFFINE:
                row.append([pixel_ops.f32_arg(v) for v in m])
            else:
                row.append([pixel_ops.f32_arg(1.0 + v) for v in m])
        rows.append(np.array(row, np.int64))
    t = np.stack(rows).astype(np.int32)
    t.setflags(write=False)
    return t


def _jitter_range(name, v):
    """torchvision's ColorJitter._check_input (center 1): a number v >= 0 is
    [max(0, 1 - v), 1 + v], a pair (lo, hi) is itself; (1, 1) is None (not applied)."""
    if v is None:
        return None
    if isinstance(v, (tuple, list)) and len(v) == 2:
        lo, hi = number(name, v[0], 0, 1e6), number(name, v[1], 0, 1e6)
        if lo > hi:
            raise ValueError(f"{name} must be a number or a pair (lo, hi) with 0 <= lo <= hi, got {v!r}")
    else:
        v = number(name, v, 0, 1e6)
        lo, hi = max(0.0, 1.0 - v), 1.0 + v
    return None if lo == hi == 1.0 else (lo, hi)


def _hue_range(v):
    """torchvision's check of hue (center 0, bound 0.5): a number v in [0, 0.5] is [-v, v], a
    pair (lo, hi) in [-0.5, 0.5] is itself; (0, 0) is None (not applied)."""
    if v is None:
        return None
    if isinstance(v, (tuple, list)) and len(v) == 2:
        lo, hi = number("hue", v[0], -0.5, 0.5), number("hue", v[1], -0.5, 0.5)
        if lo > hi:
            raise ValueError(f"hue must be a number or a pair (lo, hi) with -0.5 <= lo <= hi <= 0.5, got {v!r}")
    else:
        v = number("hue", v, 0, 0.5)
        lo, hi = -v, v
    return None if lo == hi == 0.0 else (lo, hi)


def hue_shift(factor) -> int:
    """torchvision's ``adjust_hue`` shift for a hue factor: ``np.int32(factor * 255)`` (toward
    zero) as uint8, i.e. mod 256."""
    return int(factor * 255) & 0xFF


@dataclasses.dataclass(frozen=True)
class ColorJitter:
    """torchvision's ``ColorJitter(brightness, contrast, saturation, hue)`` on a PIL image: each
    factor uniform in [max(0, 1 - v), 1 + v] (or the pair given), the hue factor uniform in
    [-hue, hue] (or the pair given, within [-0.5, 0.5]); the adjustments (Pillow's ImageEnhance
    Brightness, Contrast, Color, and torchvision's ``adjust_hue``: Pillow's HSV with the hue
    shifted by ``int(factor * 255)`` mod 256) in a random order per image.

    >>> ColorJitter(0.3, 0.3, 0.3).brightness
    (0.7, 1.3)
    >>> ColorJitter(hue=0.1).num_slots
    4
    """

    brightness: object = 0.0
    contrast: object = 0.0
    saturation: object = 0.0
    hue: object = 0.0

    def __post_init__(self):
        for name in ("brightness", "contrast", "saturation"):
            object.__setattr__(self, name, _jitter_range(name, getattr(self, name)))
        object.__setattr__(self, "hue", _hue_range(self.hue))

    @property
    def num_slots(self) -> int:
        """3, or 4 with hue (without it the order is drawn among the three, as before hue)."""
        return 3 if self.hue is None else 4

    def factor_tables(self) -> tuple:
        """Per adjustment, int32 (4096,) of its argument at the factor quantiles (float32 bits;
        hue: the shift), or None."""
        tables = [
            None if r is None else _table(quantiles.uniform_table(*r))
            for r in (self.brightness, self.contrast, self.saturation)
        ]
        if self.hue is not None:
            t = np.array([hue_shift(v) for v in quantiles.uniform_table(*self.hue).tolist()], np.int32)
            t.setflags(write=False)
            tables.append(t)
        return tuple(tables)

    def draw(self, u, xp):
        """(codes (B, S), args (B, S)) from words u (B, S, 4), S = `num_slots`: slot 0 word 0 the
        order, slot a word 2 adjustment a's factor; the slots hold the adjustments in their drawn
        order."""
        codes, args = [], []
        for a, t in enumerate(self.factor_tables()):
            if t is None:
                codes.append(xp.zeros(u.shape[:1], xp.uint8))
                args.append(xp.zeros(u.shape[:1], xp.int32))
            else:
                codes.append(xp.full(u.shape[:1], _JITTER_CODES[a], xp.uint8))
                args.append(xp.asarray(t)[(u[:, a, 2] >> (32 - quantiles.BITS)).astype(xp.int32)])
        orders = _ORDERS if self.hue is None else _ORDERS_HUE
        order = xp.asarray(orders)[choice(u[:, 0, 0], len(orders), xp)]
        return (
            xp.take_along_axis(xp.stack(codes, axis=1), order, axis=1),
            xp.take_along_axis(xp.stack(args, axis=1), order, axis=1),
        )


@dataclasses.dataclass(frozen=True)
class ThreeAugment:
    """DeiT III's 3-Augment (timm's ``"3a"`` AutoAugment policy): per image one of Solarize
    (threshold 128), grayscale and a Gaussian blur of radius uniform in [0.1, 2.0] (Pillow's
    ``ImageFilter.GaussianBlur``), chosen uniformly.

    >>> ThreeAugment().num_slots
    1
    """

    num_slots: ClassVar[int] = 1
    _ops: ClassVar[tuple] = (_C["Solarize"], _C["Grayscale"], _C["GaussianBlur"])

    def draw(self, u, xp):
        """(codes (B, 1), args (B, 1)) from words u (B, 1, 4): which op, -, the blur radius."""
        which = choice(u[:, 0, 0], 3, xp)
        radius = xp.asarray(_table(quantiles.uniform_table(0.1, 2.0)))[(u[:, 0, 2] >> 20).astype(xp.int32)]
        arg = xp.where(which == 0, 128, xp.where(which == 1, 0, radius))
        return xp.asarray(np.array(self._ops, np.uint8))[which][:, None], arg[:, None].astype(xp.int32)


@dataclasses.dataclass(frozen=True)
class Grayscale:
    """With probability `p`, Pillow's ``convert("L")`` back to RGB (DeiT's ``GrayScale``,
    torchvision's ``RandomGrayscale`` on a PIL image).

    >>> Grayscale(p=1.0).p
    1.0
    """

    p: float = 0.1
    num_slots: ClassVar[int] = 1

    def __post_init__(self):
        object.__setattr__(self, "p", number("p", self.p, 0, 1))

    draw = _prob_op(lambda self, w, xp: (xp.uint8(_C["Grayscale"]), xp.int32(0)))


@dataclasses.dataclass(frozen=True)
class Solarize:
    """With probability `p`, Pillow's ``ImageOps.solarize(img, threshold)``: values >= threshold
    inverted (DeiT's ``Solarization``: threshold 128).

    >>> Solarize().threshold
    128
    """

    p: float = 0.2
    threshold: int = 128
    num_slots: ClassVar[int] = 1

    def __post_init__(self):
        object.__setattr__(self, "p", number("p", self.p, 0, 1))
        object.__setattr__(self, "threshold", integer("threshold", self.threshold, 0, 256))

    draw = _prob_op(lambda self, w, xp: (xp.uint8(_C["Solarize"]), xp.int32(self.threshold)))


@dataclasses.dataclass(frozen=True)
class GaussianBlur:
    """With probability `p`, Pillow's ``ImageFilter.GaussianBlur(radius)``, the radius uniform
    in `sigma` (DeiT's ``GaussianBlur``: p=0.1, radius in [0.1, 2.0]).

    >>> GaussianBlur(p=1.0).sigma
    (0.1, 2.0)
    """

    p: float = 0.1
    sigma: tuple[float, float] = (0.1, 2.0)
    num_slots: ClassVar[int] = 1

    def __post_init__(self):
        object.__setattr__(self, "p", number("p", self.p, 0, 1))
        s = self.sigma
        if not (isinstance(s, (tuple, list)) and len(s) == 2):
            raise ValueError(f"sigma must be a pair (lo, hi) of radii, got {s!r}")
        lo, hi = number("sigma[0]", s[0], 0, 1000), number("sigma[1]", s[1], 0, 1000)
        if lo > hi:
            raise ValueError(f"sigma must satisfy lo <= hi, got {s!r}")
        object.__setattr__(self, "sigma", (lo, hi))

    draw = _prob_op(
        lambda self, w, xp: (
            xp.uint8(_C["GaussianBlur"]),
            xp.asarray(_table(quantiles.uniform_table(*self.sigma)))[(w[:, 2] >> 20).astype(xp.int32)],
        )
    )


CLASSES = (TrivialAugment, ColorJitter, ThreeAugment, Grayscale, Solarize, GaussianBlur)

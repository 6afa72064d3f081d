"""Per-image ops of issue 47: `RandAugment` (timm's semantics; big_vision's by `from_big_vision`)
and its per-sample decisions with those of every policy of ``Augment.ops`` (`decide`), keyed by
(seed, epoch, sample index, repeat) through `order.random_bits` like the crops; the per-sample
counters random erasing (`erasing.py`) shares. The pixels are `pixel_ops`' rules.

**Counters** (disjoint from augment's 0..40 and the buckets' 48..49): a sample's words are
``0x10000 + 0x1000 * repeat + local``; policy i of ``Augment.ops``, slot j uses local
``0x40 * i + 4 * j + {0: which op, 1: apply?, 2: magnitude, 3: sign (Cutout: its centre)}``
(at most 4 policies of 16 ops); erasing (`erasing.py`) uses 0x100 (apply?), 0x101 (count),
0x102 (noise key) and ``0x200 + 4 * (10 * box + attempt) + {0: area, 1: aspect, 2: top, 3: left}``.
View v of a sample (``views=``) adds ``VIEW_STRIDE * v`` to every counter, the crops' included
(`view_offset`): view 0 is the sample without views.

**Draws, exact on every path.** Which op: ``((w >> 16) * P) >> 16`` (uniform with replacement,
as timm's ``np.random.choice``). Apply: the top 24 bits against ``round(prob * 2**24)``. The
magnitude and sign select an entry of a host table (`arg_table`, (P, 2, 4096) int32), built once
in float64 with timm's level functions: entry k holds the op argument for magnitude
``clip(M + std * z_k, 0, mmax)``, ``z_k`` the N(0, 1) quantile at (k + 0.5) / 4096
(``mstd`` > 100 or inf: ``M (k + 0.5) / 4096``, timm's uniform), so a batch only gathers: no
float arithmetic at all, NumPy and jax.numpy agree to the bit. The sign is the word's top bit
(timm negates with probability 1/2).

Example:
    >>> import numpy as np
    >>> codes, args = decide((RandAugment(),), np.arange(4), seed=0, epoch=0)
    >>> codes.shape, codes.dtype, args.dtype
    ((4, 2), dtype('uint8'), dtype('int32'))
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np

from tbljax._src.rules import contract, image_ops, order, pixel_ops, quantiles

__all__ = [
    "OP_NAMES",
    "POLICIES",
    "MAX_VIEWS",
    "RandAugment",
    "VIEW_STRIDE",
    "arg_table",
    "counters",
    "decide",
    "op_arg",
    "repeats",
    "view_offset",
]

# timm's RandAugment op names (LEVEL_TO_ARG) this module has a pixel rule for, and its lists.
OP_NAMES = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "PosterizeIncreasing",
    "PosterizeOriginal",
    "Solarize",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "Color",
    "ColorIncreasing",
    "Contrast",
    "ContrastIncreasing",
    "Brightness",
    "BrightnessIncreasing",
    "Sharpness",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "TranslateXRel",
    "TranslateYRel",
    "Cutout",
)
_TIMM_DEFAULT = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
_TIMM_INCREASING = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
# TF's distort_image_with_randaugment (what big_vision's "randaug" calls).
_BIG_VISION = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Cutout",
    "SolarizeAdd",
)
CONVENTIONS = ("timm", "big_vision")
_BITS = quantiles.BITS
_BASE, _REPEAT_STRIDE, _POLICY_STRIDE = 0x10000, 0x1000, 0x40
# View v's counters: + 0x1000000 v, above every repeat's words here (< 0x410000); uint32 holds 256.
VIEW_STRIDE = 0x1000000
MAX_VIEWS = (1 << 32) // VIEW_STRIDE
_MAX_OPS, _MAX_POLICIES = 16, 4


_number, _int = image_ops.number, image_ops.integer


@dataclasses.dataclass(frozen=True)
class RandAugment:
    """RandAugment: per image, `num_ops` ops drawn uniformly (with replacement) from `ops`,
    each applied with probability `prob` at magnitude `magnitude` (0..10 scale; Gaussian noise
    of std `magnitude_std`, uniform on [0, magnitude] when it is > 100 or inf; clipped to
    [0, magnitude_max or 10]), timm's level functions and Pillow's pixel rules. Affine ops
    resample with `interpolation` ("bilinear" or "nearest": timm's "random"/bicubic are not
    implemented) and fill with `fill`; TranslateX/Y move ``magnitude / 10 * translate_const``
    pixels, TranslateX/YRel ``magnitude / 10 * translate_pct`` of the side.

    >>> RandAugment.from_timm("rand-m9-mstd0.5-inc1").ops[4]
    'PosterizeIncreasing'
    """

    num_ops: int = 2
    magnitude: float = 9
    magnitude_std: float = 0.0
    increasing: bool = False
    ops: tuple[str, ...] | None = None
    prob: float = 0.5
    fill: tuple[int, int, int] = (128, 128, 128)
    magnitude_max: float | None = None
    interpolation: str = "bilinear"
    translate_const: float = 100.0
    translate_pct: float = 0.45
    convention: str = "timm"

    def __post_init__(self):
        object.__setattr__(self, "num_ops", _int("num_ops", self.num_ops, 1, _MAX_OPS))
        object.__setattr__(self, "magnitude", _number("magnitude", self.magnitude, 0, 100))
        std = self.magnitude_std
        if contract.is_real(std) and std > 100:
            std = math.inf  # timm: "uniform sampling in 0 to magnitude if mstd is > 100"
        object.__setattr__(self, "magnitude_std", std if std == math.inf else _number("magnitude_std", std, 0, 100))
        if not isinstance(self.increasing, (bool, np.bool_)):
            raise ValueError(f"increasing must be True or False, got {self.increasing!r}")
        if self.ops is None:
            ops = _TIMM_INCREASING if self.increasing else _TIMM_DEFAULT
        else:
            if isinstance(self.ops, str) or not all(isinstance(n, str) for n in self.ops) or not self.ops:
                raise ValueError(f"ops must be a non-empty list of op names, got {self.ops!r}")
            ops = tuple(self.ops)
            if self.increasing:
                raise ValueError(
                    "increasing=True picks timm's increasing list when ops is None; with ops "
                    "given, name the increasing ops themselves (e.g. 'PosterizeIncreasing')"
                )
        for n in ops:
            if n not in OP_NAMES:
                raise ValueError(f"RandAugment op {n!r} is not supported; the ops are {', '.join(OP_NAMES)}")
        object.__setattr__(self, "ops", ops)
        object.__setattr__(self, "prob", _number("prob", self.prob, 0, 1))
        fill = self.fill
        if not (isinstance(fill, (tuple, list)) and len(fill) == 3 and all(_is_byte(v) for v in fill)):
            raise ValueError(f"fill must be three integers in [0, 255], got {fill!r}")
        object.__setattr__(self, "fill", tuple(int(v) for v in fill))
        if self.magnitude_max is not None:
            object.__setattr__(self, "magnitude_max", _number("magnitude_max", self.magnitude_max, 0, 100))
        if self.interpolation not in pixel_ops.INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be one of {pixel_ops.INTERPOLATIONS}, got "
                f"{self.interpolation!r} (timm's 'random' and 'bicubic' are not implemented)"
            )
        object.__setattr__(self, "translate_const", _number("translate_const", self.translate_const, 0, 4096))
        object.__setattr__(self, "translate_pct", _number("translate_pct", self.translate_pct, 0, 1))
        if self.convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {self.convention!r}")
        if "Cutout" in ops and (self.magnitude_std or self.convention != "big_vision"):
            raise ValueError("op 'Cutout' is big_vision's (RandAugment.from_big_vision), at a fixed magnitude")
        if "Cutout" in ops and int(self.magnitude / 10 * 40) > 127:
            raise ValueError(
                f"Cutout's half-side int(magnitude / 10 * 40) must be <= 127, got magnitude {self.magnitude!r}"
            )

    @classmethod
    def from_timm(cls, config: str, **kw) -> "RandAugment":
        """timm's ``rand_augment_transform`` config string (``rand-m9-n2-mstd0.5-mmax10-inc1-p0.5``;
        keys m, n, mstd, mmax, inc, p; ``t`` only with an unweighted set timm names, none here, so
        it is refused). `kw` sets the rest (fill, interpolation, translate_const, ...)."""
        parts = config.split("-") if isinstance(config, str) else []
        if not parts or parts[0] != "rand":
            raise ValueError(f"a timm RandAugment config starts with 'rand', got {config!r}")
        args = dict(magnitude=10.0, num_ops=2, increasing=False, prob=0.5)
        for part in parts[1:]:
            if part.startswith("t"):
                raise ValueError(
                    f"timm config section {part!r}: weighted or 3-Augment transform sets (t...) are not supported"
                )
            m = re.fullmatch(r"([a-z]+)(\d.*)", part)
            if m is None:
                continue  # timm skips a section without a number
            key, val = m.groups()
            try:
                if key == "mstd":
                    args["magnitude_std"] = float(val)
                elif key == "mmax":
                    args["magnitude_max"] = int(val)
                elif key == "inc":
                    args["increasing"] = bool(int(val))
                elif key == "m":
                    args["magnitude"] = int(val)
                elif key == "n":
                    args["num_ops"] = int(val)
                elif key == "p":
                    args["prob"] = float(val)
                else:
                    raise ValueError(
                        f"unknown timm RandAugment config key {key!r} in {config!r} (known: m, n, mstd, mmax, inc, p)"
                    )
            except ValueError as e:
                if "unknown" in str(e):
                    raise
                raise ValueError(f"timm config section {part!r} of {config!r}: {val!r} is not a number") from None
        return cls(**{**args, **kw})

    @classmethod
    def from_big_vision(cls, spec: str) -> "RandAugment":
        """big_vision's ``randaug(n, m)`` (TF's ``distort_image_with_randaugment``): its 16 ops
        (Cutout and absolute 100-pixel translations included), each chosen op always applied,
        the magnitude fixed and not clipped at 10, nearest resampling, fill 128."""
        m = re.fullmatch(r"\s*randaug\(\s*(\d+)\s*,\s*(\d+(?:\.\d*)?)\s*\)\s*", spec) if isinstance(spec, str) else None
        if m is None:
            raise ValueError(f"a big_vision spec is 'randaug(num_layers, magnitude)', got {spec!r}")
        return cls(
            num_ops=int(m.group(1)),
            magnitude=float(m.group(2)),
            ops=_BIG_VISION,
            prob=1.0,
            interpolation="nearest",
            translate_const=100.0,
            convention="big_vision",
        )


def _is_byte(v):
    return contract.is_integer(v) and 0 <= v <= 255


def _level(ra: RandAugment, name: str, m: float, negate: bool):
    """timm's level function (big_vision's where its convention differs), in float64."""

    def neg(v):
        return -v if negate else v

    bv = ra.convention == "big_vision"
    if _code(name) in pixel_ops.AFFINE:
        return pixel_ops.affine_level(_code(name), neg(m), ra.translate_const, ra.translate_pct)
    if name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
        bits = int(m / 10 * 4)
        return min(8, {"Posterize": bits, "PosterizeIncreasing": 4 - bits, "PosterizeOriginal": bits + 4}[name])
    if name in ("Solarize", "SolarizeIncreasing"):
        t = min(256, int(m / 10 * 256))
        return t if name == "Solarize" else 256 - t
    if name == "SolarizeAdd":
        return min(255, int(m / 10 * 110)) if bv else min(128, int(m / 10 * 110))
    if name.endswith("Increasing"):
        return max(0.1, 1.0 + neg(m / 10 * 0.9))
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return m / 10 * 1.8 + 0.1
    if name == "Cutout":
        return int(m / 10 * 40)
    return 0  # AutoContrast, Equalize, Invert take no argument


def _code(name: str) -> int:
    for suffix in ("Increasing", "Original"):
        name = name.removesuffix(suffix)
    return pixel_ops.CODES[name]


def op_arg(ra: RandAugment, name: str, magnitude: float, negate: bool = False) -> tuple[int, int]:
    """The hook that forces an op: (op code, integer argument) of op `name` at `magnitude`
    (already noised and clipped) and sign, as `decide` would draw it. Cutout's centre bits are
    left 0."""
    code, level = _code(name), _level(ra, name, float(magnitude), bool(negate))
    if code in pixel_ops.AFFINE:  # the signed magnitude: the kernel computes timm's level from it
        return code, pixel_ops.f32_arg(-float(magnitude) if negate else float(magnitude))
    if code in pixel_ops.FLOAT_ARG:
        return code, pixel_ops.f32_arg(level)
    return code, (level << 24 if name == "Cutout" else int(level))


@functools.lru_cache(maxsize=16)
def arg_table(ra: RandAugment) -> np.ndarray:
    """int32 (P, 2, 4096): op p's argument for (sign, magnitude quantile k), built in float64."""
    k = quantiles.grid()
    if ra.convention == "big_vision" or ra.magnitude_std == 0:
        mags = np.full(k.shape, ra.magnitude)
    elif ra.magnitude_std == math.inf:
        mags = ra.magnitude * k
    else:
        from scipy.special import ndtri

        mags = ra.magnitude + ra.magnitude_std * ndtri(k)
    if ra.convention == "timm":
        mags = np.clip(mags, 0.0, ra.magnitude_max or 10.0)
    t = np.array([[[op_arg(ra, n, m, s)[1] for m in mags.tolist()] for s in (False, True)] for n in ra.ops], np.int32)
    t.setflags(write=False)
    return t


@functools.lru_cache(maxsize=16)
def _op_codes(ra: RandAugment) -> np.ndarray:
    """The op codes (P,) uint8 of `ra`'s ops, built once (`decide` looks them up per batch)."""
    codes = np.array([_code(n) for n in ra.ops], np.uint8)
    codes.setflags(write=False)
    return codes


def view_offset(view) -> int:
    """View `view`'s counter offset, ``VIEW_STRIDE * view``; a ValueError outside [0, MAX_VIEWS)."""
    if not contract.is_integer(view) or not 0 <= view < MAX_VIEWS:
        raise ValueError(f"view must be an integer in [0, {MAX_VIEWS}), got {view!r}")
    return int(view) * VIEW_STRIDE


def counters(local, repeat, xp, view: int = 0):
    """A sample's counters: ``0x10000 + 0x1000 * repeat + local`` (+ `view_offset`) as uint32
    (`repeats` shapes `repeat` to broadcast against `local`)."""
    c = xp.asarray(_BASE + local, xp.uint32) + repeat * xp.uint32(_REPEAT_STRIDE)
    return c + xp.uint32(view_offset(view)) if view else c


def repeats(repeat, ndim, xp):
    """`repeat` (an int, or one per sample) as uint32 shaped to broadcast over `ndim` more axes."""
    if contract.is_integer(repeat) and not 0 <= repeat < (1 << 32) // _REPEAT_STRIDE - 16:
        raise ValueError(f"repeat must be an integer in [0, {(1 << 32) // _REPEAT_STRIDE - 16}), got {repeat!r}")
    r = xp.asarray(repeat).astype(xp.uint32)
    return r.reshape(r.shape + (1,) * ndim)


def decide(policies, indices, *, seed: int, epoch: int, repeat=0, view: int = 0, xp=np):
    """(ops (B, K) uint8, op_args (B, K) int32) for samples `indices` under `policies` (a sequence
    of `RandAugment` and `image_ops` ops, applied in order; K = their slots summed: num_ops for
    RandAugment); op 0 where an op is not applied. `view`: which view (``views=``; 0 without)."""
    policies = tuple(policies)
    if len(policies) > _MAX_POLICIES or not all(isinstance(p, POLICIES) for p in policies):
        names = ", ".join(c.__name__ for c in POLICIES)
        raise ValueError(f"ops must be at most {_MAX_POLICIES} per-image ops ({names}), got {policies!r}")
    idx = xp.asarray(indices)
    rep = repeats(repeat, 2, xp)
    codes, args = [], []
    for i, ra in enumerate(policies):
        slots = ra.num_ops if isinstance(ra, RandAugment) else ra.num_slots
        local = _POLICY_STRIDE * i + np.arange(4 * slots).reshape(slots, 4)
        u = order.random_bits(idx[:, None, None], counters(local, rep, xp, view), seed, epoch, xp=xp)
        if not isinstance(ra, RandAugment):
            code, arg = ra.draw(u, xp)
            codes.append(code.astype(xp.uint8))
            args.append(arg.astype(xp.int32))
            continue
        table, op_codes = xp.asarray(arg_table(ra)), xp.asarray(_op_codes(ra))
        which = image_ops.choice(u[..., 0], len(ra.ops), xp)
        applied = image_ops.applied(u[..., 1], ra.prob, xp)
        sign = (u[..., 3] >> 31).astype(xp.int32)
        arg = table[which, sign, (u[..., 2] >> (32 - _BITS)).astype(xp.int32)]
        code = op_codes[which]
        if "Cutout" in ra.ops:  # its centre bits
            cutout = code == pixel_ops.CODES["Cutout"]
            arg = xp.where(cutout, arg | (u[..., 3] >> 8).astype(xp.int32), arg)
        codes.append(xp.where(applied, code, xp.uint8(0)))
        args.append(xp.where(applied, arg, 0).astype(xp.int32))
    if not codes:
        b = idx.shape[0]
        return xp.zeros((b, 0), xp.uint8), xp.zeros((b, 0), xp.int32)
    return xp.concatenate(codes, axis=1), xp.concatenate(args, axis=1)


POLICIES = (RandAugment,) + image_ops.CLASSES

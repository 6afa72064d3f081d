"""Random erasing of issue 47: `RandomErasing` (timm's ``RandomErasing`` on the normalized
output) and its per-sample boxes and noise keys (`decide_erasing`), keyed by (seed, epoch,
sample index, repeat) through `order.random_bits` with the per-sample counters of `randaug`
(0x100 apply?, 0x101 count, 0x102 noise key, ``0x200 + 4 * (10 * box + attempt) + t``). The
pixels are `pixel_ops.erase`.

**Erasing** follows timm's ``RandomErasing._erase`` on the output size H x W: per box up to 10
attempts of area fraction ~ U(min_area, max_area) / count and aspect h/w ~ logU, h and w rounded
half to even from float32 products with host float32 tables (as `augment.py` does), the first
with 1 <= h < H and 1 <= w < W placed uniformly (``((w >> 16) * span) >> 16``).

Example:
    >>> import numpy as np
    >>> boxes, keys = decide_erasing(RandomErasing(p=1.0), np.arange(4), height=32, width=32, seed=0, epoch=0)
    >>> boxes.shape, boxes.dtype, keys.dtype
    ((4, 1, 4), dtype('int32'), dtype('uint32'))
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from tbljax._src.rules import contract, image_ops, order, quantiles, randaug

__all__ = ["ERASE_MODES", "RandomErasing", "decide_erasing", "decide_erasing_rows", "side_table"]

ERASE_MODES = ("pixel", "rand", "const")
_MAX_BOXES, _ATTEMPTS = 16, 10
_ERASE_APPLY, _ERASE_COUNT, _ERASE_KEY, _ERASE_BOXES = 0x100, 0x101, 0x102, 0x200
_number, _int = image_ops.number, image_ops.integer


@dataclasses.dataclass(frozen=True)
class RandomErasing:
    """timm's ``RandomErasing`` on the normalized output: with probability `p`, `min_count` to
    `max_count` boxes of area fraction in [min_area, max_area] / count and aspect h/w in
    [min_aspect, max_aspect or 1 / min_aspect], set to a normal per value (``"pixel"``), per
    channel (``"rand"``) or 0 (``"const"``).

    >>> RandomErasing(p=0.25, mode="pixel").max_count
    1
    """

    p: float = 0.25
    mode: str = "pixel"
    min_area: float = 0.02
    max_area: float = 1 / 3
    min_aspect: float = 0.3
    max_aspect: float | None = None
    min_count: int = 1
    max_count: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "p", _number("p", self.p, 0, 1))
        if self.mode not in ERASE_MODES:
            raise ValueError(f"mode must be one of {ERASE_MODES}, got {self.mode!r}")
        lo = _number("min_area", self.min_area, 0, 1)
        hi = _number("max_area", self.max_area, 0, 1)
        if not 0 < lo <= hi:
            raise ValueError(
                f"min_area and max_area must satisfy 0 < min_area <= max_area <= 1, got "
                f"{self.min_area!r}, {self.max_area!r}"
            )
        object.__setattr__(self, "min_area", lo)
        object.__setattr__(self, "max_area", hi)
        a = _number("min_aspect", self.min_aspect, 1e-3, 1e3)
        b = 1 / a if self.max_aspect is None else _number("max_aspect", self.max_aspect, 1e-3, 1e3)
        if a > b:
            raise ValueError(f"min_aspect must be <= max_aspect, got {a!r} > {b!r}")
        object.__setattr__(self, "min_aspect", a)
        object.__setattr__(self, "max_aspect", b)
        object.__setattr__(self, "min_count", _int("min_count", self.min_count, 1, _MAX_BOXES))
        mc = self.min_count if self.max_count is None else _int("max_count", self.max_count, 1, _MAX_BOXES)
        if mc < self.min_count:
            raise ValueError(f"max_count must be >= min_count, got {mc!r} < {self.min_count!r}")
        object.__setattr__(self, "max_count", mc)


@functools.lru_cache(maxsize=16)
def side_table(unit: int, units: int) -> np.ndarray:
    """float32 (units + 1, 17): row n is sqrt(n · unit / count) per box count (count 0 as 1),
    in float64 then rounded: the erasing side of an output of n · unit pixels (NaFlex rows in
    jit: n patches of unit = p² pixels, looked up per row where the size is traced)."""
    counts = np.arange(_MAX_BOXES + 1, dtype=np.float64)
    counts[0] = 1
    area = np.arange(units + 1, dtype=np.int64)[:, None] * unit
    return np.sqrt(area / counts).astype(np.float32)


def decide_erasing(
    er: RandomErasing, indices, *, height: int, width: int, seed: int, epoch: int, repeat=0, view: int = 0, xp=np
):
    """(boxes (B, E, 4) int32 of (y0, x0, h, w), h = 0 for none; keys (B,) uint32 of their
    noise) for samples `indices` erased on an output of `height` x `width`; E = max_count.
    `view`: which view (``views=``; 0 without)."""
    if not isinstance(er, RandomErasing):
        raise ValueError(f"erasing must be a RandomErasing, got {er!r}")
    height, width = _int("height", height, 1, contract.MAX_SIDE), _int("width", width, 1, contract.MAX_SIDE)
    side_t = xp.asarray(side_table(height * width, 1)[1])
    return _decide(er, indices, lambda count: side_t[count], height, width, seed, epoch, repeat, view, xp)


def decide_erasing_rows(er: RandomErasing, indices, *, heights, widths, sides, seed: int, epoch: int, repeat=0, xp=np):
    """`decide_erasing` with each row its own output size: ``heights``, ``widths`` (B,)
    integers (may be traced) and ``sides`` (B, 17) float32, each row's `side_table` row (the
    same draws as `decide_erasing` at that row's size)."""
    if not isinstance(er, RandomErasing):
        raise ValueError(f"erasing must be a RandomErasing, got {er!r}")
    sides = xp.asarray(sides)

    def side(count):
        return xp.take_along_axis(sides, count[:, None], axis=1)[:, 0]

    h, w = (xp.asarray(a)[:, None, None] for a in (heights, widths))
    return _decide(er, indices, side, h, w, seed, epoch, repeat, 0, xp)


def _decide(er, indices, side, height, width, seed, epoch, repeat, view, xp):
    """`decide_erasing`'s draws; `side(count)`: the (B,) float32 sides of the rows' counts;
    height, width: ints, or (B, 1, 1) each row's."""
    idx = xp.asarray(indices)
    # sqrt(U(min_area, max_area)), sqrt(aspect) and 1 / sqrt(aspect) at 4096 quantiles (float32)
    tables = quantiles.area_aspect_tables((er.min_area, er.max_area), (er.min_aspect, er.max_aspect))
    frac_t, r_t, inv_r_t = (xp.asarray(t) for t in tables)
    e = er.max_count
    # Every word of a row in one hash call (each word depends on its counter alone): the head's,
    # then the boxes' (box, attempt, 4).
    words = order.random_bits(
        idx[:, None],
        randaug.counters(_local(e), randaug.repeats(repeat, 1, xp), xp, view),
        seed,
        epoch,
        xp=xp,
    )
    head, u = words[:, :3], words[:, 3:].reshape(-1, e, _ATTEMPTS, 4)
    applied = image_ops.applied(head[:, 0], er.p, xp)
    span = er.max_count - er.min_count + 1
    count = image_ops.choice(head[:, 1], span, xp) + er.min_count
    shift = xp.uint32(32 - quantiles.BITS)
    s = side(count)[:, None, None] * frac_t[u[..., 0] >> shift]
    kr = u[..., 1] >> shift
    h = xp.rint(s * r_t[kr]).astype(xp.int32)
    w = xp.rint(s * inv_r_t[kr]).astype(xp.int32)
    fits = (h >= 1) & (h < height) & (w >= 1) & (w < width)
    y0 = (((u[..., 2] >> 16) * xp.maximum(height - h + 1, 1).astype(xp.uint32)) >> 16).astype(xp.int32)
    x0 = (((u[..., 3] >> 16) * xp.maximum(width - w + 1, 1).astype(xp.uint32)) >> 16).astype(xp.int32)
    boxes = xp.stack([y0, x0, h, w], axis=-1)  # (B, E, attempts, 4)
    first = xp.argmax(fits, axis=2)
    chosen = xp.take_along_axis(boxes, first[:, :, None, None], axis=2)[:, :, 0]
    keep = xp.any(fits, axis=2) & applied[:, None] & (xp.arange(e)[None, :] < count[:, None])
    return xp.where(keep[..., None], chosen, 0).astype(xp.int32), head[:, 2]


@functools.lru_cache(maxsize=_MAX_BOXES)
def _local(e: int) -> np.ndarray:
    """A row's local counters with `e` boxes: apply?, count, key, then the boxes' (e * attempts * 4)."""
    boxes = _ERASE_BOXES + np.arange(4 * _ATTEMPTS * e)
    c = np.concatenate([np.array([_ERASE_APPLY, _ERASE_COUNT, _ERASE_KEY]), boxes])
    c.setflags(write=False)
    return c

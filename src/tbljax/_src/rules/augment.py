"""Random-resized-crop boxes and horizontal flips for a batch of sample indices,
drawn from `tbljax.order.random_bits`, so a sample's crop and flip depend only on
(seed, epoch, sample index). The kernel applies them; this module only decides them.

Semantics follow torchvision's ``RandomResizedCrop`` + ``RandomHorizontalFlip(p=0.5)``: up to 10
attempts of (area fraction s ~ U(scale), aspect r ~ logU(ratio)), w = round(sqrt(A s r)),
h = round(sqrt(A s / r)); the first attempt with 0 < w <= W and 0 < h <= H is placed uniformly;
if none fits, the central crop clamped to the ratio range.

**Exactly reproducible in jax.numpy.** log and exp are not correctly rounded, so NumPy and XLA
may differ in their last bit and a box one pixel apart would follow. So nothing here calls
them at batch time: the host computes once, in float64, three float32 tables of 4096 entries,

    sqrt_scale[k] = sqrt(scale_lo + (scale_hi - scale_lo) * (k + 0.5) / 4096)
    sqrt_ratio[k] = sqrt(r_k),  inv_sqrt_ratio[k] = 1 / sqrt(r_k),
    r_k = exp(log ratio_lo + (log ratio_hi - log ratio_lo) * (k + 0.5) / 4096)

and a batch only does table look-ups, float32 multiplies (IEEE rounds them exactly on every
backend) and round-half-to-even:

    s = float32(sqrt(H*W)) * sqrt_scale[u0 >> 20]
    w = rint(s * sqrt_ratio[u1 >> 20]);  h = rint(s * inv_sqrt_ratio[u1 >> 20])

Placement is integer: y0 = ((u2 >> 16) * (H - h + 1)) >> 16, likewise x0 with u3 (uint32, no
overflow since H, W <= 65535). Random words: attempt t uses counters 4t .. 4t+3; the flip uses
counter 40 (flip when its top bit is set), also when cropping is off, so a sample flips the
same way with and without the crop. Quantizing s and log r to 4096 levels changes nothing
visible (steps of 2.3e-4 in area fraction and 1.4e-4 in log ratio).

**Records of different sizes** (`RecordGeometry`): H and W above are each sample's own record,
gathered by sample index. What needs float64 (``float32(sqrt(H*W))``, the fallback crop, the
center crop) is computed once per record on the host as a table and gathered the same way, so
jax.numpy never recomputes it in float32 and both give the same boxes.

**Center crop** (``crop="center"``, evaluation): the central square of side
c = max(1, int(center_fraction * min(H, W))) at ((H - c) // 2, (W - c) // 2), as FFCV's
``CenterCropRGBImageDecoder``; the kernel resizes it to ``size``.

Example:
    >>> import numpy as np
    >>> from tbljax.augment import Augment, sample
    >>> boxes, flips = sample(Augment(), np.arange(4), height=64, width=48, seed=0, epoch=0)
    >>> boxes.shape, boxes.dtype, flips.dtype
    ((4, 4), dtype('int32'), dtype('bool'))
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math

import numpy as np

from tbljax._src.rules import contract, order, randaug

__all__ = ["PRESETS", "Augment", "RecordGeometry", "sample", "crop_boxes", "center_boxes", "flips"]

# The augmentations a name stands for (`Augment.from_spec`, the CLI's --augment): Augment(**kw).
PRESETS: dict[str, dict] = {"rrc_flip": {}, "flip": {"crop": False}}
_ATTEMPTS = 10
_WORDS_PER_ATTEMPT = 4
_FLIP_COUNTER = _ATTEMPTS * _WORDS_PER_ATTEMPT
_TABLE_BITS = 12
# TBL stores sides as u16, which keeps the placement product in uint32.
_MAX_SIDE = contract.MAX_SIDE


def _pair(name, value, lo_ok):
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair of numbers (lo, hi), got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo_ok(lo) and lo <= hi):
        raise ValueError(f"{name} must satisfy 0 < lo <= hi (finite), got {value!r}")
    return lo, hi


def _side_pair(value) -> tuple[int, int] | None:
    """(height, width) as two ints in [1, MAX_SIDE], or None if `value` is not one."""
    try:
        h, w = value
    except (TypeError, ValueError):
        return None
    ok = all(contract.is_integer(v) and 1 <= v <= _MAX_SIDE for v in (h, w))
    return (int(h), int(w)) if ok else None


def _size_or_schedule(size):
    """`size` normalized: None, (h, w), or a schedule ((0, (h, w)), (e1, (h1, w1)), ...) sorted
    by epoch (a tuple, so an Augment stays hashable: jit takes it as a static argument)."""
    if size is None:
        return None
    bad = (
        f"size must be (height, width) with each in [1, {_MAX_SIDE}], a schedule "
        f"{{epoch: (height, width)}} starting at epoch 0, or None for the stored size; "
        f"got {size!r}"
    )
    if isinstance(size, dict):
        if not size or not all(contract.is_integer(e) and e >= 0 for e in size):
            raise ValueError(bad)
        steps = tuple(sorted((int(e), _side_pair(s)) for e, s in size.items()))
        if steps[0][0] != 0 or any(s is None for _, s in steps):
            raise ValueError(bad)
        return steps[0][1] if len(steps) == 1 else steps
    pair = _side_pair(size)
    if pair is None:
        raise ValueError(bad)
    return pair


@dataclasses.dataclass(frozen=True)
class Augment:
    """Training augmentation (random-resized-crop and flip) or the evaluation center crop.

    Attributes:
      crop: True draws a random-resized-crop box per sample (torchvision semantics, from the
        whole record); "center" takes the central square of side
        ``int(center_fraction * min(H, W))`` (evaluation); False: no crop.
      flip: flip horizontally with probability 1/2.
      size: output (height, width) of the crop; None for the stored image size; or a schedule
        ``{epoch: (height, width)}`` (progressive resizing: each size from its epoch on; the
        first key must be 0). Records of different sizes need it.
      scale: range of the crop's area as a fraction of the image's.
      ratio: range of the crop's aspect ratio w/h, sampled log-uniformly.
      center_fraction: the center crop's side as a fraction of the record's shorter side,
        in (0, 1] (0.875: 224 of 256).
      ops: per-image ops after the crop, resize and flip, in order (`RandAugment` policies);
        they change no box or flip.
      erasing: a `RandomErasing` applied to the normalized output, or None.

    ``"rrc_flip"`` is ``Augment()``; ``"flip"`` is ``Augment(crop=False)``.

    >>> Augment(size=(128, 128), scale=(0.25, 1.0)).size
    (128, 128)
    >>> Augment(size={0: (160, 160), 30: (192, 192)}).size_at(31)
    (192, 192)
    """

    crop: bool | str = True
    flip: bool = True
    size: tuple[int, int] | dict | None = None
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    center_fraction: float = 0.875
    ops: tuple = ()
    erasing: "randaug.RandomErasing | None" = None

    def __post_init__(self):
        if isinstance(self.crop, (bool, np.bool_)):
            object.__setattr__(self, "crop", bool(self.crop))
        elif not (isinstance(self.crop, str) and self.crop == "center"):
            raise ValueError(f"crop must be True (random-resized-crop), 'center' or False, got {self.crop!r}")
        if not isinstance(self.flip, (bool, np.bool_)):
            raise ValueError(f"flip must be True or False, got {self.flip!r}")
        object.__setattr__(self, "flip", bool(self.flip))
        object.__setattr__(self, "size", _size_or_schedule(self.size))
        if self.size is not None and not self.crop:
            raise ValueError(
                f"size={self.size!r} needs crop=True or crop='center': without a crop the output is the stored size"
            )
        if self.crop == "center" and self.size is None:
            raise ValueError(
                "crop='center' needs an output size, e.g. Augment(crop='center', flip=False, size=(224, 224))"
            )
        object.__setattr__(self, "scale", _pair("scale", self.scale, lambda v: v > 0))
        object.__setattr__(self, "ratio", _pair("ratio", self.ratio, lambda v: v > 0))
        f = self.center_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float, np.floating, np.integer)) or not 0 < f <= 1:
            raise ValueError(f"center_fraction must be a number in (0, 1], got {f!r}")
        object.__setattr__(self, "center_fraction", float(f))
        if (
            isinstance(self.ops, randaug.RandAugment)
            or not isinstance(self.ops, (tuple, list))
            or not all(isinstance(op, randaug.RandAugment) for op in self.ops)
        ):
            raise ValueError(f"ops must be a list of per-image ops (tbljax.RandAugment), got {self.ops!r}")
        object.__setattr__(self, "ops", tuple(self.ops))
        if self.erasing is not None and not isinstance(self.erasing, randaug.RandomErasing):
            raise ValueError(f"erasing must be a tbljax.RandomErasing or None, got {self.erasing!r}")

    @classmethod
    def from_spec(cls, spec) -> "Augment | None":
        """None, ``"rrc_flip"``, ``"flip"`` or an `Augment` → an `Augment` (or None)."""
        if spec is None or isinstance(spec, cls):
            return spec
        if isinstance(spec, str) and spec in PRESETS:
            return cls(**PRESETS[spec])
        raise ValueError(f"augment must be None, {', '.join(map(repr, PRESETS))} or an Augment, got {spec!r}")

    @property
    def schedule(self) -> tuple[tuple[int, tuple[int, int] | None], ...]:
        """((first epoch, output size or None), ...): one entry unless `size` is a schedule."""
        if self.size is not None and isinstance(self.size[0], tuple):
            return self.size
        return ((0, self.size),)

    def size_at(self, epoch: int) -> tuple[int, int] | None:
        """The output size of epoch `epoch` (a Python int), or None for the stored size."""
        if not contract.is_integer(epoch) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        return [s for first, s in self.schedule if first <= epoch][-1]

    def at_epoch(self, epoch: int) -> "Augment":
        """This augmentation with the fixed output size of epoch `epoch` (the same boxes and
        flips: they never depend on the output size). One per size of a schedule is what a
        jitted step takes as a static argument (see `tbljax.ResidentDataset.batch`)."""
        return dataclasses.replace(self, size=self.size_at(epoch))


class RecordGeometry:
    """The stored (height, width) of every record, and the per-record float64 tables that
    boxes need, built once on the host and gathered by sample index.

    ``RecordGeometry(h, w)`` with two ints: every record is h×w (``shape == (h, w)``).
    ``RecordGeometry(heights, widths)`` with two 1-D integer arrays: record i is
    heights[i]×widths[i] (``shape`` is None unless they are all equal).

    >>> g = RecordGeometry(np.array([300, 40]), np.array([200, 90]))
    >>> g.shape, len(g), g.center_table(0.5).tolist()
    (None, 2, [[100, 50, 100, 100], [10, 35, 20, 20]])
    """

    def __init__(self, heights, widths):
        if np.ndim(heights) == 0 and np.ndim(widths) == 0:
            hw = [_check_side(name, v) for name, v in (("height", heights), ("width", widths))]
            self.heights, self.widths = (np.array([v], np.int32) for v in hw)
            self._uniform = True
        else:
            h, w = np.asarray(heights), np.asarray(widths)
            if h.ndim != 1 or h.shape != w.shape or not len(h) or h.dtype.kind not in "iu" or w.dtype.kind not in "iu":
                raise ValueError(
                    f"heights and widths must be two ints or two 1-D integer arrays "
                    f"of one length >= 1, got {h.dtype} {h.shape} and "
                    f"{w.dtype} {w.shape}"
                )
            for name, a in (("height", h), ("width", w)):
                if a.min() < 1 or a.max() > _MAX_SIDE:
                    k = int(np.argmax((a < 1) | (a > _MAX_SIDE)))
                    raise ValueError(f"record {k}: {name} must be an integer in [1, {_MAX_SIDE}], got {int(a[k])}")
            self.heights, self.widths = h.astype(np.int32), w.astype(np.int32)
            self._uniform = bool((h == h[0]).all() and (w == w[0]).all())
            if self._uniform:  # one size after all: the scalar path (one table row)
                self.heights, self.widths = self.heights[:1], self.widths[:1]
        for a in (self.heights, self.widths):
            a.setflags(write=False)
        self._tables: dict = {}
        self._first = 0  # the global index of record 0 (`shifted`)

    @classmethod
    def of(cls, hw) -> "RecordGeometry":
        """`hw` itself if it is a RecordGeometry, else RecordGeometry(*hw)."""
        return hw if isinstance(hw, cls) else cls(*hw)

    @property
    def shape(self) -> tuple[int, int] | None:
        """(H, W) when every record has that size, else None."""
        return (int(self.heights[0]), int(self.widths[0])) if self._uniform else None

    def __len__(self) -> int:
        """Records described (1 for a uniform geometry: it holds one size for all)."""
        return len(self.heights)

    def __repr__(self) -> str:
        if self._uniform:
            return f"RecordGeometry({self.shape[0]}, {self.shape[1]})"
        return f"RecordGeometry({len(self)} records of different sizes)"

    def shifted(self, first: int) -> "RecordGeometry":
        """This geometry for records numbered from global index `first` (a host's part of a
        dataset): `gather` then takes global sample indices. Shares the tables."""
        if not first or self._uniform:
            return self
        other = copy.copy(self)
        other._first = int(first)
        return other

    def gather(self, table, indices, xp=np):
        """Rows of a per-record `table` for sample `indices` (uniform: its one row, shaped to
        broadcast against the batch)."""
        t = xp.asarray(table)
        return t[:1] if self._uniform else t[xp.asarray(indices) - self._first]

    def _cached(self, key, make):
        if key not in self._tables:
            table = make()
            table.setflags(write=False)
            self._tables[key] = table
        return self._tables[key]

    def sqrt_area_table(self) -> np.ndarray:
        """float32 (N,): float32(sqrt(H*W)) per record, computed in float64."""
        return self._cached(
            "sqrt_area", lambda: np.sqrt(self.heights.astype(np.float64) * self.widths).astype(np.float32)
        )

    def fallback_table(self, ratio) -> np.ndarray:
        """int32 (N, 4): torchvision's central crop clamped to `ratio`, per record (float64
        and round-half-to-even, as Python's round)."""
        lo, hi = (float(r) for r in ratio)

        def make():
            h, w = self.heights.astype(np.float64), self.widths.astype(np.float64)
            in_ratio = w / h
            # At least 1 pixel: an extreme ratio range may round a side to 0.
            ch = np.where(in_ratio < lo, np.maximum(np.rint(w / lo), 1), h)
            cw = np.where(in_ratio > hi, np.maximum(np.rint(h * hi), 1), w)
            return _boxes(h, w, ch, cw)

        return self._cached(("fallback", lo, hi), make)

    def center_table(self, fraction: float) -> np.ndarray:
        """int32 (N, 4): the central square of side max(1, int(fraction * min(H, W)))."""
        fraction = float(fraction)

        def make():
            h, w = self.heights.astype(np.float64), self.widths.astype(np.float64)
            c = np.maximum(np.floor(fraction * np.minimum(h, w)), 1)
            return _boxes(h, w, c, c)

        return self._cached(("center", fraction), make)


def _boxes(h, w, ch, cw):
    """int32 (N, 4) boxes (y0, x0, ch, cw) centred in h×w records (float64 whole numbers)."""
    return np.stack([(h - ch) // 2, (w - cw) // 2, ch, cw], axis=-1).astype(np.int32)


@functools.lru_cache(maxsize=32)
def _tables(scale, ratio):
    k = (np.arange(1 << _TABLE_BITS, dtype=np.float64) + 0.5) / (1 << _TABLE_BITS)
    s = np.sqrt(scale[0] + (scale[1] - scale[0]) * k)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    r = np.sqrt(np.exp(log_lo + (log_hi - log_lo) * k))
    tables = (s.astype(np.float32), r.astype(np.float32), (1.0 / r).astype(np.float32))
    for t in tables:
        t.setflags(write=False)
    return tables


def _check_side(name, v):
    if not contract.is_integer(v) or not 1 <= v <= _MAX_SIDE:
        raise ValueError(f"{name} must be an integer in [1, {_MAX_SIDE}], got {v!r}")
    return int(v)


def _geometry(height, width, geometry) -> RecordGeometry:
    if geometry is not None:
        if height is not None or width is not None:
            raise ValueError("give either height and width or geometry, not both")
        return RecordGeometry.of(geometry)
    if height is None or width is None:
        raise ValueError("give height and width (one size for every record) or geometry")
    return RecordGeometry(height, width)


def crop_boxes(
    indices,
    *,
    height: int | None = None,
    width: int | None = None,
    seed: int,
    epoch: int,
    scale=(0.08, 1.0),
    ratio=(3 / 4, 4 / 3),
    geometry=None,
    xp=np,
):
    """int32 (B, 4) random-resized-crop boxes (y0, x0, h, w) in source pixels for samples
    `indices`: of an H×W image (`height`, `width`), or each of its own record's size
    (`geometry`: a `RecordGeometry` indexed by sample index).

    >>> b = crop_boxes(np.arange(3), height=32, width=32, seed=0, epoch=0)
    >>> bool(((b[:, 0] + b[:, 2] <= 32) & (b[:, 1] + b[:, 3] <= 32)).all())
    True
    """
    geo = _geometry(height, width, geometry)
    scale = _pair("scale", scale, lambda v: v > 0)
    ratio = _pair("ratio", ratio, lambda v: v > 0)
    sqrt_scale, sqrt_ratio, inv_sqrt_ratio = (xp.asarray(t) for t in _tables(scale, ratio))
    indices = xp.asarray(indices)
    # Each sample's record: (B, 1) against the attempts axis ((1, 1) when all are one size).
    rec_h = geo.gather(geo.heights, indices, xp)[:, None]
    rec_w = geo.gather(geo.widths, indices, xp)[:, None]
    sqrt_area = geo.gather(geo.sqrt_area_table(), indices, xp)[:, None]
    counters = xp.arange(_ATTEMPTS * _WORDS_PER_ATTEMPT, dtype=xp.uint32).reshape(_ATTEMPTS, _WORDS_PER_ATTEMPT)
    u = order.random_bits(indices[:, None, None], counters, seed, epoch, xp=xp)
    shift = xp.uint32(32 - _TABLE_BITS)
    side = sqrt_area * sqrt_scale[u[..., 0] >> shift]
    kr = u[..., 1] >> shift
    w = xp.rint(side * sqrt_ratio[kr]).astype(xp.int32)
    h = xp.rint(side * inv_sqrt_ratio[kr]).astype(xp.int32)
    fits = (w >= 1) & (w <= rec_w) & (h >= 1) & (h <= rec_h)
    # Place every attempt (clamping spans of those that do not fit) and pick the first that fits.
    span_y = xp.maximum(rec_h - h + 1, 1).astype(xp.uint32)
    span_x = xp.maximum(rec_w - w + 1, 1).astype(xp.uint32)
    y0 = (((u[..., 2] >> 16) * span_y) >> 16).astype(xp.int32)
    x0 = (((u[..., 3] >> 16) * span_x) >> 16).astype(xp.int32)
    boxes = xp.stack([y0, x0, h, w], axis=-1)  # (B, attempts, 4)
    first = xp.argmax(fits, axis=1)  # 0 when none fits
    chosen = xp.take_along_axis(boxes, first[:, None, None], axis=1)[:, 0]
    fallback = geo.gather(geo.fallback_table(ratio), indices, xp)
    return xp.where(xp.any(fits, axis=1)[:, None], chosen, fallback)


def center_boxes(
    indices, *, fraction: float, height: int | None = None, width: int | None = None, geometry=None, xp=np
):
    """int32 (B, 4) center-crop boxes (y0, x0, c, c) for samples `indices`: the central square
    of side max(1, int(fraction * min(H, W))) of each sample's record.

    >>> center_boxes(np.arange(2), fraction=0.875, height=256, width=320).tolist()
    [[16, 48, 224, 224], [16, 48, 224, 224]]
    """
    geo = _geometry(height, width, geometry)
    indices = xp.asarray(indices)
    box = geo.gather(geo.center_table(fraction), indices, xp)
    return xp.broadcast_to(box, (indices.shape[0], 4))


def flips(indices, *, seed: int, epoch: int, xp=np):
    """bool (B,): flip sample `indices` horizontally (probability 1/2, fixed per sample and epoch).

    >>> flips(np.arange(4), seed=0, epoch=0).dtype
    dtype('bool')
    """
    u = order.random_bits(xp.asarray(indices), xp.uint32(_FLIP_COUNTER), seed, epoch, xp=xp)
    return (u >> 31) == 1


def sample(
    aug: Augment,
    indices,
    *,
    height: int | None = None,
    width: int | None = None,
    seed: int,
    epoch: int,
    geometry=None,
    xp=np,
):
    """(boxes or None, flips or None) for a batch of sample indices under options `aug`, for
    H×W records (`height`, `width`) or records of their own sizes (`geometry`)."""
    boxes = None
    if aug.crop == "center":
        boxes = center_boxes(
            indices, fraction=aug.center_fraction, height=height, width=width, geometry=geometry, xp=xp
        )
    elif aug.crop:
        boxes = crop_boxes(
            indices,
            height=height,
            width=width,
            seed=seed,
            epoch=epoch,
            scale=aug.scale,
            ratio=aug.ratio,
            geometry=geometry,
            xp=xp,
        )
    flip = flips(indices, seed=seed, epoch=epoch, xp=xp) if aug.flip else None
    return boxes, flip

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
same way with and without the crop. Repeat r of a sample (``repeats=``) adds 64 r to these
counters: repeat 0 is the crop without repeats; r < 1024 stays below RandAugment's words.
View v of a sample (``views=``, multi-crop) adds ``0x1000000 v`` (past every repeat's RandAugment
and erasing words, so at most 256 views): view 0 is the crop without views.
Quantizing s and log r to 4096 levels changes nothing visible (steps of 2.3e-4 in area fraction
and 1.4e-4 in log ratio).

**Records of different sizes** (`RecordGeometry`, `record_geometry.py`): H and W above are each
sample's own record, gathered by sample index. What needs float64 (``float32(sqrt(H*W))``, the
fallback crop, the center crop) is computed once per record on the host as a table and gathered
the same way, so jax.numpy never recomputes it in float32 and both give the same boxes.

**Detection crop** (``crop="bbox"``): SSD / DALI ``random_bbox_crop``'s window that keeps an
object, drawn on the host from each record's boxes (`bbox_crop.py` states the loop and its counters).

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

import dataclasses
import math

import numpy as np

from tbljax._src.rules import bbox_crop, contract, order, quantiles, randaug, scale_jitter
from tbljax._src.rules.erasing import RandomErasing
from tbljax._src.rules.record_geometry import RecordGeometry

__all__ = [
    "MAX_REPEATS",
    "MAX_VIEWS",
    "PRESETS",
    "Augment",
    "RecordGeometry",
    "sample",
    "crop_boxes",
    "center_boxes",
    "flips",
]

# The augmentations a name stands for (`Augment.from_spec`, the CLI's --augment): Augment(**kw).
PRESETS: dict[str, dict] = {"rrc_flip": {}, "flip": {"crop": False}}
_ATTEMPTS = 10
_WORDS_PER_ATTEMPT = 4
_FLIP_COUNTER = _ATTEMPTS * _WORDS_PER_ATTEMPT
_REPEAT_STRIDE = 64  # repeat r's counters: + 64 r (past the buckets' 48..49), below randaug's 0x10000
MAX_REPEATS = 0x10000 // _REPEAT_STRIDE
MAX_VIEWS = randaug.MAX_VIEWS  # view v's counters: + randaug.view_offset(v), one rule for crops and ops
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
    bad = contract.ArgumentError(
        contract.Arg("size"),
        f" must be (height, width) with each in [1, {_MAX_SIDE}], a "
        f"schedule {{epoch: (height, width)}} starting at epoch 0, or None for the "
        f"stored size; got {size!r}",
    )
    if isinstance(size, dict):
        if not size or not all(contract.is_integer(e) and e >= 0 for e in size):
            raise bad
        steps = tuple(sorted((int(e), _side_pair(s)) for e, s in size.items()))
        if steps[0][0] != 0 or any(s is None for _, s in steps):
            raise bad
        return steps[0][1] if len(steps) == 1 else steps
    pair = _side_pair(size)
    if pair is None:
        raise bad
    return pair


def _check_bbox(aug: "Augment") -> dict:
    """The detection crop's arguments (`bbox_crop.py`), validated, each error naming the value."""
    t = aug.min_object_covered
    t = (t,) if contract.is_real(t) else t
    if not (
        isinstance(t, (tuple, list))
        and t
        and all(contract.is_real(v) and 0 <= v <= 1 and not isinstance(v, bool) for v in t)
    ):
        raise ValueError(f"min_object_covered must be a number in [0, 1] or a non-empty list of them, got {t!r}")
    if aug.bbox_metric not in bbox_crop.METRICS:
        raise ValueError(f"bbox_metric must be one of {bbox_crop.METRICS}, got {aug.bbox_metric!r}")
    scaling = _pair("bbox_scaling", aug.bbox_scaling, lambda v: v > 0)
    if scaling[1] > 1:
        raise ValueError(f"bbox_scaling must lie in (0, 1] (a side's fraction of the image's), got {scaling!r}")
    n = aug.bbox_attempts
    if not contract.is_integer(n) or not 1 <= n <= bbox_crop.MAX_ATTEMPTS:
        raise ValueError(f"bbox_attempts must be an integer in [1, {bbox_crop.MAX_ATTEMPTS}], got {n!r}")
    if not isinstance(aug.allow_no_crop, (bool, np.bool_)):
        raise ValueError(f"allow_no_crop must be True or False, got {aug.allow_no_crop!r}")
    return dict(
        min_object_covered=tuple(float(v) for v in t),
        bbox_scaling=scaling,
        bbox_aspect_ratio=_pair("bbox_aspect_ratio", aug.bbox_aspect_ratio, lambda v: v > 0),
        bbox_attempts=int(n),
        allow_no_crop=bool(aug.allow_no_crop),
    )


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

    Detection crops, ``crop="bbox"`` (SSD; DALI ``fn.random_bbox_crop``'s arguments; the loop
    is `tbljax._src.rules.bbox_crop`'s): needs the loader to serve a boxes field.
      min_object_covered: thresholds (DALI ``thresholds``): each try picks one uniformly (or no
        crop, with allow_no_crop), then a window with ``bbox_metric`` at least it for some box.
      bbox_metric: "iou" (intersection over union) or "overlap" (intersection over the box's area).
      bbox_scaling: range of each side of the window as a fraction of the image's.
      bbox_aspect_ratio: range of (w / W) / (h / H) of the window.
      bbox_attempts: windows tried per threshold picked (DALI ``num_attempts``).
      allow_no_crop: the whole image is one of the options.

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
    erasing: "RandomErasing | None" = None
    # Detection crops (crop="bbox"): SSD's defaults as DALI's SSD example sets them.
    min_object_covered: tuple = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
    bbox_metric: str = "iou"
    bbox_scaling: tuple[float, float] = (0.3, 1.0)
    bbox_aspect_ratio: tuple[float, float] = (0.5, 2.0)
    bbox_attempts: int = 50
    allow_no_crop: bool = True
    scale_jitter: tuple[float, float] | None = None  # LSJ; with crop="longer_pad": a canvas (rules/scale_jitter.py)

    def __post_init__(self):
        if isinstance(self.crop, (bool, np.bool_)):
            object.__setattr__(self, "crop", bool(self.crop))
        elif not (isinstance(self.crop, str) and self.crop in ("center", "bbox", "longer_pad")):
            raise ValueError(
                f"crop must be True (random-resized-crop), 'center', 'bbox', 'longer_pad' or False, got {self.crop!r}"
            )
        for k, v in _check_bbox(self).items():
            object.__setattr__(self, k, v)
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
        if not contract.is_real(f) or not 0 < f <= 1:
            raise ValueError(f"center_fraction must be a number in (0, 1], got {f!r}")
        object.__setattr__(self, "center_fraction", float(f))
        if (
            isinstance(self.ops, randaug.POLICIES)
            or not isinstance(self.ops, (tuple, list))
            or not all(isinstance(op, randaug.POLICIES) for op in self.ops)
        ):
            names = ", ".join("tbljax." + c.__name__ for c in randaug.POLICIES)
            raise ValueError(f"ops must be a list of per-image ops ({names}), got {self.ops!r}")
        object.__setattr__(self, "ops", tuple(self.ops))
        if self.erasing is not None and not isinstance(self.erasing, RandomErasing):
            raise ValueError(f"erasing must be a tbljax.RandomErasing or None, got {self.erasing!r}")
        if scale_jitter.on_canvas(self):
            object.__setattr__(self, "scale_jitter", scale_jitter.check(self, _pair))

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
    repeat=0,
    view: int = 0,
    xp=np,
):
    """int32 (B, 4) random-resized-crop boxes (y0, x0, h, w) in source pixels for samples
    `indices`: of an H×W image (`height`, `width`), or each of its own record's size
    (`geometry`: a `RecordGeometry` indexed by sample index); `repeat`: an int or (B,) ints;
    `view`: which view of the sample (``views=``; 0: the crop without views).

    >>> b = crop_boxes(np.arange(3), height=32, width=32, seed=0, epoch=0)
    >>> bool(((b[:, 0] + b[:, 2] <= 32) & (b[:, 1] + b[:, 3] <= 32)).all())
    True
    """
    geo = _geometry(height, width, geometry)
    scale = _pair("scale", scale, lambda v: v > 0)
    ratio = _pair("ratio", ratio, lambda v: v > 0)
    sqrt_scale, sqrt_ratio, inv_sqrt_ratio = (xp.asarray(t) for t in quantiles.area_aspect_tables(scale, ratio))
    indices = xp.asarray(indices)
    # Each sample's record: (B, 1) against the attempts axis ((1, 1) when all are one size).
    rec_h = geo.gather(geo.heights, indices, xp)[:, None]
    rec_w = geo.gather(geo.widths, indices, xp)[:, None]
    sqrt_area = geo.gather(geo.sqrt_area_table(), indices, xp)[:, None]
    counters = xp.arange(_ATTEMPTS * _WORDS_PER_ATTEMPT, dtype=xp.uint32).reshape(_ATTEMPTS, _WORDS_PER_ATTEMPT)
    u = order.random_bits(indices[:, None, None], _keyed(counters, repeat, 2, xp, view), seed, epoch, xp=xp)
    shift = xp.uint32(32 - quantiles.BITS)
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


def flips(indices, *, seed: int, epoch: int, repeat=0, view: int = 0, xp=np):
    """bool (B,): flip sample `indices` horizontally (probability 1/2, fixed per sample and epoch).

    >>> flips(np.arange(4), seed=0, epoch=0).dtype
    dtype('bool')
    """
    u = order.random_bits(xp.asarray(indices), _keyed(_FLIP_COUNTER, repeat, 0, xp, view), seed, epoch, xp=xp)
    return (u >> 31) == 1


def _keyed(counters, repeat, ndim, xp, view: int = 0):
    """uint32 `counters` of repeat `repeat` (an int, or (B,) ints broadcast over `ndim` more axes)
    and view `view` (an int)."""
    offset = randaug.view_offset(view)
    r = xp.asarray(repeat).astype(xp.uint32)
    keyed = xp.asarray(counters, dtype=xp.uint32) + r.reshape(r.shape + (1,) * ndim) * xp.uint32(_REPEAT_STRIDE)
    return keyed + xp.uint32(offset) if view else keyed


def sample(
    aug: Augment,
    indices,
    *,
    height: int | None = None,
    width: int | None = None,
    seed: int,
    epoch: int,
    geometry=None,
    repeat=0,
    view: int = 0,
    objects=None,
    xp=np,
):
    """(boxes or None, flips or None) for a batch of sample indices under options `aug`, for
    H×W records (`height`, `width`) or records of their own sizes (`geometry`); `repeat`:
    which repeat of each sample (an int, or (B,) ints); `view`: which view (``views=``; the
    center crop is the same in every view, its flip is not); `objects`: crop="bbox" only, each
    sample's object boxes (`bbox_crop.pad_boxes`: (B, n, 4) xyxy source pixels, counts)."""
    boxes = None
    if scale_jitter.on_canvas(aug):
        geo = _geometry(height, width, geometry)
        boxes = scale_jitter.canvas_boxes(aug, indices, geometry=geo, seed=seed, epoch=epoch, repeat=repeat)[0]
    elif aug.crop == "bbox":
        if objects is None or xp is not np:
            raise ValueError(
                "Augment(crop='bbox') draws from each record's boxes on the host: serve it with a loader "
                "(tbljax.loader, HostLoader, tbljax.torch.loader, tbljax.mlx.loader) and a boxes field"
            )
        geo = _geometry(height, width, geometry)
        idx = np.asarray(indices, np.int64)
        boxes = bbox_crop.crop_boxes(
            idx,
            *objects,
            np.broadcast_to(geo.gather(geo.heights, idx), idx.shape),
            np.broadcast_to(geo.gather(geo.widths, idx), idx.shape),
            seed=seed,
            epoch=epoch,
            thresholds=aug.min_object_covered,
            metric_kind=aug.bbox_metric,
            scaling=aug.bbox_scaling,
            aspect_ratio=aug.bbox_aspect_ratio,
            num_attempts=aug.bbox_attempts,
            allow_no_crop=aug.allow_no_crop,
            repeat=repeat,
        )
    elif aug.crop == "center":
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
            repeat=repeat,
            view=view,
            xp=xp,
        )
    flip = flips(indices, seed=seed, epoch=epoch, repeat=repeat, view=view, xp=xp) if aug.flip else None
    return boxes, flip

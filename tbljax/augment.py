"""tbljax.augment: random-resized-crop boxes and horizontal flips for a batch of sample indices,
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

Example:
    >>> import numpy as np
    >>> from tbljax.augment import Augment, sample
    >>> boxes, flips = sample(Augment(), np.arange(4), height=64, width=48, seed=0, epoch=0)
    >>> boxes.shape, boxes.dtype, flips.dtype
    ((4, 4), dtype('int32'), dtype('bool'))
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from tbljax import contract, order

__all__ = ["Augment", "sample", "crop_boxes", "flips"]

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


@dataclasses.dataclass(frozen=True)
class Augment:
    """Training augmentation: random-resized-crop (optional) and horizontal flip (optional).

    Attributes:
      crop: draw a random-resized-crop box per sample (torchvision semantics).
      flip: flip horizontally with probability 1/2.
      size: output (height, width) of the crop, or None for the stored image size.
      scale: range of the crop's area as a fraction of the image's.
      ratio: range of the crop's aspect ratio w/h, sampled log-uniformly.

    ``"rrc_flip"`` is ``Augment()``; ``"flip"`` is ``Augment(crop=False)``.

    >>> Augment(size=(128, 128), scale=(0.25, 1.0)).size
    (128, 128)
    """

    crop: bool = True
    flip: bool = True
    size: tuple[int, int] | None = None
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self):
        if self.size is not None:
            try:
                h, w = self.size
                ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                         and 1 <= v <= _MAX_SIDE for v in (h, w))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"size must be (height, width) with each in [1, {_MAX_SIDE}], "
                                 f"or None for the stored size; got {self.size!r}")
            object.__setattr__(self, "size", (int(h), int(w)))
            if not self.crop:
                raise ValueError(f"size={self.size!r} needs crop=True: without a crop the output "
                                 "is the stored size")
        object.__setattr__(self, "scale", _pair("scale", self.scale, lambda v: v > 0))
        object.__setattr__(self, "ratio", _pair("ratio", self.ratio, lambda v: v > 0))

    @classmethod
    def from_spec(cls, spec) -> "Augment | None":
        """None, ``"rrc_flip"``, ``"flip"`` or an `Augment` → an `Augment` (or None)."""
        if spec is None or isinstance(spec, cls):
            return spec
        if spec == "rrc_flip":
            return cls()
        if spec == "flip":
            return cls(crop=False)
        raise ValueError(f"augment must be None, 'rrc_flip', 'flip' or an Augment, got {spec!r}")


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


def _fallback(height, width, ratio):
    """torchvision's central crop when no attempt fits: a host constant (Python floats)."""
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _check_hw(height, width):
    for name, v in (("height", height), ("width", width)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= _MAX_SIDE:
            raise ValueError(f"{name} must be an integer in [1, {_MAX_SIDE}], got {v!r}")
    return int(height), int(width)


def crop_boxes(indices, *, height: int, width: int, seed: int, epoch: int,
               scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), xp=np):
    """int32 (B, 4) boxes (y0, x0, h, w) in source pixels for samples `indices` of an H×W image.

    >>> b = crop_boxes(np.arange(3), height=32, width=32, seed=0, epoch=0)
    >>> bool(((b[:, 0] + b[:, 2] <= 32) & (b[:, 1] + b[:, 3] <= 32)).all())
    True
    """
    height, width = _check_hw(height, width)
    scale = _pair("scale", scale, lambda v: v > 0)
    ratio = _pair("ratio", ratio, lambda v: v > 0)
    sqrt_scale, sqrt_ratio, inv_sqrt_ratio = (xp.asarray(t) for t in _tables(scale, ratio))
    counters = xp.arange(_ATTEMPTS * _WORDS_PER_ATTEMPT, dtype=xp.uint32).reshape(
        _ATTEMPTS, _WORDS_PER_ATTEMPT)
    u = order.random_bits(xp.asarray(indices)[:, None, None], counters, seed, epoch, xp=xp)
    shift = xp.uint32(32 - _TABLE_BITS)
    side = xp.float32(math.sqrt(height * width)) * sqrt_scale[u[..., 0] >> shift]
    kr = u[..., 1] >> shift
    w = xp.rint(side * sqrt_ratio[kr]).astype(xp.int32)
    h = xp.rint(side * inv_sqrt_ratio[kr]).astype(xp.int32)
    fits = (w >= 1) & (w <= width) & (h >= 1) & (h <= height)
    # Place every attempt (clamping spans of those that do not fit) and pick the first that fits.
    span_y = xp.maximum(height - h + 1, 1).astype(xp.uint32)
    span_x = xp.maximum(width - w + 1, 1).astype(xp.uint32)
    y0 = (((u[..., 2] >> 16) * span_y) >> 16).astype(xp.int32)
    x0 = (((u[..., 3] >> 16) * span_x) >> 16).astype(xp.int32)
    boxes = xp.stack([y0, x0, h, w], axis=-1)                        # (B, attempts, 4)
    first = xp.argmax(fits, axis=1)                                   # 0 when none fits
    chosen = xp.take_along_axis(boxes, first[:, None, None], axis=1)[:, 0]
    fallback = xp.asarray(_fallback(height, width, ratio), dtype=xp.int32)
    return xp.where(xp.any(fits, axis=1)[:, None], chosen, fallback[None, :])


def flips(indices, *, seed: int, epoch: int, xp=np):
    """bool (B,): flip sample `indices` horizontally (probability 1/2, fixed per sample and epoch).

    >>> flips(np.arange(4), seed=0, epoch=0).dtype
    dtype('bool')
    """
    u = order.random_bits(xp.asarray(indices), xp.uint32(_FLIP_COUNTER), seed, epoch, xp=xp)
    return (u >> 31) == 1


def sample(aug: Augment, indices, *, height: int, width: int, seed: int, epoch: int, xp=np):
    """(boxes or None, flips or None) for a batch of sample indices under options `aug`."""
    boxes = crop_boxes(indices, height=height, width=width, seed=seed, epoch=epoch,
                       scale=aug.scale, ratio=aug.ratio, xp=xp) if aug.crop else None
    flip = flips(indices, seed=seed, epoch=epoch, xp=xp) if aug.flip else None
    return boxes, flip

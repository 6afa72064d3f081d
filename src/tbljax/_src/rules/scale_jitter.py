"""Large-scale jitter (LSJ) and the evaluation resize-longer-and-pad: each row's source box and
the extent (rh, rw) <= (H, W) it is resized to, at the top-left of an H x W output row whose
rest is padding. Keyed by (seed, epoch, sample index, repeat) through `order.random_bits`
(counters 50 and 51 + 64 r: past the crop's 0..40 and the buckets' 48..49); host-only NumPy,
float64, no transcendental.

What it reproduces: detectron2's ``ResizeScale(min_scale, max_scale, H, W)`` followed by
``FixedSizeCrop((H, W))`` (ViTDet's and the new detectron2 baselines' LSJ; big_vision's and
scenic's LSJ are the same two steps). For a record of h x w:

    s = lo + (hi - lo) * u,            u = (word 50 + 0.5) / 2**32           (s ~ U(lo, hi))
    f = min(H * s / h, W * s / w)                                     (the scale that fits H s x W s)
    (Rh, Rw) = (max(1, rint(h f)), max(1, rint(w f)))                 (np.round, as detectron2)
    (oy, ox) = rint(max(Rh - H, 0) * v), rint(max(Rw - W, 0) * v)      v = word 51 / 2**32, one
                                                                       draw for both axes
    (rh, rw) = (min(Rh, H), min(Rw, W))                               the valid extent

detectron2 resizes the whole record to Rh x Rw and crops rh x rw at (oy, ox); the kernel
resamples a source box instead, so that window is taken back to source pixels and rounded to
whole pixels: y0 = floor(oy h / Rh), box height = min(h - y0, max(1, rint(rh h / Rh))), likewise
x. Where nothing is cropped (Rh <= H) the box is the record's whole side and the geometry is
detectron2's exactly; a crop can sit up to one source pixel off its sub-pixel window.

``crop="longer_pad"`` (evaluation) is the same rule at s = 1 (no crop can happen): the record is
resized to fit H x W keeping its aspect — the longer side to S for a square S x S output —
as detectron2's ``ResizeShortestEdge(S, max_size=S)`` of ViTDet's evaluation (up to its
round-half-up of the side).

The flip (counter 40, `augment.flips`) mirrors the resized rh x rw region, as with a crop.
Padding: ViTDet runs FixedSizeCrop with pad=False and pads the normalized batch with 0
(ImageList); the loaders pad with 0 after normalization likewise (FixedSizeCrop's own
pad_value=128 would be before it).

>>> import numpy as np
>>> boxes, ext = decide(np.arange(2), [[480, 640]] * 2, size=(1024, 1024), scale=None, seed=0, epoch=0)
>>> boxes.tolist(), ext.tolist()
([[0, 0, 480, 640], [0, 0, 480, 640]], [[768, 1024], [768, 1024]])
"""

from __future__ import annotations

import numpy as np

from tbljax._src.rules import order
from tbljax._src.rules.record_geometry import RecordGeometry

__all__ = ["canvas_boxes", "check", "decide", "on_canvas"]

_SCALE_COUNTER, _OFFSET_COUNTER = 50, 51  # + 64 r for repeat r (augment's _REPEAT_STRIDE)
_REPEAT_STRIDE = 64


def decide(indices, record_hw, *, size, scale, seed: int, epoch: int, repeat=0):
    """(int32 (B, 4) source boxes (y0, x0, h, w), int32 (B, 2) valid extents (rh, rw)) of
    samples `indices` (global), whose records are `record_hw` (B, 2) (height, width), at output
    `size` (H, W); `scale`: (lo, hi) for LSJ, None for evaluation's resize-longer-and-pad (s = 1);
    `repeat`: an int or (B,) ints."""
    idx = np.asarray(indices, np.int64)
    hw = np.asarray(record_hw, np.float64).reshape(len(idx), 2)
    h, w = hw[:, 0], hw[:, 1]
    out_h, out_w = (float(v) for v in size)
    r = np.asarray(repeat, np.uint32) * np.uint32(_REPEAT_STRIDE)
    counters = np.stack(np.broadcast_arrays(_SCALE_COUNTER + r, _OFFSET_COUNTER + r), -1).astype(np.uint32)
    words = order.random_bits(idx[:, None], counters.reshape(-1, 2), seed, epoch).astype(np.float64)
    if scale is None:
        s = np.ones(len(idx))
    else:
        lo, hi = scale
        s = lo + (hi - lo) * ((words[:, 0] + 0.5) / 2.0**32)
    f = np.minimum(out_h * s / h, out_w * s / w)
    big_h, big_w = np.maximum(1, np.rint(h * f)), np.maximum(1, np.rint(w * f))
    v = words[:, 1] / 2.0**32
    oy, ox = np.rint(np.maximum(big_h - out_h, 0) * v), np.rint(np.maximum(big_w - out_w, 0) * v)
    rh, rw = np.minimum(big_h, out_h), np.minimum(big_w, out_w)
    y0, x0 = np.floor(oy * h / big_h), np.floor(ox * w / big_w)
    bh = np.minimum(h - y0, np.maximum(1, np.rint(rh * h / big_h)))
    bw = np.minimum(w - x0, np.maximum(1, np.rint(rw * w / big_w)))
    boxes = np.stack([y0, x0, bh, bw], -1).astype(np.int32)
    return boxes, np.stack([rh, rw], -1).astype(np.int32)


def on_canvas(aug) -> bool:
    """Whether `Augment` `aug` (or None) puts rows on a padded canvas: scale_jitter or
    crop='longer_pad'."""
    return aug is not None and (aug.scale_jitter is not None or aug.crop == "longer_pad")


def check(aug, pair):
    """`aug.scale_jitter` read by `pair` (augment's rule for a (lo, hi) range), having refused by
    name what an `Augment` on a canvas is not served with: another crop beside the jitter, no
    fixed size, per-image ops."""
    jitter = None if aug.scale_jitter is None else pair("scale_jitter", aug.scale_jitter, lambda v: v > 0)
    what = "scale_jitter" if aug.scale_jitter is not None else "crop='longer_pad'"
    if aug.scale_jitter is not None and aug.crop is not True:
        raise ValueError(f"scale_jitter with crop={aug.crop!r}: the jitter decides the crop (leave crop=True)")
    if aug.size is None or isinstance(aug.size[0], tuple):
        raise ValueError(f"{what} needs a fixed output size=(height, width), got size={aug.size!r}")
    if aug.ops or aug.erasing is not None:
        raise ValueError(f"{what} with Augment(ops=/erasing=): not served yet")
    return jitter


def canvas_boxes(aug, indices, *, geometry, seed: int, epoch: int, repeat=0):
    """(source boxes (B, 4), valid extents (B, 2)) of `Augment` `aug` with scale_jitter or
    crop='longer_pad', for sample `indices` of records `geometry` (a `RecordGeometry` indexed
    by sample index): `decide`, host NumPy only."""
    geo = RecordGeometry.of(geometry)
    idx = np.asarray(indices, np.int64)
    hw = np.stack([geo.gather(geo.heights, idx, np), geo.gather(geo.widths, idx, np)], -1)
    hw = np.broadcast_to(hw, (len(idx), 2))
    return decide(idx, hw, size=aug.size, scale=aug.scale_jitter, seed=seed, epoch=epoch, repeat=repeat)

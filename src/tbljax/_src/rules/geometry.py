"""Geometric fields follow the image: the rules, written once in NumPy, that take masks, dense
maps, boxes and keypoints through the image's geometry.

Geometry. A conversion maps a source box of the photo (continuous pixel coordinates
`(y0, x0, h, w)`) onto the stored size `(out_h, out_w)`: `resize_plan` is that mapping, the
Python statement of the C++ core's `PlanResize` (tested against `_core.resize`'s output sizes).
Serving maps an integer crop box of the record onto the output size, then may flip.

The nearest rule (masks; dense maps declared `interpolation="nearest"`). Output index `o` of an
axis of `out` samples, over a box starting at integer `start` of `length` samples, reads

    start + min(floor(float32(o) * (float32(length) / float32(out))), length - 1)

in float32 arithmetic: exactly what torchvision v2 does to a `tv_tensors.Mask`
(`torch.nn.functional.interpolate(mode="nearest")`), which differs from the exact ⌊o·length/out⌋
at some sizes (e.g. length 2, out 82, o 41). Labels are never blended: every output value is a
source value. A conversion's box is the image's with its start rounded down to a whole pixel
(center_crop's start is (H - side) / 2, half a pixel off when H - side is odd).

The linear rule (dense maps declared `interpolation="linear"`). At conversion: bilinear over
the continuous box (`resize_dense`). Served through an integer crop: `crop_taps` puts output
`o` at ((2o + 1)·length − out) / (2·out) past the crop's start, clamped to the crop, in
integers, each tap's weight a multiple of 2^-14. `blend_linear` then sums, in float64, the
four taps in a fixed order, a tap equal to `invalid` given no weight and the rest
renormalised (an output with no valid weight is `invalid`), rounded once to float32. Each
product weight · value is exact in float64 (14 + 14 + 24 bits), so a compiler that fuses a
multiply and an add (XLA on CPU and GPU does) gets the same sums: NumPy and jit agree bit
for bit.

Boxes and keypoints are coordinates (x right, y down, pixel edges at integers): mapped by
`x' = (x - x0) · out_w / w`, in float64; a flip mirrors a box's edges by `x' = out_w - x` (its two
edges swap) and a keypoint, a pixel index, by `x' = out_w - 1 - x` (torchvision v2's rules).
Serving then follows torchvision v2: boxes clipped to the output, and dropped by
`SanitizeBoundingBoxes`'s rules (a side under `min_size`, an area under `min_area`) and by
`min_visibility` (the clipped area over the area before clipping); keypoints outside the output
get visibility 0, and a flip reorders them by `flip_permutation` (left eye ↔ right eye).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "BOX_FORMATS",
    "INTERPOLATIONS",
    "WEIGHT_BITS",
    "ResizePlan",
    "blend_linear",
    "boxes_to_xyxy",
    "crop_taps",
    "linear_taps",
    "map_points",
    "nearest_index",
    "nearest_rows",
    "resize_dense",
    "resize_nearest",
    "resize_plan",
    "serve_boxes",
    "serve_boxes_batch",
    "serve_keypoints",
    "serve_keypoints_batch",
    "serve_linear_batch",
    "serve_mask",
    "stored_boxes",
    "stored_keypoints",
]

# torchvision's BoundingBoxFormat names, lower case; yxyx: TFDS's BBoxFeature order.
BOX_FORMATS = ("xyxy", "xywh", "cxcywh", "yxyx")
INTERPOLATIONS = ("nearest", "linear")  # a dense map's resize


class ResizePlan(NamedTuple):
    """The source box (continuous pixels) a conversion resizes onto (out_h, out_w)."""

    out_h: int
    out_w: int
    box_y: float
    box_x: float
    box_h: float
    box_w: float

    @property
    def int_box(self) -> tuple[int, int, int, int]:
        """(y0, x0, h, w) of the nearest rule: the start rounded down (sides are whole)."""
        return int(self.box_y), int(self.box_x), int(self.box_h), int(self.box_w)


def _mul_div_round(a: int, b: int, c: int) -> int:
    return (2 * a * b + c) // (2 * c)  # round half up, in integers (the C++ core's MulDivRound)


def resize_plan(h: int, w: int, size: int, mode: str, max_long: int = 0) -> ResizePlan:
    """The conversion's geometry of an h x w image at side `size` in resize `mode` (the C++
    core's PlanResize: center_crop maps the centred min(h, w) square onto size x size).

    >>> resize_plan(375, 500, 160, "center_crop")
    ResizePlan(out_h=160, out_w=160, box_y=0.0, box_x=62.5, box_h=375, box_w=375)
    """
    oh = ow = size
    by = bx = 0.0
    bh, bw = h, w
    lng, shrt = max(h, w), min(h, w)
    if mode == "center_crop":
        bh = bw = shrt
        by, bx = (h - shrt) / 2.0, (w - shrt) / 2.0
    elif mode == "max_side":
        other = max(1, (2 * shrt * size + lng) // (2 * lng))
        oh, ow = (other, size) if w >= h else (size, other)
    elif mode == "shorter_side":
        out_short, out_long = size, _mul_div_round(lng, size, shrt)
        if max_long and out_long > max_long:
            out_long, out_short = max_long, max(1, _mul_div_round(shrt, max_long, lng))
        oh, ow = (out_short, out_long) if w >= h else (out_long, out_short)
    elif mode != "squash":
        raise ValueError(f"resize mode {mode!r} is not one of center_crop, squash, max_side, shorter_side")
    return ResizePlan(oh, ow, by, bx, bh, bw)


def nearest_index(start: int, length: int, out: int) -> np.ndarray:
    """The source index of each of `out` samples over [start, start + length) (module doc)."""
    return nearest_rows(np.asarray([start]), np.asarray([length]), out)[0]


def nearest_rows(start, length, out: int, xp=np):
    """`nearest_index` of every row: (B, out) source indices of boxes starting at start (B,)
    of length (B,) samples; runs under NumPy and jax.numpy (the same float32 arithmetic)."""
    scale = xp.asarray(length).astype(xp.float32)[:, None] / xp.float32(out)
    idx = xp.floor(xp.arange(out, dtype=xp.float32)[None, :] * scale).astype(xp.int32)
    return xp.asarray(start)[:, None] + xp.minimum(idx, xp.asarray(length)[:, None] - 1)


def resize_nearest(
    a: np.ndarray, box: tuple[int, int, int, int], out_hw: tuple[int, int], flip: bool = False
) -> np.ndarray:
    """`a[y0:y0+h, x0:x0+w]` resized to out_hw by the nearest rule (then mirrored if flip);
    a trailing channel axis is carried."""
    y0, x0, h, w = box
    rows = nearest_index(y0, h, out_hw[0])
    cols = nearest_index(x0, w, out_hw[1])
    if flip:
        cols = cols[::-1]
    return a[rows[:, None], cols[None, :]]


def resize_dense(a: np.ndarray, plan: ResizePlan, interpolation: str, invalid: Any = None) -> np.ndarray:
    """A dense map (depth, flow: (H, W) or (H, W, C)) at the plan's geometry: "nearest" by the
    nearest rule, "linear" by `blend_linear` over the continuous box, positions clamped to the
    map's edges."""
    if interpolation == "nearest":
        return resize_nearest(a, plan.int_box, (plan.out_h, plan.out_w))
    ty = linear_taps(plan.box_y, plan.box_h, plan.out_h, 0, a.shape[0] - 1)
    tx = linear_taps(plan.box_x, plan.box_w, plan.out_w, 0, a.shape[1] - 1)
    return blend_linear(lambda ys, xs: a[ys, xs], ty, tx, invalid)[0]


def linear_taps(start, length, out: int, lo, hi, xp=np):
    """One axis of the linear rule: each of `out` samples over the continuous [start, start +
    length) sits at ``start + (o + 0.5) · length / out - 0.5`` (pixel centres), clamped to the
    source samples [lo, hi]; returns its two source indices and the weight of the second.
    start, length, lo, hi: numbers, or (B, 1) arrays (each row its own box)."""
    pos = start + (xp.arange(out) + 0.5) * (length / out) - 0.5
    pos = xp.clip(pos, lo, hi)
    i0 = xp.floor(pos).astype(xp.int64)
    return i0, xp.minimum(i0 + 1, hi).astype(xp.int64), pos - i0


def blend_linear(take, ty, tx, invalid: Any = None, xp=np):
    """The linear rule (dense maps declared ``interpolation="linear"``): bilinear in float64
    over the four taps (`linear_taps` of each axis: ty (B, out_h) or (out_h,), tx likewise),
    where a source sample equal to `invalid` gets no weight and the others' weights are
    renormalised; an output whose taps are all invalid is `invalid`. `take(ys, xs)` gives
    the source samples (B, out_h, out_w, *C) at index grids ys (B, out_h, 1), xs (B, 1,
    out_w). Returns float32 (B, out_h, out_w, *C); runs under NumPy and jax.numpy."""
    (ylo, yhi, fy), (xlo, xhi, fx) = ([xp.reshape(v, (-1, v.shape[-1])) for v in t] for t in (ty, tx))
    total = weight = 0.0
    for ys, wy in ((ylo, 1 - fy), (yhi, fy)):
        for xs, wx in ((xlo, 1 - fx), (xhi, fx)):
            v = take(ys[:, :, None], xs[:, None, :])
            ok = xp.ones(v.shape, bool) if invalid is None else (v != invalid)
            extra = (None,) * (v.ndim - 3)
            wgt = (wy[:, :, None] * wx[:, None, :])[(...,) + extra] * ok
            total = total + wgt * xp.where(ok, v.astype(xp.float64), 0)
            weight = weight + wgt
    out = xp.where(weight > 0, total / xp.where(weight > 0, weight, 1), 0)
    if invalid is not None:
        out = xp.where(weight == 0, invalid, out)
    return out.astype(xp.float32)


WEIGHT_BITS = 14  # the served linear rule's weights are multiples of 2^-14 (module doc)


def crop_taps(start, length, out: int, xp=np):
    """One axis of the served linear rule, in integers: output o of `out` samples over the
    integer crop [start, start + length) sits at p = ((2o + 1)·length − out) / (2·out) past
    start (pixel centres), clamped to [0, length − 1]; its taps are start + ⌊p⌋ and the next
    (clamped), the second weighing round-half-up((p − ⌊p⌋)·2^14) / 2^14. start, length: (B,)
    integer arrays. Returns (i0, i1, weight of i1), each (B, out) (int64, int64, float64)."""
    n = xp.asarray(length).astype(xp.int64).reshape(-1, 1)
    den = 2 * out
    num = xp.maximum((2 * xp.arange(out, dtype=xp.int64) + 1)[None, :] * n - out, 0)  # p · den, clamped at 0
    i0 = num // den
    q = ((num % den) * (1 << WEIGHT_BITS) + out) // den  # the weight · 2^14, rounded half up
    top = i0 >= n - 1
    i0, q = xp.where(top, n - 1, i0), xp.where(top, 0, q)
    s0 = xp.asarray(start).astype(xp.int64).reshape(-1, 1)
    return s0 + i0, s0 + xp.minimum(i0 + 1, n - 1), q.astype(xp.float64) / (1 << WEIGHT_BITS)


def serve_linear_batch(take, crops, out_hw: tuple[int, int], flips=None, invalid: Any = None, xp=np):
    """Dense maps served by the linear rule (module doc): row r's integer crop crops[r] (y0,
    x0, h, w) resized to out_hw by `blend_linear` over `crop_taps`, then mirrored where
    flips[r]. `take(ys, xs)`: as `blend_linear` takes it, in the record's pixels."""
    c = xp.asarray(crops).astype(xp.int64).reshape(-1, 4)
    ty = crop_taps(c[:, 0], c[:, 2], out_hw[0], xp)
    tx = crop_taps(c[:, 1], c[:, 3], out_hw[1], xp)
    out = blend_linear(take, ty, tx, invalid, xp)
    if flips is None:
        return out
    f = xp.asarray(flips, bool).reshape((-1,) + (1,) * (out.ndim - 1))
    return xp.where(f, out[:, :, ::-1], out)


def boxes_to_xyxy(boxes: np.ndarray, fmt: str) -> np.ndarray:
    """(n, 4) boxes in `fmt` (xyxy, xywh: corner and size, cxcywh: centre and size, yxyx:
    ymin, xmin, ymax, xmax) as float64 xyxy."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    if fmt == "yxyx":
        return b[:, [1, 0, 3, 2]]
    if fmt == "xywh":
        return np.concatenate([b[:, :2], b[:, :2] + b[:, 2:]], axis=1)
    if fmt == "cxcywh":
        return np.concatenate([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], axis=1)
    return b


def map_points(
    xy: np.ndarray, box: tuple[float, float, float, float], out_hw: tuple[int, int], flip: bool = False
) -> np.ndarray:
    """Points (..., 2) as (x, y) from source pixels into the output of `box` (y0, x0, h, w)
    resized to out_hw (then mirrored if flip); float64."""
    y0, x0, h, w = box
    p = np.asarray(xy, np.float64)
    x = (p[..., 0] - x0) * (out_hw[1] / w)
    y = (p[..., 1] - y0) * (out_hw[0] / h)
    if flip:
        x = out_hw[1] - x
    return np.stack([x, y], axis=-1)


def _map_boxes(
    xyxy: np.ndarray, box: tuple[float, float, float, float], out_hw: tuple[int, int], flip: bool
) -> np.ndarray:
    corners = map_points(xyxy.reshape(-1, 2, 2), box, out_hw, flip)
    lo, hi = np.minimum(corners[:, 0], corners[:, 1]), np.maximum(corners[:, 0], corners[:, 1])
    return np.concatenate([lo, hi], axis=1)  # a flip swaps x0 and x1


def stored_boxes(xyxy: np.ndarray, plan: ResizePlan) -> tuple[np.ndarray, np.ndarray]:
    """Source boxes at the conversion's geometry: (boxes clipped to the stored image, which
    of the input boxes kept: those with area left after the clip)."""
    b = _map_boxes(xyxy, (plan.box_y, plan.box_x, plan.box_h, plan.box_w), (plan.out_h, plan.out_w), False)
    b = np.clip(b, 0, [plan.out_w, plan.out_h, plan.out_w, plan.out_h])
    keep = (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])
    return b[keep], keep


def stored_keypoints(kpts: np.ndarray, plan: ResizePlan) -> np.ndarray:
    """(n, K, 3) keypoints (x, y, visibility) at the conversion's geometry: visibility 0 for a
    point outside the stored image."""
    return serve_keypoints(kpts, (plan.box_y, plan.box_x, plan.box_h, plan.box_w), (plan.out_h, plan.out_w))


def serve_mask(
    mask: np.ndarray,
    box: tuple[int, int, int, int],
    out_hw: tuple[int, int],
    flip: bool = False,
    place: tuple[int, int] | None = None,
    canvas_hw: tuple[int, int] | None = None,
    ignore: int = 255,
) -> np.ndarray:
    """A served mask: the record's mask in the integer crop `box`, resized to out_hw by the
    nearest rule, mirrored if flip, and (place, canvas_hw) put at `place` (top, left) of a
    canvas of `ignore` (the padding has no source pixel)."""
    out = resize_nearest(mask, box, out_hw, flip)
    if place is None:
        return out
    canvas = np.full(tuple(canvas_hw) + out.shape[2:], ignore, mask.dtype)
    t, left = place
    canvas[t : t + out_hw[0], left : left + out_hw[1]] = out
    return canvas


def serve_boxes(
    xyxy: np.ndarray,
    labels: np.ndarray,
    box: tuple[int, int, int, int],
    out_hw: tuple[int, int],
    flip: bool = False,
    *,
    max_boxes: int,
    min_size: float = 1.0,
    min_area: float = 1.0,
    min_visibility: float = 0.0,
) -> dict[str, np.ndarray]:
    """A record's xyxy boxes through a crop `box`, resize to out_hw and flip, clipped to the
    output; a box is dropped when a clipped side is under `min_size`, its clipped area under
    `min_area` (torchvision v2's SanitizeBoundingBoxes) or under `min_visibility` of its area
    before clipping. Returns `boxes` (max_boxes, 4) float32 (zeros past the kept ones),
    `boxes_valid` (max_boxes,) bool, `box_labels` (max_boxes,) int64 (-1 past them) and
    `boxes_count`: how many boxes the record had, before any cut. Kept boxes past max_boxes
    are cut (the first ones stay). One row of `serve_boxes_batch`."""
    b = np.asarray(xyxy, np.float64).reshape(1, -1, 4)
    lab = np.asarray(labels, np.int64).reshape(1, -1)
    got = serve_boxes_batch(
        b,
        [b.shape[1]],
        lab,
        [box],
        out_hw,
        [flip],
        max_boxes=max_boxes,
        min_size=min_size,
        min_area=min_area,
        min_visibility=min_visibility,
    )
    return {k: v[0] for k, v in got.items()}


def serve_boxes_batch(
    xyxy: np.ndarray,
    counts,
    labels: np.ndarray,
    boxes,
    out_hw: tuple[int, int],
    flips=None,
    *,
    max_boxes: int,
    min_size: float = 1.0,
    min_area: float = 1.0,
    min_visibility: float = 0.0,
    xp=np,
) -> dict[str, np.ndarray]:
    """`serve_boxes` over a batch, vectorised: row r's first counts[r] of `xyxy` (B, n, 4) and
    `labels` (B, n) through crop boxes[r] (y0, x0, h, w) and flips[r] (None: no flip), onto
    `out_hw` (h, w), or each row's own (B, 2) (a canvas row's valid extent). Returns `boxes`
    (B, max_boxes, 4) float32, `boxes_valid` (B, max_boxes), `box_labels` (B, max_boxes) int64
    and `boxes_count` (B,) int64. Runs under NumPy and jax.numpy (float64: in jit, inside
    ``jax.enable_x64``)."""
    cnt = xp.asarray(counts).astype(xp.int64)
    nb = cnt.shape[0]
    b = xp.asarray(xyxy).astype(xp.float64).reshape(nb, -1, 4)
    lab_in = xp.asarray(labels).astype(xp.int64).reshape(nb, -1)
    if b.shape[1] == 0:  # no row has a box: one empty column keeps the shapes below
        b, lab_in = xp.zeros((nb, 1, 4), xp.float64), xp.zeros((nb, 1), xp.int64)
    n = b.shape[1]
    crop = xp.asarray(boxes).astype(xp.float64).reshape(nb, 4)
    y0, x0, h, w = (crop[:, i, None] for i in range(4))
    oh, ow = _out_sides(out_hw, nb, xp)
    # map_points' arithmetic, per row: (x - x0) * (out_w / w); a flip mirrors x to out_w - x.
    xs = (b[..., 0::2] - x0[..., None]) * (ow / w)[..., None]
    ys = (b[..., 1::2] - y0[..., None]) * (oh / h)[..., None]
    if flips is not None:  # out_w - x, as (x0 + w - x) · out_w / w: no multiply-add to fuse
        mirrored = (x0[..., None] + w[..., None] - b[..., 0::2]) * (ow / w)[..., None]
        xs = xp.where(xp.asarray(flips, bool)[:, None, None], mirrored, xs)
    mapped = xp.stack([xs.min(-1), ys.min(-1), xs.max(-1), ys.max(-1)], axis=-1)  # a flip swaps x0, x1
    clipped = xp.clip(mapped, 0, xp.stack([ow, oh, ow, oh], -1))
    ws, hs = clipped[..., 2] - clipped[..., 0], clipped[..., 3] - clipped[..., 1]
    area = ws * hs
    before = (mapped[..., 2] - mapped[..., 0]) * (mapped[..., 3] - mapped[..., 1])
    keep = (xp.arange(n) < cnt[:, None]) & (ws >= min_size) & (hs >= min_size) & (area >= min_area)
    keep = keep & (area >= min_visibility * before)
    rank = xp.cumsum(keep, axis=1) - 1  # each kept box's place among its row's kept ones
    # Output place j of a row takes the box of rank j (a one-hot pick: no scatter, so it jits).
    pick = keep[:, :, None] & (rank[:, :, None] == xp.arange(max_boxes))  # (B, n, max_boxes)
    valid = pick.any(axis=1)
    src = (pick * xp.arange(n)[None, :, None]).sum(axis=1)  # the one picked column (0 where none)
    out = xp.where(valid[..., None], xp.take_along_axis(clipped, src[..., None], axis=1), 0)
    lab = xp.where(valid, xp.take_along_axis(lab_in, src, axis=1), -1)
    return {"boxes": out.astype(xp.float32), "boxes_valid": valid, "box_labels": lab, "boxes_count": cnt}


def _out_sides(out_hw, rows: int, xp=np):
    """(out_h, out_w), each (rows, 1) float64, of one (h, w) for every row or (rows, 2) sizes."""
    hw = xp.broadcast_to(xp.asarray(out_hw).astype(xp.float64).reshape(-1, 2), (rows, 2))
    return hw[:, :1], hw[:, 1:]


def serve_keypoints(
    kpts: np.ndarray,
    box: tuple[float, float, float, float],
    out_hw: tuple[int, int],
    flip: bool = False,
    flip_permutation: Any = None,
) -> np.ndarray:
    """(n, K, 3) keypoints (x, y, visibility) through a crop `box`, resize to out_hw and flip:
    float32, visibility 0 where a point falls outside [0, out_w) x [0, out_h); on a flip the K
    points are reordered by flip_permutation (point k takes point flip_permutation[k]). One row
    of `serve_keypoints_batch`."""
    k = np.asarray(kpts, np.float64)
    return serve_keypoints_batch(k[None], [box], out_hw, [flip], flip_permutation)[0]


def serve_keypoints_batch(
    kpts: np.ndarray,
    boxes,
    out_hw: tuple[int, int],
    flips=None,
    flip_permutation: Any = None,
    xp=np,
) -> np.ndarray:
    """`serve_keypoints` over a batch, vectorised: row r's keypoints `kpts[r]` (B, n, K, 3)
    through crop boxes[r] (y0, x0, h, w) and flips[r] (None: no flip), onto `out_hw` (h, w) or
    each row's own (B, 2). Returns (B, n, K, 3) float32. Runs under NumPy and jax.numpy
    (float64: in jit, inside ``jax.enable_x64``)."""
    k = xp.asarray(kpts).astype(xp.float64)
    crop = xp.asarray(boxes).astype(xp.float64).reshape(k.shape[0], 4)
    y0, x0, h, w = (crop[:, i, None, None] for i in range(4))
    oh, ow = (v[..., None] for v in _out_sides(out_hw, k.shape[0], xp))
    # map_points' arithmetic, per row: (x - x0) * (out_w / w)
    x = (k[..., 0] - x0) * (ow / w)
    y = (k[..., 1] - y0) * (oh / h)
    flip = xp.zeros(k.shape[0], bool) if flips is None else xp.asarray(flips, bool)
    # A keypoint is a pixel index, not an edge: torchvision mirrors it to out_w - 1 - x, here
    # (x0 + w - x - w / out_w) · out_w / w: no multiply-add for a compiler to fuse.
    x = xp.where(flip[:, None, None], (x0 + w - k[..., 0] - w / ow) * (ow / w), x)
    inside = (x >= 0) & (x < ow) & (y >= 0) & (y < oh)
    out = xp.stack([x, y, xp.where(inside, k[..., 2], 0)], axis=-1)
    if flip_permutation is not None:
        perm = np.asarray(flip_permutation)
        out = xp.where(flip[:, None, None, None], out[:, :, perm, :], out)
    return out.astype(xp.float32)

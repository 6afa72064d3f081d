"""Detection crops (``Augment(crop="bbox")``, issue 48): a crop window that keeps objects, SSD's
sampling (Liu et al. 2016, §2.2 "Data augmentation") with the arguments of DALI's
``fn.random_bbox_crop`` (https://docs.nvidia.com/deeplearning/dali/user-guide/docs/operations/
nvidia.dali.fn.random_bbox_crop.html). Pure NumPy, vectorised over records; the words come from
`order.random_bits` keyed by (seed, epoch, sample index, repeat), counters from ``BASE`` (past
every other draw's: the RRC's 0..40, the buckets' 48-49, NaFlex's 64, RandAugment and erasing's
0x10000 + 0x1000 r + local), so adding it moves no other draw.

The loop, for one record of H x W with object boxes B (xyxy, source pixels):

    for round t in 0 .. ROUNDS-1:
        option = options[(u_opt * len(options)) >> 32]    options: thresholds, then "no crop"
                                                          when allow_no_crop (DALI's sample options)
        if option is "no crop": return the whole image
        for attempt a in 0 .. num_attempts-1:
            sw, sh = scaling_lo + (scaling_hi - scaling_lo) * u / 2^32   (u: two words, float64)
            w, h = max(1, round(sw * W)), max(1, round(sh * H))          (round half to even)
            fail unless aspect_lo <= (w / W) / (h / H) <= aspect_hi      (DALI's relative aspect
                                                                          ratio: no input_shape)
            y0 = (u_y >> 16) * (H - h + 1) >> 16;  x0 likewise           (augment.py's placement)
            accept when some box b has metric(crop, b) >= option         (SSD: any object;
                                                                          DALI all_boxes_above_threshold=False)
    return the whole image                                            (no option found a crop)

metric: "iou" (intersection over union, DALI threshold_type="iou") or "overlap" (the
intersection over the box's area, DALI "overlap"; TensorFlow's ``min_object_covered``). Where
DALI resamples without bound (total_num_attempts=-1) this stops after ROUNDS options, so a
step's cost is fixed; a record without boxes is served whole. Boxes, masks and keypoints then
follow the crop through the ordinary serving (`rules/geometry.py`), SanitizeBoundingBoxes' drops
included (DALI prunes by box centre instead).

Counters of repeat r, round t: ``BASE + 0x10000 r + 0x1000 t`` for the option, ``+ 1 + 4 a + j``
(j: sw, sh, y, x) for attempt a (num_attempts <= MAX_ATTEMPTS keeps them inside the round's).
"""

from __future__ import annotations

import numpy as np

from tbljax._src.rules import order

__all__ = ["BASE", "MAX_ATTEMPTS", "METRICS", "ROUNDS", "crop_boxes", "metric", "pad_boxes"]

BASE = 0x20000000
ROUNDS = 10
MAX_ATTEMPTS = 1000
METRICS = ("iou", "overlap")
_REPEAT_STRIDE, _ROUND_STRIDE = 0x10000, 0x1000


def pad_boxes(boxes: list) -> tuple[np.ndarray, np.ndarray]:
    """Records' (n_i, 4) xyxy boxes → float64 (k, n, 4) zero-padded to the most, and counts."""
    counts = np.array([len(b) for b in boxes], np.int64)
    out = np.zeros((len(boxes), int(counts.max(initial=0)), 4), np.float64)
    for r, b in enumerate(boxes):
        out[r, : len(b)] = np.asarray(b, np.float64).reshape(-1, 4)
    return out, counts


def metric(crops: np.ndarray, boxes: np.ndarray, kind: str) -> np.ndarray:
    """`kind` ("iou" or "overlap") of crops (..., 4) (y0, x0, h, w) with boxes (..., 4) xyxy,
    broadcast; 0 for a box of no area."""
    y0, x0 = crops[..., 0].astype(np.float64), crops[..., 1].astype(np.float64)
    y1, x1 = y0 + crops[..., 2], x0 + crops[..., 3]
    iw = np.clip(np.minimum(x1, boxes[..., 2]) - np.maximum(x0, boxes[..., 0]), 0, None)
    ih = np.clip(np.minimum(y1, boxes[..., 3]) - np.maximum(y0, boxes[..., 1]), 0, None)
    inter = iw * ih
    area = np.clip(boxes[..., 2] - boxes[..., 0], 0, None) * np.clip(boxes[..., 3] - boxes[..., 1], 0, None)
    den = area if kind == "overlap" else area + (x1 - x0) * (y1 - y0) - inter
    return np.divide(inter, den, out=np.zeros_like(inter), where=(area > 0) & (den > 0))


def crop_boxes(
    indices,
    boxes: np.ndarray,
    counts: np.ndarray,
    heights,
    widths,
    *,
    seed: int,
    epoch: int,
    thresholds,
    metric_kind: str = "iou",
    scaling=(0.3, 1.0),
    aspect_ratio=(0.5, 2.0),
    num_attempts: int = 50,
    allow_no_crop: bool = True,
    repeat=0,
) -> np.ndarray:
    """int32 (k, 4) crop boxes (y0, x0, h, w) for samples `indices` (k,) of records of
    `heights` x `widths` (k,) whose object boxes are `boxes` (k, n, 4) xyxy, the first
    `counts[r]` of row r real (the module doc's loop).

    >>> b, c = pad_boxes([[[2.0, 2.0, 20.0, 20.0]]])
    >>> crop_boxes(np.arange(1), b, c, [32], [32], seed=0, epoch=0, thresholds=(0.5,)).shape
    (1, 4)
    """
    idx = np.asarray(indices, np.int64)
    k = len(idx)
    H = np.asarray(heights, np.int64).reshape(k, 1)
    W = np.asarray(widths, np.int64).reshape(k, 1)
    options = np.asarray(list(thresholds) + ([np.inf] if allow_no_crop else []), np.float64)  # inf: no crop
    real = np.arange(boxes.shape[1]) < np.asarray(counts)[:, None]  # (k, n)
    rep = np.broadcast_to(np.asarray(repeat, np.uint32), (k,)).astype(np.uint32)[:, None, None]
    whole = np.concatenate([np.zeros((k, 2), np.int64), H, W], axis=1)
    out = whole.copy()
    todo = np.ones(k, bool)  # rows not decided yet
    for t in range(ROUNDS):
        rows = np.flatnonzero(todo)
        if not len(rows):
            break
        base = np.uint32(BASE + _ROUND_STRIDE * t) + rep[rows] * np.uint32(_REPEAT_STRIDE)  # (m, 1, 1)
        u_opt = order.random_bits(idx[rows], base[:, 0, 0], seed, epoch)
        opt = options[(u_opt.astype(np.uint64) * len(options)) >> 32]
        no_crop = np.isinf(opt)
        todo[rows[no_crop]] = False  # the whole image (already in `out`)
        rows, opt, base = rows[~no_crop], opt[~no_crop], base[~no_crop]
        if not len(rows):
            continue
        j = np.arange(4 * num_attempts, dtype=np.uint32).reshape(num_attempts, 4) + np.uint32(1)
        u = order.random_bits(idx[rows][:, None, None], base + j, seed, epoch)  # (m, A, 4)
        lo, hi = scaling
        sw = lo + (hi - lo) * (u[..., 0] / 2.0**32)
        sh = lo + (hi - lo) * (u[..., 1] / 2.0**32)
        h_, w_ = H[rows], W[rows]  # (m, 1)
        w = np.clip(np.rint(sw * w_), 1, w_).astype(np.int64)
        h = np.clip(np.rint(sh * h_), 1, h_).astype(np.int64)
        ratio = (w * h_) / (h * w_)  # (w / W) / (h / H)
        y0 = ((u[..., 2] >> 16).astype(np.int64) * (h_ - h + 1)) >> 16
        x0 = ((u[..., 3] >> 16).astype(np.int64) * (w_ - w + 1)) >> 16
        crops = np.stack([y0, x0, h, w], axis=-1)  # (m, A, 4)
        m = metric(crops[:, :, None, :], boxes[rows][:, None, :, :], metric_kind)  # (m, A, n)
        hit = ((m >= opt[:, None, None]) & real[rows][:, None, :]).any(axis=2)
        ok = hit & (ratio >= aspect_ratio[0]) & (ratio <= aspect_ratio[1])
        found = ok.any(axis=1)
        first = np.argmax(ok, axis=1)
        out[rows[found]] = crops[found, first[found]]
        todo[rows[found]] = False
    return out.astype(np.int32)

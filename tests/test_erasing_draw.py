"""Random erasing's per-row decisions (every word of a row drawn in one hash call) equal timm's
procedure drawn one word at a time at the documented counters."""

from __future__ import annotations

import numpy as np
import pytest

import tbljax
from tbljax._src.rules import erasing, order, quantiles, randaug


def _word(index, counter, seed, epoch) -> int:
    return int(order.random_bits(np.array([index], np.int64), np.array([counter], np.uint32), seed, epoch)[0])


def _timm_boxes(er, index, h, w, seed, epoch, repeat, view):
    """timm's RandomErasing._erase for one sample, each word drawn alone at its counter."""
    base = 0x10000 + 0x1000 * repeat + randaug.VIEW_STRIDE * view
    frac_t, r_t, inv_r_t = quantiles.area_aspect_tables((er.min_area, er.max_area), (er.min_aspect, er.max_aspect))
    apply, count_word, key = (_word(index, base + c, seed, epoch) for c in (0x100, 0x101, 0x102))
    count = er.min_count + (((count_word >> 16) * (er.max_count - er.min_count + 1)) >> 16)
    side = np.float32(np.sqrt(h * w / count))
    boxes = np.zeros((er.max_count, 4), np.int32)
    if (apply >> 8) >= round(er.p * (1 << 24)):
        return boxes, key
    for box in range(count):
        for attempt in range(10):
            u = [_word(index, base + 0x200 + 4 * (10 * box + attempt) + t, seed, epoch) for t in range(4)]
            s = side * frac_t[u[0] >> 20]
            bh, bw = int(np.rint(s * r_t[u[1] >> 20])), int(np.rint(s * inv_r_t[u[1] >> 20]))
            if 1 <= bh < h and 1 <= bw < w:
                boxes[box] = (((u[2] >> 16) * (h - bh + 1)) >> 16, ((u[3] >> 16) * (w - bw + 1)) >> 16, bh, bw)
                break
    return boxes, key


@pytest.mark.parametrize(
    "er, hw, repeat, view",
    [
        (erasing.RandomErasing(0.25), (224, 224), 0, 0),
        (erasing.RandomErasing(1.0, mode="rand", max_count=3, max_area=0.9), (9, 30), 2, 1),
        (erasing.RandomErasing(0.7, min_count=2, max_count=3, min_aspect=0.05), (3, 3), 1, 0),
    ],
)
def test_erasing_boxes_equal_timms_drawn_word_by_word(er, hw, repeat, view):
    idx = np.r_[0, 1, 5, 77, 2**33 + 9, 12345, 100:110]
    seed, epoch = 2**40 + 3, 6
    boxes, keys = tbljax.augment.decide_erasing(
        er, idx, height=hw[0], width=hw[1], seed=seed, epoch=epoch, repeat=repeat, view=view
    )
    for b, i in enumerate(idx.tolist()):
        want, key = _timm_boxes(er, i, *hw, seed, epoch, repeat, view)
        assert boxes[b].tolist() == want.tolist() and int(keys[b]) == key

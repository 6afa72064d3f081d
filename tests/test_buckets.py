"""Aspect-ratio bucket rules (`_src/rules/buckets.py`) against independent references: SDXL's
published bucket table, nearest aspect by `math.log` and by exact fractions, boxes checked
against the record and the bucket's aspect, and the epoch schedule checked record by record."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tbljax._src.rules import buckets
from tbljax._src.rules.buckets import Buckets


def test_auto_sizes_are_sdxl_at_1024_squared_and_scale_to_the_budget():
    sdxl = buckets.auto_sizes(1024 * 1024)
    # SDXL's table (Podell et al. 2023): 41 sizes, each ~1024² pixels, multiples of 64.
    assert len(sdxl) == 41 and (512, 2048) in sdxl and (2048, 512) in sdxl and (832, 1216) in sdxl
    for m, pixels in ((64, 512 * 512), (32, 256 * 256), (8, 768 * 768)):
        sizes = buckets.bucket_sizes(Buckets(multiple=m), pixels)
        assert (sizes % m == 0).all()
        area = sizes[:, 0].astype(float) * sizes[:, 1]
        assert np.abs(area / pixels - 1).max() < 0.25
        aspect = sizes[:, 1] / sizes[:, 0]
        assert (np.diff(aspect) > 0).all()  # sorted, no two of one aspect
    with pytest.raises(ValueError, match="pixel budget"):
        buckets.bucket_sizes(Buckets())


def test_buckets_validated_naming_the_value():
    with pytest.raises(ValueError, match="crop must be one of"):
        Buckets(crop="left")
    with pytest.raises(ValueError, match=r"sizes must be .* got \[\(0, 4\)\]"):
        Buckets(sizes=[(0, 4)])
    with pytest.raises(ValueError, match=r"buckets \(32, 64\) and \(64, 128\) have the same aspect ratio"):
        Buckets(sizes=[(64, 128), (32, 64)])
    with pytest.raises(ValueError, match="multiple must be"):
        Buckets(multiple=0)
    with pytest.raises(ValueError, match="sizes must be"):
        Buckets(sizes="square")


def test_assign_is_the_nearest_aspect_in_log_space():
    sizes = buckets.bucket_sizes(Buckets(), 512 * 512)
    rng = np.random.default_rng(0)
    h, w = rng.integers(1, 5000, 20_000), rng.integers(1, 5000, 20_000)
    got = buckets.assign(h, w, sizes)
    dist = np.abs(np.log(w / h)[:, None] - np.log(sizes[:, 1] / sizes[:, 0])[None, :])
    best = np.sort(dist, axis=1)
    clear = best[:, 1] - best[:, 0] > 1e-9  # not a near tie
    np.testing.assert_array_equal(got[clear], np.argmin(dist, axis=1)[clear])
    assert clear.mean() > 0.99


def test_assign_breaks_an_exact_tie_to_the_narrower_bucket():
    sizes = buckets.bucket_sizes(Buckets(sizes=[(100, 400), (100, 100)]))  # aspects 1 and 4
    # 100x200: log 2 is exactly midway between log 1 and log 4.
    assert Fraction(200, 100) ** 2 == Fraction(1) * Fraction(4)
    assert buckets.assign(np.array([100, 100, 100]), np.array([199, 200, 201]), sizes).tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="record 1: width"):
        buckets.assign(np.array([100, 100]), np.array([100, 0]), sizes)


def test_cover_boxes_cover_the_bucket_inside_the_record():
    sizes = buckets.bucket_sizes(Buckets(), 256 * 256)
    rng = np.random.default_rng(1)
    n = 5000
    h, w = rng.integers(1, 3000, n), rng.integers(1, 3000, n)
    b = buckets.assign(h, w, sizes)
    for crop in ("center", "random"):
        box = buckets.cover_boxes(np.arange(n), h, w, b, sizes, crop=crop, seed=5, epoch=0).astype(np.int64)
        y0, x0, bh, bw = box.T
        assert (y0 >= 0).all() and (x0 >= 0).all() and (y0 + bh <= h).all() and (x0 + bw <= w).all()
        assert ((bh == h) | (bw == w)).all()  # the largest box: one side whole
        # Its aspect is the bucket's up to rounding one side to a pixel (or a 1-pixel floor).
        sh, sw = sizes[b, 0], sizes[b, 1]
        near = (np.abs(bw - bh * sw / sh) <= 0.5 + 1e-9) | (np.abs(bh - bw * sh / sw) <= 0.5 + 1e-9)
        assert near[(bh > 1) & (bw > 1)].all()
        if crop == "center":
            assert (np.abs(2 * y0 + bh - h) <= 1).all() and (np.abs(2 * x0 + bw - w) <= 1).all()
    tall, narrow, zero = np.full(8, 1000), np.full(8, 300), np.zeros(8, np.int8)
    square = np.array([[100, 100]])

    def record_7(epoch):
        return buckets.cover_boxes(np.array([7]), tall, narrow, zero, square, crop="random", seed=0, epoch=epoch)

    one = record_7(0)
    placements = {int(record_7(e)[0, 0]) for e in range(8)}
    assert one[0, 1:].tolist() == [0, 300, 300] and len(placements) > 1


def _check_epoch(s, bucket, g, drop):
    counts = np.bincount(bucket)
    seen = s.indices[s.indices >= 0]
    assert len(seen) == len(np.unique(seen))  # nobody twice
    for k, rows in zip(s.bucket, s.indices):
        real = rows[rows >= 0]
        assert (bucket[real] == k).all() and (rows[len(real) :] == -1).all()
    if drop:
        assert (s.indices >= 0).all() and len(seen) == (counts // g * g).sum()
    else:
        np.testing.assert_array_equal(np.sort(seen), np.arange(len(bucket)))
        assert len(s.bucket) == (-(-counts // g)).sum()


@pytest.mark.parametrize("drop", [False, True])
def test_epoch_schedule_one_bucket_per_step_every_record_once(drop):
    rng = np.random.default_rng(2)
    bucket = rng.integers(0, 7, 3001).astype(np.int8)
    s = buckets.epoch_schedule(bucket, 32, seed=11, epoch=3, drop_remainder=drop)
    _check_epoch(s, bucket, 32, drop)
    unshuffled = buckets.epoch_schedule(bucket, 32, seed=11, epoch=3, drop_remainder=drop, shuffle=False)
    _check_epoch(unshuffled, bucket, 32, drop)
    assert (np.diff(unshuffled.bucket) >= 0).all()


def test_epoch_schedule_same_on_every_host_and_differs_across_epochs():
    rng = np.random.default_rng(3)
    bucket = rng.integers(0, 5, 2000)
    g, hosts = 16, 4
    full = buckets.epoch_schedule(bucket, g, seed=9, epoch=1, drop_remainder=False)
    # Each simulated host computes it from its own copy of the table (another dtype), takes its rows.
    rows = []
    for p in range(hosts):
        mine = buckets.epoch_schedule(
            bucket.astype([np.int8, np.int16, np.int32, np.uint8][p]).copy(), g, seed=9, epoch=1, drop_remainder=False
        )
        np.testing.assert_array_equal(mine.bucket, full.bucket)
        rows.append(mine.indices[:, p * g // hosts : (p + 1) * g // hosts])
    np.testing.assert_array_equal(np.concatenate(rows, axis=1), full.indices)
    other = buckets.epoch_schedule(bucket, g, seed=9, epoch=2, drop_remainder=False)
    assert not np.array_equal(other.indices, full.indices) and not np.array_equal(other.bucket, full.bucket)


def test_epoch_schedule_resumes_at_a_step():
    bucket = np.random.default_rng(4).integers(0, 3, 500)
    full = buckets.epoch_schedule(bucket, 8, seed=2, epoch=0, drop_remainder=True)
    for start in (0, 1, 17, len(full.bucket)):
        tail = buckets.epoch_schedule(bucket, 8, seed=2, epoch=0, drop_remainder=True, start=start)
        np.testing.assert_array_equal(tail.bucket, full.bucket[start:])
        np.testing.assert_array_equal(tail.indices, full.indices[start:])
    with pytest.raises(ValueError, match="start"):
        buckets.epoch_schedule(bucket, 8, seed=2, epoch=0, drop_remainder=True, start=-1)


def test_epoch_schedule_of_imagenet_size_is_fast():
    import time

    bucket = np.random.default_rng(5).integers(0, 23, 1_281_167).astype(np.int8)
    t = time.perf_counter()
    s = buckets.epoch_schedule(bucket, 1024, seed=0, epoch=0, drop_remainder=False)
    took = time.perf_counter() - t
    assert (s.indices >= 0).sum() == len(bucket)
    assert took < 3.0, f"{took:.2f} s"  # ~0.3 s here; generous for a shared machine

"""rules/geometry.py, the NumPy reference of how masks, boxes and keypoints follow the image,
against torchvision v2's transforms on `tv_tensors` (the real package) and a float64 transform
written out here; the conversion's geometry against the C++ core's own output sizes."""

from __future__ import annotations

import numpy as np
import pytest

from tbljax import _core
from tbljax._src.rules import geometry

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tv():
    """torchvision's v2 functional ops. Its PyPI build's compiled ops do not load beside a
    CPU-only torch; the two schemas it registers at import are defined first (see
    ../shared/README.md), its v2 transforms on masks and boxes being Python."""
    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        tv.lib = lib  # kept alive: the schemas go with it
    except RuntimeError:
        pass  # defined already (torchvision's own ops, or an earlier test)
    tvt = pytest.importorskip("torchvision.tv_tensors")
    F = pytest.importorskip("torchvision.transforms.v2.functional")
    return tvt, F


@pytest.mark.parametrize("mode", ["center_crop", "squash", "max_side", "shorter_side"])
def test_resize_plan_sizes_are_the_cores(mode):
    rng = np.random.default_rng(1)
    for _ in range(40):
        h, w, size = int(rng.integers(1, 90)), int(rng.integers(1, 90)), int(rng.integers(1, 70))
        cap = int(rng.integers(size, 200)) if mode == "shorter_side" and rng.random() < 0.5 else 0
        plan = geometry.resize_plan(h, w, size, mode, cap)
        got = _core.resize(np.zeros((h, w, 3), np.uint8), size, mode, cap)
        assert (plan.out_h, plan.out_w) == got.shape[:2], (h, w, size, mode, cap)


def _random_box(rng, h, w):
    bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
    return int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw


def test_nearest_rule_is_torchvisions_and_the_documented_float32_rule(tv):
    tvt, F = tv
    rng = np.random.default_rng(2)
    for _ in range(200):
        h, w = int(rng.integers(1, 60)), int(rng.integers(1, 60))
        mask = rng.integers(0, 6, (h, w), dtype=np.uint8)
        box = _random_box(rng, h, w)
        out = int(rng.integers(1, 90)), int(rng.integers(1, 90))
        flip = bool(rng.integers(2))
        ours = geometry.serve_mask(mask, box, out, flip)
        theirs = F.resized_crop(tvt.Mask(torch.from_numpy(mask)), *box, list(out))
        if flip:
            theirs = F.horizontal_flip(theirs)
        np.testing.assert_array_equal(ours, theirs.numpy())
        # The rule stated in the module doc, written out here in float32.
        y0, x0, bh, bw = box
        rows = y0 + np.minimum(
            np.floor(np.arange(out[0], dtype=np.float32) * (np.float32(bh) / np.float32(out[0]))).astype(int), bh - 1
        )
        cols = x0 + np.minimum(
            np.floor(np.arange(out[1], dtype=np.float32) * (np.float32(bw) / np.float32(out[1]))).astype(int), bw - 1
        )
        want = mask[np.ix_(rows, cols[::-1] if flip else cols)]
        np.testing.assert_array_equal(ours, want)
        assert set(np.unique(ours)) <= set(np.unique(mask))  # labels are never blended


def test_float32_rule_differs_from_exact_floor_where_torch_does(tv):
    tvt, F = tv
    m = np.array([[3, 7]], np.uint8)
    theirs = F.resize(tvt.Mask(torch.from_numpy(m)), [1, 82]).numpy()[0]
    assert theirs[41] == 3 and (41 * 2) // 82 == 1  # torch's float32 product rounds 41 * (2/82) down
    np.testing.assert_array_equal(geometry.nearest_index(0, 2, 82), (theirs == 7).astype(int))


def test_mask_padding_is_ignore():
    mask = np.arange(12, dtype=np.uint8).reshape(3, 4)
    out = geometry.serve_mask(mask, (0, 0, 3, 4), (3, 4), place=(1, 2), canvas_hw=(5, 7), ignore=255)
    assert out.shape == (5, 7)
    np.testing.assert_array_equal(out[1:4, 2:6], mask)
    assert (out[0] == 255).all() and (out[:, :2] == 255).all() and (out[4] == 255).all()


def _float64_boxes(b, box, out, flip):
    """The analytic transform, written independently: crop, scale, mirror."""
    y0, x0, h, w = box
    sx, sy = out[1] / w, out[0] / h
    x_a, x_b = (b[:, 0] - x0) * sx, (b[:, 2] - x0) * sx
    if flip:
        x_a, x_b = out[1] - x_b, out[1] - x_a
    return np.stack([x_a, (b[:, 1] - y0) * sy, x_b, (b[:, 3] - y0) * sy], axis=1)


def test_boxes_match_float64_and_torchvision_clip_and_drop(tv):
    tvt, F = tv
    from torchvision.transforms import v2

    rng = np.random.default_rng(3)
    for _ in range(150):
        h, w = int(rng.integers(20, 300)), int(rng.integers(20, 300))
        n = int(rng.integers(0, 12))
        xy = rng.uniform(0, [w, h], (n, 2))
        wh = rng.uniform(0.2, 0.6, (n, 2)) * [w, h]
        b = np.concatenate([xy, np.minimum(xy + wh, [w, h])], axis=1)
        labels = np.arange(n)
        box = _random_box(rng, h, w)
        out = int(rng.integers(8, 200)), int(rng.integers(8, 200))
        flip = bool(rng.integers(2))
        got = geometry.serve_boxes(b, labels, box, out, flip, max_boxes=16)
        assert got["boxes_count"] == n
        # torchvision: crop + resize, flip, clamp, SanitizeBoundingBoxes (min_size 1, min_area 1).
        t = tvt.BoundingBoxes(torch.from_numpy(b), format="XYXY", canvas_size=(h, w), dtype=torch.float64)
        t = F.resized_crop(t, *box, list(out))
        if flip:
            t = F.horizontal_flip(t)
        t = F.clamp_bounding_boxes(t)
        kept = v2.SanitizeBoundingBoxes()({"boxes": t, "labels": torch.from_numpy(labels)})
        want = kept["boxes"].as_subclass(torch.Tensor).numpy()
        k = int(got["boxes_valid"].sum())
        assert k == want.shape[0]
        np.testing.assert_allclose(got["boxes"][:k], want, atol=1e-4)
        np.testing.assert_array_equal(got["box_labels"][:k], kept["labels"].numpy())
        assert (got["box_labels"][k:] == -1).all() and not got["boxes"][k:].any()
        # Boxes the clip leaves alone against the float64 transform written here (labels are
        # the boxes' own indices, so a kept box names its input).
        ref = _float64_boxes(b, box, out, flip)
        idx = got["box_labels"][:k]
        whole = (ref[idx, 0] >= 0) & (ref[idx, 1] >= 0) & (ref[idx, 2] <= out[1]) & (ref[idx, 3] <= out[0])
        np.testing.assert_allclose(got["boxes"][:k][whole], ref[idx][whole], atol=1e-4)


def test_min_visibility_and_max_boxes():
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [2, 2, 4, 4]], np.float64)
    got = geometry.serve_boxes(b, [1, 2, 3], (0, 0, 10, 10), (10, 10), max_boxes=2, min_visibility=0.6)
    # box 2 keeps 50% of its area: dropped; boxes 1 and 3 stay.
    np.testing.assert_array_equal(got["box_labels"], [1, 3])
    assert got["boxes_count"] == 3 and got["boxes_valid"].all()
    got = geometry.serve_boxes(b, [1, 2, 3], (0, 0, 10, 10), (10, 10), max_boxes=1)
    np.testing.assert_array_equal(got["box_labels"], [1])  # cut at max_boxes, count before the cut
    assert got["boxes_count"] == 3


def test_box_follows_its_rasterized_mask():
    """A box drawn into a mask, both transformed: the mask and the box agree (IoU >= 0.98 for
    boxes of 200 source pixels a side or more: the nearest rule moves an edge by under one)."""
    rng = np.random.default_rng(4)
    checked = 0
    for _ in range(100):
        h, w = int(rng.integers(300, 700)), int(rng.integers(300, 700))
        x0, y0 = int(rng.integers(0, w // 3)), int(rng.integers(0, h // 3))
        x1, y1 = int(rng.integers(x0 + w // 3, w + 1)), int(rng.integers(y0 + h // 3, h + 1))
        mask = np.zeros((h, w), np.uint8)
        mask[y0:y1, x0:x1] = 1
        bh, bw = int(rng.integers(3 * h // 4, h + 1)), int(rng.integers(3 * w // 4, w + 1))
        box = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw
        out = int(rng.integers(256, 512)), int(rng.integers(256, 512))
        flip = bool(rng.integers(2))
        m = geometry.serve_mask(mask, box, out, flip)
        got = geometry.serve_boxes(np.array([[x0, y0, x1, y1]]), [0], box, out, flip, max_boxes=1)
        ys, xs = np.nonzero(m)
        if not got["boxes_valid"][0] or ys.size == 0:
            continue
        bx = got["boxes"][0]
        scale = max(1.0, out[0] / box[2], out[1] / box[3])  # output pixels per source pixel
        if min(bx[2] - bx[0], bx[3] - bx[1]) < 200 * scale:
            continue
        checked += 1
        cy, cx = np.mgrid[: out[0], : out[1]] + 0.5  # output pixels whose centre is in the box
        raster = (cx >= bx[0]) & (cx < bx[2]) & (cy >= bx[1]) & (cy < bx[3])
        iou = (raster & (m == 1)).sum() / (raster | (m == 1)).sum()
        assert iou >= 0.98, iou
    assert checked >= 20


def test_keypoints_match_torchvision(tv):
    tvt, F = tv
    rng = np.random.default_rng(5)
    perm = [1, 0, 2, 4, 3]
    for _ in range(50):
        h, w = int(rng.integers(20, 200)), int(rng.integers(20, 200))
        k = np.concatenate([rng.uniform(0, [w, h], (3, 5, 2)), np.full((3, 5, 1), 2.0)], axis=-1)
        box = _random_box(rng, h, w)
        out = int(rng.integers(8, 100)), int(rng.integers(8, 100))
        flip = bool(rng.integers(2))
        got = geometry.serve_keypoints(k, box, out, flip, perm)
        t = tvt.KeyPoints(torch.from_numpy(k[..., :2].copy()), canvas_size=(h, w))
        t = F.resized_crop(t, *box, list(out))
        if flip:
            t = F.horizontal_flip(t)
        want = t.as_subclass(torch.Tensor).numpy()
        if flip:
            want = want[:, perm]
        np.testing.assert_allclose(got[..., :2], want, atol=1e-4)
        inside = (want[..., 0] >= 0) & (want[..., 0] < out[1]) & (want[..., 1] >= 0) & (want[..., 1] < out[0])
        np.testing.assert_array_equal(got[..., 2], np.where(inside, 2.0, 0.0))


def test_box_formats():
    xyxy = np.array([[10.0, 20.0, 30.0, 60.0]])
    np.testing.assert_array_equal(geometry.boxes_to_xyxy([[10, 20, 20, 40]], "xywh"), xyxy)
    np.testing.assert_array_equal(geometry.boxes_to_xyxy([[20, 40, 20, 40]], "cxcywh"), xyxy)


def test_linear_dense_map_keeps_invalid_out():
    depth = np.array([[1.0, 0.0], [3.0, 5.0]], np.float32)  # 0: invalid
    plan = geometry.resize_plan(2, 2, 4, "squash")
    out = geometry.resize_dense(depth, plan, "linear", invalid=0)
    assert out[0, 3] == 0  # its only tap is the invalid sample: invalid
    rest = np.delete(out.reshape(-1), 3)
    assert rest.min() >= 1.0 and rest.max() <= 5.0  # the invalid 0 never pulls a value down
    np.testing.assert_allclose(out[0, 0], 1.0)
    np.testing.assert_allclose(out[3, 3], 5.0)


def test_keypoints_batch_rows_match_torchvision(tv):
    # serve_keypoints_batch: each row its own crop and flip, one output size (a loader's step).
    tvt, F = tv
    rng = np.random.default_rng(6)
    perm, out, rows = [1, 0, 2], (24, 40), 20
    sides = rng.integers(20, 200, (rows, 2))
    k = np.concatenate([rng.uniform(0, sides[:, None, None, ::-1], (rows, 3, 3, 2)), np.ones((rows, 3, 3, 1))], -1)
    boxes = [_random_box(rng, int(h), int(w)) for h, w in sides]
    flips = rng.integers(0, 2, rows).astype(bool)
    got = geometry.serve_keypoints_batch(k, boxes, out, flips, perm)
    assert got.shape == k.shape and got.dtype == np.float32
    for r, ((h, w), box, flip) in enumerate(zip(sides, boxes, flips)):
        t = F.resized_crop(tvt.KeyPoints(torch.from_numpy(k[r, ..., :2].copy()), canvas_size=(h, w)), *box, list(out))
        want = (F.horizontal_flip(t) if flip else t).as_subclass(torch.Tensor).numpy()
        want = want[:, perm] if flip else want
        np.testing.assert_allclose(got[r, ..., :2], want, atol=1e-4)
        inside = (want[..., 0] >= 0) & (want[..., 0] < out[1]) & (want[..., 1] >= 0) & (want[..., 1] < out[0])
        np.testing.assert_array_equal(got[r, ..., 2], inside)

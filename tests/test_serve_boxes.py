"""`_core.serve_boxes`, the host loader's boxes stage (issue 48), against the rule it implements,
`rules/geometry.serve_boxes_batch` (itself held to torchvision v2 in tests/test_geometry.py):
the same bytes over random boxes half outside their crops, flips, per-row output sizes (canvas
extents), min_size / min_area / min_visibility drops, the max_boxes cut and rows of fewer boxes;
and `GeometricServing` on a step's row range without records."""

import numpy as np
import pytest

import tbljax
from tbljax import _core
from tbljax._src.engine.geometric_serving import GeometricServing
from tbljax._src.engine.plan import RowsDrawn
from tbljax._src.rules import geometry


def native(xyxy, counts, labels, crops, out_hw, flips, max_boxes, **rules):
    b = len(counts)
    boxes, valid = np.zeros((b, max_boxes, 4), np.float32), np.zeros((b, max_boxes), bool)
    lab = np.zeros((b, max_boxes), np.int32)
    sides = np.ascontiguousarray(np.broadcast_to(np.asarray(out_hw, np.float64).reshape(-1, 2), (b, 2)))
    flip = None if flips is None else np.asarray(flips, np.uint8)
    _core.serve_boxes(xyxy, counts, labels, crops, sides, flip, *rules.values(), boxes, valid, lab)
    return boxes, valid, lab


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("per_row_sides", [False, True])
def test_serve_boxes_is_the_reference_rule(seed, per_row_sides):
    rng = np.random.default_rng(seed)
    b, n, m = 16, 40, [40, 7, 0, 64][seed]
    x, y = rng.uniform(-60, 500, (b, n)), rng.uniform(-60, 400, (b, n))
    w, h = rng.uniform(0, 200, (b, n)), rng.uniform(0, 200, (b, n))
    xyxy = np.stack([x, y, x + w, y + h], -1)
    xyxy[0, :3] = [[10, 10, 10, 50], [5, 5, 6, 6], [20, 30, 20.5, 90]]  # empty, 1 px, thinner than min_size
    counts = rng.integers(0, n + 1, b)
    counts[1] = n
    labels = rng.integers(-5, 1000, (b, n))
    crops = np.stack(
        [rng.integers(0, 200, b), rng.integers(0, 300, b), rng.integers(8, 300, b), rng.integers(8, 400, b)], 1
    )
    crops = crops.astype(np.float64)
    out_hw = rng.integers(16, 300, (b, 2)) if per_row_sides else (224, 320)
    flips = rng.random(b) < 0.5
    rules = dict(min_size=[1.0, 0.5, 2.0, 1.0][seed], min_area=[1.0, 0.0, 10.0, 4.0][seed])
    rules["min_visibility"] = [0.0, 0.3, 0.5, 1.0][seed]
    want = geometry.serve_boxes_batch(xyxy, counts, labels, crops, out_hw, flips, max_boxes=m, **rules)
    got = native(xyxy, counts, labels, crops, out_hw, flips, m, **rules)
    assert want["boxes_valid"].sum() > 0 or m == 0
    assert got[0].tobytes() == want["boxes"].tobytes()
    np.testing.assert_array_equal(got[1], want["boxes_valid"])
    np.testing.assert_array_equal(got[2], want["box_labels"])


def test_serve_boxes_by_hand():
    # A 100x200 crop at (y0, x0) = (10, 20) onto 50x100, flipped: x' = 100 - (x - 20) / 2; the last box
    # maps to x in [-90, -5], wholly outside: dropped.
    xyxy = np.array([[[20, 10, 60, 30], [0, 0, 30, 12], [230, 0, 400, 400]]], np.float64)
    got = native(
        xyxy,
        np.array([3]),
        np.array([[7, 8, 9]]),
        np.array([[10.0, 20, 100, 200]]),
        (50, 100),
        [True],
        3,
        min_size=1.0,
        min_area=1.0,
        min_visibility=0.0,
    )
    np.testing.assert_array_equal(got[0][0], [[80, 0, 100, 10], [95, 0, 100, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(got[1][0], [True, True, False])
    np.testing.assert_array_equal(got[2][0], [7, 8, -1])


def test_serve_boxes_refuses_a_count_past_the_boxes():
    with pytest.raises(ValueError, match="row 0: count 5 is not in"):
        native(
            np.zeros((1, 3, 4)),
            np.array([5]),
            None,
            np.array([[0.0, 0, 8, 8]]),
            (8, 8),
            None,
            2,
            min_size=1.0,
            min_area=1.0,
            min_visibility=0.0,
        )


def test_a_row_range_without_records_gets_padding_rows(tmp_path):
    # A step's second row range holds no record (the end of an epoch split over devices): its
    # boxes are padding rows, the first range's are served as usual.
    objects = [{"boxes": [[2, 2, 10, 12], [0, 0, 30, 30]], "labels": [3, 4]}] * 3
    images = [np.zeros((32, 32, 3), np.uint8)] * 3
    path = tmp_path / "b.tbl"
    tbljax.convert(
        {"image": images, "objects": objects},
        path,
        image_size=32,
        progress=False,
        fields={"boxes": tbljax.Boxes(key="objects", labels="box_labels")},
    )
    ds = tbljax.open(path)
    serving = GeometricServing(ds, ["boxes", "box_labels"], tbljax.LoaderOptions(batch_size=4, max_boxes=3))
    crops, flips = np.array([[0, 0, 32, 32]]), np.array([False])
    drawn = [
        RowsDrawn(np.array([0]), crops, flips, np.array([0]), None),
        RowsDrawn(np.zeros(0, int), crops[:0], flips[:0], np.zeros(0, int), None),
    ]
    got = serving.build(ds.geometry, [np.array([0]), np.zeros(0, int)], drawn, [2, 2], (16, 16))
    np.testing.assert_array_equal(got["boxes"][0][0], [[1, 1, 5, 6], [0, 0, 15, 15], [0, 0, 0, 0]])
    np.testing.assert_array_equal(got["box_labels"][0][0], [3, 4, -1])
    np.testing.assert_array_equal(got["boxes"][1], np.zeros((2, 3, 4)))
    np.testing.assert_array_equal(got["box_labels"][1], -np.ones((2, 3)))
    np.testing.assert_array_equal(got["boxes_valid"][1], np.zeros((2, 3), bool))

"""Detection crops, ``Augment(crop="bbox")`` (issue 48): the window drawn keeps an object (its
IoU / coverage with some box reaches the threshold picked, or it is the whole image), equals an
independent plain-Python statement of the documented loop (`rules/bbox_crop.py`'s docstring)
fed the same random words, and the loader's masks and boxes follow it through the ordinary
serving; a loader without a boxes field is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import tbljax
from tbljax._src.rules import bbox_crop, geometry, order
from tbljax._src.rules.augment import sample
from tbljax._src.rules.record_geometry import RecordGeometry

import oracle

N, H, W, OUT, MAXB = 24, 40, 56, 16, 4


def _objects(n=N, seed=5):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        m = k % 4  # 0..3 boxes: a record with none is served whole
        xy = rng.uniform(0, [W - 8, H - 8], (m, 2))
        out.append(np.concatenate([xy, np.minimum(xy + rng.uniform(4, 20, (m, 2)), [W, H])], 1))
    return out


def _loop(i, boxes, hh, ww, *, seed, epoch, thresholds, metric, scaling, aspect, attempts, allow_no_crop):
    """The documented loop for one record, one word at a time in plain Python."""

    def word(c):
        return int(order.random_bits(np.array([i]), np.uint32(c), seed, epoch)[0])

    def score(y0, x0, h, w, b):
        iw = max(0.0, min(x0 + w, b[2]) - max(x0, b[0]))
        ih = max(0.0, min(y0 + h, b[3]) - max(y0, b[1]))
        area = max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])
        den = area if metric == "overlap" else area + w * h - iw * ih
        return iw * ih / den if area > 0 and den > 0 else 0.0

    options = list(thresholds) + (["none"] if allow_no_crop else [])
    for t in range(bbox_crop.ROUNDS):
        base = bbox_crop.BASE + 0x1000 * t
        opt = options[(word(base) * len(options)) >> 32]
        if opt == "none":
            break
        for a in range(attempts):
            u = [word(base + 1 + 4 * a + j) for j in range(4)]
            sw = scaling[0] + (scaling[1] - scaling[0]) * (u[0] / 2**32)
            sh = scaling[0] + (scaling[1] - scaling[0]) * (u[1] / 2**32)
            w = min(max(1, round(sw * ww)), ww)  # Python's round: half to even, as np.rint
            h = min(max(1, round(sh * hh)), hh)
            if not aspect[0] <= (w / ww) / (h / hh) <= aspect[1]:
                continue
            y0 = ((u[2] >> 16) * (hh - h + 1)) >> 16
            x0 = ((u[3] >> 16) * (ww - w + 1)) >> 16
            if any(score(y0, x0, h, w, b) >= opt for b in boxes):
                return [y0, x0, h, w]
    return [0, 0, hh, ww]


@pytest.mark.parametrize(
    "kw",
    [
        dict(),  # SSD's defaults
        dict(min_object_covered=0.7, bbox_metric="overlap", allow_no_crop=False, bbox_attempts=5),
        dict(
            min_object_covered=(0.5,),
            bbox_metric="overlap",
            bbox_scaling=(0.1, 0.6),
            bbox_aspect_ratio=(0.8, 1.25),
            bbox_attempts=3,
        ),
    ],
)
def test_crops_are_the_documented_loop_and_keep_an_object(kw):
    aug = tbljax.Augment(crop="bbox", **kw)
    objs = _objects()
    idx = np.arange(100, 100 + N)
    geo = RecordGeometry(np.full(N, H), np.full(N, W)).shifted(100)
    held = bbox_crop.pad_boxes(objs)
    got, _ = sample(aug, idx, geometry=geo, seed=3, epoch=2, objects=held)
    whole = 0
    for r, i in enumerate(idx.tolist()):
        want = _loop(
            i,
            objs[r],
            H,
            W,
            seed=3,
            epoch=2,
            thresholds=aug.min_object_covered,
            metric=aug.bbox_metric,
            scaling=aug.bbox_scaling,
            aspect=aug.bbox_aspect_ratio,
            attempts=aug.bbox_attempts,
            allow_no_crop=aug.allow_no_crop,
        )
        assert got[r].tolist() == want, (r, kw)
        y0, x0, h, w = want
        if want == [0, 0, H, W]:
            whole += 1
            continue
        # A crop: inside the image, its aspect in range, an object kept at the lowest threshold.
        assert 0 <= y0 and y0 + h <= H and 0 <= x0 and x0 + w <= W
        assert aug.bbox_aspect_ratio[0] <= (w / W) / (h / H) <= aug.bbox_aspect_ratio[1]
        m = bbox_crop.metric(np.array(want)[None], objs[r], aug.bbox_metric)
        assert m.max() >= min(aug.min_object_covered)
    assert whole < N  # some records are cropped
    # Records without boxes are served whole.
    assert all(got[r].tolist() == [0, 0, H, W] for r in range(N) if not len(objs[r]))


def test_the_threshold_picked_spreads_over_the_options():
    """Distribution sanity: with one attempt a round, every option is picked about as often."""
    aug = tbljax.Augment(crop="bbox", min_object_covered=(0.0, 0.5), bbox_attempts=1)
    n = 3000
    objs = [np.array([[0.0, 0.0, W, H]])] * n  # the whole image: IoU = the window's area fraction
    got, _ = sample(aug, np.arange(n), height=H, width=W, seed=0, epoch=0, objects=bbox_crop.pad_boxes(objs))
    u = order.random_bits(np.arange(n), np.uint32(bbox_crop.BASE), 0, 0)
    first = (u.astype(np.uint64) * 3) >> 32  # round 0's option: 0.0, 0.5 or no crop
    assert abs((first == 2).mean() - 1 / 3) < 0.04
    # Option 0.0 always takes its window; the scaling range makes most windows smaller than the image.
    cropped = (got[:, 2] * got[:, 3] < H * W).mean()
    assert 0.4 < cropped < 0.9


def test_arguments_are_validated_naming_the_value():
    for kw, msg in [
        (dict(min_object_covered=1.5), "min_object_covered must be"),
        (dict(min_object_covered=()), "min_object_covered must be"),
        (dict(bbox_metric="giou"), "bbox_metric must be one of"),
        (dict(bbox_scaling=(0.5, 2.0)), "bbox_scaling must lie in"),
        (dict(bbox_aspect_ratio=(2.0, 1.0)), "bbox_aspect_ratio must satisfy"),
        (dict(bbox_attempts=0), r"bbox_attempts must be an integer in \[1, 1000\], got 0"),
        (dict(allow_no_crop="yes"), "allow_no_crop must be True or False"),
        (dict(crop="boxes"), "crop must be True .*'bbox'"),
    ]:
        with pytest.raises(ValueError, match=msg):
            tbljax.Augment(**kw)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("bbox")
    rng = np.random.default_rng(9)
    images = rng.integers(0, 256, (N, H, W, 3), np.uint8)
    masks = rng.integers(0, 5, (N, H, W)).astype(np.uint8)
    objs = _objects()
    objects = [{"boxes": b.tolist(), "labels": list(range(len(b)))} for b in objs]
    path = d / "det.tbl"
    fields = {"seg": tbljax.Mask(ignore=255), "boxes": tbljax.Boxes(key="objects", labels="box_labels")}
    cols = {"image": images, "seg": list(masks), "objects": objects}
    tbljax.convert(cols, path, image_size=H, resize="shorter_side", format="raw", progress=False, fields=fields)
    assert tbljax.open(path).geometry.shape == (H, W)
    return str(path), images, masks, objs


def test_the_loader_serves_image_masks_and_boxes_through_the_detection_crop(data):
    path, images, masks, objs = data
    aug = tbljax.Augment(crop="bbox", size=(OUT, OUT))
    kw = dict(augment=aug, dtype="uint8", max_boxes=MAXB, seed=1, drop_remainder=False)
    for b in tbljax.loader(path, 8, num_epochs=1, **kw):
        b = {k: np.asarray(v) for k, v in b.items()}
        idx = b["index"]
        crops, flips = sample(
            aug, idx, height=H, width=W, seed=1, epoch=0, objects=bbox_crop.pad_boxes([objs[i] for i in idx])
        )
        # The image rows are the NumPy oracle's of the same crops and flips.
        want_img = oracle.gather(list(images), idx, (OUT, OUT), crop=crops, flip=flips, dtype=np.uint8)
        np.testing.assert_array_equal(b["image"], want_img)
        for r, k in enumerate(idx.tolist()):
            box, flip = tuple(crops[r]), bool(flips[r])
            np.testing.assert_array_equal(b["seg"][r], geometry.serve_mask(masks[k], box, (OUT, OUT), flip))
            want = geometry.serve_boxes(objs[k], np.arange(len(objs[k])), box, (OUT, OUT), flip, max_boxes=MAXB)
            np.testing.assert_allclose(b["boxes"][r], want["boxes"], atol=1e-4)
            assert b["boxes_valid"][r].tolist() == want["boxes_valid"].tolist()


def test_crop_bbox_without_a_boxes_field_is_refused_by_name(data):
    path = data[0]
    aug = tbljax.Augment(crop="bbox", size=(OUT, OUT))
    with pytest.raises(ValueError, match=r"Augment\(crop='bbox'\) crops around each record's boxes: .* got \[\]"):
        tbljax.loader(path, 4, augment=aug, fields=["seg"])
    with pytest.raises(ValueError, match=r"Augment\(crop='bbox'\) draws from each record's boxes on the host"):
        sample(aug, np.arange(2), height=H, width=W, seed=0, epoch=0)

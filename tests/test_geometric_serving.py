"""Geometric fields served through the image's crop, flip and resize (issue 48,
engine/geometric_serving.py): masks bit-exact against rules/geometry.serve_mask and against
torchvision v2's `tv_tensors.Mask` given the same crop box, on RAW fixed-size, full-aspect and
compact JPEG records; a mask made from the photos' own pixels stays equal to the same function
of the served image over two epochs and across a resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_geometry import tv  # noqa: F401 - the torchvision v2 fixture

import tbljax
from tbljax import augment as tba
from tbljax._src.rules import geometry

KINDS = {
    "raw_square": dict(resize="center_crop", format="raw"),
    "raw_full_aspect": dict(resize="shorter_side", format="raw"),
    "compact_jpeg": dict(resize="center_crop", format="jpeg", quality=95),
}


def _blocky(rng, h, w):
    """An image of flat 8x8 blocks, each black, white or mid grey (gray: JPEG's chroma
    subsampling leaves it alone; its 8x8 blocks keep them)."""
    cells = np.repeat(rng.integers(0, 3, (h // 8 + 1, w // 8 + 1, 1)).astype(np.uint8) * 120, 3, axis=2)
    y, x = np.mgrid[0:h, 0:w] // 8
    return cells[y, x]


def _classes(img):
    """The mask a photo's own pixels make: 0, 1 or 2 by its brightness."""
    return np.digitize(img[..., 0], [60, 180]).astype(np.uint8)


def _convert(tmp_path, kind, n=7, size=24, sides=((40, 48), (48, 40), (32, 56))):
    rng = np.random.default_rng(5)
    images = [_blocky(rng, *sides[k % len(sides)]) for k in range(n)]
    seg = [_classes(im) for im in images]
    depth = [rng.standard_normal(im.shape[:2] + (2,)).astype(np.float32) for im in images]
    path = tmp_path / f"{kind}.tbl"
    tbljax.convert(
        {"image": images, "seg": seg, "depth": depth},
        path,
        image_size=size,
        progress=False,
        fields={"seg": tbljax.Mask(ignore=255), "depth": tbljax.DenseMap(invalid=0.0)},
        **KINDS[kind],
    )
    return tbljax.open(path)


def _stored(ds, name, k):
    """Record k's stored map at its record's shape (flat rows reshaped)."""
    v = np.asarray(ds.field(name)[k])
    h, w = (int(np.broadcast_to(a, (len(ds),))[k]) for a in (ds.geometry.heights, ds.geometry.widths))
    return v.reshape(h, w, *v.shape[(1 if v.shape[0] == h * w else 2) :])


def _crops(ds, aug, idx, epoch, seed=0):
    """The crop boxes and flips the loader draws, from the public augment module."""
    return tba.sample(aug, np.asarray(idx, np.int64), geometry=ds.geometry, seed=seed, epoch=epoch)


@pytest.mark.parametrize("kind", list(KINDS))
def test_masks_and_dense_maps_follow_the_crop_exactly(tmp_path, kind, tv):  # noqa: F811
    tvt, F = tv
    ds = _convert(tmp_path, kind)
    aug = tbljax.Augment(size=(20, 28))
    ld = tbljax.HostLoader(ds, tbljax.LoaderOptions(batch_size=4, augment=aug, drop_remainder=False, num_epochs=2))
    seen = 0
    for hb in ld:
        seg, depth = hb.fields["seg"][0], hb.fields["depth"][0]
        assert seg.shape == (4, 20, 28) and seg.dtype == np.uint8
        assert depth.shape == (4, 20, 28, 2) and depth.dtype == np.float32
        valid = hb.index >= 0
        boxes, flips = _crops(ds, aug, hb.index[valid], hb.epoch)
        for r, (k, box, flip) in enumerate(zip(hb.index[valid], boxes, flips)):
            m = _stored(ds, "seg", k)
            want = geometry.serve_mask(m, tuple(box), (20, 28), bool(flip))
            np.testing.assert_array_equal(seg[r], want)
            theirs = F.resized_crop(tvt.Mask(torch.from_numpy(m.copy())), *map(int, box), [20, 28])
            if flip:
                theirs = F.horizontal_flip(theirs)
            np.testing.assert_array_equal(seg[r], theirs.numpy())
            d = _stored(ds, "depth", k)
            np.testing.assert_array_equal(depth[r], geometry.serve_mask(d, tuple(box), (20, 28), bool(flip)))
            seen += 1
        assert (seg[~valid] == 255).all() and (depth[~valid] == 0).all()  # padding: no source pixel
    assert seen == 2 * len(ds)


@pytest.mark.parametrize("kind", ["raw_square", "compact_jpeg"])
def test_mask_made_from_the_photo_stays_aligned_over_epochs_and_resume(tmp_path, kind):
    # Photos stored at their own size and crops of the output's size (scale and ratio fixed):
    # the image is copied, not resampled, so the served mask must be the same function of
    # the served pixels, wherever the crop lands and whichever way it flips.
    ds = _convert(tmp_path, kind, size=32, sides=((32, 32),))
    aug = tbljax.Augment(size=(16, 16), scale=(0.25, 0.25), ratio=(1.0, 1.0))
    opts = tbljax.LoaderOptions(batch_size=3, augment=aug, num_epochs=2, seed=3, dtype="uint8")

    def check(batches):
        n = 0
        for hb in batches:
            np.testing.assert_array_equal(hb.fields["seg"][0], _classes(hb.image))
            n += 1
        return n

    ld = tbljax.HostLoader(ds, opts)
    it = iter(ld)
    check([next(it) for _ in range(3)])
    state = ld.state_dict()
    del it
    resumed = tbljax.HostLoader(ds, opts)
    resumed.load_state_dict(state)
    assert check(resumed) == 2 * (len(ds) // 3) - 3
    assert check(tbljax.HostLoader(ds, opts)) == 2 * (len(ds) // 3)


def test_boxes_and_keypoints_follow_the_crop_on_the_loader(tmp_path, tv):  # noqa: F811
    tvt, F = tv
    from torchvision.transforms import v2

    rng = np.random.default_rng(9)
    images = [_blocky(rng, 40, 48) for _ in range(6)]
    objects = []
    for k in range(6):
        n = k % 4  # 0..3 boxes a record
        xy = rng.uniform(0, [30, 24], (n, 2))
        objects.append(
            {"boxes": np.concatenate([xy, xy + rng.uniform(4, 16, (n, 2))], 1).tolist(), "labels": list(range(n))}
        )
    kpts = [rng.uniform(0, [48, 40], (2, 3, 2)) for _ in range(6)]
    path = tmp_path / "det.tbl"
    tbljax.convert(
        {"image": images, "objects": objects, "kpts": kpts},
        path,
        image_size=24,
        progress=False,
        fields={
            "boxes": tbljax.Boxes(key="objects", labels="box_labels"),
            "kpts": tbljax.Keypoints(flip_permutation=[0, 2, 1]),
        },
    )
    ds = tbljax.open(path)
    aug = tbljax.Augment(size=(16, 20))
    ld = tbljax.HostLoader(
        ds, tbljax.LoaderOptions(batch_size=4, augment=aug, drop_remainder=False, max_boxes=2, num_epochs=1)
    )
    for hb in ld:
        f = {k: v[0] for k, v in hb.fields.items()}
        assert f["boxes"].shape == (4, 2, 4) and f["boxes_valid"].shape == (4, 2) and f["box_labels"].shape == (4, 2)
        valid = hb.index >= 0
        crops, flips = _crops(ds, aug, hb.index[valid], hb.epoch)
        for r, (k, box, flip) in enumerate(zip(hb.index[valid], crops, flips)):
            b, lab = np.asarray(ds.field("boxes")[k], np.float64), np.array(ds.field("box_labels")[k])
            assert f["boxes_count"][r] == len(b)
            t = tvt.BoundingBoxes(torch.from_numpy(b), format="XYXY", canvas_size=(24, 24), dtype=torch.float64)
            t = F.resized_crop(t, *map(int, box), [16, 20])
            t = F.clamp_bounding_boxes(F.horizontal_flip(t) if flip else t)
            kept = v2.SanitizeBoundingBoxes()({"boxes": t, "labels": torch.from_numpy(lab)})
            want = kept["boxes"].as_subclass(torch.Tensor).numpy()[:2]
            n = len(want)
            assert f["boxes_valid"][r].sum() == n
            np.testing.assert_allclose(f["boxes"][r, :n], want, atol=1e-4)
            np.testing.assert_array_equal(f["box_labels"][r, :n], kept["labels"].numpy()[:2])
            assert (f["box_labels"][r, n:] == -1).all()
            want_k = geometry.serve_keypoints(ds.field("kpts")[k], tuple(box), (16, 20), bool(flip), [0, 2, 1])
            np.testing.assert_array_equal(f["kpts"][r, : len(want_k)], want_k[:2])
        assert not f["boxes_valid"][~valid].any() and (f["box_labels"][~valid] == -1).all()


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(max_boxes=0), "max_boxes must be an integer >= 1, got 0"),
        (dict(min_area=-1), r"min_area must be a finite number in \[0, inf\], got -1"),
        (dict(min_visibility=1.5), r"min_visibility must be a finite number in \[0, 1.0\], got 1.5"),
    ],
)
def test_box_options_name_the_bad_value(kw, match):
    with pytest.raises(ValueError, match=match):
        tbljax.LoaderOptions(batch_size=2, **kw)


def test_unserved_combinations_are_refused_by_name(tmp_path):
    ds = _convert(tmp_path, "raw_square", n=3)
    ops = tbljax.Augment(size=(8, 8), ops=[tbljax.RandAugment()])
    with pytest.raises(ValueError, match=r"geometric fields \['seg', 'depth'\] with Augment\(ops=...\)"):
        tbljax.HostLoader(ds, tbljax.LoaderOptions(batch_size=2, augment=ops))

"""Geometric fields on every serving path (issue 48): `tbljax.loader` (jax.Arrays), the torch
and MLX loaders, host parts, a mixture of two files and a mid-epoch resume serve masks, boxes
and keypoints equal to an independent reference. The records are 32x32 RAW noise photos served
at 16x16 through a crop of scale 1/4 and ratio 1: the image is copied, not resampled, so each
row's crop box and flip can be read back from its own pixels (`_crop_of`), whatever path drew
them; the row's mask must then be the same function of the served pixels as of the photo, and
its boxes and keypoints `rules/geometry.serve_boxes` / `serve_keypoints` of the source's values
through that crop."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import tbljax
from tbljax import HostLoader, LoaderOptions, RowLayout
from tbljax._src.datasets.host_part import PartDataset
from tbljax._src.rules import geometry

N, S, OUT, MAXB, PERM = 12, 32, 16, 3, [0, 2, 1]
AUG = tbljax.Augment(size=(OUT, OUT), scale=(0.25, 0.25), ratio=(1.0, 1.0))
KW = dict(augment=AUG, dtype="uint8", max_boxes=MAXB, seed=4)


def _classes(img):
    """The mask a photo's own pixels make: 0, 1 or 2 by its red channel."""
    return np.digitize(img[..., 0], [85, 170]).astype(np.uint8)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("geopaths")
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, (N, S, S, 3), np.uint8)
    objects = []
    for k in range(N):
        n = k % 4 + 1  # 1..4 boxes a record: some cut at MAXB
        xy = rng.uniform(0, 18, (n, 2))  # inside the photo (a box outside it is skipped)
        boxes = np.concatenate([xy, xy + rng.uniform(2, 12, (n, 2))], 1)
        objects.append({"boxes": boxes.tolist(), "labels": (np.arange(n) + k).tolist()})
    kpts = np.concatenate([rng.uniform(0, S, (N, 2, 3, 2)), np.full((N, 2, 3, 1), 2.0)], -1).astype(np.float32)
    fields = {
        "seg": tbljax.Mask(ignore=255),
        "boxes": tbljax.Boxes(key="objects", labels="box_labels"),
        "kpts": tbljax.Keypoints(flip_permutation=PERM),
    }
    paths = []
    for name, rows in (("a", slice(0, 6)), ("b", slice(6, N))):
        cols = {"image": images[rows], "seg": [_classes(im) for im in images[rows]], "objects": objects[rows]}
        tbljax.convert(
            {**cols, "kpts": kpts[rows]}, d / f"{name}.tbl", image_size=S, format="raw", progress=False, fields=fields
        )
        paths.append(str(d / f"{name}.tbl"))
    return paths, images, objects, kpts


def _crop_of(photo, row):
    """The (y0, x0, h, w) crop and flip that copy `row` out of `photo`: the only window of the
    noise photo (or of its mirror) equal to it."""
    for flip in (False, True):
        win = sliding_window_view(photo, (OUT, OUT, 3))[:, :, 0]
        want = row[:, ::-1] if flip else row
        hits = np.argwhere((win == want).all(axis=(2, 3, 4)))
        if len(hits):
            assert len(hits) == 1
            return (int(hits[0][0]), int(hits[0][1]), OUT, OUT), flip
    raise AssertionError("a served row is no window of its photo")


def check(data, index, image, f, where):
    """One batch's rows (`index`: the dataset's numbering, -1 on padding; `f`: its fields as
    NumPy arrays) against the reference."""
    _, images, objects, kpts = data
    assert f["seg"].shape == (len(index), OUT, OUT) and f["seg"].dtype == np.uint8, where
    assert f["boxes"].shape == (len(index), MAXB, 4) and f["boxes"].dtype == np.float32, where
    assert f["boxes_valid"].dtype == np.bool_ and f["boxes_count"].dtype == np.int32, where
    assert f["box_labels"].shape == (len(index), MAXB) and f["box_labels"].dtype == np.int32, where
    assert f["kpts"].shape == (len(index), MAXB, len(PERM), 3) and f["kpts"].dtype == np.float32, where
    for r, k in enumerate(np.asarray(index).tolist()):
        if k < 0:
            assert (f["seg"][r] == 255).all() and not f["boxes_valid"][r].any(), where
            assert (f["box_labels"][r] == -1).all() and f["boxes_count"][r] == 0, where
            continue
        np.testing.assert_array_equal(f["seg"][r], _classes(image[r]), err_msg=f"{where} record {k}")
        box, flip = _crop_of(images[k], image[r])
        np.testing.assert_array_equal(f["seg"][r], geometry.serve_mask(_classes(images[k]), box, (OUT, OUT), flip))
        want = geometry.serve_boxes(objects[k]["boxes"], objects[k]["labels"], box, (OUT, OUT), flip, max_boxes=MAXB)
        np.testing.assert_allclose(f["boxes"][r], want["boxes"], atol=1e-4, err_msg=f"{where} record {k}")
        assert f["boxes_valid"][r].tolist() == want["boxes_valid"].tolist(), (where, k)
        assert f["box_labels"][r].tolist() == want["box_labels"].tolist(), (where, k)
        assert f["boxes_count"][r] == len(objects[k]["labels"]), (where, k)
        np.testing.assert_allclose(
            f["kpts"][r, : len(kpts[k])], geometry.serve_keypoints(kpts[k], box, (OUT, OUT), flip, PERM), atol=1e-4
        )


def _np(batch) -> dict:
    return {k: np.asarray(v) for k, v in batch.items()}


def test_jax_loader_serves_global_arrays_of_the_reference(data):
    import jax

    seen = []
    for b in tbljax.loader(data[0], 5, num_epochs=1, drop_remainder=False, **KW):
        assert all(isinstance(v, jax.Array) for v in b.values())
        b = _np(b)
        check(data, b["index"], b["image"], b, "jax")
        seen += b["index"][b["index"] >= 0].tolist()
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_torch_and_mlx_loaders_serve_the_reference(data, framework):
    mod = pytest.importorskip(f"tbljax.{framework}")
    seen = []
    host = (lambda t: t.numpy()) if framework == "torch" else np.array
    for b in mod.loader(data[0], 5, layout="NHWC", drop_remainder=False, **KW):
        idx = host(b.index)
        check(data, idx, host(b.images), {k: host(v) for k, v in b.fields.items()}, framework)
        seen += idx[idx >= 0].tolist()
    assert sorted(seen) == list(range(N))


def test_two_host_parts_each_serve_their_records_with_the_reference(data):
    counts = (6, 6)  # each process's part: one of the two files
    seen = []
    for p, lo in enumerate((0, 6)):
        part = PartDataset(tbljax.open(data[0][p]), 0, counts[p], "fp")
        opts = LoaderOptions(batch_size=4, num_epochs=1, drop_remainder=False, **KW)
        ld = HostLoader(part, opts, RowLayout.for_rank(2, 0, 1), parts=tbljax.order.Parts(counts, p))
        for hb in ld:
            idx = hb.index  # the global numbering: the part's records from its first
            assert (idx[idx >= 0] >= lo).all() and (idx < lo + counts[p]).all()
            check(data, idx, hb.image, {k: v[0] for k, v in hb.fields.items()}, f"part {p}")
            seen += idx[idx >= 0].tolist()
    assert sorted(seen) == list(range(N))
    # One process of partition="host" through tbljax.loader: the whole dataset, as one part.
    for b in tbljax.loader(data[0], 4, num_epochs=1, partition="host", **KW):
        b = _np(b)
        check(data, b["index"], b["image"], b, "partition='host'")


def test_a_mixture_serves_each_source_with_the_reference(data):
    mixture = tbljax.mix({"a": data[0][0], "b": data[0][1]}, {"a": 1, "b": 1}, steps_per_epoch=3)
    sources = []
    for b in tbljax.loader(mixture, 4, num_epochs=1, **KW):
        b = _np(b)
        check(data, b["index"], b["image"], b, "mixture")  # the mixture numbers a's records, then b's
        sources += b["source"].tolist()
    assert sorted(set(sources)) == [0, 1]


def test_a_resumed_loader_serves_the_rest_with_the_reference(data):
    kw = dict(num_epochs=2, **KW)
    ld = tbljax.loader(data[0], 4, **kw)
    it = iter(ld)
    for _ in range(4):  # into the second epoch
        next(it)
    state = ld.state_dict()
    rest = [_np(b) for b in it]
    again = tbljax.loader(data[0], 4, **kw)
    again.load_state_dict(state)
    resumed = [_np(b) for b in again]
    assert len(rest) == len(resumed) == 2
    for b1, b2 in zip(rest, resumed):
        check(data, b2["index"], b2["image"], b2, "resumed")
        for k in b1:
            np.testing.assert_array_equal(b1[k], b2[k], err_msg=k)


def test_a_field_fn_on_a_geometric_field_gets_its_stored_values(data):
    got = []
    kw = dict(KW, field_fn={"seg": lambda v: (got.append(np.stack(v)), np.zeros(len(v)))[1]})
    for b in tbljax.loader(data[0], 4, num_epochs=1, shuffle=False, **kw):
        assert "seg" in b and "boxes" in b  # the others still follow the crop
    np.testing.assert_array_equal(np.concatenate(got), [_classes(im) for im in data[1]])


def test_unserved_combinations_are_refused_by_name(data):
    paths = data[0]
    for framework in ("torch", "mlx"):
        mod = pytest.importorskip(f"tbljax.{framework}")
        mixup = tbljax.ops.Mixup(num_classes=12)
        with pytest.raises(
            ValueError, match=r"mixup= with the geometric fields \['seg', 'kpts', 'boxes', 'box_labels'\]"
        ):
            mod.loader(paths, 4, mixup=mixup, **KW)

"""Multi-view serving (issue 47, `views=`, DINO's multi-crop): each view group ``batch[name]``
(B, count, H, W, 3); every view's rows equal the oracle's crop-resize of the record at the box and
flip drawn for (seed, epoch, index, view); view 0 is the loader without views; resume exact;
torch and MLX serve the same bytes; what is not served is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import tbljax
from tbljax._src.datasets.host_part import PartDataset
from tbljax._src.engine.host_loader import HostLoader
from tbljax._src.engine.rows import RowLayout
from tbljax._src.rules import erasing, pixel_ops, randaug
from tbljax._src.rules.augment import sample

import _loader_testing as T
import oracle

N, G, SEED, H, W = 7, 3, 5, 12, 10
GLOBAL = tbljax.Augment(size=(6, 5), scale=(0.4, 1.0))
LOCAL = tbljax.Augment(size=(3, 4), scale=(0.05, 0.4))
VIEWS = {"global": (2, GLOBAL), "local": (3, LOCAL)}
# DINO's per-view colour ops (jitter with hue, grayscale, blur, solarize) and erasing.
DINO_OPS = [
    tbljax.ColorJitter(0.4, 0.4, 0.2, 0.1),
    tbljax.Grayscale(0.2),
    tbljax.GaussianBlur(0.5),
    tbljax.Solarize(0.3),
]
OP_GLOBAL = tbljax.Augment(size=(8, 7), scale=(0.4, 1.0), ops=DINO_OPS, erasing=tbljax.RandomErasing(p=0.7))
OP_LOCAL = tbljax.Augment(size=(5, 4), scale=(0.05, 0.4), ops=[tbljax.Solarize(0.5), tbljax.Grayscale(0.5)])
OP_VIEWS = {"global": (2, OP_GLOBAL), "local": (3, OP_LOCAL)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    imgs = T.images(N, H, W, seed=3)
    return imgs, T.write_tbl(tmp_path_factory.mktemp("views") / "a.tbl", imgs, np.arange(N))


def expected(imgs, idx, epoch, layout="NHWC", dtype=np.uint8, mean=None, std=None):
    """{name: (B, count, ...)}: the oracle's pixels at each view's box and flip (views numbered
    over the groups in order: global 0-1, local 2-4)."""
    out, v = {}, 0
    for name, (count, aug) in VIEWS.items():
        per = []
        for k in range(count):
            boxes, flips = sample(aug, idx, height=H, width=W, seed=SEED, epoch=epoch, view=v + k)
            per.append(oracle.gather(imgs, idx, aug.size, boxes, flips, dtype, layout, mean, std))
        out[name] = np.stack(per, axis=1)
        v += count
    return out


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_every_view_is_the_oracle_crop_at_its_own_draw(data, layout):
    imgs, path = data
    steps = -(-N // G)  # a padded last step an epoch
    ld = tbljax.loader(
        path, G, seed=SEED, views=VIEWS, dtype="uint8", layout=layout, num_epochs=2, drop_remainder=False
    )
    for s, b in enumerate(ld):
        assert "image" not in b
        idx, valid = np.asarray(b["index"]), np.asarray(b["valid"])
        want = expected(imgs, idx[valid], s // steps, layout)
        for name, (count, aug) in VIEWS.items():
            got = np.asarray(b[name])
            row = (*aug.size, 3) if layout == "NHWC" else (3, *aug.size)
            assert got.shape == (G, count, *row) and got.dtype == np.uint8
            np.testing.assert_array_equal(got[valid], want[name], err_msg=name)
            assert (got[~valid] == 0).all()  # padding rows
        np.testing.assert_array_equal(np.asarray(b["label"])[valid], idx[valid])


def test_normalized_views_match_the_oracle_and_view_0_is_the_loader_without_views(data):
    imgs, path = data
    kw = dict(seed=SEED, num_epochs=1, dtype="float32")
    plain = [np.asarray(b["image"]) for b in tbljax.loader(path, G, augment=GLOBAL, **kw)]
    local0 = [np.asarray(b["image"]) for b in tbljax.loader(path, G, augment=LOCAL, **kw)]
    served = list(tbljax.loader(path, G, views=VIEWS, **kw))
    assert len(served) == len(plain) == N // G
    mean, std = tbljax.LoaderOptions(batch_size=1).normalization
    for b, p, q in zip(served, plain, local0):
        g, loc = np.asarray(b["global"]), np.asarray(b["local"])
        np.testing.assert_array_equal(g[:, 0], p)  # view 0: the loader with augment=that Augment
        assert not np.array_equal(loc[:, 0], q)  # local view 0 is view 2: its own draw
        want = expected(imgs, np.asarray(b["index"]), 0, dtype=np.float32, mean=mean, std=std)
        np.testing.assert_allclose(g, want["global"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(loc, want["local"], rtol=0, atol=1e-6)
        # The views of a record are different draws.
        assert all(not np.array_equal(g[i, 0], g[i, 1]) for i in range(len(g)))


def expected_with_ops(imgs, idx, epoch, dtype):
    """{name: (B, count, H, W, 3)}: the oracle's crop of each view, pixel_ops' program of the ops
    `randaug.decide` draws for (seed, epoch, index, view), normalized and erased by pixel_ops."""
    mean, std = tbljax.LoaderOptions(batch_size=1).normalization
    out, v = {}, 0
    for name, (count, aug) in OP_VIEWS.items():
        per = []
        for k in range(count):
            boxes, flips = sample(aug, idx, height=H, width=W, seed=SEED, epoch=epoch, view=v + k)
            pix = oracle.gather(imgs, idx, aug.size, boxes, flips)
            codes, args = randaug.decide(aug.ops, idx, seed=SEED, epoch=epoch, view=v + k)
            pix = np.stack([pixel_ops.apply_all(im, c, a) for im, c, a in zip(pix, codes, args)])
            rows = pix if dtype == np.uint8 else oracle.normalize(pix, mean, std, np.float32)
            if aug.erasing is not None and dtype != np.uint8:
                eb, keys = erasing.decide_erasing(
                    aug.erasing, idx, height=aug.size[0], width=aug.size[1], seed=SEED, epoch=epoch, view=v + k
                )
                rows = np.stack(
                    [
                        pixel_ops.erase(r.transpose(2, 0, 1), e, key, "pixel").transpose(1, 2, 0)
                        for r, e, key in zip(rows, eb, keys)
                    ]
                )
            per.append(rows)
        out[name] = np.stack(per, axis=1)
        v += count
    return out


def test_views_with_ops_are_each_views_crop_through_its_own_program(data):
    """Augment(ops=, erasing=) per view: each view's rows are pixel_ops' program (and erasing) of
    the oracle's crop, the decisions keyed by (seed, epoch, index, view); view 0 is the loader
    with augment= that Augment; the views' programs differ."""
    imgs, path = data
    served = list(tbljax.loader(path, G, seed=SEED, views=OP_VIEWS, dtype="float32", num_epochs=2))
    plain = list(tbljax.loader(path, G, seed=SEED, augment=OP_GLOBAL, dtype="float32", num_epochs=2))
    steps = N // G
    for s, (b, p) in enumerate(zip(served, plain)):
        idx = np.asarray(b["index"])
        want = expected_with_ops(imgs, idx, s // steps, np.float32)
        for name in OP_VIEWS:
            np.testing.assert_allclose(np.asarray(b[name]), want[name], rtol=0, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(np.asarray(b["global"])[:, 0], np.asarray(p["image"]))
    codes = [randaug.decide(DINO_OPS, np.arange(N), seed=SEED, epoch=0, view=v)[0] for v in range(2)]
    assert (codes[0] != codes[1]).any(axis=1).mean() > 0.5  # drawn apart per view
    u8 = next(iter(tbljax.loader(path, G, seed=SEED, views={"local": (3, OP_LOCAL)}, dtype="uint8")))
    for k in range(3):  # the local group alone: its views are 0..2
        idx = np.asarray(u8["index"])
        boxes, flips = sample(OP_LOCAL, idx, height=H, width=W, seed=SEED, epoch=0, view=k)
        codes, args = randaug.decide(OP_LOCAL.ops, idx, seed=SEED, epoch=0, view=k)
        pix = oracle.gather(imgs, idx, OP_LOCAL.size, boxes, flips)
        want = np.stack([pixel_ops.apply_all(im, c, a) for im, c, a in zip(pix, codes, args)])
        np.testing.assert_array_equal(np.asarray(u8["local"])[:, k], want)


def test_views_are_drawn_apart_and_keyed_by_view():
    idx = np.arange(64)
    draws = [sample(GLOBAL, idx, height=H, width=W, seed=SEED, epoch=0, view=v) for v in range(3)]
    for a in range(3):
        for c in range(a + 1, 3):
            assert (draws[a][0] != draws[c][0]).any(axis=1).mean() > 0.9
    base = sample(GLOBAL, idx, height=H, width=W, seed=SEED, epoch=0)
    np.testing.assert_array_equal(draws[0][0], base[0])
    np.testing.assert_array_equal(draws[0][1], base[1])
    with pytest.raises(ValueError, match=r"view must be an integer in \[0, 256\), got 256"):
        sample(GLOBAL, idx, height=H, width=W, seed=SEED, epoch=0, view=256)


def test_mid_epoch_state_resumes_exactly(data):
    _, path = data
    kw = dict(seed=SEED, views=VIEWS, dtype="uint8", num_epochs=2, drop_remainder=False)
    ld = tbljax.loader(path, G, **kw)
    it = iter(ld)
    next(it), next(it)
    state = ld.state_dict()
    rest = [{k: np.asarray(v) for k, v in b.items()} for b in it]
    again = tbljax.loader(path, G, **kw)
    again.load_state_dict(state)
    resumed = [{k: np.asarray(v) for k, v in b.items()} for b in again]
    assert len(rest) == len(resumed) == 2 * -(-N // G) - 2
    for a, b in zip(rest, resumed):
        assert a.keys() == b.keys() == {"global", "local", "label", "index", "valid"}
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("views", [VIEWS, OP_VIEWS], ids=["crops", "ops"])
def test_torch_and_mlx_serve_the_jax_loaders_views(data, views):
    torch = pytest.importorskip("torch")
    pytest.importorskip("mlx.core")
    import tbljax.mlx
    import tbljax.torch

    _, path = data
    kw = dict(seed=SEED, views=views, dtype="bfloat16", drop_remainder=False, layout="NCHW")
    want = [{k: np.asarray(v) for k, v in b.items()} for b in tbljax.loader(path, G, num_epochs=1, **kw)]

    got = list(tbljax.torch.loader(path, G, **kw))
    assert len(got) == len(want)
    for b, w in zip(got, want):
        assert set(b.images) == {"global", "local"}
        for name in VIEWS:
            t = b.images[name]
            assert t.dtype == torch.bfloat16
            np.testing.assert_array_equal(t.view(torch.int16).numpy(), w[name].view(np.int16), err_msg=name)
        np.testing.assert_array_equal(b.index.numpy(), w["index"])
    mlx_kw = {**kw, "dtype": "float32", "layout": "NHWC"}
    want = [{k: np.asarray(v) for k, v in b.items()} for b in tbljax.loader(path, G, num_epochs=1, **mlx_kw)]
    got = list(tbljax.mlx.loader(path, G, **mlx_kw))
    assert len(got) == len(want)
    for b, w in zip(got, want):
        assert set(b.images) == {"global", "local"}
        for name in VIEWS:
            np.testing.assert_array_equal(np.array(b.images[name]), w[name], err_msg=name)
        np.testing.assert_array_equal(np.array(b.index), w["index"])


@pytest.mark.parametrize(
    ("views", "extra", "match"),
    [
        ({"image": (1, GLOBAL)}, {}, r"views: 'image' is not a view name"),
        ({"label": (1, GLOBAL)}, {}, r"views: 'label' is not a view name"),
        ({"g": (0, GLOBAL)}, {}, r"views\['g'\]: count must be an integer >= 1, got 0"),
        ({"g": (1.5, GLOBAL)}, {}, r"views\['g'\]: count must be an integer >= 1, got 1.5"),
        ({"g": (1, tbljax.Augment())}, {}, r"views\['g'\]: the Augment needs a fixed size=\(height, width\)"),
        ({"g": (1, "rrc_flip")}, {}, r"views\['g'\]: the augmentation must be a tbljax.Augment, got 'rrc_flip'"),
        ({"g": (1, GLOBAL)}, {"augment": GLOBAL}, r"augment= with views="),
        ({"g": (1, GLOBAL)}, {"buckets": tbljax.Buckets("auto")}, r"views with buckets: not served yet"),
        ({"g": (257, GLOBAL)}, {}, r"views of 257 crops in all \(at most 256\)"),
        ({}, {}, r"views must be a non-empty dict"),
    ],
)
def test_bad_views_are_refused_by_name(views, extra, match):
    with pytest.raises(ValueError, match=match):
        tbljax.LoaderOptions(batch_size=4, views=views, **extra)


def test_a_views_erasing_with_uint8_output_is_refused_by_name(data):
    _, path = data
    with pytest.raises(ValueError, match=r"views\['global'\]: Augment\(erasing=...\) sets normalized values"):
        tbljax.loader(path, G, views=OP_VIEWS, dtype="uint8")


def test_a_mixture_refuses_views_by_name(data):
    _, path = data
    mixture = tbljax.mix({"a": path, "b": path}, weights={"a": 0.5, "b": 0.5}, steps_per_epoch=2)
    with pytest.raises(ValueError, match=r"views with a mixture \(tbljax.mix\): not served yet"):
        tbljax.loader(mixture, G, views=VIEWS)


def test_repeats_views_are_keyed_by_repeat_and_view(data):
    imgs, path = data
    aug = {"g": (2, GLOBAL)}
    for b in tbljax.loader(path, G, seed=SEED, views=aug, repeats=2, dtype="uint8", num_epochs=1):
        idx, rep, got = np.asarray(b["index"]), np.asarray(b["repeat"]), np.asarray(b["g"])
        for v in range(2):
            boxes, flips = sample(GLOBAL, idx, height=H, width=W, seed=SEED, epoch=0, repeat=rep, view=v)
            np.testing.assert_array_equal(got[:, v], oracle.gather(imgs, idx, GLOBAL.size, boxes, flips))


def test_repeats_view_ops_are_keyed_by_repeat_and_view(data):
    imgs, path = data
    for b in tbljax.loader(path, G, seed=SEED, views={"l": (2, OP_LOCAL)}, repeats=2, dtype="uint8", num_epochs=1):
        idx, rep, got = np.asarray(b["index"]), np.asarray(b["repeat"]), np.asarray(b["l"])
        for v in range(2):
            boxes, flips = sample(OP_LOCAL, idx, height=H, width=W, seed=SEED, epoch=0, repeat=rep, view=v)
            codes, args = randaug.decide(OP_LOCAL.ops, idx, seed=SEED, epoch=0, repeat=rep, view=v)
            pix = oracle.gather(imgs, idx, OP_LOCAL.size, boxes, flips)
            want = np.stack([pixel_ops.apply_all(im, c, a) for im, c, a in zip(pix, codes, args)])
            np.testing.assert_array_equal(got[:, v], want)


def test_host_parts_key_views_by_the_global_index(data):
    imgs, path = data
    ds = tbljax.open(path)
    counts = (3, 4)
    for p, (lo, hi) in enumerate([(0, 3), (3, 7)]):
        part = PartDataset(ds, lo, hi, ds.fingerprint)
        opts = tbljax.LoaderOptions(batch_size=2, seed=SEED, num_epochs=1, views=VIEWS, dtype="uint8")
        ld = HostLoader(part, opts, RowLayout.for_rank(1, 0, 1), parts=tbljax.order.Parts(counts, p))
        for hb in ld:
            assert lo <= hb.index[0] < hi
            want = expected(imgs, hb.index, 0)
            for name in VIEWS:
                np.testing.assert_array_equal(hb.views[name][0], want[name], err_msg=name)


def test_a_view_named_like_a_field_of_the_dataset_is_refused(tmp_path):
    imgs = T.images(4, H, W, seed=1)
    path = tmp_path / "f.tbl"
    tbljax.convert({"image": imgs, "label": np.arange(4), "score": np.arange(4.0)}, path, image_size=8, progress=False)
    with pytest.raises(ValueError, match=r"views \['score'\]: the dataset serves fields of these names"):
        tbljax.loader(path, 2, views={"score": (1, GLOBAL)})


def test_compact_jpeg_views_are_crops_of_the_decoded_record(tmp_path):
    imgs = T.images(5, 16, 16, seed=4)
    path = tmp_path / "c.tbl"
    tbljax.convert(
        {"image": imgs, "label": np.arange(5)}, path, image_size=16, format="jpeg", quality=90, progress=False
    )
    ds = tbljax.open(path)
    assert ds.compact
    decoded = np.stack([ds.read(i) for i in range(len(ds))])  # the records as stored, decoded whole
    aug = {"g": (3, tbljax.Augment(size=(8, 8), scale=(0.3, 1.0)))}
    for b in tbljax.loader(path, 5, seed=SEED, views=aug, dtype="uint8", num_epochs=1):
        idx, got = np.asarray(b["index"]), np.asarray(b["g"])
        for v in range(3):
            boxes, flips = sample(aug["g"][1], idx, height=16, width=16, seed=SEED, epoch=0, view=v)
            np.testing.assert_array_equal(got[:, v], oracle.gather(decoded, idx, (8, 8), boxes, flips), err_msg=v)


def test_compact_views_with_ops_decode_once_and_serve_the_decoded_records_bytes(tmp_path):
    """Compact JPEG records (some stored RAW by the budget), two groups with ops: one kernel
    pass decodes each record once for all of its views (`kernels.prepare_serve_jpeg_views`), and every
    view is the oracle's crop of the record decoded whole, through pixel_ops' program."""
    imgs = T.images(6, 20, 24, seed=7)
    path = tmp_path / "c.tbl"
    tbljax.convert(
        {"image": imgs, "label": np.arange(6)}, path, image_size=20, format="jpeg", quality=90, progress=False
    )
    ds = tbljax.open(path)
    decoded = [ds.read(i) for i in range(len(ds))]
    views = {"a": (2, OP_LOCAL), "b": (3, tbljax.Augment(size=(7, 6), scale=(0.2, 0.9), ops=DINO_OPS))}
    b = next(iter(tbljax.loader(path, 6, seed=SEED, views=views, dtype="uint8")))
    idx, v = np.asarray(b["index"]), 0
    geo = tbljax.augment.RecordGeometry(*np.array([d.shape[:2] for d in decoded]).T)
    for name, (count, aug) in views.items():
        for k in range(count):
            boxes, flips = sample(aug, idx, geometry=geo, seed=SEED, epoch=0, view=v)
            codes, args = randaug.decide(aug.ops, idx, seed=SEED, epoch=0, view=v)
            pix = oracle.gather(decoded, idx, aug.size, boxes, flips)
            want = np.stack([pixel_ops.apply_all(im, c, a) for im, c, a in zip(pix, codes, args)])
            np.testing.assert_array_equal(np.asarray(b[name])[:, k], want, err_msg=f"{name} {k}")
            v += 1


def test_prepare_serve_jpeg_views_is_serve_jpeg_per_group_and_refuses_rows_not_record_major(tmp_path):
    """The one-decode pass writes each group exactly what serve_jpeg writes for it (the path
    that decodes each view's own box)."""
    from tbljax._src.engine import kernels

    imgs = T.images(5, 30, 26, seed=2)
    path = tmp_path / "k.tbl"
    tbljax.convert(
        {"image": imgs, "label": np.arange(5)}, path, image_size=26, format="jpeg", quality=85, progress=False
    )
    ds = tbljax.open(path)
    src = kernels.jpeg_source(*ds.jpeg_records())
    h, w = ds.read(0).shape[:2]
    rng = np.random.default_rng(0)
    records = np.array([4, 0, 2], np.int64)
    groups, want = [], []
    for count, size in ((2, (9, 8)), (3, (5, 5))):
        idx = np.repeat(records, count)
        ys, xs = rng.integers(0, h // 2, len(idx)), rng.integers(0, w // 2, len(idx))
        crop = np.stack([ys, xs, rng.integers(4, h - ys + 1), rng.integers(4, w - xs + 1)], 1).astype(np.int32)
        flip = rng.random(len(idx)) < 0.5
        ref = np.zeros((len(idx), *size, 3), np.float32)
        kernels.serve_jpeg(src, idx, ref, crop=crop, flip=flip, mean=(0.5,) * 3, std=(0.25,) * 3)
        want.append(ref)
        groups.append((count, idx, np.zeros_like(ref), crop, flip, None))
    kernels.prepare_serve_jpeg_views(src, groups, mean=(0.5,) * 3, std=(0.25,) * 3)()
    for (_, _, got, _, _, _), ref in zip(groups, want):
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    count, idx, out, crop, flip, ops = groups[1]
    bad = (count, idx[::-1].copy(), out, crop, flip, ops)
    with pytest.raises(ValueError, match=r"views: group 1 row 0 is not its record's view \(record-major\)"):
        kernels.prepare_serve_jpeg_views(src, [groups[0], bad], mean=(0.5,) * 3, std=(0.25,) * 3)()

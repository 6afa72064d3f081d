"""Serving with the new crop decisions, end to end, against the NumPy oracle (tests/oracle.py):
the evaluation loader (center crop, every record once, padded last batch, ``valid`` mask) on RAW
and LZ4 files; a size schedule's batches through the JAX, torch and MLX loaders and the
resident dataset, and a resumed run equal to an uninterrupted one bit for bit, across the size
change; and the clear error for a file of records of different sizes with no output size."""

from __future__ import annotations

import numpy as np
import pytest

import tbljax
from tbljax import order
from tbljax._src.rules import augment
from tbljax._src.rules.augment import Augment

import _loader_testing as T
import oracle

N, H, W, G = 37, 20, 14, 8
SCHEDULE = Augment(size={0: (4, 3), 2: (7, 5)})  # a bigger size from epoch 2 on
EPOCHS = 4


def _write(path, imgs, labels, lz4=False):
    with tbljax.Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im, lz4=lz4)
        w.set_metadata(labels=labels)
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("sizes")
    imgs = T.images(N, H, W, seed=3)
    labels = (np.arange(N) * 5) % 7
    return imgs, labels, _write(d / "raw.tbl", imgs, labels), _write(d / "lz4.tbl", imgs, labels, lz4=True)


def numpy_batches(ld):
    out = []
    for b in ld:
        out.append({k: np.array(v) for k, v in b.items()})  # copies: the ring is recycled
    return out


# ---- evaluation: center crop, every record once ----


@pytest.mark.parametrize("fmt", ["raw", "lz4"])
@pytest.mark.parametrize("dtype, layout", [("uint8", "NHWC"), ("float32", "NCHW")])
def test_eval_loader_serves_every_record_once_center_cropped(data, fmt, dtype, layout):
    imgs, labels, raw, lz4 = data
    aug = Augment(crop="center", flip=False, size=(9, 11))
    ld = tbljax.loader(
        raw if fmt == "raw" else lz4,
        G,
        shuffle=False,
        num_epochs=1,
        drop_remainder=False,
        augment=aug,
        dtype=dtype,
        layout=layout,
    )
    box = oracle.center_crop_box(H, W, 0.875)
    assert box == (4, 1, 12, 12)  # int(0.875 * 14) = 12, centred in 20 x 14
    for _ in range(2):  # an evaluation loader serves the whole set on every pass
        batches = numpy_batches(ld)
        assert len(batches) == -(-N // G)
        valid = np.concatenate([b["valid"] for b in batches])
        index = np.concatenate([b["index"] for b in batches])
        assert valid.sum() == N and sorted(index[valid].tolist()) == list(range(N))
        assert (index[~valid] == -1).all()
        for b in batches:
            idx = b["index"][b["valid"]]
            want = oracle.gather(
                imgs,
                idx,
                (9, 11),
                crop=[box] * len(idx),
                dtype=dtype,
                layout=layout,
                mean=tbljax.IMAGENET_MEAN,
                std=tbljax.IMAGENET_STD,
            )
            np.testing.assert_array_equal(b["image"][b["valid"]], want)
            np.testing.assert_array_equal(b["label"][b["valid"]], labels[idx])
            assert (b["image"][~b["valid"]] == 0).all() and (b["label"][~b["valid"]] == -1).all()


def test_eval_loader_through_torch(data):
    torch = pytest.importorskip("torch")
    import tbljax.torch

    imgs, labels, raw, _ = data
    aug = Augment(crop="center", flip=False, size=(9, 11), center_fraction=0.5)
    ld = tbljax.torch.loader(
        raw, 5, shuffle=False, drop_remainder=False, augment=aug, dtype="uint8", layout="NHWC", pin_memory=False
    )
    seen = []
    for b in ld:
        idx = b.index[b.valid].numpy()
        want = oracle.gather(imgs, idx, (9, 11), crop=[oracle.center_crop_box(H, W, 0.5)] * len(idx))
        assert b.images.dtype == torch.uint8
        np.testing.assert_array_equal(b.images[b.valid].numpy(), want)
        seen += idx.tolist()
    assert sorted(seen) == list(range(N))


# ---- a size schedule ----


def expected(imgs, labels, batch, epoch, seed, aug=SCHEDULE):
    """The oracle's batch: each row's crop box and flip by (seed, epoch, index), resized to the
    size of `epoch`."""
    idx = batch["index"]
    boxes = augment.crop_boxes(idx, height=H, width=W, seed=seed, epoch=epoch)
    flips = augment.flips(idx, seed=seed, epoch=epoch)
    return oracle.gather(imgs, idx, aug.size_at(epoch), crop=boxes, flip=flips), labels[idx]


def test_schedule_batches_take_the_size_of_their_epoch(data):
    imgs, labels, raw, _ = data
    ld = tbljax.loader(raw, G, seed=5, num_epochs=EPOCHS, augment=SCHEDULE, dtype="uint8")
    assert ld.row_shape == (4, 3, 3)
    batches = numpy_batches(ld)
    steps = len(ld)
    assert len(batches) == EPOCHS * steps
    for k, b in enumerate(batches):
        epoch = k // steps
        want = (G, 4, 3, 3) if epoch < 2 else (G, 7, 5, 3)
        assert b["image"].shape == want, (k, b["image"].shape)
        np.testing.assert_array_equal(
            b["index"], order.permute(np.arange(k % steps * G, (k % steps + 1) * G), N, 5, epoch)
        )
        image, label = expected(imgs, labels, b, epoch, seed=5)
        np.testing.assert_array_equal(b["image"], image)
        np.testing.assert_array_equal(b["label"], label)
    ld.set_epoch(3)
    assert ld.row_shape == (7, 5, 3)


@pytest.mark.parametrize("cut", [1, 6, 8, 9, 13])  # epoch 0; epoch 1, just before and at the
def test_schedule_resumes_exactly_across_the_change(data, cut):  # change; epoch 2; epoch 3
    _, _, raw, _ = data
    kw = dict(seed=2, num_epochs=EPOCHS, augment=SCHEDULE, dtype="bfloat16", layout="NCHW")
    whole = numpy_batches(tbljax.loader(raw, G, **kw))
    first = tbljax.loader(raw, G, **kw)
    head = []
    for b in first:
        head.append({k: np.array(v) for k, v in b.items()})
        if len(head) == cut:
            break
    state = first.state_dict()
    first.close()
    resumed = tbljax.loader(raw, G, **kw)
    resumed.load_state_dict(state)
    assert resumed.row_shape == whole[cut]["image"].shape[1:]
    rest = numpy_batches(resumed)
    assert len(head) + len(rest) == len(whole)
    for got, want in zip(head + rest, whole):
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype
            np.testing.assert_array_equal(got[k].view(np.uint8), want[k].view(np.uint8))


def test_schedule_shares_one_ring_allocated_once(data):
    imgs, labels, raw, _ = data
    from tbljax import HostLoader, LoaderOptions

    class Copies(HostLoader):
        def finisher(self):
            # Copies: nothing handed out views a slot, so a slot is only ever reused.
            return lambda hb: ((hb.epoch, hb.index.copy(), hb.image.copy()), [])

    opts = LoaderOptions(batch_size=G, seed=1, num_epochs=EPOCHS, augment=SCHEDULE, dtype="uint8")
    ld = Copies(tbljax.open(raw), opts)
    served = list(ld)
    assert {img.shape for _, _, img in served} == {(G, 4, 3, 3), (G, 7, 5, 3)}
    assert ld.metrics()["slots_replaced"] == 0  # no slot made after the ring's first ones
    for epoch, idx, img in served[::5]:
        want, _ = expected(imgs, labels, {"index": idx}, epoch, seed=1)
        np.testing.assert_array_equal(img, want)


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_schedule_through_the_adapters(data, framework):
    imgs, labels, raw, _ = data
    if framework == "torch":
        pytest.importorskip("torch")
        import tbljax.torch as adapter

        kw, to_numpy = dict(pin_memory=False), lambda t: t.numpy()
    else:
        pytest.importorskip("mlx.core")
        import tbljax.mlx as adapter

        kw, to_numpy = {}, np.array
    ld = adapter.loader(raw, G, seed=4, augment=SCHEDULE, dtype="uint8", layout="NHWC", **kw)
    for epoch in (1, 2):
        ld.set_epoch(epoch)
        for b in ld:
            images = to_numpy(b.images)
            assert images.shape == (G, *SCHEDULE.size_at(epoch), 3)
            want, _ = expected(imgs, labels, {"index": to_numpy(b.index)}, epoch, seed=4)
            np.testing.assert_array_equal(images, want)


def test_schedule_on_the_resident_dataset(data):
    jax = pytest.importorskip("jax")
    imgs, labels, raw, _ = data
    ds = tbljax.ResidentDataset(raw)
    kw = dict(batch_size=G, seed=6, dtype="uint8")
    loader = numpy_batches(tbljax.loader(raw, num_epochs=EPOCHS, augment=SCHEDULE, **kw))
    steps = N // G
    # Concrete step or epoch: the size of that epoch.
    for epoch, step in ((1, 3), (2, 0), (3, 2)):
        b = ds.batch(epoch * steps + step, augment=SCHEDULE, **kw)
        np.testing.assert_array_equal(np.asarray(b["image"]), loader[epoch * steps + step]["image"])
        b = ds.batch(step, epoch=epoch, augment=SCHEDULE, **kw)
        assert b["image"].shape == (G, *SCHEDULE.size_at(epoch), 3)
    # Traced: one jitted step per size, the epoch's Augment a static argument.
    traces = []  # jit traces once per compiled program: once per static Augment and shapes

    def step(ds, s, e, aug):
        traces.append(aug)
        return ds.batch(s, epoch=e, augment=aug, **kw)

    fn = jax.jit(step, static_argnames="aug")
    for epoch in range(EPOCHS):
        b = fn(ds, 1, epoch, SCHEDULE.at_epoch(epoch))
        np.testing.assert_array_equal(np.asarray(b["image"]), loader[epoch * steps + 1]["image"])
    assert len(traces) == 2  # one compiled step per size, not per epoch
    with pytest.raises(
        ValueError,
        match="one jitted step per size, passing "
        r"augment=aug.at_epoch\(epoch\)",
    ):
        jax.jit(lambda ds, s, e: ds.batch(s, epoch=e, augment=SCHEDULE, **kw))(ds, 1, 2)
    with pytest.raises(ValueError, match="one jitted step per size"):
        jax.jit(lambda ds, s: ds.batch(s, augment=SCHEDULE, **kw))(ds, 1)


# ---- records of different sizes ----


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    sizes = [(20, 14), (9, 30), (33, 33), (5, 7), (40, 12)]
    rng = np.random.default_rng(1)
    imgs = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    path = tmp_path_factory.mktemp("mixed") / "mixed.tbl"
    return _write(path, imgs, np.arange(len(sizes))), sizes


@pytest.mark.parametrize("spec", [None, "flip", Augment(crop=False), Augment()])
def test_records_of_different_sizes_need_an_output_size(mixed, spec):
    path, _ = mixed
    with pytest.raises(ValueError) as e:
        tbljax.loader(path, 2, augment=spec)
    msg = str(e.value)
    assert "mixed.tbl" in msg and "records of different sizes" in msg
    assert "augment=tbljax.Augment(size=(224, 224))" in msg
    assert "augment=tbljax.Augment(crop='center', flip=False, size=(224, 224))" in msg


def test_records_of_different_sizes_are_described_per_record(mixed):
    path, sizes = mixed
    from tbljax._src.engine.record_source import RecordSource

    src = RecordSource(tbljax.open(path), None)
    assert src.shape is None
    np.testing.assert_array_equal(src.geometry.heights, [h for h, _ in sizes])
    np.testing.assert_array_equal(src.geometry.widths, [w for _, w in sizes])
    for aug in (
        Augment(size=(8, 6)),
        Augment(crop="center", flip=False, size=(8, 6)),
        Augment(size={0: (4, 4), 3: (8, 6)}),
    ):
        ld = tbljax.loader(path, 2, augment=aug, num_epochs=4)
        ld.set_epoch(3)
        assert ld.row_shape == (8, 6, 3) and len(ld) == 2
        ld.close()

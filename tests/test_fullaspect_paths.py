"""Every serving path on a file of records of different sizes (full-aspect records, as
``convert(..., resize="max_side")`` writes them), bit for bit: the host loader (uint8 /
float32 / bfloat16, NHWC / NCHW, random-resized-crop and center crop, padded last batch), the
torch and MLX adapters, `ResidentDataset.batch` inside `jax.jit` (FFI handler and pure-JAX
twin) and `ops.gather_normalize` of a `PackedRecords` all give the batch the NumPy oracle
(tests/oracle.py) computes from each record's pixels and the boxes `tbljax.augment.sample`
draws for the indices the batch reports. Also: an LZ4 file serves what its RAW twin does; a
size schedule and a resume across its change; `tbljax show` and `tbljax bench` on such a
file, and what they say when no output size is given."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import tbljax
from tbljax._src.rules.augment import Augment, sample
from tbljax._src.rules.record_geometry import RecordGeometry

import oracle

# Portrait, landscape, square, tiny (upscaled) and large (shrunk several times: the
# antialiased filter reads many taps) records.
SIZES = [
    (20, 14),
    (9, 30),
    (33, 33),
    (5, 7),
    (40, 12),
    (17, 23),
    (64, 48),
    (12, 61),
    (26, 19),
    (48, 64),
    (8, 8),
    (31, 45),
    (70, 22),
]
N = len(SIZES)
MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)
SEED = 5
RRC = Augment(size=(8, 6))
CENTER = Augment(crop="center", flip=False, size=(7, 7))
AUGMENTS = {"rrc": RRC, "center": CENTER}
GEOMETRY = RecordGeometry(np.array([h for h, _ in SIZES]), np.array([w for _, w in SIZES]))


def _write(path, imgs, lz4=False):
    with tbljax.Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im, lz4=lz4)
        w.set_metadata(labels=(np.arange(len(imgs)) * 3) % 5)
    return str(path)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(records as a list of (H, W, 3) uint8 arrays, RAW file, LZ4 file)."""
    d = tmp_path_factory.mktemp("fullaspect")
    rng = np.random.default_rng(11)
    imgs = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]
    return imgs, _write(d / "raw.tbl", imgs), _write(d / "lz4.tbl", imgs, lz4=True)


def expected(imgs, idx, valid, aug, epoch, dtype, layout):
    """The oracle's batch for the valid rows of a batch that holds samples `idx`."""
    idx = np.asarray(idx)[np.asarray(valid, bool)]
    aug = aug.at_epoch(epoch)
    boxes, flips = sample(aug, idx, geometry=GEOMETRY, seed=SEED, epoch=epoch)
    return oracle.gather(imgs, idx, aug.size, crop=boxes, flip=flips, dtype=dtype, layout=layout, mean=MEAN, std=STD)


def same(got, want):
    """Bit for bit (float32 and bfloat16 compared as their bit patterns)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_array_equal(got.view(f"u{got.dtype.itemsize}"), want.view(f"u{want.dtype.itemsize}"))


def loader_batches(path, aug, dtype, layout, epochs=2, **kw):
    """[(epoch, image, index, valid, label)] of the JAX loader, copied out of the ring."""
    ld = tbljax.loader(
        path, 4, seed=SEED, num_epochs=epochs, dtype=dtype, layout=layout, mean=MEAN, std=STD, augment=aug, **kw
    )
    steps = len(ld)
    out = []
    for k, b in enumerate(ld):
        valid = np.array(b["valid"]) if "valid" in b else np.ones(len(b["index"]), bool)
        out.append((k // steps, np.array(b["image"]), np.array(b["index"]), valid, np.array(b["label"])))
    return out


@pytest.mark.parametrize("crop", ["rrc", "center"])
@pytest.mark.parametrize("dtype", ["uint8", "float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_host_loader_equals_the_oracle(mixed, crop, dtype, layout):
    imgs, raw, _ = mixed
    batches = loader_batches(raw, AUGMENTS[crop], dtype, layout, drop_remainder=False)
    served = []
    for epoch, image, idx, valid, label in batches:
        same(image[valid], expected(imgs, idx, valid, AUGMENTS[crop], epoch, dtype, layout))
        assert (image[~valid] == 0).all() and (idx[~valid] == -1).all()
        np.testing.assert_array_equal(label[valid], (idx[valid] * 3) % 5)
        served.append(idx[valid])
    # Every record once an epoch: 13 records in batches of 4, the last one padded.
    assert len(batches) == 8
    for e in range(2):
        assert sorted(np.concatenate(served[4 * e : 4 * e + 4]).tolist()) == list(range(N))


def host(x):
    """A torch tensor or an mx.array as a NumPy array."""
    return x.numpy() if hasattr(x, "numpy") else np.array(x)


@pytest.mark.parametrize("framework", ["torch", "mlx"])
@pytest.mark.parametrize("crop", ["rrc", "center"])
def test_adapters_equal_the_loader_and_the_oracle(mixed, framework, crop):
    imgs, raw, _ = mixed
    if framework == "torch":
        pytest.importorskip("torch")
        import tbljax.torch as adapter
    else:
        pytest.importorskip("mlx.core")
        import tbljax.mlx as adapter
    aug = AUGMENTS[crop]
    ref = loader_batches(raw, aug, "float32", "NCHW", drop_remainder=False)
    ld = adapter.loader(
        raw, 4, seed=SEED, dtype="float32", layout="NCHW", mean=MEAN, std=STD, augment=aug, drop_remainder=False
    )
    got = []
    for epoch in range(2):
        ld.set_epoch(epoch)
        for b in ld:
            got.append((b.epoch, *(host(x) for x in (b.images, b.index, b.valid))))
    assert len(got) == len(ref)
    for (epoch, image, idx, valid), (r_epoch, r_image, r_idx, r_valid, _) in zip(got, ref):
        assert epoch == r_epoch
        np.testing.assert_array_equal(idx, r_idx)
        np.testing.assert_array_equal(valid, r_valid)
        same(image, r_image)
        same(image[valid], expected(imgs, idx, valid, aug, epoch, "float32", "NCHW"))


@pytest.fixture(scope="module")
def resident(mixed):
    return tbljax.ResidentDataset(mixed[1])


# The twin compiles slowly for large shrink factors (24 taps per axis here): one case of it.
@pytest.mark.parametrize(
    "backend, crop, dtype, layout",
    [
        ("ffi", "rrc", "uint8", "NHWC"),
        ("ffi", "rrc", "bfloat16", "NCHW"),
        ("ffi", "center", "float32", "NHWC"),
        ("twin", "rrc", "bfloat16", "NCHW"),
    ],
)
def test_resident_dataset_in_jit_equals_the_loader_and_the_oracle(mixed, resident, backend, crop, dtype, layout):
    import jax

    imgs, raw, _ = mixed
    aug = AUGMENTS[crop]
    assert resident.image_shape is None and isinstance(resident.data, tbljax.ops.PackedRecords)
    ref = loader_batches(raw, aug, dtype, layout)  # full batches, as ResidentDataset serves
    step = jax.jit(
        lambda ds, s: ds.batch(
            s, batch_size=4, seed=SEED, augment=aug, mean=MEAN, std=STD, dtype=dtype, layout=layout, backend=backend
        )
    )
    assert len(ref) == 2 * resident.steps_per_epoch(4)
    for s, (epoch, image, idx, valid, label) in enumerate(ref):
        b = step(resident, s)
        np.testing.assert_array_equal(np.asarray(b["index"]), idx)
        np.testing.assert_array_equal(np.asarray(b["label"]), label)
        same(b["image"], image)
        same(b["image"], expected(imgs, idx, valid, aug, epoch, dtype, layout))


def test_resident_dataset_of_packed_records_closed_over_is_refused(resident):
    import jax

    with pytest.raises(ValueError, match="Pass the dataset as an argument"):
        jax.jit(lambda s: resident.batch(s, batch_size=4, augment=RRC))(0)


def packed_by_hand(imgs):
    """PackedRecords as its docstring lays them out: record i's HWC bytes from the start of
    page table[i, 0] of a (P, PAGE_BYTES) uint8 array; table rows (first page, H, W)."""
    page = tbljax.ops.PAGE_BYTES
    table, first = [], 0
    for im in imgs:
        table.append((first, im.shape[0], im.shape[1]))
        first += -(-im.nbytes // page)
    pages = np.zeros((first, page), np.uint8)
    flat = pages.reshape(-1)
    for (start, _, _), im in zip(table, imgs):
        flat[start * page : start * page + im.nbytes] = im.reshape(-1)
    return pages, np.array(table, np.int32)


@pytest.mark.parametrize(
    "backend, dtype, layout",
    [("ffi", "uint8", "NCHW"), ("ffi", "float32", "NHWC"), ("ffi", "bfloat16", "NHWC"), ("twin", "float32", "NHWC")],
)
def test_gather_normalize_of_packed_records_equals_the_oracle(mixed, resident, backend, dtype, layout):
    import jax
    import jax.numpy as jnp

    from tbljax import ops

    imgs = mixed[0]
    pages, table = packed_by_hand(imgs)
    layout_table, n_pages = ops.pack_layout([h for h, _ in SIZES], [w for _, w in SIZES])
    np.testing.assert_array_equal(layout_table, table)
    assert n_pages == len(pages)
    np.testing.assert_array_equal(np.asarray(resident.data.table), table)
    np.testing.assert_array_equal(np.asarray(resident.data.pages), pages)
    data = ops.PackedRecords(jnp.asarray(pages), jnp.asarray(table), max(max(s) for s in SIZES))
    out_dtype = {"uint8": jnp.uint8, "float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    norm = {} if dtype == "uint8" else {"mean": MEAN, "std": STD}

    @jax.jit
    def step(data, idx, boxes, flips):
        return ops.gather_normalize(
            data, idx, crop=boxes, flip=flips, out_size=(8, 6), dtype=out_dtype, layout=layout, backend=backend, **norm
        )

    idx = np.array([6, 3, 9, 0, 12, 6, 1, 7, 11, 4], np.int32)  # record 6 twice
    for epoch in range(2):
        boxes, flips = sample(RRC, idx, geometry=GEOMETRY, seed=SEED, epoch=epoch)
        same(step(data, idx, boxes, flips), expected(imgs, idx, np.ones(len(idx), bool), RRC, epoch, dtype, layout))


def test_lz4_file_serves_what_its_raw_twin_does(mixed):
    _, raw, lz4 = mixed
    for aug in AUGMENTS.values():
        a = loader_batches(raw, aug, "float32", "NHWC", drop_remainder=False)
        b = loader_batches(lz4, aug, "float32", "NHWC", drop_remainder=False)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            for u, v in zip(x[1:], y[1:]):
                same(u, v)
    res_raw, res_lz4 = tbljax.ResidentDataset(raw), tbljax.ResidentDataset(lz4)
    same(res_lz4.data.pages, res_raw.data.pages)
    same(
        res_lz4.batch(1, batch_size=4, seed=SEED, augment=RRC)["image"],
        res_raw.batch(1, batch_size=4, seed=SEED, augment=RRC)["image"],
    )


SCHEDULE = Augment(size={0: (6, 5), 2: (9, 7)})


def test_size_schedule_across_epochs(mixed):
    imgs, raw, _ = mixed
    batches = loader_batches(raw, SCHEDULE, "uint8", "NHWC", epochs=4)
    assert len(batches) == 4 * 3
    for epoch, image, idx, valid, _ in batches:
        assert image.shape[1:3] == ((6, 5) if epoch < 2 else (9, 7))
        same(image, expected(imgs, idx, valid, SCHEDULE, epoch, "uint8", "NHWC"))


@pytest.mark.parametrize("cut", [4, 6, 7])  # in epoch 1; at the change (epoch 2); in epoch 2
def test_resume_across_the_size_change(mixed, cut):
    _, raw, _ = mixed
    whole = loader_batches(raw, SCHEDULE, "float32", "NCHW", epochs=4)

    def make():
        return tbljax.loader(
            raw, 4, seed=SEED, num_epochs=4, dtype="float32", layout="NCHW", mean=MEAN, std=STD, augment=SCHEDULE
        )

    first = make()
    it = iter(first)
    for _ in range(cut):
        next(it)
    state = first.state_dict()
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [(np.array(b["image"]), np.array(b["index"])) for b in resumed]
    assert len(rest) == len(whole) - cut
    for (image, idx), ref in zip(rest, whole[cut:]):
        np.testing.assert_array_equal(idx, ref[2])
        same(image, ref[1])


def cli(*args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "tbljax", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("command", ["show", "bench"])
def test_show_and_bench_say_what_to_pass_without_an_output_size(mixed, command, tmp_path):
    raw = mixed[1]
    for extra in ([], ["--augment", "flip"]):
        r = cli(
            command,
            raw,
            *extra,
            "--out" if command == "show" else "--steps",
            tmp_path / "g.png" if command == "show" else 2,
        )
        assert r.returncode == 2, r.stderr
        assert "raw.tbl: its records have different sizes" in r.stderr
        assert "--augment rrc_flip --size 224" in r.stderr and "--center-crop --size 224" in r.stderr
    r = cli(
        command,
        raw,
        "--size",
        8,
        "--out" if command == "show" else "--steps",
        tmp_path / "g.png" if command == "show" else 2,
    )
    assert r.returncode == 2 and "--size S resizes a crop" in r.stderr, r.stderr
    r = cli(
        command,
        raw,
        "--center-crop",
        "--out" if command == "show" else "--steps",
        tmp_path / "g.png" if command == "show" else 2,
    )
    assert r.returncode == 2 and "--center-crop takes --size S" in r.stderr, r.stderr
    assert not (tmp_path / "g.png").exists()


def test_show_draws_center_crops_of_full_aspect_records(mixed, tmp_path):
    Image = pytest.importorskip("PIL.Image")
    from tbljax._src.tools.show import sample_grid

    imgs, raw, _ = mixed
    grid, captions = sample_grid(raw, count=N, columns=N, augment=CENTER)
    want = oracle.gather(imgs, np.arange(N), (7, 7), crop=[oracle.center_crop_box(h, w, 0.875) for h, w in SIZES])
    tiles = grid[1:8].reshape(7, N, 9, 3)[:, :, 1:8].transpose(1, 0, 2, 3)
    np.testing.assert_array_equal(tiles, want)
    assert captions[0] == "0: 0" and len(captions) == N
    out = tmp_path / "g.png"
    for flags in (["--center-crop", "--size", 7], ["--augment", "rrc_flip", "--size", 9]):
        r = cli("show", raw, "--out", out, "--count", 6, *flags)
        assert r.returncode == 0, r.stderr
        with Image.open(out) as im:
            assert im.format == "PNG" and im.width > 6 * (flags[-1] + 2)


@pytest.mark.parametrize(
    "flags, augment",
    [
        (["--augment", "rrc_flip", "--size", 8], "Augment(crop=True, flip=True, size=(8, 8)"),
        (["--center-crop", "--size", 8], "Augment(crop='center', flip=False, size=(8, 8)"),
    ],
)
def test_bench_measures_full_aspect_records(mixed, flags, augment):
    r = cli("bench", mixed[1], "--batch-size", 4, "--steps", 2, "--json", *flags)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["settings"]["augment"].startswith(augment), report["settings"]
    assert report["produce_img_s"] > 0 and report["consumed_img_s"] > 0

"""Tests of tbljax.ResidentDataset: the chunked upload (one file, shard files, LZ4 records), the
batches drawn inside jit against the real loader for the same (seed, epoch, step) with and
without augmentation, the closure guard, the memory check, and 8 CPU devices (replicated, and
records partitioned over a mesh axis) in a subprocess."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tbljax
from tbljax._src.jax import sharding
from tbljax._src.jax.resident import ResidentDataset
from tbljax._src.jax.resident_host import check_device_memory, host_rows

N, H, W, G = 40, 20, 24, 8  # 5 steps per epoch


def _write(path, imgs, labels, lz4=False):
    with tbljax.Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im, lz4=lz4)
        w.set_metadata(labels=labels)
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("resident")
    imgs = np.random.default_rng(0).integers(0, 256, (N, H, W, 3), dtype=np.uint8)
    labels = (np.arange(N) * 7) % 11
    return _write(d / "x.tbl", imgs, labels), imgs, labels


@pytest.fixture(scope="module")
def resident(data):
    return ResidentDataset(data[0], chunk_bytes=H * W * 3 * 7)  # 7 records per upload chunk


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_upload_holds_the_records_and_labels(data, resident):
    _, imgs, labels = data
    assert resident.data.shape == (N, H, W, 3) and resident.data.dtype == jnp.uint8
    assert np.array_equal(np.asarray(resident.data), imgs)
    assert np.array_equal(np.asarray(resident.labels), labels)
    assert len(resident) == N and resident.nbytes == imgs.nbytes
    leaves, tree = jax.tree_util.tree_flatten(resident)
    assert len(leaves) == 2
    assert jax.tree_util.tree_unflatten(tree, leaves).fingerprint == resident.fingerprint


def test_upload_reads_the_memory_map_in_place_and_crosses_shard_files(data, tmp_path):
    _, imgs, labels = data
    parts = [
        _write(tmp_path / f"s{k}.tbl", imgs[a:b], labels[a:b]) for k, (a, b) in enumerate([(0, 13), (13, 14), (14, N)])
    ]
    ds = tbljax.open(parts)
    views = ds.shard_views()
    starts = np.array([0, 13, 14, N])
    chunk = host_rows(ds, views, starts, 2, 9, (H, W))
    assert np.shares_memory(chunk, views[0])  # a slice of the map, not a copy
    assert np.array_equal(host_rows(ds, views, starts, 10, 20, (H, W)), imgs[10:20])
    up = ResidentDataset(parts, chunk_bytes=H * W * 3 * 6)  # chunks straddle both boundaries
    assert np.array_equal(np.asarray(up.data), imgs)
    assert np.array_equal(np.asarray(up.labels), labels)


def test_lz4_records_are_decoded_on_the_way_up(data, tmp_path):
    _, imgs, labels = data
    imgs = np.repeat(imgs[:, :1], H, axis=1)  # repeated rows: LZ4 shrinks them
    path = _write(tmp_path / "lz4.tbl", imgs, labels, lz4=True)
    assert tbljax.open(path).record_format == "lz4"
    assert np.array_equal(np.asarray(ResidentDataset(path, chunk_bytes=1).data), imgs)


@pytest.mark.parametrize(
    "augment, dtype, layout",
    [
        (None, "float32", "NHWC"),
        ("flip", "bfloat16", "NCHW"),
        ("rrc_flip", "float32", "NHWC"),
        (tbljax.Augment(size=(16, 12), scale=(0.2, 1.0)), "uint8", "NCHW"),
        (tbljax.Augment(size=(16, 12)), "bfloat16", "NHWC"),
    ],
    ids=["plain", "flip", "rrc_flip", "rrc_uint8", "rrc_bf16"],
)
def test_batches_equal_the_loader_over_two_epochs(data, resident, augment, dtype, layout):
    path = data[0]
    kw = dict(seed=3, augment=augment, dtype=dtype, layout=layout)
    loader = tbljax.loader(path, G, num_epochs=2, **kw)
    traces = []

    @jax.jit
    def step_fn(ds, step):
        traces.append(1)
        return ds.batch(step, batch_size=G, **kw)

    n = 0
    for step, want in enumerate(loader):
        got = step_fn(resident, step)  # one compiled program for every step and epoch
        for key in ("image", "label", "index"):
            assert _same(got[key], want[key]), (step, key)
        n += 1
    assert n == 2 * (N // G) and len(traces) == 1


def test_explicit_epoch_eager_call_and_no_shuffle(data, resident):
    loader = tbljax.loader(data[0], G, seed=9, augment="rrc_flip", num_epochs=3)
    loader.set_epoch(2)
    want = list(loader)
    f = jax.jit(lambda ds, s, e: ds.batch(s, epoch=e, batch_size=G, seed=9, augment="rrc_flip"))
    for s, b in enumerate(want):
        assert _same(f(resident, s, 2)["image"], b["image"]), s
    # Outside jit: a cached jitted program; the global step 2 * 5 + 1 is step 1 of epoch 2.
    eager = resident.batch(2 * (N // G) + 1, batch_size=G, seed=9, augment="rrc_flip")
    assert _same(eager["image"], want[1]["image"])
    plain = resident.batch(1, batch_size=G, shuffle=False, dtype="uint8")
    assert np.array_equal(np.asarray(plain["index"]), np.arange(G, 2 * G))
    assert np.array_equal(np.asarray(plain["image"]), data[1][G : 2 * G])


def test_twin_backend_gives_the_same_batches(resident):
    kw = dict(batch_size=G, seed=1, augment="rrc_flip", dtype="bfloat16")
    f = jax.jit(lambda ds, s, backend: ds.batch(s, backend=backend, **kw), static_argnums=2)
    for s in (0, 7):
        assert _same(f(resident, s, "twin")["image"], f(resident, s, "ffi")["image"])


def test_closing_over_the_dataset_is_refused(resident):
    f = jax.jit(lambda s: resident.batch(s, batch_size=G))
    with pytest.raises(ValueError, match=r"Pass the dataset as an argument of the jitted "):
        f(0)


def test_dataset_that_does_not_fit_is_a_clear_error(data):
    with pytest.raises(
        MemoryError,
        match=r"needs 0.1 MiB per device .* but only 0.0 MiB fit "
        r"\(max_bytes=1000\)",
    ):
        ResidentDataset(data[0], max_bytes=1000)
    # Far beyond this machine: without memory_stats (CPU) the default limit is the free RAM.
    with pytest.raises(MemoryError, match=r"available host RAM"):
        check_device_memory((1 << 40, 1000, 1000, 3), sharding.data_sharding(None), None)


def test_batch_argument_errors(data, resident):
    with pytest.raises(ValueError, match=r"batch_size 48 is larger than the dataset"):
        resident.batch(0, batch_size=48)
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1"):
        resident.batch(0, batch_size=0)
    with pytest.raises(ValueError, match=r"augment must be None, 'rrc_flip', 'flip'"):
        resident.batch(0, batch_size=G, augment="crop")
    with pytest.raises(ValueError, match=r"sharding must be a NamedSharding \(or Mesh\) on the "):
        resident.batch(0, batch_size=G, sharding="batch")
    with pytest.raises(TypeError, match=r"sharding must be None, a jax.sharding.Mesh"):
        ResidentDataset(data[0], sharding="batch")


_EIGHT = textwrap.dedent("""
    import sys
    import numpy as np, jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tbljax
    path = sys.argv[1]
    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("batch", "data"))
    cases = [
        # (dataset sharding, batch sharding, collectives allowed in the step)
        (None, None, ()),                                   # a copy per device, batch over 8
        (NamedSharding(mesh, P()), NamedSharding(mesh, P("batch")), ()),
        (NamedSharding(mesh, P("data")), None, ("all-reduce",)),  # records split in 2
    ]
    for data_sharding, batch_sharding, allowed in cases:
        ds = tbljax.ResidentDataset(path, data_sharding, chunk_bytes=20 * 24 * 3 * 5)
        local = ds.data.addressable_shards[0].data.shape[0]
        assert local == (20 if data_sharding is not None and data_sharding.spec == P("data")
                         else 40), local
        f = jax.jit(lambda ds, s: ds.batch(s, batch_size=16, seed=3, augment="rrc_flip",
                                           sharding=batch_sharding))
        loader = tbljax.loader(path, 16, seed=3, augment="rrc_flip", num_epochs=2)
        for s, want in enumerate(loader):
            got = f(ds, s)
            for k in ("image", "label", "index"):
                assert np.array_equal(np.asarray(got[k]), np.asarray(want[k])), (s, k)
        parts = got["image"].sharding.shard_shape(got["image"].shape)[0]
        assert parts == (2 if batch_sharding is None and data_sharding is None else 4), parts
        text = f.lower(ds, 0).compile().as_text()
        for op in ("all-gather", "all-to-all", "all-reduce", "collective-permute"):
            assert (op in text) == (op in allowed), (data_sharding, op)
    print("OK")
""")


def test_eight_devices_replicated_and_records_partitioned(data):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _EIGHT, data[0]], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


# ---- record fields on the device ----


def _fields_source(n=16):
    """A dict source: images, a fixed float16 (4,) field, a scalar bool, a ragged int32 and a str."""
    rng = np.random.default_rng(5)
    return {
        "image": rng.integers(0, 256, (n, 12, 12, 3), np.uint8),
        "label": np.arange(n) % 3,
        "emb": rng.standard_normal((n, 4)).astype(np.float16),
        "flag": np.arange(n) % 2 == 0,
        "tok": [rng.integers(1, 99, i % 5).astype(np.int32) for i in range(n)],
        "caption": [f"c{i}" for i in range(n)],
    }


@pytest.fixture(scope="module")
def with_fields(tmp_path_factory):
    src = _fields_source()
    path = tmp_path_factory.mktemp("resident_fields") / "f.tbl"
    tbljax.convert(src, path, image_size=12, progress=False)
    return str(path), src


def _padded(tok, idx, length):
    out = np.zeros((len(idx), length), np.int32)
    for r, i in enumerate(idx):
        out[r, : min(length, len(tok[i]))] = tok[i][:length]
    return out


def test_numeric_fields_are_drawn_in_jit_by_the_same_indices(with_fields):
    path, src = with_fields
    ds = ResidentDataset(path, pad={"tok": 3})  # "all": the ndarray fields; the str is left out
    assert sorted(ds.fields) == ["emb", "flag", "tok", "tok_length"]
    step = jax.jit(lambda ds, s: ds.batch(s, batch_size=4, seed=1, augment="rrc_flip"))
    for s in range(8):  # two epochs
        b = step(ds, s)
        idx = np.asarray(b["index"])
        assert sorted(b) == ["emb", "flag", "image", "index", "label", "tok", "tok_length"]
        np.testing.assert_array_equal(np.asarray(b["emb"]), src["emb"][idx])
        np.testing.assert_array_equal(np.asarray(b["flag"]), src["flag"][idx])
        np.testing.assert_array_equal(np.asarray(b["tok"]), _padded(src["tok"], idx, 3))
        assert np.asarray(b["tok_length"]).tolist() == [len(src["tok"][i]) for i in idx]
    only = ResidentDataset(path, fields=["emb"])
    assert sorted(only.fields) == ["emb"] and sorted(ResidentDataset(path, fields=None, pad=None).fields) == []


def test_by_default_it_holds_what_a_device_array_can_and_says_what_it_left_out(with_fields):
    path, src = with_fields
    ds = ResidentDataset(path)  # a ragged field without pad= and a str field: left out, said
    assert sorted(ds.fields) == ["emb", "flag"]
    assert sorted(ds.left_out) == ["caption", "tok"]
    assert "pad=" in ds.left_out["tok"] and "str" in ds.left_out["caption"]
    np.testing.assert_array_equal(np.asarray(ds.fields["emb"]), src["emb"])
    assert ResidentDataset(path, pad={"tok": 3}).left_out == {"caption": ds.left_out["caption"]}
    assert ResidentDataset(path, fields=["emb"]).left_out == {}


def test_resident_fields_it_cannot_hold_are_refused_by_name(with_fields):
    path, _ = with_fields
    with pytest.raises(ValueError, match="field 'tok' is ragged.*pad="):
        ResidentDataset(path, fields=["emb", "tok"])
    with pytest.raises(ValueError, match="field 'caption' is str, which cannot be a device array"):
        ResidentDataset(path, fields=["caption"])
    with pytest.raises(KeyError, match="no field 'nope'"):
        ResidentDataset(path, fields=["nope"])
    with pytest.raises(ValueError, match="pad\\['emb'\\]: field 'emb' is fixed"):
        ResidentDataset(path, fields=["emb"], pad={"emb": 2})


_EIGHT_FIELDS = textwrap.dedent("""
    import sys
    import numpy as np, jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tbljax
    path, emb, flag = sys.argv[1], np.load(sys.argv[2]), np.load(sys.argv[3])
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("batch", "data"))
    ds = tbljax.ResidentDataset(path, NamedSharding(mesh, P("data")), fields=["emb", "flag"])
    assert ds.fields["emb"].addressable_shards[0].data.shape == (8, 4)  # records split in 2
    f = jax.jit(lambda ds, s: ds.batch(s, batch_size=8, seed=2))
    for s in range(4):
        b = f(ds, s)
        idx = np.asarray(b["index"])
        assert np.array_equal(np.asarray(b["emb"]), emb[idx]) and np.array_equal(np.asarray(b["flag"]), flag[idx])
    print("OK")
""")


def test_eight_devices_fields_with_records_partitioned(with_fields, tmp_path):
    path, src = with_fields
    np.save(tmp_path / "emb.npy", src["emb"])
    np.save(tmp_path / "flag.npy", src["flag"])
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    r = subprocess.run(
        [sys.executable, "-c", _EIGHT_FIELDS, path, str(tmp_path / "emb.npy"), str(tmp_path / "flag.npy")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


def test_upload_under_x64_same_and_different_sizes(data, tmp_path):
    """Under jax_enable_x64 the upload's start indices and zeros agree in dtype (int64 literals
    beside an int32 start were a TypeError), for same-size rows and packed pages alike."""
    path, imgs, _ = data
    small = np.random.default_rng(1).integers(0, 256, (2, 5, 7, 3), dtype=np.uint8)
    mixed = _write(tmp_path / "mixed.tbl", [imgs[0], small[0], small[1]], np.arange(3))
    with jax.enable_x64(True):
        rows = ResidentDataset(path, chunk_bytes=H * W * 3 * 7)
        packed = ResidentDataset(mixed, chunk_bytes=1)  # a chunk per record: several page writes
    assert np.array_equal(np.asarray(rows.data), imgs)
    pages, table = np.asarray(packed.data.pages).reshape(-1), np.asarray(packed.data.table)
    for want, (page, h, w) in zip([imgs[0], small[0], small[1]], table):
        start = int(page) * 4096
        assert (h, w) == want.shape[:2]
        assert np.array_equal(pages[start : start + want.size], want.reshape(-1))

"""GPU tests of the CUDA handler (tbljax._ffi_cuda): on the GPU it must give what the host
kernel gives, bit for bit, for every dtype x layout x crop x flip; all 256 values per channel;
out-of-range rows never read outside the dataset; donated outputs; a ResidentDataset on the
GPU serves the loader's batches, NaFlex rows with timm's recipe (the twin) too. Without a CUDA
device (or without the module) every test skips; with TBLJAX_REQUIRE_CUDA=1
(benchmarks/gpu_check.sh sets it) they fail instead."""

import os

import jax
import ml_dtypes
import numpy as np
import pytest

from tbljax import ops
from tbljax._src.engine import kernels

REQUIRE = os.environ.get("TBLJAX_REQUIRE_CUDA", "") == "1"
BF16 = np.dtype(ml_dtypes.bfloat16)
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _gpu():
    try:
        devices = jax.devices("cuda")
    except RuntimeError as e:
        why = f"no CUDA device ({e})"
    else:
        status = ops.registered_platforms().get("cuda", "not registered")
        if not devices:
            why = "no CUDA device"
        elif not status.startswith("registered"):
            why = f"the CUDA handler is {status}"
        else:
            return devices[0]
    if REQUIRE:
        pytest.fail(f"TBLJAX_REQUIRE_CUDA=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def gpu():
    return _gpu()


N, H, W, B, OUT = 12, 13, 11, 6, (9, 14)
RECORDS = np.random.default_rng(0).integers(0, 256, (N, H, W, 3), dtype=np.uint8)
IDX = np.array([3, 0, 11, 7, 7, 5])
CROPS = np.array([[0, 0, 13, 11], [2, 3, 8, 6], [1, 1, 5, 10], [0, 5, 13, 3], [12, 10, 1, 1], [4, 2, 9, 9]], np.int32)
FLIPS = np.array([1, 0, 1, 0, 1, 1], bool)


def _same(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _host(idx, dtype, layout, crop, flip, out_hw, mean, std):
    oh, ow = out_hw
    shape = (len(idx), oh, ow, 3) if layout == "NHWC" else (len(idx), 3, oh, ow)
    return kernels.gather(RECORDS, idx, np.empty(shape, dtype), layout=layout, crop=crop, flip=flip, mean=mean, std=std)


@pytest.mark.parametrize("flip", [False, True], ids=["noflip", "flip"])
@pytest.mark.parametrize("crop", [False, True], ids=["nocrop", "crop"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", [np.dtype(np.uint8), np.dtype(np.float32), BF16], ids=lambda d: d.name)
def test_cuda_handler_matches_host_kernel(gpu, dtype, layout, crop, flip):
    norm = dtype != np.uint8
    mean, std = IMAGENET if norm else (None, None)
    c, f = (CROPS if crop else None), (FLIPS if flip else None)
    hw = OUT if crop else (H, W)
    want = _host(IDX, dtype, layout, c, f, hw, mean, std)
    data = jax.device_put(RECORDS, gpu)
    kw = dict(mean=mean, std=std, dtype=dtype, layout=layout, out_size=hw if crop else None)
    f_jit = jax.jit(
        lambda d, i, c, fl, backend: ops.gather_normalize(d, i, crop=c, flip=fl, backend=backend, **kw),
        static_argnums=4,
    )
    args = [jax.device_put(x, gpu) if x is not None else None for x in (IDX, c, f)]
    got = f_jit(data, *args, "ffi")
    assert list(got.devices())[0].platform == "gpu"
    assert _same(got, want)
    assert _same(f_jit(data, *args, "auto"), want)
    assert _same(f_jit(data, *args, "twin"), want)


def test_auto_lowers_to_the_cuda_handler(gpu):
    f = jax.jit(lambda d, i: ops.gather_normalize(d, i))
    text = f.lower(jax.device_put(RECORDS, gpu), jax.device_put(IDX, gpu)).compile().as_text()
    assert 'custom_call_target="tbljax_gather_normalize"' in text


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
def test_all_256_values_per_channel(gpu, dtype):
    v = np.arange(256).reshape(16, 16)
    img = np.stack([(v + 85 * c) % 256 for c in range(3)], axis=-1).astype(np.uint8)[None]
    for mean, std in (IMAGENET, ((0.5, -0.25, 3.0), (0.1, 2.0, 1e-3))):
        table = kernels.normalize_table(mean, std, dtype)
        got = ops.gather_normalize(
            jax.device_put(img, gpu), jax.device_put(np.array([0]), gpu), mean=mean, std=std, dtype=dtype, backend="ffi"
        )
        assert _same(got, table[np.arange(3), img[0]][None])


def test_int64_indices_and_random_resized_crops(gpu):
    from tbljax._src.rules import augment

    idx = np.random.default_rng(1).integers(0, N, 300)
    boxes = augment.crop_boxes(idx, height=H, width=W, seed=5, epoch=2)
    flips = augment.flips(idx, seed=5, epoch=2)
    want = _host(idx, BF16, "NCHW", boxes, flips, (31, 7), *IMAGENET)
    with jax.enable_x64(True):
        got = jax.jit(
            lambda d, i, c, f: ops.gather_normalize(
                d,
                i,
                crop=c,
                flip=f,
                out_size=(31, 7),
                mean=IMAGENET[0],
                std=IMAGENET[1],
                dtype=BF16,
                layout="NCHW",
                backend="ffi",
            )
        )(
            jax.device_put(RECORDS, gpu),
            jax.device_put(idx.astype(np.int64), gpu),
            jax.device_put(boxes, gpu),
            jax.device_put(flips, gpu),
        )
    assert _same(got, want)


def test_out_of_range_rows_are_zero_and_nothing_crashes(gpu):
    f = jax.jit(lambda d, i, c: ops.gather_normalize(d, i, crop=c, out_size=(4, 4), backend="ffi"))
    crop = np.array([[0, 0, 4, 4], [0, 0, 4, 4], [10, 0, 5, 3]], np.int32)
    got = np.asarray(
        f(jax.device_put(RECORDS, gpu), jax.device_put(np.array([1, 99, 2]), gpu), jax.device_put(crop, gpu))
    )
    assert np.all(got[1] == 0) and np.all(got[2] == 0)
    assert _same(got[:1], _host([1], np.float32, "NHWC", crop[:1], None, (4, 4), None, None))


def test_donated_output(gpu):
    f = jax.jit(lambda d, i, o: ops.gather_normalize(d, i, out=o, backend="ffi"), donate_argnums=2)
    out = jax.device_put(np.zeros((B, H, W, 3), np.float32), gpu)
    got = f(jax.device_put(RECORDS, gpu), jax.device_put(IDX, gpu), out)
    assert out.is_deleted()
    assert _same(got, _host(IDX, np.float32, "NHWC", None, None, (H, W), None, None))


def test_resident_dataset_on_the_gpu_serves_the_loaders_batches(gpu, tmp_path):
    import tbljax

    path = str(tmp_path / "x.tbl")
    with tbljax.Writer(path, 40) as w:
        for im in np.random.default_rng(2).integers(0, 256, (40, 20, 24, 3), dtype=np.uint8):
            w.add_raw(im)
        w.set_metadata(labels=np.arange(40) % 5)
    ds = tbljax.ResidentDataset(path, jax.sharding.Mesh(np.array([gpu]), ("batch",)))
    assert ds.data.devices() == {gpu}
    f = jax.jit(lambda ds, s: ds.batch(s, batch_size=8, seed=4, augment="rrc_flip", dtype="bfloat16"))
    loader = tbljax.loader(
        path,
        8,
        seed=4,
        augment="rrc_flip",
        dtype="bfloat16",
        num_epochs=2,
        sharding=jax.sharding.Mesh(np.array([jax.devices("cpu")[0]]), ("batch",)),
    )
    for s, want in enumerate(loader):
        got = f(ds, s)
        for k in ("image", "label", "index"):
            assert _same(got[k], want[k]), (s, k)


def test_naflex_rows_with_timms_recipe_on_the_gpu_serve_the_loaders_batches(gpu, tmp_path):
    # The twin in token space on the GPU (the CUDA handler has no ops): NaFlex rows of records of
    # several aspects with timm's RandAugment and erasing, the bytes of the host loader's batches.
    import tbljax

    rng = np.random.default_rng(3)
    sizes = [(20, 14), (9, 30), (33, 33), (40, 12), (17, 23), (48, 36), (12, 41), (26, 19)]
    path = str(tmp_path / "mixed.tbl")
    src = {"image": [rng.integers(0, 256, (h, w, 3), np.uint8) for h, w in sizes], "label": np.arange(8) % 3}
    tbljax.convert(src, path, image_size=48, resize="max_side", progress=False)
    aug = tbljax.Augment(
        size=None,
        ops=[tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1")],
        erasing=tbljax.RandomErasing(p=0.5),
    )
    patches = tbljax.Patches(size=4, max_tokens=24)
    kw = dict(seed=2, augment=aug, dtype="float32", patches=patches)
    with jax.enable_x64(True):  # the affine ops resample in float64, as Pillow
        ds = tbljax.ResidentDataset(path, jax.sharding.Mesh(np.array([gpu]), ("batch",)))
        f = jax.jit(lambda ds, s: ds.batch(s, batch_size=4, **kw))
        cpu = jax.sharding.Mesh(np.array([jax.devices("cpu")[0]]), ("batch",))
        for s, want in enumerate(tbljax.loader(path, 4, num_epochs=1, sharding=cpu, **kw)):
            got = f(ds, s)
            for k in ("image", "label", "index", "patch_yx", "patch_valid"):
                assert _same(np.asarray(got[k]), np.asarray(want[k])), (s, k)

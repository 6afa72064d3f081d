"""Tests of tbljax.ops: the XLA FFI handler and the pure-JAX twin against the host kernel and a
NumPy reference written here from the formulas of ffi/core/serve/kernel.h, bit for bit, for every
dtype x layout x crop x flip, eager and under jit; the normalization contract for all 256
values of every channel; errors (eager and from inside jit); donated outputs; the dataset as
an operand; and per-shard execution on 8 CPU devices (subprocesses), with `sharding=` and
without it, following the indices' sharding."""

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from tbljax import ops
from tbljax._src.engine import kernels

import oracle

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.uint8), np.dtype(np.float32), BF16]
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
PLAIN = ((0, 0, 0), (1, 1, 1))  # x / 255
RuntimeErr = getattr(jax.errors, "JaxRuntimeError", None) or jax.errors.XlaRuntimeError


def same(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


# ---------------------------------------------------------------------------------------------
# Every path agrees
# ---------------------------------------------------------------------------------------------

N, H, W, B, OUT = 12, 13, 11, 6, (9, 14)
RECORDS = np.random.default_rng(0).integers(0, 256, (N, H, W, 3), dtype=np.uint8)
IDX = np.array([3, 0, 11, 7, 7, 5])
CROPS = np.array([[0, 0, 13, 11], [2, 3, 8, 6], [1, 1, 5, 10], [0, 5, 13, 3], [12, 10, 1, 1], [4, 2, 9, 9]], np.int32)
FLIPS = np.array([1, 0, 1, 0, 1, 1], bool)


@pytest.mark.parametrize("flip", [False, True], ids=["noflip", "flip"])
@pytest.mark.parametrize("crop", [False, True], ids=["nocrop", "crop"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_ffi_twin_host_and_reference_agree(dtype, layout, crop, flip):
    norm = dtype != np.uint8
    mean, std = IMAGENET if norm else (None, None)
    c, f = (CROPS if crop else None), (FLIPS if flip else None)
    hw = OUT if crop else (H, W)
    want = oracle.gather(RECORDS, IDX, hw, c, f, dtype, layout, *(IMAGENET if norm else (0, 1)))
    shape = want.shape
    host = kernels.gather(RECORDS, IDX, np.empty(shape, dtype), layout=layout, crop=c, flip=f, mean=mean, std=std)
    kw = dict(mean=mean, std=std, dtype=dtype, layout=layout, crop=c, flip=f, out_size=hw if crop else None)
    data = jnp.asarray(RECORDS)
    eager_ffi = ops.gather_normalize(data, IDX, backend="ffi", **kw)
    eager_twin = ops.gather_normalize(data, IDX, backend="twin", **kw)

    @jax.jit
    def jitted(d, i, c, f):
        k = dict(kw, crop=c, flip=f)
        return (
            ops.gather_normalize(d, i, **k),  # auto: the FFI handler on CPU
            ops.gather_normalize(d, i, backend="twin", **k),
        )

    jit_auto, jit_twin = jitted(data, jnp.asarray(IDX), c, f)
    assert same(host, want)
    for name, got in [
        ("ffi eager", eager_ffi),
        ("twin eager", eager_twin),
        ("auto jit", jit_auto),
        ("twin jit", jit_twin),
    ]:
        assert same(got, want), name


def _all_values_image():
    """One (16, 16, 3) image in which every channel holds each of the 256 values once."""
    v = np.arange(256).reshape(16, 16)
    return np.stack([(v + 85 * c) % 256 for c in range(3)], axis=-1).astype(np.uint8)[None]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize(
    "params",
    [IMAGENET, ((0, 0, 0), (1, 1, 1)), ((0.5, -0.25, 3.0), (0.1, 2.0, 1e-3)), ((0.3, 0.7, 0.11), (0.37, 0.019, 7.5))],
    ids=["imagenet", "identity", "odd", "random"],
)
def test_normalize_contract_all_256_values_per_channel(dtype, params):
    img = _all_values_image()
    mean, std = params
    table = oracle.table(mean, std, dtype)
    want = table[np.arange(3), img[0]][None]
    assert same(kernels.normalize_table(mean, std, dtype), table)
    for backend in ("ffi", "twin"):
        got = ops.gather_normalize(jnp.asarray(img), [0], mean=mean, std=std, dtype=dtype, backend=backend)
        assert same(got, want), backend
    assert same(ops.normalize(jnp.asarray(img), mean=mean, std=std, dtype=dtype), want)
    nchw = ops.normalize(jnp.asarray(img.transpose(0, 3, 1, 2)), mean=mean, std=std, dtype=dtype, layout="NCHW")
    assert same(nchw, want.transpose(0, 3, 1, 2))


def test_every_simd_target_of_the_handler_matches():
    # The handler is compiled into _core: the one target set there is the one it runs.
    from tbljax import _core

    want = oracle.gather(RECORDS, IDX, OUT, CROPS, FLIPS, BF16, "NCHW", *IMAGENET)
    f = jax.jit(
        lambda d, i: ops.gather_normalize(
            d,
            i,
            crop=CROPS,
            flip=FLIPS,
            out_size=OUT,
            mean=IMAGENET[0],
            std=IMAGENET[1],
            dtype=BF16,
            layout="NCHW",
            backend="ffi",
        )
    )
    try:
        for target in _core.supported_kernel_targets():
            _core.set_kernel_target(target)
            assert _core.kernel_target() == target
            assert same(f(jnp.asarray(RECORDS), jnp.asarray(IDX)), want), target
    finally:
        _core.set_kernel_target("auto")


def test_int64_indices_and_uint8_flips_and_random_resized_crops():
    from tbljax._src.rules import augment

    idx = np.random.default_rng(1).integers(0, N, 40)
    boxes = augment.crop_boxes(idx, height=H, width=W, seed=5, epoch=2)
    flips = augment.flips(idx, seed=5, epoch=2).astype(np.uint8)
    want = oracle.gather(RECORDS, idx, (7, 8), boxes, flips, np.float32, "NHWC", *PLAIN)
    for backend in ("ffi", "twin"):
        f = jax.jit(
            functools.partial(
                lambda d, i, c, fl, backend: ops.gather_normalize(
                    d, i, crop=c, flip=fl, out_size=(7, 8), backend=backend
                ),
                backend=backend,
            )
        )
        assert same(f(jnp.asarray(RECORDS), idx, boxes, flips), want), backend


def test_auto_uses_the_handler_on_cpu_and_the_dataset_is_an_operand():
    assert ops.registered_platforms()["cpu"].startswith("registered")
    f = jax.jit(lambda d, i: ops.gather_normalize(d, i, dtype=jnp.uint8))
    text = f.lower(jnp.asarray(RECORDS), jnp.asarray(IDX)).compile().as_text()
    assert 'custom_call_target="tbljax_gather_normalize"' in text
    assert f"u8[{N},{H},{W},3]" in text and "constant" not in [
        ln.split("=")[1].split("(")[0].split()[-1]
        for ln in text.splitlines()
        if f"u8[{N},{H},{W},3]" in ln and "=" in ln
    ]
    # One compiled program serves any dataset of that shape: the records are an operand.
    other = RECORDS[::-1].copy()
    assert same(f(jnp.asarray(other), jnp.asarray(IDX)), other[IDX])
    assert same(f(jnp.asarray(RECORDS), jnp.asarray(IDX)), RECORDS[IDX])
    twin = jax.jit(lambda d, i: ops.gather_normalize(d, i, backend="twin"))
    text = twin.lower(jnp.asarray(RECORDS), jnp.asarray(IDX)).compile().as_text()
    assert "custom-call" not in text


def test_donated_output_is_written_in_place():
    f = jax.jit(lambda d, i, o: ops.gather_normalize(d, i, out=o, crop=CROPS, out_size=OUT), donate_argnums=2)
    out = jnp.zeros((B, *OUT, 3), jnp.float32)
    lowered = f.lower(jnp.asarray(RECORDS), jnp.asarray(IDX), out).compile().as_text()
    assert "input_output_alias" in lowered
    got = f(jnp.asarray(RECORDS), jnp.asarray(IDX), out)
    assert out.is_deleted()
    assert same(got, oracle.gather(RECORDS, IDX, OUT, CROPS, None, np.float32, "NHWC", *PLAIN))


def test_vmap_runs_each_batch():
    idx = jnp.asarray(np.array([[1, 2], [3, 4], [5, 6]]))
    got = jax.vmap(lambda i: ops.gather_normalize(jnp.asarray(RECORDS), i, dtype=jnp.uint8))(idx)
    assert same(got, RECORDS[np.asarray(idx)])
    for backend in ("ffi", "twin"):  # traced: through the op that follows the mesh
        f = jax.jit(
            jax.vmap(functools.partial(ops.gather_normalize, dtype=jnp.uint8, backend=backend), in_axes=(None, 0))
        )
        assert same(f(jnp.asarray(RECORDS), idx), RECORDS[np.asarray(idx)]), backend


def test_empty_batch():
    got = ops.gather_normalize(jnp.asarray(RECORDS), np.zeros(0, np.int32), layout="NCHW")
    assert got.shape == (0, 3, H, W) and got.dtype == jnp.float32


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ops.BACKENDS)
@pytest.mark.parametrize("bad", [-1, N])
def test_concrete_bad_index_is_an_index_error(backend, bad):
    with pytest.raises(
        IndexError,
        match=rf"indices\[2\] = {bad} is out of range for a source "
        rf"of {N} records \(allowed 0..{N - 1}\)",
    ):
        ops.gather_normalize(jnp.asarray(RECORDS), [0, 1, bad], backend=backend)


def test_bad_index_inside_jit_fails_the_computation_naming_it():
    f = jax.jit(lambda d, i: ops.gather_normalize(d, i, backend="ffi"))
    with pytest.raises(
        RuntimeErr,
        match=r"indices\[1\] = 25 is out of range for a source of "
        r"12 records",
    ):
        f(jnp.asarray(RECORDS), jnp.array([1, 25, 3])).block_until_ready()
    g = jax.jit(lambda d, c: ops.gather_normalize(d, jnp.arange(2), crop=c, out_size=(4, 4)))
    with pytest.raises(
        RuntimeErr,
        match=r"crop\[1\] = \(y0=10, x0=0, h=5, w=3\) is not a "
        r"non-empty box inside the 13x11 image",
    ):
        g(jnp.asarray(RECORDS), jnp.array([[0, 0, 2, 2], [10, 0, 5, 3]])).block_until_ready()
    # The failure is per call: the next good call runs.
    assert same(
        f(jnp.asarray(RECORDS), jnp.array([1, 2, 3])),
        oracle.gather(RECORDS, [1, 2, 3], (H, W), None, None, np.float32, "NHWC", *PLAIN),
    )


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(crop=[[0, 0, 14, 2]] * 3), ValueError, r"crop\[0\] = \(y0=0, x0=0, h=14, w=2\)"),
        (dict(crop=[[0, 0, 2, 2]] * 2), ValueError, r"crop must have shape \(3, 4\)"),
        (dict(crop=[[0.0, 0, 2, 2]] * 3), TypeError, r"crop must hold integers"),
        (dict(flip=[True, False]), ValueError, r"flip must have shape \(3,\)"),
        (dict(dtype=np.float16), ValueError, r"dtype must be one of \['uint8', 'float32', 'bfloat16'\]"),
        (dict(dtype=np.uint8, mean=(0, 0, 0)), ValueError, r"uint8 output is not normalized"),
        (dict(std=(1, 0, 1)), ValueError, r"std\[1\] = 0.0 must be a finite number > 0"),
        (dict(mean=(1, 2)), ValueError, r"mean must have 3 values"),
        (dict(layout="HWC"), ValueError, r"layout must be one of"),
        (dict(out_size=(5, 5)), ValueError, r"resizing needs crop boxes"),
        (dict(backend="gpu"), ValueError, r"backend must be one of"),
        (dict(out=jnp.zeros((3, 5, 5, 3))), ValueError, r"out must be float32 of shape"),
    ],
)
def test_argument_errors_name_the_value(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ops.gather_normalize(jnp.asarray(RECORDS), [0, 1, 2], **kwargs)


def test_data_and_indices_errors():
    with pytest.raises(ValueError, match=r"data must be a non-empty uint8 array of shape"):
        ops.gather_normalize(jnp.zeros((4, 5, 5, 3), jnp.float32), [0])
    with pytest.raises(ValueError, match=r"data must be"):
        ops.gather_normalize(jnp.zeros((4, 5, 5, 4), jnp.uint8), [0])
    with pytest.raises(ValueError, match=r"indices must be 1-D"):
        ops.gather_normalize(jnp.asarray(RECORDS), [[0]])
    with pytest.raises(TypeError, match=r"indices must be integers"):
        ops.gather_normalize(jnp.asarray(RECORDS), [0.5])
    with pytest.raises(TypeError, match=r"normalize writes float32 or bfloat16"):
        ops.normalize(jnp.asarray(RECORDS), dtype=jnp.uint8)


# ---------------------------------------------------------------------------------------------
# Per-shard execution on 8 CPU devices
# ---------------------------------------------------------------------------------------------

_SHARDED = textwrap.dedent("""
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from tbljax import kernels, ops
    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
    rng = np.random.default_rng(0)
    host = rng.integers(0, 256, (50, 12, 10, 3), dtype=np.uint8)
    rep = NamedSharding(mesh, P())
    rows = NamedSharding(mesh, P(("a", "b")))
    data = jax.device_put(host, rep)
    idx = rng.integers(0, 50, 32).astype(np.int32)
    crop = np.tile(np.array([[1, 2, 8, 7]], np.int32), (32, 1))
    crop[::3] = [0, 0, 12, 10]
    flip = rng.integers(0, 2, 32).astype(bool)
    args = [jax.device_put(x, rows) for x in (idx, crop, flip)]
    want = kernels.gather(host, idx, np.empty((32, 3, 6, 5), np.float32), layout="NCHW",
                          crop=crop, flip=flip, mean=(0.5,) * 3, std=(0.2,) * 3)
    for backend in ("ffi", "twin", "auto"):
        f = jax.jit(lambda d, i, c, fl: ops.gather_normalize(
            d, i, crop=c, flip=fl, out_size=(6, 5), mean=(0.5,) * 3, std=(0.2,) * 3,
            layout="NCHW", backend=backend, sharding=rows))
        got = f(data, *args)
        assert np.array_equal(np.asarray(got), want), backend
        assert got.sharding.is_equivalent_to(rows, 4), (backend, got.sharding)
        text = f.lower(data, *args).compile().as_text()
        for op in ("all-gather", "all-to-all", "all-reduce", "collective-permute"):
            assert op not in text, (backend, op)
        if backend != "twin":  # each device's call sees its own 4 rows
            assert 'f32[4,3,6,5]{3,2,1,0} custom-call(' in text, text
    # A Mesh as the sharding splits the batch over all its axes.
    g = jax.jit(lambda d, i: ops.gather_normalize(d, i, dtype=jnp.uint8, sharding=mesh))
    assert np.array_equal(np.asarray(g(data, args[0])), host[idx])
    print("OK")
""")


def _run_on_8_cpu_devices(code: str) -> None:
    """Runs `code` in a child process that sees 8 CPU devices; it must end by printing OK."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


def test_sharded_indices_run_per_shard_on_8_cpu_devices():
    _run_on_8_cpu_devices(_SHARDED)


_FOLLOWS = textwrap.dedent("""
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from tbljax import kernels, ops
    assert jax.device_count() == 8
    devices = np.array(jax.devices())
    rng = np.random.default_rng(1)
    host = rng.integers(0, 256, (48, 12, 10, 3), dtype=np.uint8)
    idx = rng.integers(0, 48, 32).astype(np.int32)
    crop = np.tile(np.array([[1, 2, 8, 7]], np.int32), (32, 1))
    crop[::3] = [0, 0, 12, 10]
    flip = rng.integers(0, 2, 32).astype(bool)
    kw = dict(out_size=(6, 5), mean=(0.5,) * 3, std=(0.2,) * 3, layout="NCHW")
    want = np.asarray(jax.jit(lambda d, i: ops.gather_normalize(d, i, crop=crop, flip=flip, **kw))(
        jax.device_put(host, devices[0]), jax.device_put(idx, devices[0])))  # on one device
    assert np.array_equal(want, kernels.gather(host, idx, np.empty((32, 3, 6, 5), np.float32),
                                               crop=crop, flip=flip, mean=kw["mean"],
                                               std=kw["std"], layout="NCHW"))

    def check(mesh, rows, data_spec=P(), gathers=0):
        data = jax.device_put(host, NamedSharding(mesh, data_spec))
        args = [jax.device_put(x, rows) for x in (idx, crop, flip)]
        per = rows.shard_shape((32,))[0]
        for backend in ("ffi", "twin"):
            f = jax.jit(lambda d, i, c, fl: ops.gather_normalize(d, i, crop=c, flip=fl,
                                                             backend=backend, **kw))
            got = f(data, *args)
            where = (mesh.axis_names, rows.spec, data_spec, backend)
            assert np.array_equal(np.asarray(got), want), where
            assert got.sharding.is_equivalent_to(rows, 4), (where, got.sharding)
            text = f.lower(data, *args).compile().as_text()
            assert text.count("all-gather(") + text.count("all-gather-start(") == gathers, where
            assert "all-to-all" not in text, where
            # Each device computes its own rows: the result exists only at the per-shard size.
            assert f"f32[{per},3,6,5]" in text and "f32[32,3,6,5]" not in text, (where, text)
            if backend == "ffi":
                assert f"f32[{per},3,6,5]{{3,2,1,0}} custom-call(" in text, (where, text)

    flat = Mesh(devices, ("data",))
    check(flat, NamedSharding(flat, P("data")))
    grid = Mesh(devices.reshape(4, 2), ("data", "model"))
    check(grid, NamedSharding(grid, P("data")))            # batch over data; model replicated
    check(grid, NamedSharding(grid, P(("data", "model"))))
    # Records that arrive sharded are gathered whole (one all-gather), as sharding= expects.
    check(flat, NamedSharding(flat, P("data")), data_spec=P("data"), gathers=1)
    # Under a mesh with explicit axes the indices' type carries the sharding (jax.set_mesh:
    # jax >= 0.7; the floor, 0.6.1, has no explicit-axis meshes to follow).
    if hasattr(jax, "set_mesh"):
        explicit = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
        with jax.set_mesh(explicit):
            check(explicit, NamedSharding(explicit, P("data")))
    else:
        print("explicit-axis meshes: not in jax", jax.__version__)
    print("OK")
""")


def test_without_sharding_the_op_follows_the_indices_on_8_cpu_devices():
    _run_on_8_cpu_devices(_FOLLOWS)

"""The per-image ops and random erasing inside `jax.jit` (issue 47): `ResidentDataset.batch`
serves, byte for byte, what `tbljax.loader` serves for the same (seed, epoch, index, repeat)
-- records of one size and of different sizes (PackedRecords), float32 and bfloat16,
repeats=2, RandAugment with its affine ops, erasing in every mode, ThreeAugment, ColorJitter,
TrivialAugment --; `tbljax.ops.gather_normalize(ops=...)` on the FFI handler equals the host
kernel (`tbljax.kernels.gather(ops=...)`) and, op by op, the NumPy reference
(`pixel_ops.apply_all`); what is not served is refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tbljax
from tbljax import ops
from tbljax._src.engine import pixel_program as host_program
from tbljax._src.jax import ops as _ops_module
from tbljax._src.jax import program as _program_module
from tbljax._src.rules import erasing, pixel_ops, randaug

SIZE = (16, 16)
MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)
SEED = 3
# timm's DeiT string, every chosen op applied (the affine ops' matrices are looked up in jit
# among every magnitude mstd can draw); a fixed magnitude (two matrices per op) where that
# suffices, which builds its table faster.
RAND = tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1", prob=1.0)
RAND_M9 = tbljax.RandAugment.from_timm("rand-m9-n3", prob=1.0)
AUGMENTS = {
    "randaug+pixel": tbljax.Augment(size=SIZE, ops=[RAND], erasing=tbljax.RandomErasing(p=0.7, mode="pixel")),
    "randaug+rand": tbljax.Augment(size=SIZE, ops=[RAND_M9], erasing=tbljax.RandomErasing(p=0.7, mode="rand")),
    "three+jitter+const": tbljax.Augment(
        size=SIZE,
        ops=[tbljax.ThreeAugment(), tbljax.ColorJitter(0.3, 0.3, 0.3)],
        erasing=tbljax.RandomErasing(p=0.7, mode="const"),
    ),
    "trivial": tbljax.Augment(size=SIZE, ops=[tbljax.TrivialAugment()]),
}


def _write(path, imgs):
    with tbljax.Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(labels=np.arange(len(imgs)) % 7)
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    rng = np.random.default_rng(0)
    d = tmp_path_factory.mktemp("jit_ops")
    same_size = [rng.integers(0, 256, (24, 20, 3), np.uint8) for _ in range(12)]
    sizes = [(20, 14), (9, 30), (33, 33), (40, 12), (17, 23), (26, 19), (31, 45), (12, 12), (22, 28), (30, 18)]
    mixed = [rng.integers(0, 256, (h, w, 3), np.uint8) for h, w in sizes]
    return {"raw": _write(d / "raw.tbl", same_size), "packed": _write(d / "mixed.tbl", mixed), "mixed": mixed}


def same(got, want):
    """Bit for bit (float32 and bfloat16 compared as their bit patterns)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_array_equal(got.view(f"u{got.dtype.itemsize}"), want.view(f"u{want.dtype.itemsize}"))


@pytest.mark.parametrize(
    "records, aug, dtype, repeats",
    [
        ("raw", "randaug+pixel", "float32", 1),
        ("raw", "three+jitter+const", "bfloat16", 2),
        ("packed", "randaug+rand", "bfloat16", 2),
        ("packed", "trivial", "float32", 1),
    ],
)
def test_resident_batch_in_jit_equals_the_loader(files, records, aug, dtype, repeats):
    augment = AUGMENTS[aug]
    kw = dict(seed=SEED, augment=augment, mean=MEAN, std=STD, dtype=dtype, repeats=repeats)
    ds = tbljax.ResidentDataset(files[records])
    assert isinstance(ds.data, tbljax.ops.PackedRecords) == (records == "packed")
    step = jax.jit(lambda d, s: d.batch(s, batch_size=4, **kw))
    ld = tbljax.loader(files[records], 4, num_epochs=2, **kw)
    for s, want in enumerate(ld):
        got = step(ds, s)
        np.testing.assert_array_equal(np.asarray(got["index"]), np.asarray(want["index"]))
        if repeats > 1:
            np.testing.assert_array_equal(np.asarray(got["repeat"]), np.asarray(want["repeat"]))
        same(got["image"], np.asarray(want["image"]))
    assert s + 1 == 2 * ds.steps_per_epoch(4, repeats)
    # The case exercises the ops: most rows drew some (the loader applies them, so a path that
    # dropped them would differ above).
    codes, _ = randaug.decide(augment.ops, np.arange(len(ds)), seed=SEED, epoch=0)
    assert (codes != 0).any(axis=1).mean() > 0.5


def _program_case(batch=12, policies=(RAND,), out=(16, 16), erase=None, seed=1):
    """(data, indices, crops, flips, codes, args, boxes, keys) of a small case."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (10, 30, 28, 3), np.uint8)
    idx = rng.integers(0, 10, batch)
    crops = np.array([[rng.integers(0, 10), rng.integers(0, 8), 20, 20] for _ in range(batch)], np.int32)
    flips = rng.integers(0, 2, batch).astype(bool)
    codes, args = randaug.decide(policies, np.arange(batch), seed=seed, epoch=0)
    boxes = keys = None
    if erase is not None:
        boxes, keys = erasing.decide_erasing(erase, np.arange(batch), height=out[0], width=out[1], seed=seed, epoch=0)
    return data, idx, crops, flips, codes, args, boxes, keys


@pytest.mark.parametrize("mode", ["pixel", "rand", "const"])
def test_gather_normalize_ops_in_jit_equals_the_host_kernel(mode):
    er = tbljax.RandomErasing(p=1.0, mode=mode)
    data, idx, crops, flips, codes, args, boxes, keys = _program_case(erase=er)
    assert np.isin(codes, sorted(pixel_ops.AFFINE)).any() and (boxes[..., 2] > 0).any()
    norm = dict(mean=MEAN, std=STD)
    want = np.zeros((len(idx), 3, 16, 16), np.float32)
    prog = host_program.pixel_program(
        codes, args, SIZE, policies=(RAND,), erase_boxes=boxes, erase_keys=keys, erase_mode=mode
    )
    tbljax.kernels.gather(data, idx, want, layout="NCHW", crop=crops, flip=flips, ops=prog, **norm)

    @jax.jit
    def step(d, i, c, f, co, a, b, k):
        p = ops.pixel_program(co, a, SIZE, policies=(RAND,), erase_boxes=b, erase_keys=k, erase_mode=mode)
        return ops.gather_normalize(d, i, crop=c, flip=f, out_size=SIZE, layout="NCHW", ops=p, **norm)

    same(step(data, idx, crops, flips, codes, args, boxes, keys), want)
    # A host program (float64 matrices) is taken as it is, outside jit.
    eager = ops.gather_normalize(data, idx, crop=crops, flip=flips, out_size=SIZE, layout="NCHW", ops=prog, **norm)
    same(eager, want)


def test_erasing_without_ops_in_jit_equals_the_host_kernel():
    """K = 0 op columns, erasing only (bfloat16)."""
    er = tbljax.RandomErasing(p=1.0, mode="rand", max_count=2)
    data, idx, crops, flips, codes, args, boxes, keys = _program_case(policies=(), erase=er)
    assert codes.shape == (12, 0) and (boxes[..., 2] > 0).any()
    prog = host_program.pixel_program(codes, args, SIZE, erase_boxes=boxes, erase_keys=keys, erase_mode="rand")
    want = np.zeros((12, 16, 16, 3), jnp.bfloat16)
    tbljax.kernels.gather(data, idx, want, crop=crops, flip=flips, ops=prog, mean=MEAN, std=STD)
    step = jax.jit(
        lambda c, a, b, k: ops.gather_normalize(
            data,
            idx,
            crop=crops,
            flip=flips,
            out_size=SIZE,
            dtype=jnp.bfloat16,
            mean=MEAN,
            std=STD,
            ops=ops.pixel_program(c, a, SIZE, erase_boxes=b, erase_keys=k, erase_mode="rand"),
        )
    )
    same(step(codes, args, boxes, keys), want)


def test_gather_normalize_ops_of_packed_records_equals_the_host_kernel(files):
    pols = (tbljax.TrivialAugment(), tbljax.ColorJitter(0.4, 0.4, 0.4))
    ds = tbljax.ResidentDataset(files["packed"])
    imgs = files["mixed"]
    idx = np.arange(len(imgs))[::-1].copy()
    crops = np.array([[1, 2, imgs[i].shape[0] - 1, imgs[i].shape[1] - 2] for i in idx], np.int32)
    codes, args = randaug.decide(pols, idx, seed=4, epoch=1)
    want = np.zeros((len(idx), 16, 16, 3), np.uint8)
    for b, i in enumerate(idx):  # each record alone, through the host kernel
        prog = host_program.pixel_program(codes[b : b + 1], args[b : b + 1], SIZE, policies=pols)
        tbljax.kernels.gather(imgs[i][None], [0], want[b : b + 1], crop=crops[b : b + 1], ops=prog)
    step = jax.jit(
        lambda d, i, c, co, a: ops.gather_normalize(
            d, i, crop=c, out_size=SIZE, dtype=jnp.uint8, ops=ops.pixel_program(co, a, SIZE, policies=pols)
        )
    )
    same(step(ds.data, idx, crops, codes, args), want)


def test_gather_normalize_ops_equal_the_numpy_reference_op_by_op():
    """uint8 output: row b is pixel_ops.apply_all (NumPy) of the same row served without ops."""
    pols = (RAND, tbljax.TrivialAugment())
    data, idx, crops, flips, codes, args, _, _ = _program_case(policies=pols, seed=2)
    kw = dict(crop=crops, flip=flips, out_size=SIZE, dtype=jnp.uint8)
    plain = np.asarray(ops.gather_normalize(data, idx, **kw))
    got = np.asarray(
        jax.jit(lambda c, a: ops.gather_normalize(data, idx, ops=ops.pixel_program(c, a, SIZE, policies=pols), **kw))(
            codes, args
        )
    )
    slots = host_program.column_policies(pols, codes.shape[1])
    for b in range(len(idx)):
        want = plain[b]
        for j, (code, arg) in enumerate(zip(codes[b].tolist(), args[b].tolist())):
            p = slots[j]
            if code:
                want = pixel_ops.apply(
                    want,
                    code,
                    arg,
                    fill=p.fill,
                    interpolation=p.interpolation,
                    translate_const=getattr(p, "translate_const", 100.0),
                    translate_pct=getattr(p, "translate_pct", 0.45),
                )
        np.testing.assert_array_equal(got[b], want, err_msg=f"row {b}: ops {codes[b]} args {args[b]}")


# Colour-only RandAugment (no affine op: the twin runs it without x64), and the small images
# and batches of the twin's cases (its compile time dominates).
COLOUR = tbljax.RandAugment(num_ops=2, magnitude=9, ops=["Color", "Contrast", "Posterize", "Solarize", "Equalize"])
TWIN_SIZE = (8, 8)


def _gathered(backend, data, idx, crops, flips, codes, args, boxes, keys, *, policies, mode="pixel", **kw):
    """gather_normalize(ops=...) in jit on `backend`: (the batch, the compiled program's text)."""

    def step(d, i, c, f, co, a, b, k):
        p = ops.pixel_program(co, a, TWIN_SIZE, policies=policies, erase_boxes=b, erase_keys=k, erase_mode=mode)
        return ops.gather_normalize(d, i, crop=c, flip=f, out_size=TWIN_SIZE, ops=p, backend=backend, **kw)

    compiled = jax.jit(step).lower(data, idx, crops, flips, codes, args, boxes, keys).compile()
    return compiled(data, idx, crops, flips, codes, args, boxes, keys), compiled.as_text()


def _twin_and_ffi(*case, **kw):
    """gather_normalize(ops=...) in jit on the twin and on the FFI handler: (twin, ffi)."""
    return _gathered("twin", *case, **kw)[0], _gathered("ffi", *case, **kw)[0]


@pytest.mark.parametrize(
    "mode, dtype, layout, backend",
    [("pixel", "float32", "NHWC", "twin"), ("rand", "bfloat16", "NCHW", "auto"), ("const", "bfloat16", "NHWC", "twin")],
)
def test_twin_ops_equal_the_ffi_handler(monkeypatch, mode, dtype, layout, backend):
    """backend='twin' (and 'auto' on a platform whose handler has no ops, as CUDA) without x64:
    colour ops, then erasing (bfloat16: the noise rounded as the kernel rounds it; NCHW), byte
    for byte the FFI handler's (itself the host kernel's, above)."""
    er = tbljax.RandomErasing(p=0.8, mode=mode)
    case = _program_case(batch=6, policies=(COLOUR,), out=TWIN_SIZE, erase=er)
    codes, boxes = case[4], case[6]
    assert (codes != 0).any() and (boxes[..., 2] > 0).any() and (boxes[..., 2] == 0).any()
    kw = dict(policies=(COLOUR,), mode=mode, dtype=dtype, layout=layout, mean=MEAN, std=STD)
    with monkeypatch.context() as m:
        if backend == "auto":
            m.setattr(_ops_module, "ops_platforms", lambda: ())
        twin, program = _gathered(backend, *case, **kw)
    assert "tbljax_gather" not in program  # no custom call: the twin ran
    same(twin, _gathered("ffi", *case, **kw)[0])


def test_twin_affine_ops_equal_the_ffi_handler_with_x64():
    """DeiT's RandAugment (Rotate, Shear, Translate...) on the twin needs x64: refused by name
    without it, the FFI handler's bytes with it."""
    case = _program_case(batch=6, policies=(RAND,), out=TWIN_SIZE, erase=tbljax.RandomErasing(p=0.8))
    assert np.isin(case[4], sorted(pixel_ops.AFFINE)).any()
    kw = dict(policies=(RAND,), layout="NCHW", mean=MEAN, std=STD)
    with pytest.raises(ValueError, match="jax_enable_x64 is off"):
        _twin_and_ffi(*case, **kw)
    with jax.enable_x64(True):
        twin, ffi = _twin_and_ffi(*case, **kw)
    same(twin, ffi)


def test_twin_colour_jitter_with_hue_equals_the_ffi_handler():
    """ColorJitter with hue (Pillow's HSV round trip) on the twin, without x64: the FFI
    handler's bytes."""
    jitter = tbljax.ColorJitter(0.3, 0.3, 0.3, hue=0.5)
    case = _program_case(batch=6, policies=(jitter,), out=TWIN_SIZE)
    assert (case[4] == pixel_ops.CODES["Hue"]).any()
    twin, ffi = _twin_and_ffi(*case, policies=(jitter,), dtype="uint8")
    same(twin, ffi)


def test_the_codes_a_program_may_draw_are_the_policies_draws():
    """The op codes the twin compiles for (`program.drawable_codes`, static) are those the
    policies draw (`randaug.decide` over many rows), policy by policy."""
    policies = [
        RAND,
        COLOUR,
        tbljax.RandAugment.from_big_vision("randaug(2,15)"),
        tbljax.TrivialAugment(),
        tbljax.ThreeAugment(),
        tbljax.ColorJitter(0.4, 0.0, 0.4, hue=0.1),
        tbljax.Grayscale(0.1),
        tbljax.GaussianBlur(0.1),
        tbljax.Solarize(0.0),  # never applied: no code
    ]
    for p in policies:
        codes, _ = randaug.decide((p,), np.arange(20000), seed=1, epoch=0)
        slots = tuple(host_program.column_policies((p,), codes.shape[1]))
        want = tuple(sorted(set(np.unique(codes).tolist()) - {0}))
        assert _program_module.drawable_codes(slots) == want, p


def test_twin_ops_of_packed_records_equal_the_ffi_handler(tmp_path):
    # Small records: the twin's resize unrolls taps in proportion to the largest side.
    rng = np.random.default_rng(5)
    imgs = [rng.integers(0, 256, (h, w, 3), np.uint8) for h, w in [(9, 12), (12, 7), (8, 8), (11, 10)]]
    ds = tbljax.ResidentDataset(_write(tmp_path / "small.tbl", imgs))
    assert isinstance(ds.data, tbljax.ops.PackedRecords)
    idx = np.array([3, 0, 1, 2, 0, 3], np.int32)
    crops = np.array([[1, 0, imgs[i].shape[0] - 1, imgs[i].shape[1]] for i in idx], np.int32)
    flips = np.array([True, False, True, False, False, True])
    codes, args = randaug.decide((COLOUR,), idx, seed=4, epoch=1)
    twin, ffi = _twin_and_ffi(ds.data, idx, crops, flips, codes, args, None, None, policies=(COLOUR,), dtype="uint8")
    assert (codes != 0).any()
    same(twin, ffi)


def test_resident_batch_on_the_twin_equals_the_loader(files):
    """ResidentDataset.batch(backend='twin'): DeiT's RandAugment (affine ops: x64) and erasing."""
    augment = tbljax.Augment(size=TWIN_SIZE, ops=[RAND], erasing=tbljax.RandomErasing(p=0.7, mode="rand"))
    kw = dict(seed=SEED, augment=augment, mean=MEAN, std=STD, dtype="bfloat16")
    ds = tbljax.ResidentDataset(files["raw"])
    with jax.enable_x64(True):
        step = jax.jit(lambda d, s: d.batch(s, batch_size=6, backend="twin", **kw))
        for s, want in enumerate(tbljax.loader(files["raw"], 6, num_epochs=1, **kw)):
            got = step(ds, s)
            np.testing.assert_array_equal(np.asarray(got["index"]), np.asarray(want["index"]))
            same(got["image"], np.asarray(want["image"]))
    assert s == 1
    codes, _ = randaug.decide(augment.ops, np.arange(len(ds)), seed=SEED, epoch=0)
    assert np.isin(codes, sorted(pixel_ops.AFFINE)).any()


def test_what_is_not_served_in_jit_is_refused_by_name(monkeypatch):
    er = tbljax.RandomErasing(p=1.0)
    data, idx, crops, flips, codes, args, boxes, keys = _program_case(batch=4, erase=er)
    prog = ops.pixel_program(codes, args, SIZE, policies=(RAND,), erase_boxes=boxes, erase_keys=keys)
    kw = dict(crop=crops, flip=flips, out_size=SIZE)
    with monkeypatch.context() as m:  # a platform whose handler has no ops (CUDA): the twin, not 'ffi'
        m.setattr(_ops_module, "ops_platforms", lambda: ())
        with pytest.raises(ValueError, match="backend='ffi' with ops=...: .* use backend='auto' or 'twin'"):
            ops.gather_normalize(data, idx, backend="ffi", ops=prog, **kw)
    with pytest.raises(ValueError, match="needs dtype='float32' or 'bfloat16', not uint8"):
        ops.gather_normalize(data, idx, dtype=jnp.uint8, ops=prog, **kw)
    bad = codes.copy()
    bad[2, 1] = 99  # no op has code 99: the twin has no rule for it
    prog_bad = ops.pixel_program(bad, args, SIZE, policies=(RAND,), erase_boxes=boxes, erase_keys=keys)
    for backend in ("twin", "ffi"):
        with pytest.raises(ValueError, match=r"ops: row 2 column 1: op code 99 is not one of pixel_ops.CODES"):
            ops.gather_normalize(data, idx, ops=prog_bad, backend=backend, **kw)
    with pytest.raises(TypeError, match="ops must be a tbljax.ops.pixel_program"):
        ops.gather_normalize(data, idx, ops=(codes, args), **kw)
    rotate = np.zeros((4, 2), np.uint8) + pixel_ops.CODES["Rotate"]
    with pytest.raises(ValueError, match="row 0 column 0: op code .* argument 12345 is not one its policy can draw"):
        ops.pixel_program(rotate, np.full((4, 2), 12345, np.int32), SIZE, policies=(RAND,))


_EIGHT_DEVICES = textwrap.dedent("""
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tbljax
    from tbljax import ops
    from tbljax._src.engine import pixel_program as host_program
    from tbljax._src.rules import erasing, randaug
    assert jax.device_count() == 8
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (24, 18, 20, 3), np.uint8)
    with tbljax.Writer("eight.tbl", len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(labels=np.arange(len(imgs)))
    ra = tbljax.RandAugment.from_timm("rand-m9-n3", prob=1.0)
    er = tbljax.RandomErasing(p=0.8, mode="pixel")
    aug = tbljax.Augment(size=(12, 12), ops=[ra], erasing=er)
    kw = dict(seed=2, augment=aug, mean=(0.5,) * 3, std=(0.25,) * 3)

    # ResidentDataset: a copy per device, each device drawing and serving its rows.
    ds = tbljax.ResidentDataset("eight.tbl")
    f = jax.jit(lambda d, s: d.batch(s, batch_size=16, **kw))
    for s, want in enumerate(tbljax.loader("eight.tbl", 16, num_epochs=2, **kw)):
        got = f(ds, s)
        assert np.array_equal(np.asarray(got["index"]), np.asarray(want["index"])), s
        assert np.array_equal(np.asarray(got["image"]), np.asarray(want["image"])), s
    assert got["image"].sharding.shard_shape(got["image"].shape)[0] == 2

    # gather_normalize(ops=): following sharded indices, and under sharding=.
    mesh = Mesh(np.array(jax.devices()), ("b",))
    rows = NamedSharding(mesh, P("b"))
    idx = rng.integers(0, 24, 16).astype(np.int32)
    crop = np.tile(np.array([[1, 2, 15, 16]], np.int32), (16, 1))
    codes, args = randaug.decide((ra,), idx, seed=5, epoch=0)
    boxes, keys = erasing.decide_erasing(er, idx, height=12, width=12, seed=5, epoch=0)
    norm = dict(mean=(0.5,) * 3, std=(0.25,) * 3)
    want = np.zeros((16, 12, 12, 3), np.float32)
    prog = host_program.pixel_program(codes, args, (12, 12), policies=(ra,), erase_boxes=boxes, erase_keys=keys)
    tbljax.kernels.gather(imgs, idx, want, crop=crop, ops=prog, **norm)
    # The twin too, split the same way: its affine ops under x64, set globally (XLA partitions
    # the op following the indices on its own thread, outside a jax.enable_x64 context).
    for backend, sharding in [("ffi", None), ("ffi", mesh), ("twin", None), ("twin", mesh)]:
        def step(d, i, c, co, a, b, k):
            p = ops.pixel_program(co, a, (12, 12), policies=(ra,), erase_boxes=b, erase_keys=k)
            return ops.gather_normalize(
                d, i, crop=c, out_size=(12, 12), ops=p, sharding=sharding, backend=backend, **norm)
        jax.config.update("jax_enable_x64", backend == "twin")
        got = jax.jit(step)(imgs, *(jax.device_put(x, rows) for x in (idx, crop, codes, args, boxes, keys)))
        assert np.array_equal(np.asarray(got), want), (backend, sharding)
        assert got.sharding.shard_shape(got.shape)[0] == 2, got.sharding

    # Records partitioned over devices (uploaded under x64, still on): refused by name.
    grid = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "d"))
    part = tbljax.ResidentDataset("eight.tbl", NamedSharding(grid, P("d")))
    try:
        jax.jit(lambda d, s: d.batch(s, batch_size=8, **kw))(part, 0)
        raise AssertionError("not refused")
    except ValueError as e:
        assert "records partitioned over devices: not yet" in str(e), e
    print("OK")
""")


def test_ops_in_jit_on_8_cpu_devices(tmp_path):
    """Each device draws and serves its own rows (ResidentDataset, gather_normalize following the
    indices or under sharding=, on the FFI handler and the twin): the same bytes as the loader
    and the host kernel."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    r = subprocess.run(
        [sys.executable, "-c", _EIGHT_DEVICES], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr

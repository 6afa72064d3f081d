"""NaFlex patch sequences inside `jax.jit` (issue 49): `tbljax.ops.gather_normalize(patches=...)`
through the CPU FFI handler and the pure-JAX twin against `tbljax.kernels.gather(patches=...)`,
and `ResidentDataset.batch(patches=...)` against the batches `tbljax.loader(patches=...)` serves
for the same (seed, epoch, step), bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tbljax
from tbljax._src.rules import naflex

SIZES = [(20, 14), (9, 30), (33, 33), (5, 7), (40, 12), (17, 23), (48, 36), (12, 41), (26, 19), (8, 8)]
P, T, G, SEED = 4, 20, 4, 3
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
PATCHES = tbljax.Patches(size=P, max_tokens=T)


def _write(path, imgs):
    with tbljax.Writer(str(path), len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(labels=np.arange(len(imgs)) * 2)
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("resident_patches")
    rng = np.random.default_rng(11)
    mixed = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]
    same = [rng.integers(0, 256, (18, 30, 3), dtype=np.uint8) for _ in range(8)]
    return {"mixed": (_write(d / "mixed.tbl", mixed), mixed), "same": (_write(d / "same.tbl", same), same)}


@pytest.fixture(scope="module")
def resident(files):
    return {k: tbljax.ResidentDataset(path) for k, (path, _) in files.items()}


def _loader_steps(path, epochs, per, **kw):
    """[(epoch, step in the epoch, batch as NumPy)] of tbljax.loader's full batches (`per` an epoch)."""
    ld = tbljax.loader(path, G, num_epochs=epochs, drop_remainder=True, patches=PATCHES, seed=SEED, **kw)
    out = []
    for s, b in enumerate(ld):
        out.append((s // per, s % per, {k: np.asarray(v) for k, v in b.items()}))
    return out


@pytest.mark.parametrize(
    "kind, augment, dtype, backend",
    [
        ("mixed", None, "uint8", "ffi"),
        ("mixed", "flip", "float32", "twin"),
        ("mixed", tbljax.Augment(size=None, scale=(0.3, 1.0)), "float32", "ffi"),
        ("mixed", tbljax.Augment(size=None, scale=(0.3, 1.0)), "uint8", "twin"),
        ("same", tbljax.Augment(size=None), "bfloat16", "ffi"),
        ("same", "flip", "uint8", "twin"),
    ],
)
def test_resident_batches_equal_the_loaders_patch_batches(files, resident, kind, augment, dtype, backend):
    path, _ = files[kind]
    ds = resident[kind]
    assert (ds.image_shape is None) == (kind == "mixed")
    norm = dict(mean=MEAN, std=STD) if dtype != "uint8" else {}
    ref = _loader_steps(path, 2, ds.steps_per_epoch(G), augment=augment, dtype=dtype, **norm)
    traces = []

    @jax.jit
    def step(ds, s, e):
        traces.append(1)
        return ds.batch(
            s, epoch=e, batch_size=G, seed=SEED, augment=augment, dtype=dtype, patches=PATCHES, backend=backend, **norm
        )

    assert len(ref) == 2 * ds.steps_per_epoch(G)
    for e, s, want in ref:
        got = step(ds, jnp.int32(s), jnp.int32(e))
        assert got["image"].shape == (G, T, P * P * 3) and got["image"].dtype == want["image"].dtype
        for k in ("image", "label", "index", "patch_yx", "patch_valid"):
            np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=f"epoch {e} step {s}: {k}")
        assert got["patch_yx"].dtype == np.int32 and got["patch_valid"].dtype == np.bool_
    assert len(traces) == 1  # one program for every step and epoch


def _kernel_rows(imgs, idx, boxes, flips, sizes, dtype):
    """tbljax.kernels.gather(patches=) over records of their own sizes (one call per record
    size, each a (1, H, W, 3) source), the reference of the in-jit op."""
    out = np.zeros((len(idx), T, P * P * 3), np.dtype(dtype))
    norm = dict(mean=MEAN, std=STD) if dtype != "uint8" else {}
    for r, i in enumerate(idx):
        tbljax.kernels.gather(
            imgs[i][None],
            np.zeros(1, np.int64),
            out[r : r + 1],
            crop=boxes[r : r + 1],
            flip=flips[r : r + 1],
            patches=(P, sizes[r : r + 1]),
            **norm,
        )
    return out


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_op_ffi_and_twin_write_the_kernels_patches(files, resident, dtype):
    # Packed records (the full-aspect resident data): boxes inside each record, some shrunk, some
    # grown, each row at its own sequence size, flipped or not.
    _, imgs = files["mixed"]
    data = resident["mixed"].data
    idx = np.array([2, 6, 3, 7, 0, 9])
    hw = np.array([SIZES[i] for i in idx])
    boxes = np.stack([hw[:, 0] // 4, hw[:, 1] // 5, hw[:, 0] - hw[:, 0] // 4, hw[:, 1] - hw[:, 1] // 5], -1)
    boxes = boxes.astype(np.int32)
    flips = np.array([True, False, True, True, False, False])
    sizes = np.stack(naflex.sequence_size(boxes[:, 2], boxes[:, 3], P, T), -1).astype(np.int32)
    sizes[1] = (P, P)  # a 1-patch row: the largest shrink
    want = _kernel_rows(imgs, idx, boxes, flips, sizes, dtype)
    norm = dict(mean=MEAN, std=STD) if dtype != "uint8" else {}
    for backend in ("ffi", "twin"):
        f = jax.jit(
            lambda d, i, c, fl, s, b=backend: tbljax.ops.gather_normalize(
                d, i, crop=c, flip=fl, patches=(P, s), out_size=(T, P * P * 3), dtype=dtype, backend=b, **norm
            )
        )
        got = f(data, jnp.asarray(idx, jnp.int32), boxes, flips, sizes)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=backend)
    # Records of one size, eagerly (concrete arguments), without flips.
    same = np.stack(files["same"][1])
    box = np.array([[0, 0, 18, 30], [2, 3, 9, 20]], np.int32)
    sz = np.stack(naflex.sequence_size(box[:, 2], box[:, 3], P, T), -1).astype(np.int32)
    want = np.zeros((2, T, P * P * 3), np.dtype(dtype))
    tbljax.kernels.gather(same, np.array([5, 1]), want, crop=box, patches=(P, sz), **norm)
    for backend in ("ffi", "twin"):
        got = tbljax.ops.gather_normalize(
            same,
            np.array([5, 1]),
            crop=box,
            patches=(P, sz),
            out_size=(T, P * P * 3),
            dtype=dtype,
            backend=backend,
            **norm,
        )
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=backend)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(layout="NCHW"), "patches are written in layout NHWC"),
        (dict(crop=None), "patches need a crop box per row"),
        (dict(out_size=(T, 7)), r"need out_size=\(T, 48\)"),
        (dict(out_size=None), r"need out_size=\(T, 48\)"),
        (dict(patches=(P, np.array([[8, 8], [6, 8]]))), r"sizes\[1\] = \(6, 8\) is not a grid of at most 20"),
        (dict(patches=(P, np.array([[8, 8], [40, 40]]))), r"sizes\[1\] = \(40, 40\) is not a grid of at most 20"),
        (dict(patches=(P, np.array([8, 8]))), r"sizes must be \(2, 2\) integers"),
        (dict(patches=(0, np.array([[8, 8], [8, 8]]))), "the patch size must be an integer"),
        (dict(patches=P), r"patches must be \(p, sizes\)"),
    ],
)
def test_op_refuses_what_patches_are_not_served_with_by_name(kw, words):
    data = np.zeros((3, 10, 12, 3), np.uint8)
    args = dict(crop=np.array([[0, 0, 10, 12]] * 2, np.int32), patches=(P, np.array([[8, 8], [4, 12]])))
    args |= dict(out_size=(T, P * P * 3)) | kw
    with pytest.raises(ValueError, match=words):
        tbljax.ops.gather_normalize(data, np.array([0, 1]), **args)


def test_op_refuses_patches_with_per_image_ops_by_name():
    data = np.zeros((3, 10, 12, 3), np.uint8)
    prog = tbljax.ops.pixel_program(np.full((2, 1), 3, np.uint8), np.zeros((2, 1), np.int32), (8, 8))
    with pytest.raises(
        ValueError, match="patches with ops=...: the program's affine ops were built at one output size"
    ):
        tbljax.ops.gather_normalize(
            data,
            np.array([0, 1]),
            crop=np.array([[0, 0, 10, 12]] * 2, np.int32),
            patches=(P, np.array([[8, 8], [8, 8]])),
            out_size=(T, P * P * 3),
            ops=prog,
        )


@pytest.mark.parametrize(
    "patches, augment, words",
    [
        (
            tbljax.Patches(size=P, max_tokens=[16, 36], tokens_per_batch=144),
            None,
            "with patches with a length schedule",
        ),
        (tbljax.Patches(size=P, max_tokens=64, pack=True), None, "with patches with pack=True"),
        (PATCHES, tbljax.Augment(size=(8, 8)), "patches with an Augment size"),
    ],
)
def test_resident_refuses_what_it_does_not_serve_with_patches_by_name(resident, patches, augment, words):
    with pytest.raises(ValueError, match=words):
        resident["mixed"].batch(0, batch_size=G, patches=patches, augment=augment)
    with pytest.raises(ValueError, match="layout='NCHW'"):
        resident["same"].batch(0, batch_size=G, patches=PATCHES, layout="NCHW")

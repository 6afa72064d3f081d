"""Per-image ops and random erasing on NaFlex rows inside `jax.jit` (issue 49):
`ResidentDataset.batch(patches=..., augment=Augment(size=None, ops=[...], erasing=...))` against
the batches `tbljax.loader` serves for the same (seed, epoch, step), bit for bit, over records of
many aspect ratios (so many NaFlex sizes, each row's affine matrices finished at its own size)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tbljax
from tbljax._src.engine import pixel_program
from tbljax._src.rules import pixel_ops, randaug

SIZES = [
    (20, 14),
    (9, 30),
    (33, 33),
    (5, 7),
    (40, 12),
    (17, 23),
    (48, 36),
    (12, 41),
    (26, 19),
    (8, 8),
    (30, 9),
    (22, 44),
]
P, T, G, SEED = 4, 20, 4, 7
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
PATCHES = tbljax.Patches(size=P, max_tokens=T)
_C = pixel_ops.CODES
TIMM = tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1")
# Every affine op, RandAugment's (two a row, always applied) and TrivialAugment's: each at many sizes.
AFFINE = tbljax.RandAugment(
    num_ops=2,
    magnitude=9,
    prob=1.0,
    ops=["Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"],
)
TIMM_ERASING = tbljax.Augment(size=None, scale=(0.3, 1.0), ops=[TIMM], erasing=tbljax.RandomErasing(p=0.5))


def _affine_erasing(third):
    """AFFINE and TrivialAugment, then `third`, with up to 3 erasing boxes of random pixels a row."""
    erasing = tbljax.RandomErasing(p=1.0, max_count=3, mode="rand")
    return tbljax.Augment(size=None, scale=(0.4, 1.0), ops=[AFFINE, tbljax.TrivialAugment(), third], erasing=erasing)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    rng = np.random.default_rng(12)
    path = str(tmp_path_factory.mktemp("resident_patch_ops") / "mixed.tbl")
    with tbljax.Writer(path, len(SIZES)) as w:
        for h, wd in SIZES:
            w.add_raw(rng.integers(0, 256, (h, wd, 3), dtype=np.uint8))
        w.set_metadata(labels=np.arange(len(SIZES)))
    return path, tbljax.ResidentDataset(path)


def _check_equal_to_loader(path, ds, augment, dtype, epochs, backend="ffi"):
    """Every full batch of `epochs` epochs in jit equals the loader's; returns the drawn (codes).
    The twin runs under x64 (its affine ops resample in float64), the loader's batches read first."""
    norm = dict(mean=MEAN, std=STD) if dtype != "uint8" else {}
    kw = dict(augment=augment, dtype=dtype, patches=PATCHES, seed=SEED, **norm)
    per = ds.steps_per_epoch(G)
    ld = tbljax.loader(path, G, num_epochs=epochs, drop_remainder=True, **kw)
    batches = [{k: np.asarray(v) for k, v in b.items()} for b in ld]

    @jax.jit
    def step(ds, s, e):
        return ds.batch(s, epoch=e, batch_size=G, backend=backend, **kw)

    codes = []
    with jax.enable_x64(backend == "twin"):
        got_all = [step(ds, jnp.int32(n % per), jnp.int32(n // per)) for n in range(len(batches))]
    for n, (want, got) in enumerate(zip(batches, got_all)):
        e, s = n // per, n % per
        for k in ("image", "label", "index", "patch_yx", "patch_valid"):
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=f"epoch {e} step {s}: {k}")
        idx = np.asarray(want["index"], np.int64)
        codes.append(randaug.decide(augment.ops, idx, seed=SEED, epoch=e)[0])
    assert len(codes) == epochs * per
    return np.concatenate(codes)


@pytest.mark.parametrize(
    "augment, dtype, epochs, want_codes",
    [
        (TIMM_ERASING, "float32", 2, ()),
        (
            _affine_erasing(tbljax.TrivialAugment()),
            "bfloat16",
            2,
            (*AFFINE.ops, "TvRotate", "TvShearX", "TvShearY", "TvTranslateX", "TvTranslateY"),
        ),
    ],
    ids=["timm-erasing", "affine-erasing"],
)
def test_resident_patch_rows_with_ops_equal_the_loaders(mixed, augment, dtype, epochs, want_codes):
    path, ds = mixed
    codes = _check_equal_to_loader(path, ds, augment, dtype, epochs)
    missing = {n for n in want_codes if not (codes == _C[n]).any()}
    assert not missing, f"the draws never ran {missing}: pick another seed"


@pytest.mark.parametrize(
    "augment, dtype, epochs",
    [
        (
            tbljax.Augment(
                size=None,
                ops=[
                    tbljax.RandAugment(num_ops=2, prob=1.0, ops=["AutoContrast", "Equalize", "Contrast", "Sharpness"])
                ],
                erasing=tbljax.RandomErasing(p=1.0, max_count=2),
            ),
            "float32",
            1,
        ),
        (TIMM_ERASING, "float32", 2),
        (_affine_erasing(tbljax.ThreeAugment()), "bfloat16", 1),
    ],
    ids=["stats-erasing", "timm-erasing", "affine-three-erasing"],
)
def test_resident_patch_rows_with_ops_on_the_twin_equal_the_loaders(mixed, augment, dtype, epochs):
    # The pure-JAX twin (what runs on TPU / GPU without our handler): the same bytes as the loader.
    path, ds = mixed
    _check_equal_to_loader(path, ds, augment, dtype, epochs, backend="twin")


@pytest.mark.parametrize(
    "patches, backend, words",
    [
        (None, "ffi", r"a pixel_program of per-row sizes \(out_hw \(B, 2\)\) is for NaFlex rows"),
        (None, "twin", r"a pixel_program of per-row sizes \(out_hw \(B, 2\)\) is for NaFlex rows"),
    ],
    ids=["no-patches-ffi", "no-patches-twin"],
)
def test_op_refuses_a_program_of_per_row_sizes_where_it_is_not_served_by_name(patches, backend, words):
    sizes = np.array([[8, 8], [4, 12]])
    invert = [tbljax.RandAugment(num_ops=1, ops=["Invert"])]
    prog = tbljax.ops.pixel_program(
        np.full((2, 1), _C["Invert"], np.uint8), np.zeros((2, 1), np.int32), sizes, policies=invert
    )
    kw = dict(out_size=(T, P * P * 3)) if patches is not None else dict(out_size=(8, 8))
    with pytest.raises(ValueError, match=words):
        tbljax.ops.gather_normalize(
            np.zeros((3, 10, 12, 3), np.uint8),
            np.array([0, 1]),
            crop=np.array([[0, 0, 10, 12]] * 2, np.int32),
            patches=patches,
            ops=prog,
            backend=backend,
            **kw,
        )


def _finish(code, m, h, w):
    """gather_cpu.cpp's FinishAtSize in Python floats (IEEE float64, one rounding an operation)."""
    m = list(m)
    cx, cy = w / 2.0, h / 2.0
    if code in (_C["Rotate"], _C["TvRotate"]):
        m[2] = m[0] * -cx + m[1] * -cy + cx
        m[5] = m[3] * -cx + m[4] * -cy + cy
    elif code == _C["TranslateXRel"]:
        m[2] = m[2] * w
    elif code == _C["TranslateYRel"]:
        m[5] = m[5] * h
    elif code in (_C["TvTranslateX"], _C["TvTranslateY"]):
        x, y = -cx - m[2], -cy - m[5]
        m[2] = 0.0 + (m[0] * x + m[1] * y) + cx
        m[5] = 0.0 + (m[3] * x + m[4] * y) + cy
    return np.array(m, np.float64)


@pytest.mark.parametrize("policy", [TIMM, AFFINE, tbljax.TrivialAugment()], ids=["timm", "affine", "trivial"])
def test_size_free_templates_finished_at_a_size_are_that_sizes_matrices(policy):
    # The templates the jit program carries, finished as the handler finishes them, against the
    # host's pixel_ops.op_matrix at that size, bit for bit: every drawable affine argument at
    # NaFlex sizes of several aspects (odd and even sides, so half-integer centres).
    tp = (getattr(policy, "translate_const", 100.0), getattr(policy, "translate_pct", 0.45))
    (entries,) = pixel_program.size_free_table([policy])
    assert entries, "no affine ops drawn"
    for h, w in [(16, 256), (208, 304), (40, 12), (1, 7), (33, 65)]:
        for code, args, templates in entries:
            step = max(1, len(args) // 16)  # mstd's ~4096 arguments an op: every step-th and the last
            for a, t in zip([*args[::step].tolist(), int(args[-1])], [*templates[::step], templates[-1]]):
                want = np.array(pixel_ops.op_matrix(code, a, h, w, *tp), np.float64)
                got = _finish(code, t, h, w)
                np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64), err_msg=f"{code} {a} {h}x{w}")

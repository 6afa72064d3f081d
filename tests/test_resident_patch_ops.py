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
P, T, G, SEED = 4, 20, 4, 5
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
PATCHES = tbljax.Patches(size=P, max_tokens=T)
_C = pixel_ops.CODES
TIMM = tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1")
# Every RandAugment affine op, two a row, always applied: each at many sizes.
AFFINE = tbljax.RandAugment(
    num_ops=2, magnitude=9, prob=1.0, ops=["Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]
)


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
    """Every full batch of `epochs` epochs in jit equals the loader's; returns the drawn (codes)."""
    norm = dict(mean=MEAN, std=STD) if dtype != "uint8" else {}
    kw = dict(augment=augment, dtype=dtype, patches=PATCHES, seed=SEED, **norm)
    per = ds.steps_per_epoch(G)
    ld = tbljax.loader(path, G, num_epochs=epochs, drop_remainder=True, **kw)

    @jax.jit
    def step(ds, s, e):
        return ds.batch(s, epoch=e, batch_size=G, backend=backend, **kw)

    codes = []
    for n, want in enumerate(ld):
        e, s = n // per, n % per
        got = step(ds, jnp.int32(s), jnp.int32(e))
        for k in ("image", "label", "index", "patch_yx", "patch_valid"):
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=f"epoch {e} step {s}: {k}")
        idx = np.asarray(want["index"], np.int64)
        codes.append(randaug.decide(augment.ops, idx, seed=SEED, epoch=e)[0])
    assert len(codes) == epochs * per
    return np.concatenate(codes)


@pytest.mark.parametrize(
    "augment, dtype, epochs, want_codes",
    [
        (
            tbljax.Augment(size=None, scale=(0.3, 1.0), ops=[TIMM], erasing=tbljax.RandomErasing(p=0.5)),
            "float32",
            2,
            (),
        ),
        (
            tbljax.Augment(size=None, ops=[AFFINE], erasing=tbljax.RandomErasing(p=1.0, max_count=3, mode="rand")),
            "bfloat16",
            2,
            ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"),
        ),
        (
            tbljax.Augment(size=None, scale=(0.4, 1.0), ops=[tbljax.TrivialAugment(), tbljax.TrivialAugment()]),
            "uint8",
            3,
            ("TvRotate", "TvShearX", "TvShearY", "TvTranslateX", "TvTranslateY"),
        ),
    ],
    ids=["timm-erasing", "affine-erasing", "trivial"],
)
def test_resident_patch_rows_with_ops_equal_the_loaders(mixed, augment, dtype, epochs, want_codes):
    path, ds = mixed
    codes = _check_equal_to_loader(path, ds, augment, dtype, epochs)
    missing = {n for n in want_codes if not (codes == _C[n]).any()}
    assert not missing, f"the draws never ran {missing}: pick another seed"


def test_resident_patch_rows_with_ops_refuse_the_twin_by_name(mixed):
    _, ds = mixed
    aug = tbljax.Augment(size=None, ops=[tbljax.RandAugment(num_ops=1)])
    with pytest.raises(ValueError, match="NaFlex rows with per-image ops run in the FFI handler"):
        ds.batch(0, batch_size=G, augment=aug, patches=PATCHES, backend="twin")

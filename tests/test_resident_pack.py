"""Packed NaFlex sequences inside jax.jit (issue 49): `ResidentDataset.pack_plan` and
`batch(plan=)` against the host loader `tbljax.loader(patches=Patches(pack=True))` (the
reference: tests/test_matrix.py holds it to the NumPy oracle's resizes and `naflex.pack`), every
key of every step of two epochs bit for bit, padding sequences included, on the FFI handler and
the twin, one trace for both epochs (whose step counts differ); what is not served is refused by
name."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import tbljax

from _loader_testing import loader_epoch, resident_of_sizes, same_batch

SIZES = [(20, 14), (9, 30), (33, 33), (5, 7), (40, 12), (17, 23), (48, 36), (12, 41), (26, 19), (8, 8), (30, 10)]
# 3 to 6 tokens an image, up to 4 a sequence; epochs 0 and 1 pack 6 and 7 sequences (3 and 4 steps).
PACK = tbljax.Patches(size=4, max_tokens=12, pack=True, image_tokens=6, pack_window=3)
SEED, G = 3, 2
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
RECIPE = tbljax.Augment(
    crop=False,
    size=None,
    ops=[tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1")],
    erasing=tbljax.RandomErasing(p=0.5),
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d, rng = tmp_path_factory.mktemp("resident_pack"), np.random.default_rng(11)
    return {
        "mixed": resident_of_sizes(str(d / "mixed.tbl"), SIZES, rng, 48),
        "same": resident_of_sizes(str(d / "same.tbl"), [(18, 30)] * 9, rng, 48),
    }


def _loader(path, epoch, **kw):
    return loader_epoch(path, G, epoch, patches=PACK, seed=SEED, **kw)


@pytest.mark.parametrize(
    "kind, backend, augment, dtype, drop",
    [
        ("mixed", "twin", "flip", "float32", False),
        ("mixed", "ffi", RECIPE, "float32", False),  # per-image ops and erasing at image_tokens
        ("mixed", "twin", RECIPE, "float32", False),  # the same on the twin (its affine ops under x64)
        ("same", "ffi", "flip", "bfloat16", True),  # outside jit: a cached program of its own
    ],
)
def test_every_step_of_two_epochs_equals_the_loaders_bit_for_bit_in_one_trace(
    data, kind, backend, augment, dtype, drop
):
    path, ds = data[kind]
    norm = dict(mean=MEAN, std=STD) if dtype != "uint8" else {}
    kw = dict(augment=augment, dtype=dtype, **norm)
    traced = []

    def step(ds, plan, s):
        traced.append(1)
        return ds.batch(s, batch_size=G, seed=SEED, backend=backend, plan=plan, **kw)

    step = jax.jit(step) if kind == "mixed" else step
    steps = []
    for epoch in (0, 1):
        plan = ds.pack_plan(G, PACK, seed=SEED, epoch=epoch, drop_remainder=drop)
        want = _loader(path, epoch, drop_remainder=drop, **kw)
        assert plan.steps == len(want)
        steps.append(plan.steps)
        for s, w in enumerate(want):
            with jax.enable_x64(backend == "twin" and not isinstance(augment, str)):
                got = step(ds, plan, s)
            same_batch(got, w, f"epoch {epoch} step {s}")
    if kind == "mixed":
        assert len(traced) == 1  # one program for every step of both epochs
        assert steps == [3, 4]  # epoch 1 packs one more sequence: its last step holds a padding sequence
        assert (w["segment_ids"].max(1) > 1).any() and not w["valid"].all()  # several images a row; padding


SPLIT_CHILD = r"""
import sys
import numpy as np, jax
import tbljax
assert len(jax.devices()) == 2
path, out, g = sys.argv[1], sys.argv[2], int(sys.argv[3])
ds = tbljax.ResidentDataset(path)
pack = tbljax.Patches(size=4, max_tokens=12, pack=True, image_tokens=6, pack_window=3)
step = jax.jit(lambda ds, plan, s: ds.batch(s, batch_size=g, seed=3, augment="flip", dtype="uint8", plan=plan))
got = {}
for e in (0, 1):
    plan = ds.pack_plan(g, pack, seed=3, epoch=e)
    for s in range(plan.steps):
        b = step(ds, plan, s)
        assert {x.data.shape[0] for x in b["image"].addressable_shards} == {g // 2}  # each device its half
        got.update({f"{e}|{s}|{k}": np.asarray(v) for k, v in b.items()})
try:
    ds.batch(0, batch_size=3, seed=3, plan=ds.pack_plan(3, pack, seed=3))
except ValueError as err:
    got["refused"] = np.array(str(err))
np.savez(out, **got)
"""


def test_a_batch_split_over_two_devices_is_the_loaders(data, tmp_path):
    """Over 2 CPU devices each device assembles its half of the step's sequences (from its own
    first sequence): the global batch is the loader's, every key of every step of two epochs;
    a batch that does not split over the devices is refused by name."""
    path, _ = data["mixed"]
    out = tmp_path / "got.npz"
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2")
    p = subprocess.run(
        [sys.executable, "-c", SPLIT_CHILD, path, str(out), str(G)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    got = dict(np.load(out))
    assert "does not split evenly over the 2 batch shards" in str(got.pop("refused"))
    n = 0
    for epoch in (0, 1):
        for s, w in enumerate(_loader(path, epoch, augment="flip", dtype="uint8", drop_remainder=False)):
            same_batch({k: got[f"{epoch}|{s}|{k}"] for k in w}, w, f"epoch {epoch} step {s}")
            n += len(w)
    assert len(got) == n


def test_what_packed_batches_do_not_serve_is_refused_by_name(data):
    _, ds = data["mixed"]
    plan = ds.pack_plan(G, PACK, seed=SEED)
    cases = [
        (dict(patches=PACK), "pass plan=ds.pack_plan"),
        (dict(plan=plan, augment=tbljax.Augment(size=None)), "pack=True and an Augment crop"),
        (dict(plan=plan, epoch=0), "the plan holds the epoch"),
        (dict(plan=plan, seed=SEED + 1), "is not the plan's"),
        (dict(plan=plan, patches=tbljax.Patches(size=4, max_tokens=12, pack=True)), "is not the plan's"),
        (dict(plan=plan, bucket=0), "packed sequences have no buckets"),
    ]
    for kw, words in cases:
        with pytest.raises(ValueError, match=words):
            ds.batch(0, batch_size=G, **{"seed": SEED, **kw})
    with pytest.raises(ValueError, match="Patches\\(..., pack=True\\)"):
        ds.pack_plan(G, tbljax.Patches(size=4, max_tokens=12))
    with pytest.raises(ValueError, match="leaves no step"):
        ds.pack_plan(64, PACK, drop_remainder=True)
    with pytest.raises(ValueError, match="closed over"):
        jax.jit(lambda s: ds.batch(s, batch_size=G, seed=SEED, plan=plan))(0)

"""A NaFlex length schedule inside jax.jit (issue 49): `ResidentDataset.length_plan` and
`batch(plan=, max_tokens=)` against the host loader `tbljax.loader(patches=Patches(max_tokens=[...]))`
(the reference: tests/test_matrix.py holds its rows to the NumPy oracle), every key of every step
bit for bit, padding rows included, on the FFI handler and the twin; one program per length, which
a new epoch's plan runs again; what cannot work is refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import tbljax
from tbljax._src.rules import naflex

from _loader_testing import loader_epoch, resident_of_sizes, same_batch

SIZES = [(20, 14), (9, 30), (33, 33), (5, 7), (40, 12), (17, 23), (48, 36), (12, 41), (26, 19), (8, 8), (30, 30)]
SEED = 5  # epochs 0 and 1 order their steps differently, and epoch 0 pads a step
# Lengths 8 and 20 tokens of 4x4 patches, 40 tokens a step: 5 rows of 8 or 2 rows of 20.
LENGTHS = tbljax.Patches(size=4, max_tokens=[8, 20], tokens_per_batch=40, batch_divisor=1)
G = 5  # the largest step's rows: the loader's batch_size
RECIPE = tbljax.Augment(
    size=None,
    scale=(0.3, 1.0),
    ops=[tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1")],
    erasing=tbljax.RandomErasing(p=0.5),
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("resident_lengths") / "mixed.tbl")
    return resident_of_sizes(path, SIZES, np.random.default_rng(11), 48)


def _loader(path, epoch, **kw):
    kw = dict(seed=SEED, augment="flip", dtype="uint8", drop_remainder=False) | kw
    return loader_epoch(path, G, epoch, patches=LENGTHS, **kw)


@pytest.mark.parametrize(
    "backend, augment, dtype",
    [
        ("twin", "flip", "uint8"),
        ("ffi", RECIPE, "float32"),  # per-image ops and erasing at each step's length
        ("twin", RECIPE, "float32"),  # the same on the twin (its affine ops under x64)
    ],
)
def test_every_step_of_two_epochs_equals_the_loaders_bit_for_bit_one_trace_a_length(data, backend, augment, dtype):
    path, ds = data
    traced = []

    def body(ds, plan, s, t):
        traced.append(t)
        kw = dict(seed=SEED, augment=augment, dtype=dtype, backend=backend)
        return ds.batch(s, batch_size=G, plan=plan, max_tokens=t, **kw)

    step = jax.jit(body, static_argnums=3)
    plans = [ds.length_plan(LENGTHS, seed=SEED, epoch=e) for e in (0, 1)]
    assert len({jax.tree_util.tree_structure(p) for p in plans}) == 1  # one static part for every epoch
    assert plans[0].length.tolist() != plans[1].length.tolist()  # though the epochs' schedules differ
    padded = 0
    for epoch, plan in enumerate(plans):
        want = _loader(path, epoch, augment=augment, dtype=dtype)
        assert plan.steps == len(want) and plan.length.tolist() == [w["image"].shape[1] for w in want]
        assert plan.batch_size.tolist() == [len(w["index"]) for w in want]
        for s, w in enumerate(want):
            with jax.enable_x64(backend == "twin" and not isinstance(augment, str)):
                got = step(ds, plan, s, int(plan.length[s]))
            same_batch(got, w, f"epoch {epoch} step {s}")
            padded += int((~w["valid"]).sum())
    assert padded  # the padding rows were compared too
    assert sorted(traced) == [8, 20]  # one program per length: the second epoch traced nothing


def test_drop_remainder_and_the_eager_call_serve_what_the_loader_serves(data):
    path, ds = data
    want = _loader(path, 1, drop_remainder=True)
    plan = ds.length_plan(LENGTHS, seed=SEED, epoch=1, drop_remainder=True)
    assert plan.steps == len(want) and plan.length.tolist() == [w["image"].shape[1] for w in want]
    at_8 = [s for s in range(plan.steps) if plan.length[s] == 8]  # one length: one program to compile
    assert at_8
    for s in at_8:  # outside jit: a cached jitted program per length
        got = ds.batch(s, batch_size=G, seed=SEED, plan=plan, max_tokens=8, augment="flip", dtype="uint8")
        same_batch(got, want[s], f"step {s}")
        assert "valid" not in got


def test_the_twin_sizes_its_weights_by_the_naflex_bound_of_the_steps_length(data):
    _, ds = data
    plan = ds.length_plan(LENGTHS, seed=SEED)
    side = max(max(hw) for hw in SIZES)  # the records' largest side (stored at their own sizes)
    for t, b in zip(plan.lengths, plan.sizes):
        step = jax.make_jaxpr(
            lambda ds, plan, t=t: ds.batch(0, batch_size=G, seed=SEED, plan=plan, max_tokens=t, backend="twin")
        )
        text = str(step(ds, plan))
        k = naflex.max_taps(side, 4, t)
        assert k < 2 * side // 4 + 1 and f"i32[{b},{t},4,{k}]" in text, (t, k)


def _refused(ds, made, **kw):
    args = dict(batch_size=G, seed=SEED, plan=made, max_tokens=int(made.length[0])) | kw
    return ds.batch(0, **args)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(epoch=1), "the plan holds the epoch"),
        (dict(seed=SEED + 1), "is not the plan's 5"),
        (dict(batch_size=2), "batch_size 2 is not the plan's 5"),
        (dict(max_tokens=12), r"max_tokens must be one of the plan's lengths \[8, 20\]"),
        (dict(max_tokens=None), "max_tokens must be one of the plan's lengths"),
        (dict(plan="p"), "plan must be a plan from ds.length_plan"),
        (dict(patches=tbljax.Patches(size=4, max_tokens=20)), "is not the plan's Patches"),
        (dict(augment=tbljax.Augment(size=(8, 8))), "patches with an Augment size"),
        (dict(repeats=2), "patches with repeats=2"),
        (dict(shuffle=False), "shuffle=False is not the plan's True"),
        (dict(bucket=0), "bucket=0 with a length plan"),
    ],
)
def test_what_cannot_work_is_refused_by_name(data, kw, words):
    _, ds = data
    with pytest.raises(ValueError, match=words):
        _refused(ds, ds.length_plan(LENGTHS, seed=SEED), **kw)


def test_a_traced_length_a_wrong_length_and_closed_over_plans_are_refused(data):
    path, ds = data
    plan = ds.length_plan(LENGTHS, seed=SEED)
    t = int(plan.length[0])
    with pytest.raises(ValueError, match="max_tokens is traced.*static_argnames='max_tokens'"):
        jax.jit(lambda ds, plan, t: ds.batch(0, batch_size=G, seed=SEED, plan=plan, max_tokens=t))(ds, plan, t)
    other = 8 if t == 20 else 20
    with pytest.raises(ValueError, match=f"step 0 of the plan has length {t}, not {other}"):
        _refused(ds, plan, max_tokens=other)
    with pytest.raises(ValueError, match="the plan is closed over"):
        jax.jit(lambda ds, s: ds.batch(s, batch_size=G, seed=SEED, plan=plan, max_tokens=t))(ds, 0)
    with pytest.raises(ValueError, match="Pass the dataset as an argument"):
        jax.jit(lambda plan, s: ds.batch(s, batch_size=G, seed=SEED, plan=plan, max_tokens=t))(plan, 0)
    with pytest.raises(ValueError, match=r"step must be an int in \[0, "):
        ds.batch(plan.steps, batch_size=G, seed=SEED, plan=plan, max_tokens=t)
    with pytest.raises(ValueError, match="length_plan takes a tbljax.Patches with a list of max_tokens"):
        ds.length_plan(tbljax.Patches(size=4, max_tokens=20))
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    by_record = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), PartitionSpec("data"))
    with pytest.raises(ValueError, match="records are partitioned over"):
        tbljax.ResidentDataset(path, by_record).length_plan(LENGTHS)


_TWO = textwrap.dedent("""
    import sys
    import numpy as np, jax
    import tbljax
    path, seed = sys.argv[1], int(sys.argv[2])
    assert jax.device_count() == 2
    ds = tbljax.ResidentDataset(path)  # a copy per device: each step's rows split over the 2
    odd = tbljax.Patches(size=4, max_tokens=[8, 20], tokens_per_batch=40, batch_divisor=1)  # 5 and 2 rows
    plan = ds.length_plan(odd, seed=seed)
    try:
        ds.batch(0, batch_size=5, seed=seed, plan=plan, max_tokens=int(plan.length[0]))
        raise SystemExit("not refused")
    except ValueError as e:
        words = ("(8, 5)] do not split over the 2 batch shards", "set batch_divisor to a multiple of 2")
        assert all(w in str(e) for w in words), e
    even = tbljax.Patches(size=4, max_tokens=[8, 20], tokens_per_batch=40, batch_divisor=2)  # 4 and 2 rows
    step = jax.jit(lambda ds, p, s, t: ds.batch(s, batch_size=4, seed=seed, plan=p, max_tokens=t, augment="flip",
                                               dtype="uint8", backend="twin"), static_argnums=3)
    plan = ds.length_plan(even, seed=seed)
    want = list(tbljax.loader(path, 4, patches=even, seed=seed, augment="flip", dtype="uint8", num_epochs=1,
                             drop_remainder=False))
    assert len(want) == plan.steps
    for s, w in enumerate(want):
        got = step(ds, plan, s, int(plan.length[s]))
        assert sorted(got) == sorted(w), (sorted(got), sorted(w))
        for k in w:
            assert np.array_equal(np.asarray(got[k]), np.asarray(w[k])), (s, k)
        rows = got["image"].sharding.shard_shape(got["image"].shape)[0]
        assert rows == int(plan.batch_size[s]) // 2, rows
    print("OK")
""")


def test_two_devices_split_each_steps_rows_and_a_batch_that_does_not_split_is_refused(data):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    r = subprocess.run(
        [sys.executable, "-c", _TWO, data[0], str(SEED)], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr

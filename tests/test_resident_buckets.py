"""Aspect-ratio buckets inside jax.jit (issue 49): `ResidentDataset.bucket_plan` and
`batch(plan=, bucket=)` against the host loader `tbljax.loader(..., buckets=)` (the reference:
tests/test_native_res.py holds it to the NumPy oracle's cover-crop), every key of every step
bit for bit, padding rows included; a new epoch's plan runs the compiled programs again; the
combinations that cannot work are refused by name."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tbljax

from _loader_testing import loader_epoch, resident_of_sizes, same_batch

# Four aspect ratios (2:1, 1:2, 1:1, 3:4) at several sizes, stored at their own sizes.
SIZES = [
    (24, 12),
    (20, 10),
    (12, 24),
    (9, 18),
    (24, 24),
    (15, 15),
    (18, 24),
    (12, 16),
    (22, 11),
    (10, 20),
    (21, 28),
    (8, 8),
]
BUCKETS = {crop: tbljax.Buckets(sizes=[(8, 16), (12, 12), (16, 8)], crop=crop) for crop in ("center", "random")}
SEED, G = 3, 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("resident_buckets") / "mixed.tbl")
    return resident_of_sizes(path, SIZES, np.random.default_rng(11), 28)


def _loader(path, buckets, epoch, **kw):
    kw = dict(seed=SEED, augment="flip", dtype="uint8", drop_remainder=False) | kw
    return loader_epoch(path, G, epoch, buckets=buckets, **kw)


@pytest.mark.parametrize(
    "backend, crop, dtype, layout",
    [
        ("ffi", "center", "float32", "NCHW"),
        ("ffi", "random", "uint8", "NHWC"),
        ("twin", "center", "uint8", "NHWC"),
        ("twin", "random", "bfloat16", "NHWC"),
    ],
)
def test_every_step_of_two_epochs_equals_the_loaders_bit_for_bit_one_trace_a_bucket(data, backend, crop, dtype, layout):
    path, ds = data
    traced = []

    def body(ds, plan, s, k):
        traced.append(k)
        kw = dict(seed=SEED, augment="flip", dtype=dtype, layout=layout, backend=backend)
        return ds.batch(s, batch_size=G, plan=plan, bucket=k, **kw)

    step = jax.jit(body, static_argnums=3)
    plans = [ds.bucket_plan(G, BUCKETS[crop], seed=SEED, epoch=e) for e in (0, 1)]
    assert len({jax.tree_util.tree_structure(p) for p in plans}) == 1  # one static part for every epoch
    assert plans[0].bucket.tolist() != plans[1].bucket.tolist()  # though the epochs' schedules differ
    padded = 0
    for epoch, plan in enumerate(plans):
        want = _loader(path, BUCKETS[crop], epoch, dtype=dtype, layout=layout)
        assert plan.steps == len(want) and plan.bucket.tolist() == [int(b["bucket"][0]) for b in want]
        for s, w in enumerate(want):
            same_batch(step(ds, plan, s, int(plan.bucket[s])), w, f"epoch {epoch} step {s}")
            padded += int((~w["valid"]).sum())
    assert padded  # the padding rows were compared too
    assert sorted(traced) == [0, 1, 2]  # one program per bucket: the second epoch traced nothing


def test_ops_and_erasing_run_at_the_buckets_size_as_the_loader_runs_them(data):
    path, ds = data
    ra = tbljax.RandAugment(num_ops=2, magnitude=9, prob=1.0)
    aug = tbljax.Augment(crop=False, size=None, ops=[ra], erasing=tbljax.RandomErasing(p=1.0, mode="pixel"))
    want = _loader(path, BUCKETS["random"], 0, augment=aug, dtype="float32")
    plan = ds.bucket_plan(G, BUCKETS["random"], seed=SEED)
    step = jax.jit(
        lambda ds, plan, s, k: ds.batch(s, batch_size=G, seed=SEED, plan=plan, bucket=k, augment=aug, backend="ffi"),
        static_argnums=3,
    )
    for s, w in enumerate(want):
        same_batch(step(ds, plan, s, int(plan.bucket[s])), w, f"step {s}")


def test_drop_remainder_and_the_eager_call_serve_what_the_loader_serves(data):
    path, ds = data
    want = _loader(path, BUCKETS["center"], 1, drop_remainder=True)
    plan = ds.bucket_plan(G, BUCKETS["center"], seed=SEED, epoch=1, drop_remainder=True)
    assert plan.steps == len(want)
    for s, w in enumerate(want):  # outside jit: a cached jitted program per bucket
        got = ds.batch(s, batch_size=G, seed=SEED, plan=plan, bucket=int(plan.bucket[s]), augment="flip", dtype="uint8")
        same_batch(got, w, f"step {s}")
        assert "valid" not in got


def _refused(ds, made, **kw):
    args = dict(batch_size=G, seed=SEED, plan=made, bucket=int(made.bucket[0])) | kw
    return ds.batch(0, **args)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(augment="rrc_flip"), "buckets with an Augment crop"),
        (dict(repeats=2), "repeats=2 with buckets"),
        (dict(epoch=1), "the plan holds the epoch"),
        (dict(seed=SEED + 1), "is not the plan's 3"),
        (dict(batch_size=2 * G), "batch_size 8 is not the plan's 4"),
        (dict(bucket=3), r"bucket must be an int in \[0, 3\)"),
        (dict(bucket=None), "plan.bucket"),
        (dict(plan="p"), "plan must be a plan from ds.bucket_plan"),
        (dict(patches=tbljax.Patches(size=8, max_tokens=16)), "buckets and patches together"),
    ],
)
def test_what_cannot_work_is_refused_by_name(data, kw, words):
    _, ds = data
    with pytest.raises(ValueError, match=words):
        _refused(ds, ds.bucket_plan(G, BUCKETS["center"], seed=SEED), **kw)


def test_a_traced_bucket_a_wrong_bucket_and_closed_over_plans_are_refused(data):
    _, ds = data
    plan = ds.bucket_plan(G, BUCKETS["center"], seed=SEED)
    with pytest.raises(ValueError, match="bucket is traced.*static_argnames='bucket'"):
        jax.jit(lambda ds, plan, k: ds.batch(0, batch_size=G, seed=SEED, plan=plan, bucket=k))(ds, plan, 0)
    other = next(k for k in range(3) if k != int(plan.bucket[0]))
    with pytest.raises(ValueError, match=f"step 0 of the plan is bucket {int(plan.bucket[0])}, not {other}"):
        _refused(ds, plan, bucket=other)
    with pytest.raises(ValueError, match="the plan is closed over"):
        jax.jit(lambda ds, s: ds.batch(s, batch_size=G, seed=SEED, plan=plan, bucket=int(plan.bucket[0])))(ds, 0)
    k = int(plan.bucket[0])
    with pytest.raises(ValueError, match="Pass the dataset as an argument"):
        jax.jit(lambda plan, s: ds.batch(s, batch_size=G, seed=SEED, plan=plan, bucket=k))(plan, 0)
    with pytest.raises(ValueError, match=r"step must be an int in \[0, "):
        ds.batch(plan.steps, batch_size=G, seed=SEED, plan=plan, bucket=0)


def test_bucket_plan_refuses_patches_partitioned_records_and_a_batch_no_bucket_fills(data):
    path, ds = data
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    by_record = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), PartitionSpec("data"))
    with pytest.raises(ValueError, match="buckets with records partitioned over devices"):
        tbljax.ResidentDataset(path, by_record).bucket_plan(G, BUCKETS["center"])
    with pytest.raises(ValueError, match="bucket_plan takes a tbljax.Buckets, got Patches"):
        ds.bucket_plan(G, tbljax.Patches())
    with pytest.raises(ValueError, match="no step"):
        ds.bucket_plan(len(SIZES), BUCKETS["center"], drop_remainder=True)

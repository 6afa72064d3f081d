"""Aspect-ratio buckets inside `jax.jit` (issue 49): a resident dataset's epoch planned on the
host with the loader's rules, each step drawn in the graph at its bucket's static size.

The host computes an epoch's schedule exactly as `tbljax.loader(..., buckets=)` does
(`rules/buckets.py`: `assign` of the stored sizes, `epoch_schedule`) into a `BucketPlan`, a
pytree whose leaves are the epoch's (S, G) record indices and the epoch, and whose static part
(the buckets, G, seed, ...) is the same every epoch: a new epoch's plan reuses the compiled
programs. Each step is one bucket, one output shape: the caller picks the static bucket of
step s from ``plan.bucket[s]`` (host NumPy) and runs that bucket's program, which takes the
step's row of indices, the cover boxes (`buckets.cover` under jax.numpy), the flips and the
per-image ops as the loader draws them, and serves the conditioning keys as the loader does
(padding rows: zero pixels, label and index -1, zero ``orig_hw`` and ``crop_yx``).

>>> plan = ds.bucket_plan(batch_size=8, buckets=tbljax.Buckets(sizes=[(64, 128), (96, 96)]), epoch=0)
>>> step = jax.jit(lambda ds, plan, s, k: ds.batch(s, batch_size=8, plan=plan, bucket=k), static_argnums=3)
>>> b = step(ds, plan, 0, int(plan.bucket[0]))
"""

from __future__ import annotations

import dataclasses
import functools
import typing

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from tbljax._src.engine import native_res
from tbljax._src.engine import step as _step
from tbljax._src.jax import ops as _ops
from tbljax._src.jax import program as _program
from tbljax._src.jax import resident_plans as _plans
from tbljax._src.jax import sharding as _sharding
from tbljax._src.rules import augment as _augment
from tbljax._src.rules import buckets as _buckets
from tbljax._src.rules import contract, order
from tbljax._src.rules.options import LoaderOptions

__all__ = ["BucketPlan", "batch", "plan"]


class PlanKey(typing.NamedTuple):
    """What a plan's programs depend on: the same every epoch (the pytree's static part)."""

    buckets: _buckets.Buckets
    sizes: tuple[tuple[int, int], ...]  # sorted by aspect: bucket k is sizes[k]
    batch_size: int
    seed: int
    shuffle: bool
    drop_remainder: bool
    steps: int
    fingerprint: str


@jax.tree_util.register_pytree_node_class
class BucketPlan(_plans.Plan):
    """One epoch of a resident dataset under aspect-ratio buckets (`ResidentDataset.bucket_plan`).

    ``indices``: int32 (S, G) device array, step s's global record indices (-1: padding);
    ``epoch``: int32 device scalar. ``bucket``: host NumPy int32 (S,), the bucket of each step
    (None inside jit: pick it before the call); ``steps`` S; ``sizes`` the buckets' (h, w), bucket
    k of size ``sizes[k]``. The leaves change with the epoch, the static part does not.
    """

    LEAVES = ("indices", "epoch")

    def __init__(self, indices, epoch, key: PlanKey, bucket=None):
        self.indices, self.epoch, self.key, self.bucket = indices, epoch, key, bucket

    @property
    def steps(self) -> int:
        return self.key.steps

    @property
    def sizes(self) -> tuple[tuple[int, int], ...]:
        return self.key.sizes

    def __repr__(self) -> str:
        return f"BucketPlan({self.steps} steps of {self.key.batch_size} over buckets {list(self.sizes)})"


def plan(
    ds, batch_size: int, buckets, *, seed: int = 0, epoch: int = 0, shuffle: bool = True, drop_remainder: bool = False
) -> BucketPlan:
    """Epoch `epoch` of `ds` (a `ResidentDataset`) under `buckets`: the loader's schedule."""
    if not isinstance(buckets, _buckets.Buckets):
        raise ValueError(
            f"bucket_plan takes a tbljax.Buckets, got {type(buckets).__name__} (patch sequences are not "
            "served with buckets)"
        )
    _plans.check_dataset(ds, "buckets")
    opts = LoaderOptions(
        batch_size=batch_size, seed=seed, shuffle=shuffle, buckets=buckets, drop_remainder=drop_remainder
    )
    seed, epoch = order.check_seed_epoch(seed, epoch)
    serving = native_res.BucketServing(ds.geometry, ds.num_records, opts, opts.batch_size)
    if serving.steps == 0:
        raise ValueError(
            f"batch_size {batch_size} with drop_remainder=True leaves no step: every bucket holds fewer "
            "records (use drop_remainder=False or a smaller batch)"
        )
    s = _buckets.epoch_schedule(
        serving.bucket, opts.batch_size, seed=seed, epoch=epoch, drop_remainder=drop_remainder, shuffle=shuffle
    )
    sizes = tuple((int(h), int(w)) for h, w in serving.sizes)
    key = PlanKey(
        buckets, sizes, opts.batch_size, seed, bool(shuffle), bool(drop_remainder), serving.steps, ds.fingerprint
    )
    rep = NamedSharding(ds.sharding.mesh, PartitionSpec())
    indices = jax.device_put(s.indices.astype(np.int32), rep)
    bucket = s.bucket.astype(np.int32)
    bucket.setflags(write=False)
    return BucketPlan(indices, jax.device_put(np.int32(epoch), rep), key, bucket)


def _check_call(ds, plan, bucket, opts: LoaderOptions, epoch) -> LoaderOptions:
    """The loader's options of a bucket batch, or a ValueError naming what is wrong."""
    if not isinstance(plan, BucketPlan):
        raise ValueError(f"plan must be a plan from ds.bucket_plan(...), got {type(plan).__name__}")
    if isinstance(bucket, jax.core.Tracer):
        raise ValueError(
            "bucket is traced, but each bucket is its own output shape: pass it as a static argument "
            "(jax.jit(..., static_argnames='bucket')), chosen on the host as int(plan.bucket[step])"
        )
    k = len(plan.sizes)
    if not contract.is_integer(bucket) or not 0 <= bucket < k:
        raise ValueError(f"bucket must be an int in [0, {k}) (plan.bucket[step]), got {bucket!r}")
    key = plan.key
    _plans.check_key(ds, key, opts, epoch, method="bucket_plan", batch_size=key.batch_size, repeats="buckets")
    _plans.check_dataset(ds, "buckets")
    # The loader's own refusals (an Augment crop: the bucket decides the crop).
    return dataclasses.replace(opts, buckets=key.buckets, drop_remainder=key.drop_remainder)


def batch(ds, step, *, plan: BucketPlan, bucket: int, opts: LoaderOptions, epoch, sharding, backend: str) -> dict:
    """Step `step` of `plan` at bucket `bucket` (static): `ResidentDataset.batch(plan=, bucket=)`."""
    opts = _check_call(ds, plan, bucket, opts, epoch)
    bucket = int(bucket)
    batch_axes, _ = _plans.split(ds, sharding, opts.batch_size)
    _plans.check_step(step, plan.steps)
    if not _plans.traced(ds, step, plan.indices):
        if plan.bucket is not None and int(plan.bucket[int(step)]) != bucket:
            raise ValueError(f"step {int(step)} of the plan is bucket {int(plan.bucket[int(step)])}, not {bucket}")
        return _eager(
            ds, plan, jnp.asarray(step, jnp.int32), bucket=bucket, opts=opts, batch_axes=batch_axes, backend=backend
        )
    return _serve(ds, plan, step, bucket=bucket, opts=opts, batch_axes=batch_axes, backend=backend)


def _serve(ds, plan: BucketPlan, step, *, bucket: int, opts: LoaderOptions, batch_axes, backend: str) -> dict:
    size = plan.sizes[bucket]
    local_b = opts.batch_size // _sharding.parts(ds.sharding, batch_axes)
    geo = _augment.RecordGeometry.of(ds.image_shape or ds.geometry)
    crop, aug = opts.buckets.crop, opts.augment
    mean, std = opts.normalization

    def per_shard(data, labels, fields, indices, epoch, step):
        shard = jax.lax.axis_index(batch_axes) if batch_axes else 0
        row = jax.lax.dynamic_index_in_dim(indices, step.astype(jnp.int32), keepdims=False)
        idx = jax.lax.dynamic_slice_in_dim(row, shard * local_b, local_b)
        valid = idx >= 0
        safe = jnp.where(valid, idx, 0)  # padding rows draw record 0 and are zeroed below
        hw = [jnp.broadcast_to(geo.gather(t, safe, jnp), safe.shape) for t in (geo.heights, geo.widths)]
        boxes = _buckets.cover(safe, *hw, size, crop=crop, seed=opts.seed, epoch=epoch, xp=jnp)
        flips = _augment.flips(safe, seed=opts.seed, epoch=epoch, xp=jnp) if aug is not None and aug.flip else None
        row_ops = _step.draw_ops(safe, opts, epoch=epoch, out_hw=size, xp=jnp)
        ops = None if row_ops is None else row_ops.program(_program.pixel_program)
        image = _ops.gather_normalize(
            data,
            safe,
            crop=boxes,
            flip=flips,
            out_size=size,
            layout=opts.layout,
            dtype=opts.out_dtype,
            mean=mean,
            std=std,
            ops=ops,
            backend=backend,
        )

        def rows(x, pad=0):  # padding rows as the loader serves them
            return jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.asarray(pad, x.dtype))

        out = {
            "image": rows(image),
            "label": rows(labels[safe], -1),
            "index": idx,
            "orig_hw": rows(jnp.stack(hw, -1).astype(jnp.int32)),
            "crop_yx": rows(boxes[:, :2]),
            "bucket": jnp.full(idx.shape, bucket, jnp.int32),
            **{n: rows(f[safe]) for n, f in fields.items()},
        }
        if not opts.drop_remainder:
            out["valid"] = valid
        return out

    rep, spec = PartitionSpec(), PartitionSpec(batch_axes or None)
    keys = ["image", "label", "index", "orig_hw", "crop_yx", "bucket", *ds.fields]
    fn = jax.shard_map(
        per_shard,
        mesh=ds.sharding.mesh,
        in_specs=(rep, rep, {n: rep for n in ds.fields}, rep, rep, rep),
        out_specs={k: spec for k in keys + ([] if opts.drop_remainder else ["valid"])},
    )
    return fn(ds.data, ds.labels, ds.fields, plan.indices, plan.epoch, jnp.asarray(step))


@functools.partial(jax.jit, static_argnames=("bucket", "opts", "batch_axes", "backend"))
def _eager(ds, plan, step, *, bucket, opts, batch_axes, backend):
    return _serve(ds, plan, step, bucket=bucket, opts=opts, batch_axes=batch_axes, backend=backend)

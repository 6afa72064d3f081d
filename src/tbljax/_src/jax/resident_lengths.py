"""A NaFlex length schedule inside `jax.jit` (issue 49): a resident dataset's epoch planned on the
host with the loader's rule (`naflex.length_schedule`, as `engine/naflex_lengths.py` serves it),
each step drawn in the graph at its length's static shape.

As `resident_buckets.py` plans buckets: the host computes epoch e's steps into a `LengthPlan`, a
pytree whose leaves are each step's first position and real rows and the epoch, and whose static
part (the Patches, seed, shuffle, drop_remainder, the step count) is the same every epoch (the
canonical batches come from the seed alone; an epoch permutes them), so a new epoch's plan runs
the compiled programs again. The caller picks step s's length from ``plan.length[s]`` (host
NumPy) and runs that length's program: its batch is the length's ``plan.batch_size[s]`` rows,
positions first[s] + r of the epoch's order drawn as `engine/step.draw` draws them, the rows
``r >= count[s]`` padding (zero image, label and index -1, zero fields and ``patch_yx``,
``patch_valid`` and ``valid`` False), each real row written by `resident_patches.serve` at
``max_tokens`` = the length: the loader's step, bit for bit.

>>> plan = ds.length_plan(tbljax.Patches(size=16, max_tokens=[256, 1024], tokens_per_batch=8192), epoch=0)
>>> step = jax.jit(lambda ds, plan, s, t: ds.batch(s, batch_size=32, plan=plan, max_tokens=t), static_argnums=3)
>>> b = step(ds, plan, 0, int(plan.length[0]))
"""

from __future__ import annotations

import dataclasses
import functools
import typing

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from tbljax._src.engine import step as _step
from tbljax._src.jax import resident_fields as _geo
from tbljax._src.jax import resident_patches as _patches
from tbljax._src.jax import resident_plans as _plans
from tbljax._src.jax import sharding as _sharding
from tbljax._src.rules import contract, naflex, order
from tbljax._src.rules.options import LoaderOptions

__all__ = ["LengthPlan", "batch", "plan"]


class PlanKey(typing.NamedTuple):
    """What a plan's programs depend on: the same every epoch (the pytree's static part)."""

    patches: naflex.Patches
    seed: int
    shuffle: bool
    drop_remainder: bool
    steps: int
    fingerprint: str


@jax.tree_util.register_pytree_node_class
class LengthPlan(_plans.Plan):
    """One epoch of a resident dataset under a NaFlex length schedule (`ResidentDataset.length_plan`).

    ``first``, ``count``: int32 (S,) device arrays, step s's first position in the epoch's order
    and its real rows (the rest of its batch is padding); ``epoch``: int32 device scalar.
    ``length``, ``batch_size``: host NumPy int32 (S,), each step's max_tokens and rows (None
    inside jit: pick the length before the call); ``steps`` S; ``lengths`` the schedule's lengths
    and ``sizes`` their batch sizes; ``biggest`` the largest step's rows (the loader's batch_size).
    """

    LEAVES = ("first", "count", "epoch")

    def __init__(self, first, count, epoch, key: PlanKey, length=None, batch_size=None):
        self.first, self.count, self.epoch, self.key = first, count, epoch, key
        self.length, self.batch_size = length, batch_size

    @property
    def steps(self) -> int:
        return self.key.steps

    @property
    def lengths(self) -> tuple[int, ...]:
        return self.key.patches.max_tokens

    @property
    def sizes(self) -> tuple[int, ...]:
        return _sizes(self.key.patches)

    @property
    def biggest(self) -> int:
        return max(self.sizes)

    def __repr__(self) -> str:
        return f"LengthPlan({self.steps} steps over lengths {list(self.lengths)} of {list(self.sizes)} rows)"


def _sizes(p: naflex.Patches) -> tuple[int, ...]:
    """Each length's batch size (timm's rule)."""
    return tuple(int(b) for b in naflex.length_batch_size(p.tokens_per_batch, np.array(p.max_tokens), p.batch_divisor))


def _check_dataset(ds, opts: LoaderOptions) -> None:
    """The refusals of resident patches (partitioned records, geometric fields, names)."""
    _patches.check(opts, _sharding.mesh_axes(ds.sharding), list(ds.fields), _geo.output_keys(ds.geometric))


def _at(opts: LoaderOptions, length: int, rows: int) -> LoaderOptions:
    """The options of one step: one max_tokens (the step's length) and its rows."""
    p = opts.patches
    return dataclasses.replace(opts, patches=naflex.Patches(p.size, length), batch_size=rows)


def plan(ds, patches, *, seed: int = 0, epoch: int = 0, shuffle: bool = True, drop_remainder: bool = False):
    """Epoch `epoch` of `ds` (a `ResidentDataset`) under the length schedule `patches`."""
    if not isinstance(patches, naflex.Patches) or not isinstance(patches.max_tokens, tuple):
        raise ValueError(
            "length_plan takes a tbljax.Patches with a list of max_tokens (a length schedule), got "
            f"{patches!r} (one max_tokens: ds.batch(patches=...) without a plan)"
        )
    seed, epoch = order.check_seed_epoch(seed, epoch)
    biggest = max(_sizes(patches))
    opts = LoaderOptions(batch_size=biggest, seed=seed, shuffle=shuffle, patches=patches)
    _check_dataset(ds, _at(opts, patches.max_tokens[0], biggest))
    s = naflex.length_schedule(
        ds.num_records, patches, seed=seed, epoch=epoch, drop_remainder=drop_remainder, shuffle=shuffle
    )
    if len(s.seq_len) == 0:
        raise ValueError(
            f"{patches} with drop_remainder=True leaves no step: the schedule's first batch holds more than "
            f"the {ds.num_records} records (use drop_remainder=False or a smaller tokens_per_batch)"
        )
    rep = NamedSharding(ds.sharding.mesh, PartitionSpec())
    host = [a.astype(np.int32) for a in (s.seq_len, s.batch_size)]
    for a in host:
        a.setflags(write=False)
    first, count = (jax.device_put(a.astype(np.int32), rep) for a in (s.first, s.count))
    key = PlanKey(patches, seed, bool(shuffle), bool(drop_remainder), len(s.seq_len), ds.fingerprint)
    return LengthPlan(first, count, jax.device_put(np.int32(epoch), rep), key, *host)


def _check_call(ds, plan, max_tokens, opts: LoaderOptions, epoch) -> LoaderOptions:
    """The loader's options of the step's length, or a ValueError naming what is wrong."""
    if not isinstance(plan, LengthPlan):
        raise ValueError(f"plan must be a plan from ds.length_plan(...), got {type(plan).__name__}")
    if isinstance(max_tokens, jax.core.Tracer):
        raise ValueError(
            "max_tokens is traced, but each length is its own output shape: pass it as a static argument "
            "(jax.jit(..., static_argnames='max_tokens')), chosen on the host as int(plan.length[step])"
        )
    if not contract.is_integer(max_tokens) or int(max_tokens) not in plan.lengths:
        raise ValueError(f"max_tokens must be one of the plan's lengths {list(plan.lengths)}, got {max_tokens!r}")
    key = plan.key
    why = " (the schedule's largest step, as the loader's batch_size; each step serves its own length's rows)"
    _plans.check_key(ds, key, opts, epoch, method="length_plan", batch_size=plan.biggest, why=why, patches=key.patches)
    full = dataclasses.replace(opts, patches=key.patches, drop_remainder=key.drop_remainder)  # the loader's checks
    rows = plan.sizes[plan.lengths.index(int(max_tokens))]
    at = _at(full, int(max_tokens), rows)
    _check_dataset(ds, at)
    return at


def batch(
    ds, step, *, plan: LengthPlan, max_tokens: int, opts: LoaderOptions, epoch, sharding, backend: str, bucket=None
):
    """Step `step` of `plan` at its length `max_tokens` (static): `ResidentDataset.batch(plan=, max_tokens=)`."""
    if bucket is not None:
        raise ValueError(
            f"bucket={bucket!r} with a length plan: a step of a length schedule is chosen by max_tokens="
            "int(plan.length[step]) (bucket= is for ds.bucket_plan)"
        )
    at = _check_call(ds, plan, max_tokens, opts, epoch)
    batch_axes, parts = _plans.split(ds, sharding)
    odd = [(t, b) for t, b in zip(plan.lengths, plan.sizes) if b % parts]
    if odd:
        raise ValueError(
            f"{plan.key.patches}: the batch sizes (length, rows) {odd} do not split over the {parts} batch "
            f"shards {batch_axes}: set batch_divisor to a multiple of {parts}"
        )
    _plans.check_step(step, plan.steps)
    if not _plans.traced(ds, step, plan.first):
        if plan.length is not None and int(plan.length[int(step)]) != int(max_tokens):
            raise ValueError(f"step {int(step)} of the plan has length {int(plan.length[int(step)])}, not {max_tokens}")
        return _eager(ds, plan, jnp.asarray(step, jnp.int32), opts=at, batch_axes=batch_axes, backend=backend)
    return _serve(ds, plan, step, opts=at, batch_axes=batch_axes, backend=backend)


def _serve(ds, plan: LengthPlan, step, *, opts: LoaderOptions, batch_axes, backend: str) -> dict:
    local_b = opts.batch_size // _sharding.parts(ds.sharding, batch_axes)
    image_hw = ds.image_shape or ds.geometry

    def per_shard(data, labels, fields, first, count, epoch, step):
        shard = jax.lax.axis_index(batch_axes) if batch_axes else 0
        step = step.astype(jnp.int32)
        f0, n = (jax.lax.dynamic_index_in_dim(a, step, keepdims=False) for a in (first, count))
        row = shard * local_b + jnp.arange(local_b, dtype=jnp.int32)
        valid = row < n
        pos = f0 + jnp.where(valid, row, 0)  # padding rows draw the step's first record, zeroed below
        idx, boxes, flips, _ = _step.draw(pos, opts, num_records=ds.num_records, image_hw=image_hw, epoch=epoch, xp=jnp)
        image, got = _patches.serve(data, idx, boxes, flips, opts, ds.geometry, backend=backend, epoch=epoch)

        def rows(x, pad=0):  # padding rows as the loader serves them
            return jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.asarray(pad, x.dtype))

        out = {
            "image": rows(image),
            "label": rows(labels[idx], -1),
            "index": rows(idx.astype(jnp.int32), -1),
            **{k: rows(v) for k, v in got.items()},
            **{k: rows(f[idx]) for k, f in fields.items()},
        }
        if not opts.drop_remainder:
            out["valid"] = valid
        return out

    rep, spec = PartitionSpec(), PartitionSpec(batch_axes or None)
    keys = ["image", "label", "index", *_patches.keys(opts), *ds.fields]
    fn = jax.shard_map(
        per_shard,
        mesh=ds.sharding.mesh,
        in_specs=(rep, rep, {k: rep for k in ds.fields}, rep, rep, rep, rep),
        out_specs={k: spec for k in keys + ([] if opts.drop_remainder else ["valid"])},
    )
    return fn(ds.data, ds.labels, ds.fields, plan.first, plan.count, plan.epoch, jnp.asarray(step))


@functools.partial(jax.jit, static_argnames=("opts", "batch_axes", "backend"))
def _eager(ds, plan, step, *, opts, batch_axes, backend):
    return _serve(ds, plan, step, opts=opts, batch_axes=batch_axes, backend=backend)

"""Packed NaFlex sequences (``Patches(pack=True)``, issue 49) inside `jax.jit`: an epoch's
packing computed on the host by the loader's rules (`engine/naflex_pack.py`'s `PackServing`:
`naflex.pack`, first-fit-decreasing in windows of the epoch's order), each step's sequences
assembled in the graph.

The plan (`PackPlan`) holds the epoch's packed records sorted by (sequence, offset): their
positions in the epoch's order, sequences and first tokens, flat arrays of N + G·S entries
(S: the most images a sequence can hold), so its shapes, and its static part, are the same
every epoch, however many sequences an epoch packs: a new epoch's plan reuses the compiled
program. Step s finds its first record by a binary search for sequence s·G and takes G·S
entries from there (a step holds at most that many images); with the batch split over P
devices, each device does so for its own G/P sequences. Each image is drawn as the loader
draws it (`engine/step.draw`: the record and flip of its position), written at ``image_tokens``
by `resident_patches.serve` (the one-image NaFlex rows, bit for bit the loader's), and placed at
its offset through a (G, T) map token -> (image, token in it): each image marks its first token,
a running max along the sequence carries the mark over its tokens.

>>> plan = ds.pack_plan(8, tbljax.Patches(16, 1024, pack=True), epoch=0)
>>> step = jax.jit(lambda ds, plan, s: ds.batch(s, batch_size=8, plan=plan))
>>> for s in range(plan.steps): b = step(ds, plan, s)
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
from tbljax._src.engine.naflex_pack import PACK_KEYS, PackServing
from tbljax._src.jax import resident_patches as _patches
from tbljax._src.jax import resident_plans as _plans
from tbljax._src.jax import sharding as _sharding
from tbljax._src.rules import naflex, order
from tbljax._src.rules.options import LoaderOptions

__all__ = ["PackPlan", "batch", "plan"]

_NO_SEQUENCE = np.iinfo(np.int32).max  # the sequence of the entries past the epoch's records


class PackKey(typing.NamedTuple):
    """What a plan's program depends on: the same every epoch (the pytree's static part)."""

    patches: naflex.Patches
    batch_size: int
    segments: int  # S: the most images one sequence holds
    seed: int
    shuffle: bool
    drop_remainder: bool
    fingerprint: str


@jax.tree_util.register_pytree_node_class
class PackPlan(_plans.Plan):
    """One epoch of a resident dataset packed into NaFlex sequences (`ResidentDataset.pack_plan`).

    ``position``, ``sequence``, ``offset``: int32 (N + G·S,) device arrays, the epoch's records
    (as positions of its order) sorted by (sequence, first token), then padding (sequence
    2³¹ - 1); ``epoch``: int32 device scalar. ``steps``: the epoch's steps (host int; None
    inside jit), which can differ by a few between epochs. The leaves change with the epoch,
    the static part does not.
    """

    LEAVES = ("position", "sequence", "offset", "epoch")

    def __init__(self, position, sequence, offset, epoch, key: PackKey, steps=None):
        self.position, self.sequence, self.offset, self.epoch = position, sequence, offset, epoch
        self.key, self.steps = key, steps

    def __repr__(self) -> str:
        p = self.key.patches
        return f"PackPlan({self.steps} steps of {self.key.batch_size} sequences of {p.max_tokens} tokens)"


def _check_dataset(ds, opts: LoaderOptions) -> None:
    """What a packed resident batch does not serve, refused by name (`resident_patches.check`
    refuses every schedule, packing included: the plans' dataset checks, and the packed keys')."""
    _plans.check_dataset(ds, "pack=True")
    clash = sorted(set(ds.fields) & {*PACK_KEYS, "valid"})
    if clash:
        raise ValueError(f"the dataset's field(s) {clash} have the names of keys packing adds: leave them out")


def _options(batch_size, patches, seed, shuffle, drop_remainder) -> LoaderOptions:
    if not isinstance(patches, naflex.Patches) or not patches.pack:
        raise ValueError(f"pack_plan takes a tbljax.Patches(..., pack=True), got {patches!r}")
    kw = dict(seed=seed, shuffle=shuffle, patches=patches, drop_remainder=drop_remainder)
    return LoaderOptions(batch_size=batch_size, **kw)


def plan(
    ds, batch_size: int, patches, *, seed: int = 0, epoch: int = 0, shuffle: bool = True, drop_remainder: bool = False
) -> PackPlan:
    """Epoch `epoch` of `ds` (a `ResidentDataset`) packed as `tbljax.loader(patches=patches)` packs it."""
    opts = _options(batch_size, patches, seed, shuffle, drop_remainder)
    _check_dataset(ds, opts)
    seed, epoch = order.check_seed_epoch(seed, epoch)
    serving = PackServing(ds.geometry, ds.num_records, opts, opts.batch_size)
    steps = serving.steps(epoch)
    if steps == 0:
        raise ValueError(
            f"batch_size {batch_size} with drop_remainder=True leaves no step: the epoch packs "
            f"{serving.packing(epoch).sequences} sequences (use drop_remainder=False or a smaller batch)"
        )
    pos, placed = serving.positions(epoch, 0, 0, steps * opts.batch_size)  # sorted by (sequence, offset)
    pad = opts.batch_size * serving.segments  # room for one more step's slice past the last record
    position = np.full(ds.num_records + pad, -1, np.int32)
    sequence = np.full(ds.num_records + pad, _NO_SEQUENCE, np.int32)
    offset = np.zeros(ds.num_records + pad, np.int32)
    position[: len(pos)], sequence[: len(pos)], offset[: len(pos)] = pos, placed.row, placed.offset
    key = PackKey(patches, opts.batch_size, serving.segments, seed, bool(shuffle), bool(drop_remainder), ds.fingerprint)
    rep = NamedSharding(ds.sharding.mesh, PartitionSpec())
    leaves = [jax.device_put(a, rep) for a in (position, sequence, offset, np.int32(epoch))]
    return PackPlan(*leaves, key, steps)


def _check_call(ds, plan, opts: LoaderOptions, epoch) -> LoaderOptions:
    """The loader's options of a packed batch, or a ValueError naming what is wrong."""
    key = plan.key
    kw = dict(method="pack_plan", batch_size=key.batch_size, repeats="pack=True", patches=key.patches)
    _plans.check_key(ds, key, opts, epoch, **kw)
    # The loader's own refusals (an Augment crop: a record's tokens come from its stored size).
    opts = dataclasses.replace(opts, patches=key.patches, drop_remainder=key.drop_remainder)
    _check_dataset(ds, opts)
    return opts


def batch(ds, step, *, plan, bucket, opts: LoaderOptions, epoch, sharding, backend: str) -> dict:
    """Step `step` of `plan`: `ResidentDataset.batch(plan=a PackPlan)`."""
    if not isinstance(plan, PackPlan):
        raise ValueError(
            "ResidentDataset.batch with patches with pack=True serves an epoch packed on the host: "
            f"pass plan=ds.pack_plan(batch_size, patches, epoch=e), got plan={type(plan).__name__}"
        )
    if bucket is not None:
        raise ValueError(f"bucket={bucket!r} with a pack plan: packed sequences have no buckets; leave it out")
    opts = _check_call(ds, plan, opts, epoch)
    batch_axes, _ = _plans.split(ds, sharding, opts.batch_size)
    _plans.check_step(step, plan.steps)
    if not _plans.traced(ds, step, plan.position):
        return _eager(ds, plan, jnp.asarray(step, jnp.int32), opts=opts, batch_axes=batch_axes, backend=backend)
    return _serve(ds, plan, step, opts=opts, batch_axes=batch_axes, backend=backend)


def _serve(ds, plan: PackPlan, step, *, opts: LoaderOptions, batch_axes, backend: str) -> dict:
    p, key = opts.patches, plan.key
    g = key.batch_size // _sharding.parts(ds.sharding, batch_axes)  # this device's sequences
    t, s = p.max_tokens, key.segments
    m, n = g * s, ds.num_records  # m: the most images g sequences hold
    image_opts = dataclasses.replace(opts, patches=naflex.Patches(p.size, p.image_tokens))
    rep = PartitionSpec()

    def serve(data, labels, fields, position, sequence, offset, epoch, step):
        shard = jax.lax.axis_index(batch_axes) if batch_axes else 0
        first_seq = step.astype(jnp.int32) * key.batch_size + shard * g
        lo = jnp.searchsorted(sequence, first_seq, side="left").astype(jnp.int32)
        pos, seq, off = (jax.lax.dynamic_slice_in_dim(a, lo, m) for a in (position, sequence, offset))
        row = jnp.where(seq < first_seq + g, seq - first_seq, g)  # g: not this step's (dropped below)
        ok = row < g
        k = jnp.arange(m, dtype=jnp.int32)
        new_row = jnp.concatenate([jnp.ones(1, bool), row[1:] != row[:-1]])
        number = k - jax.lax.cummax(jnp.where(new_row, k, 0))  # each image's segment in its sequence
        hw = ds.image_shape or ds.geometry
        idx, boxes, flips, _ = _step.draw(jnp.where(ok, pos, 0), opts, num_records=n, image_hw=hw, epoch=epoch, xp=jnp)
        rows, got = _patches.serve(data, idx, boxes, flips, image_opts, ds.geometry, backend=backend, epoch=epoch)
        tokens = got["patch_valid"].sum(-1, dtype=jnp.int32)
        # Token (r, j) -> the image starting last at or before it in sequence r, and its token.
        starts = jnp.full(g * t, -1, jnp.int32).at[jnp.where(ok, row * t + off, g * t)].set(k, mode="drop")
        slot = jax.lax.cummax(starts.reshape(g, t), axis=1)
        at = jnp.maximum(slot, 0)
        tok = jnp.arange(t, dtype=jnp.int32) - off[at]
        inside = (slot >= 0) & (tok < tokens[at])
        tok = jnp.where(inside, tok, 0)
        image = jnp.where(inside[..., None], rows[at, tok], jnp.zeros((), rows.dtype))
        yx = jnp.where(inside[..., None], got["patch_yx"][at, tok], 0)

        def per_segment(x, pad):  # (G, S, ...): each image's value at its (sequence, segment)
            return jnp.full((g, s, *x.shape[1:]), pad, x.dtype).at[row, number].set(x, mode="drop")

        out = {
            "image": image,
            "label": jnp.full(g, -1, jnp.int32),
            "index": jnp.full(g, -1, jnp.int32),
            "patch_yx": yx.astype(jnp.int32),
            "patch_valid": inside,
            "segment_ids": jnp.where(inside, number[at] + 1, 0).astype(jnp.int32),
            "segment_index": per_segment(idx.astype(jnp.int32), -1),
            "segment_label": per_segment(labels[idx].astype(jnp.int32), -1),
            **{n: per_segment(f[idx], 0) for n, f in fields.items()},
        }
        if not key.drop_remainder:  # sequences are filled as a prefix: valid where one holds an image
            out["valid"] = jnp.zeros(g, bool).at[row].set(True, mode="drop")
        return out

    keys = ["image", "label", "index", *PACK_KEYS, *ds.fields] + ([] if key.drop_remainder else ["valid"])
    fn = jax.shard_map(
        serve,
        mesh=ds.sharding.mesh,
        in_specs=(rep, rep, {n: rep for n in ds.fields}, rep, rep, rep, rep, rep),
        out_specs={n: PartitionSpec(batch_axes or None) for n in keys},
    )
    leaves = (plan.position, plan.sequence, plan.offset, plan.epoch)
    return fn(ds.data, ds.labels, ds.fields, *leaves, jnp.asarray(step))


@functools.partial(jax.jit, static_argnames=("opts", "batch_axes", "backend"))
def _eager(ds, plan, step, *, opts, batch_axes, backend):
    return _serve(ds, plan, step, opts=opts, batch_axes=batch_axes, backend=backend)

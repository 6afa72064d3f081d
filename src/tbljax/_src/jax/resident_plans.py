"""What a batch of an epoch's plan checks, whatever the plan (issue 49): `resident_buckets.py`,
`resident_pack.py` and `resident_lengths.py` each plan an epoch on the host into a pytree and
serve its steps in the graph; the call's options must be the plan's, its step in range, its
rows split over the batch shards, and the dataset and the plan arguments of the jitted function
(closed over, they would be constants of the compiled program); and what the dataset does not
serve with a plan (partitioned records, geometric fields). Each plan keeps its own checks (its
static arguments) and words its method and batch size. `Plan`: the pytree plumbing they share."""

from __future__ import annotations

import jax

from tbljax._src.engine import native_res
from tbljax._src.jax import sharding as _sharding
from tbljax._src.rules import contract
from tbljax._src.rules.options import LoaderOptions

__all__ = ["Plan", "check_dataset", "check_key", "check_step", "split", "traced"]


class Plan:
    """An epoch's plan as a pytree: its device arrays (the attributes named by ``LEAVES``) change
    with the epoch, its ``key`` (the static part) does not, so a new epoch's plan reuses the
    compiled programs. ``__init__`` takes the leaves, then the key, then host-only attributes
    (None once unflattened inside jit). Subclasses are registered with
    `jax.tree_util.register_pytree_node_class`."""

    LEAVES: tuple[str, ...] = ()

    def tree_flatten(self):
        return tuple(getattr(self, n) for n in self.LEAVES), self.key

    @classmethod
    def tree_unflatten(cls, key, children):
        return cls(*children, key)


def check_dataset(ds, what: str) -> None:
    """A ValueError if `ds` holds what `what` (a plan's schedule) does not serve."""
    if _sharding.mesh_axes(ds.sharding):
        raise ValueError(
            f"{what} with records partitioned over devices ({ds.sharding}): not yet (replicate the "
            "records: ResidentDataset(path) or sharding=a Mesh)"
        )
    geometric = [s.name for s in ds.geometric.specs]
    if geometric:
        raise ValueError(
            f"{what} with the geometric fields {geometric}: not served yet (leave them out with "
            "ResidentDataset(..., fields=[...]))"
        )
    native_res.check_names(ds.fields)


def check_key(
    ds, key, opts: LoaderOptions, epoch, *, method: str, batch_size: int, why="", repeats=None, patches=None
) -> None:
    """A ValueError naming the first of the call's options that is not the plan's `key`.

    ``method``: the plan's maker (``bucket_plan``); ``batch_size``, ``why``: the plan's batch size
    and what it is; ``repeats``: what refuses repeats (None: the loader's checks do); ``patches``:
    the plan's Patches, which the call may leave out (None: the plan has none)."""
    wrong = [
        (epoch is not None, f"epoch={epoch!r}: the plan holds the epoch (ds.{method}(..., epoch=e)); leave it out"),
        (
            repeats is not None and opts.repeats > 1,
            f"repeats={opts.repeats} with {repeats}: an epoch's plan serves each record once (repeats=1)",
        ),
        (key.fingerprint != ds.fingerprint, "the plan was made for another dataset (its fingerprint differs)"),
        (
            patches is not None and opts.patches is not None and opts.patches != patches,
            f"patches={opts.patches!r} is not the plan's {patches!r}: leave it out (the plan holds it)",
        ),
        (opts.batch_size != batch_size, f"batch_size {opts.batch_size} is not the plan's {batch_size}{why}"),
        (opts.seed != key.seed, f"seed {opts.seed} is not the plan's {key.seed}: pass the same seed to both"),
        (opts.shuffle != key.shuffle, f"shuffle={opts.shuffle} is not the plan's {key.shuffle}"),
    ]
    for bad, words in wrong:
        if bad:
            raise ValueError(words)


def split(ds, sharding, batch_size=None) -> tuple:
    """The batch's mesh axes and its shards; a ValueError if `batch_size` rows do not split over them."""
    _, batch_axes = _sharding.batch_axes(ds.sharding, sharding)
    parts = _sharding.parts(ds.sharding, batch_axes)
    if batch_size is not None and batch_size % parts:
        raise ValueError(
            f"batch_size {batch_size} does not split evenly over the {parts} batch shards {batch_axes}: "
            f"use a multiple of {parts}"
        )
    return batch_axes, parts


def check_step(step, steps) -> None:
    """A ValueError if a step known on the host is outside the plan's `steps` (None: not known)."""
    if isinstance(step, jax.core.Tracer) or steps is None:
        return
    if not (contract.is_integer(step) and 0 <= step < steps):
        raise ValueError(f"step must be an int in [0, {steps}) (the plan's steps), got {step!r}")


def traced(ds, step, leaf) -> bool:
    """True inside jit with the dataset and the plan (its array `leaf`) arguments of the jitted
    function, False outside jit (nothing traced); a ValueError naming what is closed over."""
    ds_traced, plan_traced = isinstance(ds.labels, jax.core.Tracer), isinstance(leaf, jax.core.Tracer)
    if ds_traced and plan_traced:
        return True
    if not (ds_traced or plan_traced or isinstance(step, jax.core.Tracer)):
        return False
    if plan_traced:
        raise ValueError(
            "ResidentDataset.batch is being traced with the dataset closed over: it would be embedded "
            "in the compiled program as a constant. Pass the dataset as an argument of the jitted function"
        )
    if ds_traced:
        raise ValueError(
            "the plan is closed over: its arrays would be constants of the compiled program, compiled "
            "again every epoch. Pass the plan as an argument of the jitted function"
        )
    raise ValueError(
        "ResidentDataset.batch is being traced with the dataset and the plan closed over: they would be "
        "constants of the compiled program (the plan's, compiled again every epoch). Pass both as arguments "
        "of the jitted function"
    )

"""Where the gather runs per shard: under `jax.shard_map` when the caller names a sharding, or
following the indices' sharding inside `jax.jit` (a `custom_partitioning` rule; `shard_map`
under a mesh with explicit axes). Each device gathers its own rows; nothing is all-gathered
but records that arrive sharded."""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from tbljax._src.jax import sharding as _sharding

__all__ = ["batch_spec", "follow_indices", "shard_map_rows"]


# The op's operands, in order: data (records, or the pages of packed records), the packed
# records' table (None for records of one size), indices, crop, flip, out, the normalization
# table, then the per-image ops (None without ops=): codes, args, matrix bits, fill, nearest,
# erase boxes, erase keys, normal table, then the NaFlex rows' sizes (None without patches).
# Their axes as factors of a Shardy sharding rule: the batch b is the one factor operands and
# result share (a result of NaFlex rows is (b, y, x): tokens and their values).
_FACTORS = (
    "n h w d",
    "r s",
    "b",
    "b k",
    "b",
    None,
    "t v",
    "b o",
    "b o",
    "b o m z",
    "o g",
    "o",
    "b e a",
    "b",
    "u",
    "b j",
)
_INDICES, _OUT, _SIZES = 2, 5, 15
# Split like the batch; records and tables are whole on every device.
_BATCHED = (2, 3, 4, 5, 7, 8, 9, 12, 13, 15)


def batch_spec(sharding):
    """A Mesh or NamedSharding of the batch → (mesh, PartitionSpec of the batch axis)."""
    s = _sharding.batch_sharding(sharding)
    mesh = getattr(s, "mesh", None)
    if mesh is None:
        raise TypeError(f"sharding must be a Mesh or NamedSharding, got {type(sharding).__name__}")
    return mesh, PartitionSpec(s.spec[0] if len(s.spec) else None)


def _present(body, args):
    """body over all the operands (`_FACTORS`) → (fn over the operands that are not None, their slots)."""
    slots = tuple(k for k, a in enumerate(args) if a is not None)

    def fn(*local):
        full = [None] * len(args)
        for k, a in zip(slots, local):
            full[k] = a
        return body(*full)

    return fn, slots


def shard_map_rows(body, args, mesh, spec):
    """body under `jax.shard_map`: each device gets its rows of the batched operands."""
    fn, slots = _present(body, args)
    rep = PartitionSpec()
    in_specs = tuple(spec if k in _BATCHED else rep for k in slots)
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=spec)(*(args[k] for k in slots))


def follow_indices(body, args, layout):
    """body as one op that XLA partitions like the indices (no `sharding=`, inside jit).

    A `custom_partitioning` rule: the batch axis of the result and of crop, flip and out is
    split as the indices' axis is; data and table are replicated (gathered first if they
    arrive sharded); each device runs body on its own rows. Indices that are replicated, or
    split over axes that do not divide the batch, run whole on every device. On one device,
    and inside a `shard_map` over every mesh axis, XLA inlines body as it is. Under a mesh
    with explicit axes the indices' type names their sharding, and `shard_map` splits the
    batch the same way (custom_partitioning there would type the result replicated).
    """
    fn, slots = _present(body, args)
    operands = [args[k] for k in slots]
    batch = int(args[_INDICES].shape[0])
    context = jax.sharding.get_abstract_mesh()
    if context.axis_names and set(context.manual_axes) == set(context.axis_names):
        return fn(*operands)  # inside shard_map over every axis: already one device's rows
    typed = getattr(jax.typeof(args[_INDICES]), "sharding", None)
    explicit = _explicit_entry(typed, batch)
    if explicit is not None:
        return shard_map_rows(body, args, typed.mesh, PartitionSpec(explicit))
    if not any(isinstance(x, jax.core.Tracer) for x in operands):
        return fn(*operands)  # eager: nothing is partitioned outside a compiled program

    from jax.experimental.custom_partitioning import custom_partitioning

    def placement(mesh, arg_shapes):
        entry = _split_entry(arg_shapes[slots.index(_INDICES)].sharding, batch)  # indices decide
        rows = NamedSharding(mesh, PartitionSpec(entry))
        rep = NamedSharding(mesh, PartitionSpec())
        return rows, tuple(rows if k in _BATCHED else rep for k in slots)

    def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
        del result_shape
        return placement(mesh, arg_shapes)[0]

    def partition(mesh, arg_shapes, result_shape):
        del result_shape
        rows, in_shardings = placement(mesh, arg_shapes)
        return mesh, fn, rows, in_shardings

    result = "b y x" if args[_SIZES] is not None else "b y x c" if layout == "NHWC" else "b c y x"
    data_factors = "n h w d" if args[0].ndim == 4 else "p q"
    factors = [result if k == _OUT else data_factors if k == 0 else _FACTORS[k] for k in slots]
    op = custom_partitioning(fn)
    op.def_partition(
        partition,
        infer_sharding_from_operands=infer_sharding_from_operands,
        sharding_rule=f"{', '.join(factors)} -> {result}",
    )

    # custom_partitioning has no batching rule: under vmap, body is batched as it is.
    @jax.custom_batching.custom_vmap
    def call(*xs):
        return op(*xs)

    @call.def_vmap
    def _(axis_size, in_batched, *xs):
        del axis_size
        return jax.vmap(fn, in_axes=tuple(0 if b else None for b in in_batched))(*xs), True

    return call(*operands)


def _split_entry(sharding, batch: int):
    """The PartitionSpec entry splitting a 1-D array's axis, if it divides `batch`, else None."""
    if getattr(sharding, "mesh", None) is None or getattr(sharding, "spec", None) is None:
        return None
    entry = sharding.spec[0] if len(sharding.spec) else None
    return entry if entry is not None and batch % _sharding.parts(sharding) == 0 else None


def _explicit_entry(sharding, batch: int):
    """`_split_entry` for an array typed with a sharding over explicit mesh axes, else None."""
    entry = _split_entry(sharding, batch)
    if entry is None:
        return None
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    types = dict(zip(sharding.mesh.axis_names, getattr(sharding.mesh, "axis_types", ())))
    axes = entry if isinstance(entry, tuple) else (entry,)
    return entry if explicit is not None and all(types.get(a) == explicit for a in axes) else None

"""What the user's `sharding=` argument means, decided once (JAX's alone: the rooms upstream
of `jax/` import no framework). A batch's
sharding (the loader, the in-jit op, the resident dataset's batches) partitions only the
leading batch axis; a resident dataset's sharding partitions only its record axis. jax is
imported when these are called, so `import tbljax` stays quick.
"""

from __future__ import annotations

import numpy as np

from tbljax._src.engine.rows import RowLayout, register_from_sharding

__all__ = ["batch_axes", "batch_sharding", "data_sharding", "mesh_axes", "parts", "row_layout"]


def _leading_only(sharding, what: str):
    from jax.sharding import NamedSharding, PartitionSpec

    spec = tuple(sharding.spec)
    if any(s is not None for s in spec[1:]):
        raise ValueError(
            f"sharding may partition only {what}, got spec {sharding.spec}; use e.g. PartitionSpec({spec[0]!r})"
        )
    return NamedSharding(sharding.mesh, PartitionSpec(spec[0] if spec else None))


def batch_sharding(sharding):
    """The sharding the user gave → one sharding for every batch array (leading axis only).

    None → the batch axis over all devices. A `Mesh` → the batch axis over all its axes. A
    `NamedSharding` may partition only the leading (batch) axis; it is applied to arrays of
    every rank, so image, label, index and valid rows land on the same devices.
    """
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

    if sharding is None:
        mesh = Mesh(np.array(jax.devices()), ("batch",))
        return NamedSharding(mesh, PartitionSpec("batch"))
    if isinstance(sharding, Mesh):
        return NamedSharding(sharding, PartitionSpec(sharding.axis_names))
    if isinstance(sharding, SingleDeviceSharding):
        return sharding
    if isinstance(sharding, NamedSharding):
        return _leading_only(sharding, "the batch (leading) axis")
    raise TypeError(
        f"sharding must be None, a jax.sharding.Mesh, NamedSharding or "
        f"SingleDeviceSharding, got {type(sharding).__name__}"
    )


def data_sharding(sharding):
    """Where a resident dataset's ``(N, H, W, 3)`` records live. None → replicated on all
    devices; a `Mesh` → replicated on it; a `NamedSharding` as given (it may partition the
    record axis N, and nothing else)."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if sharding is None:
        return NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec())
    if isinstance(sharding, Mesh):
        return NamedSharding(sharding, PartitionSpec())
    if isinstance(sharding, NamedSharding):
        return _leading_only(sharding, "the record axis (N) of the (N, H, W, 3) dataset")
    raise TypeError(f"sharding must be None, a jax.sharding.Mesh or a NamedSharding, got {type(sharding).__name__}")


def mesh_axes(sharding) -> tuple[str, ...]:
    """The mesh axes that partition the leading axis of a sharding from this module."""
    spec = getattr(sharding, "spec", None)
    entry = spec[0] if spec is not None and len(spec) else None
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def parts(sharding, axes: tuple[str, ...] | None = None) -> int:
    """How many pieces the leading axis is cut into (over `axes`, default the sharding's)."""
    axes = mesh_axes(sharding) if axes is None else axes
    mesh = getattr(sharding, "mesh", None)
    return int(np.prod([mesh.shape[a] for a in axes], dtype=np.int64)) if axes else 1


def batch_axes(data, sharding):
    """(mesh, the mesh axes a resident batch's rows split over) for a resident dataset placed
    by `data` (from `data_sharding`) and the batch's `sharding=`: None (every mesh axis that does
    not partition the records), or a `NamedSharding` / `Mesh` on the dataset's mesh."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = data.mesh
    data_axes = mesh_axes(data)
    if sharding is None:
        return mesh, tuple(a for a in mesh.axis_names if a not in data_axes)
    if isinstance(sharding, Mesh):
        sharding = NamedSharding(sharding, PartitionSpec(sharding.axis_names))
    if not isinstance(sharding, NamedSharding) or sharding.mesh.shape != mesh.shape:
        raise ValueError(f"sharding must be a NamedSharding (or Mesh) on the dataset's mesh {mesh}, got {sharding!r}")
    axes = mesh_axes(sharding)
    both = sorted(set(axes) & set(data_axes))
    if both:
        raise ValueError(f"the batch cannot be split over {both}, which already partition the records")
    return mesh, axes


def row_layout(sharding, global_batch: int) -> RowLayout:
    """The rows of a global batch of `global_batch` rows this process's devices hold under a
    JAX `sharding` (from `batch_sharding`).

    >>> tbljax.row_layout(sharding, 8).ranges
    """
    n = parts(sharding)
    if global_batch % n:
        raise ValueError(
            f"global batch {global_batch} does not split evenly over the "
            f"{n} batch shards of {sharding}: use a multiple of {n}"
        )
    per_device = sharding.addressable_devices_indices_map((global_batch,))
    return RowLayout.from_spans(
        sharding, global_batch, {d: idx[0].indices(global_batch)[:2] for d, idx in per_device.items()}
    )


register_from_sharding(row_layout)

"""Host batches to JAX: one global `jax.Array` from this process's per-range host arrays (ring
slot views), without copying on CPU; and the rule for 64-bit integer fields, which JAX holds
in 32 bits unless ``jax_enable_x64`` is on (`narrowed`, `check_fields_fit`).

Lifetime contract. On CPU, `jax.device_put` of a 64-byte-aligned NumPy array does not copy: the
jax.Array reads the ring's memory, and XLA keeps a reference to the NumPy array for as long as
any buffer aliases it; on GPU/TPU until the host-to-device copy has finished. The ring
(`engine/ring.py`) counts those references before it reuses a slot.
"""

from __future__ import annotations

import numpy as np

from tbljax._src.engine.rows import RowLayout

__all__ = ["check_fields_fit", "check_fits", "narrowed", "to_global"]

_CHECK_ROWS = 1 << 16  # records a field is checked in at a time: memory flat in N


def narrowed(dtype) -> np.dtype | None:
    """The 32-bit integer type JAX holds a 64-bit integer dtype in when x64 is off, else None
    (x64 on, or a dtype JAX keeps; float64 becomes float32, which rounds but never wraps)."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu" or dtype.itemsize < 8:
        return None
    import jax  # here, not at import: `import tbljax` stays free of jax (and quick)

    if jax.config.jax_enable_x64:
        return None
    return np.dtype(np.int32 if dtype.kind == "i" else np.uint32)


def _overflow(values: np.ndarray, to: np.dtype) -> int | None:
    """A value of `values` that `to` cannot hold, else None."""
    if not values.size:
        return None
    lo, hi = values.min(), values.max()
    info = np.iinfo(to)
    return None if info.min <= lo and hi <= info.max else int(hi if hi > info.max else lo)


def _way_out(name: str) -> str:
    return (
        f"enable 64-bit JAX (jax.config.update('jax_enable_x64', True)), leave the field out "
        f"with fields=, or make it fit with field_fn={{{name!r}: ...}}"
    )


def check_fields_fit(ds, names, what: str) -> None:
    """ValueError naming the field, a value and the way out when a 64-bit integer field of
    `ds` among `names` holds a value its narrowed JAX type cannot (it would wrap silently);
    fields whose every value fits are served narrowed. O(N) over those fields only."""
    infos = ds.fields
    for name in names:
        to = narrowed(infos[name].dtype) if infos[name].kind == "ndarray" else None
        if to is None:
            continue
        for lo in range(0, len(ds), _CHECK_ROWS):
            got = ds.field_rows(name, np.arange(lo, min(lo + _CHECK_ROWS, len(ds))))
            vals = (
                got
                if isinstance(got, np.ndarray)
                else np.concatenate([np.asarray(v).reshape(-1) for v in got] or [np.zeros(0, infos[name].dtype)])
            )
            bad = _overflow(vals, to)
            if bad is not None:
                raise ValueError(
                    f"{what}: field {name!r} of {ds!r} holds {bad}, which does not fit "
                    f"{to}, the type JAX holds {infos[name].dtype} in without 64-bit "
                    f"mode: {_way_out(name)}"
                )


def check_fits(name: str, pieces, where: str) -> None:
    """The same rule for arrays made while serving (a field_fn's output): ValueError naming the
    field and `where` when a value would wrap."""
    to = narrowed(pieces[0].dtype)
    if to is None:
        return
    for p in pieces:
        bad = _overflow(p, to)
        if bad is not None:
            raise ValueError(
                f"field {name!r} holds {bad} {where}, which does not fit {to}, the type "
                f"JAX holds {p.dtype} in without 64-bit mode: {_way_out(name)}"
            )


def to_global(rows: RowLayout, pieces, row_shape=()):
    """One global jax.Array from per-range host arrays (``pieces[i]`` holds ``rows.ranges[i]``)."""
    import jax  # here, not at import: `import tbljax` stays free of jax (and quick)

    if len(rows.devices) == 1 and rows.ranges == ((0, rows.global_batch),):
        # One device holds the whole batch: one call (half the cost of the general path).
        return jax.device_put(pieces[0], rows.sharding)
    shape = (rows.global_batch, *row_shape)
    if len(rows.ranges) == 1:
        # This process's rows are one block (one device a process, or replicas of it):
        # JAX slices it for its devices in one call, no copy on CPU; 2 CPU processes,
        # 256 rows of 160 px: 31-101 us against 104-182 us per device (docs/pods.md).
        return jax.make_array_from_process_local_data(rows.sharding, pieces[0], shape)
    arrays = [jax.device_put(pieces[i], d) for d, i in rows.devices]
    return jax.make_array_from_single_device_arrays(shape, rows.sharding, arrays)

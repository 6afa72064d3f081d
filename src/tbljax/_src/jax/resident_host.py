"""What a resident dataset (`jax/resident.py`) gathers on the host before it uploads: whether
its records fit each device, its records' rows a chunk at a time (zero-copy from RAW files),
records of different sizes packed into pages and uploaded, and the columns of the record fields
it holds (with those it leaves out, and why, and the geometric ones `jax/resident_fields.py`
holds)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from tbljax._src.engine import memory
from tbljax._src.engine.batch_fields import check_pad
from tbljax._src.engine.geometric_serving import geometric_names
from tbljax._src.jax import packed as _packed
from tbljax._src.jax import sharding as _sharding
from tbljax._src.jax.arrays import check_fields_fit

__all__ = ["check_device_memory", "field_columns", "host_rows", "upload_packed"]


def check_device_memory(shape, sharding, max_bytes: int | None, *, num_records: int = 0) -> None:
    """MemoryError, saying what to do, when records of `shape` ((N, H, W, 3), or (pages,
    PAGE_BYTES) of packed records) split over `sharding`'s record shards do not fit each
    device: in `max_bytes`, else in what the device reports free, else (CPU) in the host's
    available RAM (`engine/memory.py`: the cgroup's limit counted) shared by the local devices."""
    per_device = int(np.prod(shape, dtype=np.int64)) // _sharding.parts(sharding)
    devices = list(sharding.addressable_devices)
    where = f"max_bytes={max_bytes}"
    limit = max_bytes
    if limit is None:
        free = []
        for d in devices:
            stats = d.memory_stats() if hasattr(d, "memory_stats") else None
            if stats and "bytes_limit" in stats:
                free.append(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
        if free:
            limit, where = min(free), "free on the device (memory_stats)"
        else:  # CPU: every local device's copy shares the host's RAM
            avail = memory.available_bytes()
            if avail is not None:
                limit = avail // max(1, len(devices))
                where = f"available host RAM ({avail / 2**30:.1f} GiB) shared by {len(devices)} local device(s)"
    if limit is not None and per_device > limit:
        what = (
            f"{num_records} records of different sizes in {shape[0]} pages"
            if len(shape) == 2
            else f"{shape[0]} records of {shape[1]}x{shape[2]}x3 uint8"
        )
        raise MemoryError(
            f"the dataset needs {per_device / 2**20:.1f} MiB per device ({what} "
            f"over {_sharding.parts(sharding)} record shard(s)) "
            f"but only {limit / 2**20:.1f} MiB fit ({where}): shard the records over more "
            f"devices (sharding=NamedSharding(mesh, PartitionSpec('data'))), convert at a "
            f"smaller image_size, or stream with tbljax.loader instead"
        )


def host_rows(ds, views, starts, a: int, b: int, image_shape) -> np.ndarray:
    """Records [a, b) on the host: a zero-copy slice of the memory map when they sit in one
    RAW file (`views`: the files' memory maps, `starts`: their first records), else a
    chunk-sized copy (decoded for JPEG / LZ4 records)."""
    if views is not None:
        k = int(np.searchsorted(starts, a, side="right") - 1)
        if b <= starts[k + 1]:
            return views[k][a - starts[k] : b - starts[k]]
        return np.concatenate(
            [
                host_rows(ds, views, starts, a, int(starts[k + 1]), image_shape),
                host_rows(ds, views, starts, int(starts[k + 1]), b, image_shape),
            ]
        )
    out = np.empty((b - a, *image_shape, 3), np.uint8)
    return ds.read_into(np.arange(a, b, dtype=np.int64), out)


def field_columns(ds, fields, pad) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """(the host columns of the plain fields a resident dataset holds (see ResidentDataset's
    args): (N, *shape) for a fixed field, (N, pad, *trail) and its (N,) int32 lengths for a
    ragged one; {name: why} for the fields ``fields="all"`` leaves out; the geometric fields it
    holds, served through the crop (`jax/resident_fields.py`), as the host loader picks them:
    a field given a `pad` is served as stored)."""
    infos = ds.fields
    pads = dict(pad or {})
    left_out = {}
    asked = list(infos) if fields == "all" else [n for n in fields or () if n in infos]  # unknown: below
    geometric = geometric_names(infos, [n for n in asked if n not in pads])
    if fields == "all":  # what a device array can hold; the rest said, not refused
        for n, f in infos.items():
            if n in geometric:
                continue
            if f.kind != "ndarray":
                left_out[n] = f"{f.kind}: not numeric (serve it with tbljax.loader)"
            elif f.ragged and n not in pads:
                left_out[n] = "ragged: give pad={name: length} to hold it cut or zero-padded"
        names = [n for n in infos if n not in left_out]
    elif fields is None:
        names = []
    else:
        names = list(fields)
    for n in list(names) + list(pads):
        if n not in infos:
            raise KeyError(f"ResidentDataset: no field {n!r} in {ds!r}; its fields: {list(infos)}")
    held = list(names)
    names = [n for n in names if n not in geometric]
    out = {}
    for n in names:
        info = infos[n]
        if info.kind != "ndarray":
            raise ValueError(
                f"ResidentDataset: field {n!r} is {info.kind}, which cannot be a device "
                "array: serve it with tbljax.loader (field_fn= can make it numeric), or "
                "leave it out with fields="
            )
        if info.fixed:
            if n in pads:
                raise ValueError(f"pad[{n!r}]: field {n!r} is fixed (shape {info.shape}), not ragged")
            out[n] = np.ascontiguousarray(ds.field_rows(n, np.arange(len(ds), dtype=np.int64)))
            continue
        length = pads.get(n)
        if length is None:
            raise ValueError(
                f"ResidentDataset: field {n!r} is ragged (shape {info.shape}): pass "
                f"pad={{{n!r}: length}} (an integer >= 1) to hold it cut or zero-padded "
                "to length rows, or leave it out with fields="
            )
        length = check_pad(n, length, info, len(ds))
        col = np.zeros((len(ds), int(length), *info.shape[1:]), info.dtype)
        lengths = np.zeros(len(ds), np.int32)
        ds.field_padded(n, np.arange(len(ds), dtype=np.int64), int(length), col, lengths)
        out[n], out[n + "_length"] = col, lengths
    for n in pads:
        if n not in names:
            raise KeyError(f"pad names field {n!r}, which is not held (fields held: {held})")
    check_fields_fit(ds, names, "ResidentDataset")
    return out, left_out, geometric


@functools.partial(jax.jit, donate_argnums=0)
def _write_pages(buf, rows, start):
    return jax.lax.dynamic_update_slice(buf, rows, (start, jnp.zeros_like(start)))


def upload_packed(ds, table, pages: int, chunk_bytes: int, sharding):
    """The records of `ds` packed from page starts (`tbljax.ops.pack_layout`'s `table`), uploaded
    a chunk of records at a time into a (pages, PAGE_BYTES) array on every device of `sharding`."""
    page = _packed.PAGE_BYTES
    raw = ds.record_format == "raw"
    if raw:
        views, counts, offsets, _, _ = ds.raw_records()
        starts = np.concatenate([[0], np.cumsum(counts)])
    bufs = {d: jnp.zeros((pages, page), jnp.uint8, device=d) for d in sharding.addressable_devices}
    first_page = table[:, 0].astype(np.int64)
    end_page = np.append(first_page[1:], pages)
    a, num_records = 0, len(table)
    while a < num_records:
        # Records [a, b) fill pages [first_page[a], end_page[b - 1]): about chunk_bytes.
        b = int(np.searchsorted(first_page, first_page[a] + max(1, chunk_bytes // page), side="right"))
        b = max(b, a + 1)
        chunk = np.zeros((int(end_page[b - 1] - first_page[a]), page), np.uint8)
        flat = chunk.reshape(-1)
        for i in range(a, b):
            if raw:
                k = int(np.searchsorted(starts, i, side="right") - 1)
                o, n = int(offsets[i]), int(table[i, 1]) * int(table[i, 2]) * 3
                pixels = views[k][o : o + n]
            else:
                pixels = ds.read(i).reshape(-1)
            at = int(first_page[i] - first_page[a]) * page
            flat[at : at + pixels.size] = pixels
        for d in bufs:
            bufs[d] = _write_pages(bufs[d], jax.device_put(chunk, d), np.int32(first_page[a]))
        a = b
    pieces = [bufs[d] for d in sharding.addressable_devices]
    rep = NamedSharding(sharding.mesh, PartitionSpec())
    return jax.make_array_from_single_device_arrays((pages, page), rep, pieces)

"""The part of a dataset this process of a JAX job reads with
``tbljax.loader(paths, ..., partition="host")``. Its shard files (or, for a single file, its
range of records) are chosen by `tbljax.host_part`, and only those files are opened:
the other processes' files need not exist on this host (a staged part holds only its own).

The processes exchange once, with `jax.experimental.multihost_utils.process_allgather`, what
each part holds: its record count (so every process runs the same steps and knows the global
index of its records), its image size (so the global batch has one shape) and a fingerprint
of its files. The dataset's fingerprint is then ``"{N}-{h:08x}"`` with h the sum modulo 2^32
of ``hash32(i, crc32(fingerprint of file i))`` over the files: the same on every process and
for any process count, found without reading another host's files. Header-only reads of the
other parts would need their files here; the exchange needs nothing but the running job.

>>> part = open_part(["train-00.tbl", "train-01.tbl", "train-02.tbl"])  # on every process
>>> part.parts.counts, part.parts.index      # record count of every part; this process's
"""
from __future__ import annotations

import dataclasses
import os
from functools import cached_property

import numpy as np

from tbljax import _core
from tbljax._src.rules import contract, order
from tbljax._src.rules.parts import Parts
from tbljax._src.io import reader
from tbljax._src.rules.augment import RecordGeometry
from tbljax._src.rules.dataset import JpegRecords, RawRecords, RecordDataset, record_number
from tbljax._src.rules.partition import host_part

__all__ = ["LocalPart", "PartDataset", "open_part"]

_OK = 1
# The row each process contributes: status, number of paths, records of its part, image
# height and width, its files' share of the fingerprint sum, its single file's fingerprint.
_ROW = 7


class PartDataset(RecordDataset):
    """Records [lo, hi) of an open `tbljax.Dataset` (this process's part), under the
    fingerprint of the whole dataset: what `tbljax.HostLoader` reads for a host part. Record
    i here is record lo + i of `dataset` (lo > 0 only for a single file split by records).
    Implements the whole dataset contract (`tbljax._src.rules.dataset`), so every record kind
    serves from a host part as from the whole dataset."""

    def __init__(self, dataset: reader.Dataset, lo: int, hi: int, fingerprint: str):
        if (lo, hi) != (0, len(dataset)) and len(dataset.paths) != 1:
            raise ValueError("a part of several files holds whole files")
        if not 0 <= lo <= hi <= len(dataset):
            raise ValueError(f"records [{lo}, {hi}) are not records of {dataset!r}")
        self._ds, self._lo, self._hi = dataset, int(lo), int(hi)
        self._fingerprint = fingerprint

    def __len__(self) -> int:
        return self._hi - self._lo

    def __repr__(self) -> str:
        return f"PartDataset(records [{self._lo}, {self._hi}) of {self._ds!r})"

    @property
    def whole(self) -> bool:
        """True when the part is the whole of the dataset it was cut from (whole files)."""
        return (self._lo, self._hi) == (0, len(self._ds))

    def _global(self, indices) -> np.ndarray:
        idx = np.asarray(indices, np.int64)
        return idx if self.whole else idx + self._lo

    def _record(self, i: int) -> int:
        return self._lo + record_number(i, len(self), "a part")

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def paths(self) -> list[str]:
        return self._ds.paths

    @property
    def record_format(self) -> str:
        return self._ds.record_format

    @property
    def compact(self) -> bool:
        return self._ds.compact

    @property
    def classes(self):
        return self._ds.classes

    @property
    def image_shape(self):
        return self._ds.image_shape

    @cached_property
    def geometry(self) -> RecordGeometry:
        g = self._ds.geometry
        if g.shape is not None:
            return g
        return RecordGeometry(g.heights[self._lo:self._hi], g.widths[self._lo:self._hi])

    @cached_property
    def labels(self) -> np.ndarray:
        return self._ds.labels[self._lo:self._hi]

    @cached_property
    def index(self) -> np.ndarray:
        return self._ds.index[self._lo:self._hi]

    def shard_views(self) -> list[np.ndarray]:
        views = self._ds.shard_views()
        return views if self.whole else [views[0][self._lo:self._hi]]

    def raw_records(self) -> RawRecords:
        r = self._ds.raw_records()
        if self.whole:
            return r
        cut = slice(self._lo, self._hi)
        return RawRecords(r.views, np.array([len(self)], np.int64), r.offsets[cut],
                          r.heights[cut], r.widths[cut])

    def jpeg_records(self) -> JpegRecords:
        r = self._ds.jpeg_records()
        if self.whole:
            return r
        cut = slice(self._lo, self._hi)
        return JpegRecords(r.views, np.array([len(self)], np.int64), r.offsets[cut],
                           r.sizes[cut], r.heights[cut], r.widths[cut], r.stored_raw[cut])

    def checksums(self) -> np.ndarray | None:
        crc = self._ds.checksums()
        return None if crc is None else crc[self._lo:self._hi]

    def byte_ranges(self, indices):
        return self._ds.byte_ranges(self._global(indices))

    def read(self, i: int) -> np.ndarray:
        return self._ds.read(self._record(i))

    def read_into(self, indices, out, threads: int = 0):
        return self._ds.read_into(self._global(indices), out, threads)

    def locate(self, i: int) -> tuple[str, int]:
        return self._ds.locate(self._record(i))

    def files_of(self, indices) -> np.ndarray:
        return self._ds.files_of(self._global(indices))

    def check_unchanged(self, files=None) -> None:
        self._ds.check_unchanged(files)

    @property
    def fields(self):
        return self._ds.fields

    def field_rows(self, name: str, indices, out=None):
        idx = np.asarray(indices, np.int64)
        return self._ds.field_rows(name, self._global(np.where(idx < 0, idx + len(self), idx)), out)

    def field_padded(self, name: str, indices, length: int, out: np.ndarray, lengths: np.ndarray) -> None:
        idx = np.asarray(indices, np.int64)
        self._ds.field_padded(name, self._global(np.where(idx < 0, idx + len(self), idx)), length, out, lengths)


@dataclasses.dataclass(frozen=True)
class LocalPart:
    """This process's part (``dataset``) and every process's record count (``parts``)."""

    dataset: PartDataset
    parts: Parts


def _file_hash(file_number: int, fingerprint: str) -> int:
    """File `file_number`'s share of the dataset fingerprint (summed modulo 2^32)."""
    crc = _core.crc32(np.frombuffer(fingerprint.encode(), np.uint8), 0)
    return int(order.hash32([np.array([file_number], np.uint32), np.array([crc], np.uint32)])[0])


def _as_paths(path_or_paths) -> list:
    if isinstance(path_or_paths, RecordDataset):
        raise TypeError(f"partition='host' takes a TBL path or the list of all shard paths, so "
                        f"that each process opens only its own part; {path_or_paths!r} is an open "
                        "dataset (a tbljax.mix of paths is served by its parts: tbljax.loader("
                        "mix(...), ..., partition='host'))"[:400])
    if isinstance(path_or_paths, (str, bytes, os.PathLike)):
        return [path_or_paths]
    if isinstance(path_or_paths, (list, tuple)) and path_or_paths and all(
            isinstance(p, (str, bytes, os.PathLike)) for p in path_or_paths):
        return list(path_or_paths)
    raise TypeError("partition='host' takes a TBL path or the list of all shard paths (each "
                    "process opens only its own part), got "
                    f"{type(path_or_paths).__name__} {path_or_paths!r}"[:300])


def _open_local(paths: list, index: int, processes: int):
    """(the part's Dataset, its record range [lo, hi) in it, the row to exchange)."""
    row = np.zeros(_ROW, np.uint32)
    if len(paths) == 1:
        ds = reader.open(paths)
        mine = host_part(len(ds), index, processes)
        lo, hi = mine.start, mine.stop
        crc = _core.crc32(np.frombuffer(ds.fingerprint.encode(), np.uint8), 0)
        row[5] = _file_hash(0, ds.fingerprint) if index == 0 else 0  # counted once
        row[6] = crc
    else:
        if len(paths) < processes:
            raise ValueError(f"{len(paths)} shard files cannot be split over {processes} "
                             "processes with partition='host': each process reads whole files "
                             "of its own; give at least one file per process, or a single file "
                             "(split by records)")
        mine = host_part(len(paths), index, processes)
        ds = reader.open([paths[i] for i in mine])
        lo, hi = 0, len(ds)
        share = sum(_file_hash(i, reader.open(paths[i]).fingerprint) for i in mine)
        row[5] = share % (1 << 32)
    shape = ds.image_shape or (0, 0)
    row[0:5] = [_OK, len(paths), hi - lo, shape[0], shape[1]]
    return ds, lo, hi, row


def _jax_allgather(row: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(row))


def open_part(path_or_paths, rank: int | None = None, world_size: int | None = None,
              allgather=None) -> LocalPart:
    """Opens this process's part of a dataset for host-local reading, and agrees with the
    other processes on every part's size and the dataset's fingerprint. Every process of the
    job must call it, with the same list of paths (files of other parts may be absent).

    Several files: process p of P opens files ``host_part(len(paths), p, P)``. One file: every
    process opens it and serves records ``host_part(len(file), p, P)`` of it. Raises on every
    process if any process cannot open its part (that process raises its own error).

    By default p and P are this JAX process's (``jax.process_index()``, ``jax.process_count()``)
    and the rows are exchanged over JAX. Another framework gives `rank`, `world_size` and
    ``allgather(row) -> (world_size, len(row))`` array, every rank's row in rank order (the
    torch adapter passes one over torch.distributed)."""
    if allgather is None:
        import jax

        rank, world_size, allgather = jax.process_index(), jax.process_count(), _jax_allgather
    paths = _as_paths(path_or_paths)
    index, processes = rank, world_size
    error, row = None, np.zeros(_ROW, np.uint32)
    try:
        ds, lo, hi, row = _open_local(paths, index, processes)
    except Exception as e:  # reported to the others first, so that no process waits forever
        error = e
    rows = np.asarray(allgather(row)).astype(np.uint32).reshape(-1, _ROW)
    if error is not None:
        raise error
    failed = [q for q in range(processes) if rows[q, 0] != _OK]
    if failed:
        raise RuntimeError(f"tbljax.loader(partition='host'): processes {failed} could not open "
                           "their part of the dataset (each says why in its own error)")
    if len(set(rows[:, 1].tolist())) != 1:
        raise ValueError(f"partition='host': the processes were given different numbers of "
                         f"paths ({rows[:, 1].tolist()}, in process order); give every "
                         "process the same list")
    shapes = [tuple(r) for r in rows[:, 3:5].tolist()]
    if len(set(shapes)) != 1:
        raise ValueError(f"partition='host': the parts hold images of different sizes "
                         f"(H, W) = {shapes} (in process order); one batch needs one size")
    if len(paths) == 1 and len(set(rows[:, 6].tolist())) != 1:
        raise ValueError(f"partition='host': the copies of {paths[0]!r} differ between "
                         "processes (their fingerprints do not match)")
    parts = Parts(tuple(rows[:, 2].tolist()), index)
    total = sum(parts.counts)
    contract.check_record_count(total, what="the dataset")
    fingerprint = f"{total}-{int(rows[:, 5].astype(np.uint64).sum()) % (1 << 32):08x}"
    return LocalPart(PartDataset(ds, lo, hi, fingerprint), parts)

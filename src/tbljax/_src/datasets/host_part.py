"""The part of a dataset this process of a JAX job reads with
``tbljax.loader(paths, ..., partition="host")``. Its shard files (or, for a single file, its
range of records) are chosen by `tbljax.host_part`, and only those files are opened:
the other processes' files need not exist on this host (a staged part holds only its own).

The processes exchange once, through the collective the framework layer passes in (JAX's
``process_allgather``, torch.distributed's ``all_gather``), what each part holds: its record
count (so every process runs the same steps and knows the global
index of its records), its image size (so the global batch has one shape) and a fingerprint
of its files. The dataset's fingerprint is then ``"{N}-{h:08x}"`` with h the sum modulo 2^32
of ``hash32(i, crc32(fingerprint of file i))`` over the files: the same on every process and
for any process count, found without reading another host's files. Header-only reads of the
other parts would need their files here; the exchange needs nothing but the running job.

>>> part = open_part(["train-00.tbl", "train-01.tbl", "train-02.tbl"], rank, world_size, allgather)
>>> part.parts.counts, part.parts.index      # record count of every part; this process's
"""

from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np

from tbljax import _core
from tbljax._src.datasets import reader
from tbljax._src.rules import contract, order
from tbljax._src.rules.dataset import RecordDataset, Records, paths_or_dataset, record_number
from tbljax._src.rules.errors import shown
from tbljax._src.rules.partition import host_part
from tbljax._src.rules.parts import Parts
from tbljax._src.rules.record_geometry import RecordGeometry

__all__ = ["LocalPart", "PartDataset", "open_part"]

_OK = 1
# The row each process contributes: status, number of paths, records of its part, image
# height and width, its files' share of the fingerprint sum, its single file's fingerprint.
_ROW = 7


class PartDataset(RecordDataset):
    """Records [lo, hi) of an open `tbljax.Dataset` (this process's part), under the
    fingerprint of the whole dataset: what `tbljax.HostLoader` reads for a host part. Record
    i here is record lo + i of `dataset` (lo > 0 only for a single file split by records).
    It slices what the contract's narrow core holds (`records()`, labels, keys, geometry) and
    shifts record numbers; the rest of the contract is derived from those."""

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

    def _global(self, indices) -> np.ndarray:
        idx = np.asarray(indices, np.int64)
        return np.where(idx < 0, idx + len(self), idx) + self._lo

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

    @cached_property
    def geometry(self) -> RecordGeometry:
        g = self._ds.geometry
        return (
            g if g.shape is not None else RecordGeometry(g.heights[self._lo : self._hi], g.widths[self._lo : self._hi])
        )

    @cached_property
    def labels(self) -> np.ndarray:
        return self._ds.labels[self._lo : self._hi]

    @cached_property
    def keys(self) -> list[str]:
        return self._ds.keys[self._lo : self._hi]

    @cached_property
    def _records(self) -> Records:
        r = self._ds.records()
        return r if (self._lo, self._hi) == (0, len(self._ds)) else r.take(self._lo, self._hi)

    def records(self) -> Records:
        return self._records

    def read(self, i: int) -> np.ndarray:
        return self._ds.read(self._record(i))

    def read_into(self, indices, out, threads: int = 0):
        return self._ds.read_into(self._global(indices), out, threads)

    def locate(self, i: int) -> tuple[str, int]:
        return self._ds.locate(self._record(i))

    def check_unchanged(self, files=None) -> None:
        self._ds.check_unchanged(files)

    @property
    def fields(self):
        return self._ds.fields

    def field_rows(self, name: str, indices, out=None):
        idx = contract.record_numbers(indices, len(self), "a host part")
        return self._ds.field_rows(name, self._global(idx), out)

    def field_padded(self, name: str, indices, length: int, out: np.ndarray, lengths: np.ndarray) -> None:
        idx = contract.record_numbers(indices, len(self), "a host part")
        self._ds.field_padded(name, self._global(idx), length, out, lengths)


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
        raise TypeError(
            f"partition='host' takes a TBL path or the list of all shard paths, so "
            f"that each process opens only its own part; {shown(repr(path_or_paths), 200)} is an open "
            "dataset (a tbljax.mix of paths is served by its parts: tbljax.loader("
            "mix(...), ..., partition='host'))"
        )
    return paths_or_dataset(path_or_paths, "partition='host' (each process opens only its own part)")


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
            raise ValueError(
                f"{len(paths)} shard files cannot be split over {processes} "
                "processes with partition='host': each process reads whole files "
                "of its own; give at least one file per process, or a single file "
                "(split by records)"
            )
        mine = host_part(len(paths), index, processes)
        ds = reader.open([paths[i] for i in mine])
        lo, hi = 0, len(ds)
        share = sum(_file_hash(i, reader.open(paths[i]).fingerprint) for i in mine)
        row[5] = share % (1 << 32)
    shape = ds.image_shape or (0, 0)
    row[0:5] = [_OK, len(paths), hi - lo, shape[0], shape[1]]
    return ds, lo, hi, row


def open_part(path_or_paths, rank: int, world_size: int, allgather) -> LocalPart:
    """Opens this process's part of a dataset for host-local reading, and agrees with the
    other processes on every part's size and the dataset's fingerprint. Every process of the
    job must call it, with the same list of paths (files of other parts may be absent).

    Several files: process p of P opens files ``host_part(len(paths), p, P)``. One file: every
    process opens it and serves records ``host_part(len(file), p, P)`` of it. Raises on every
    process if any process cannot open its part (that process raises its own error).

    p is `rank` of P = `world_size`; ``allgather(row) -> (world_size, len(row))`` array gives
    every rank's row in rank order, exchanged by the framework that runs the job (the JAX
    loader passes `jax/collectives.py`'s, the torch adapter one over torch.distributed): the
    dataset room imports no framework."""
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
        raise RuntimeError(
            f"tbljax.loader(partition='host'): processes {failed} could not open "
            "their part of the dataset (each says why in its own error)"
        )
    if len(set(rows[:, 1].tolist())) != 1:
        raise ValueError(
            f"partition='host': the processes were given different numbers of "
            f"paths ({rows[:, 1].tolist()}, in process order); give every "
            "process the same list"
        )
    shapes = [tuple(r) for r in rows[:, 3:5].tolist()]
    if len(set(shapes)) != 1:
        raise ValueError(
            f"partition='host': the parts hold images of different sizes "
            f"(H, W) = {shapes} (in process order); one batch needs one size"
        )
    if len(paths) == 1 and len(set(rows[:, 6].tolist())) != 1:
        raise ValueError(
            f"partition='host': the copies of {paths[0]!r} differ between processes (their fingerprints do not match)"
        )
    parts = Parts(tuple(rows[:, 2].tolist()), index)
    total = sum(parts.counts)
    contract.check_record_count(total, what="the dataset")
    fingerprint = f"{total}-{int(rows[:, 5].astype(np.uint64).sum()) % (1 << 32):08x}"
    return LocalPart(PartDataset(ds, lo, hi, fingerprint), parts)

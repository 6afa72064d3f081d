"""Record fields read back from a file: each field of each file over the file's memory map
(`FileColumn`, built from the dataset metadata in O(1)), a field over shard files read as one
(`Column`), and the columns of a dataset (`open_columns`). How fields are parsed and written is
`file/fields.py`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tbljax import _core
from tbljax._src.file.field_meta import info_of
from tbljax._src.file.fields import COPY_BYTES, FIELD_BLOCKS, FieldInfo

__all__ = ["Column", "FieldValues", "FileColumn", "merge_infos", "open_columns"]


class FileColumn:
    """One field of one file, over the file's memory map: built from the metadata in O(1)."""

    def __init__(self, name: str, meta: dict[str, Any], view: np.ndarray, n: int, path: str):
        self.name, self.n, self.path, self.meta = name, n, path, meta
        self.info = info_of(meta)
        self.values = self._block(view, "values")
        self.offsets: np.ndarray | None = None
        if "offsets" in meta and not self.info.fixed:
            self.offsets = self._int64s(view, "offsets")
        self.encoding = meta.get("encoding")  # "lz4": values are per-record blocks (`decode`)
        self.blocks: np.ndarray | None = None
        if self.encoding is not None:
            self.blocks = self._int64s(view, "blocks")
            trail = self.info.shape[1:] if self.info.ragged else self.info.shape
            self.row_bytes = int(np.prod(trail, dtype=np.int64)) * self.info.dtype.itemsize
            self._checked = False
            return
        if self.info.kind == "ndarray":
            dt = self.info.dtype
            trail = self.info.shape[1:] if self.info.ragged else self.info.shape
            per = int(np.prod(trail, dtype=np.int64)) * dt.itemsize
            if self.info.fixed:
                want = per * n
            else:
                want = None
            if want is not None and self.values.size != want:
                raise _core.CorruptFileError(
                    f"{path}: field {name!r}: {self.values.size} bytes for {n} records of {dt} {self.info.shape}"
                )
            if self.info.ragged and (per == 0 or self.values.size % per):
                raise _core.CorruptFileError(
                    f"{path}: field {name!r}: {self.values.size} bytes are no whole number of {dt} rows of {trail}"
                )
            rows = self.values.size // per if per else 0
            shape = (n, *self.info.shape) if self.info.fixed else (rows, *trail)
            self.array = self.values.view(dt).reshape(shape)
        self._checked = False

    def _int64s(self, view: np.ndarray, which: str) -> np.ndarray:
        """An (N+1,) int64 block (offsets, blocks)."""
        blk = self._block(view, which)
        if blk.size != 8 * (self.n + 1):
            raise _core.CorruptFileError(
                f"{self.path}: field {self.name!r}: {which} block of {blk.size} bytes for {self.n} records"
            )
        return blk.view("<i8")

    def _block(self, view: np.ndarray, which: str) -> np.ndarray:
        blk = self.meta[which]
        lo, size = blk["offset"], blk["bytes"]
        if lo + size > view.size:
            raise _core.CorruptFileError(
                f"{self.path}: field {self.name!r}: {which} block "
                f"[{lo}, +{size}) runs past the end of the file: truncated?"
            )
        return view[lo : lo + size]

    def check_offsets(self) -> None:
        """The offsets rise from 0 to the values' end (done once, at first use: O(N)); an
        encoded field's blocks to the values' end, its offsets (rows) from 0."""
        if self._checked:
            return
        if self.encoding is not None:
            self._rise(self.blocks, "blocks", self.values.size)
            if self.offsets is not None:
                self._rise(self.offsets, "offsets", None)
        elif self.offsets is not None:
            end = self.array.shape[0] if self.info.kind == "ndarray" else self.values.size
            self._rise(self.offsets, "offsets", end)
        self._checked = True

    def _rise(self, off: np.ndarray, which: str, end: int | None) -> None:
        if off[0] != 0 or (end is not None and off[-1] != end) or np.any(np.diff(off) < 0):
            falls = np.flatnonzero(np.diff(off) < 0)
            where = f" (record {int(falls[0])} ends before it starts)" if len(falls) else ""
            raise _core.CorruptFileError(
                f"{self.path}: field {self.name!r}: {which} do not rise from 0 to {end}{where}"
            )

    def decode(self, local: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """An encoded field's records `local`: their bytes back to back (into `out`, uint8, when
        given) and each one's (len+1,) byte offsets in them; LZ4 in C++, rows in parallel."""
        self.check_offsets()
        local = np.asarray(local, np.int64)
        if self.offsets is None:  # fixed: row_bytes is the whole record
            rows = np.ones(len(local), np.int64)
        else:
            rows = self.offsets[local + 1] - self.offsets[local]
        at = np.zeros(len(local) + 1, np.int64)
        np.cumsum(rows * self.row_bytes, out=at[1:])
        if out is None:
            out = np.empty(int(at[-1]), np.uint8)
        begin = np.ascontiguousarray(self.blocks[local])
        end = np.ascontiguousarray(self.blocks[local + 1])
        bad = _core.lz4_decode_blocks(self.values, begin, end, out, at)
        if bad >= 0:
            raise _core.CorruptFileError(
                f"{self.path}: record {int(local[bad])}: field {self.name!r}: its LZ4 block does not "
                f"decompress to the {int(at[bad + 1] - at[bad])} bytes its shape declares; "
                "`tbljax verify` checks the blocks' checksums"
            )
        return out, at

    def decoded(self, local: np.ndarray) -> list[np.ndarray]:
        """An encoded field's records `local` as arrays (views of one decoded buffer)."""
        buf, at = self.decode(local)
        shape = (-1, *self.info.shape[1:]) if self.info.ragged else self.info.shape
        return [buf[at[r] : at[r + 1]].view(self.info.dtype).reshape(shape) for r in range(len(local))]

    def verify(self) -> list[str]:
        """Problems with the blocks' CRC-32s (empty: all good)."""
        out = []
        for which in FIELD_BLOCKS:
            blk = self.meta.get(which)
            if blk is None or (which == "offsets" and self.offsets is None):
                continue
            data = {"values": self.values, "offsets": self.offsets, "blocks": self.blocks}[which].view(np.uint8)
            crc = 0
            for lo in range(0, data.size, COPY_BYTES):
                crc = _core.crc32(data[lo : lo + COPY_BYTES], crc)
            if crc != blk["crc32"]:
                out.append(
                    f"field {self.name!r} {which} block: checksum mismatch (crc32 {crc:08x}, stored {blk['crc32']:08x})"
                )
        return out

    def value(self, j: int) -> Any:
        """Record j's value (a view for ndarray fields)."""
        if self.encoding is not None:
            return self.decoded(np.array([j]))[0]
        if self.info.fixed:
            return self.array[j]
        self.check_offsets()
        lo, hi = int(self.offsets[j]), int(self.offsets[j + 1])
        if self.info.kind == "ndarray":
            return self.array[lo:hi]
        try:  # the one place a str/json value is decoded: damage names file, record, field
            text = bytes(self.values[lo:hi]).decode("utf-8")
            return text if self.info.kind == "str" else json.loads(text)
        except (ValueError, RecursionError) as e:  # Unicode/JSONDecodeError are ValueErrors
            raise _core.CorruptFileError(
                f"{self.path}: record {j}: field {self.name!r} holds no valid "
                f"{'UTF-8 text' if self.info.kind == 'str' else 'JSON'} ({e}); "
                "`tbljax verify` checks the blocks' checksums"
            ) from None


def merge_infos(name: str, infos: Sequence[FieldInfo], paths: Sequence[str]) -> FieldInfo:
    """The field of shard files read as one: the same kind and dtype in every file; a fixed
    field whose first size differs between files is ragged over the whole."""
    first = infos[0]
    for info, p in zip(infos[1:], paths[1:]):
        same_trail = info.shape[1:] == first.shape[1:] and len(info.shape) == len(first.shape)
        if (
            info.kind != first.kind
            or info.dtype != first.dtype
            or not same_trail
            or info.role != first.role
            or (info.kind == "ndarray" and not first.shape and info.shape)
        ):
            raise ValueError(f"field {name!r} is {first} in {paths[0]} but {info} in {p}: the shard files disagree")
    if first.kind == "ndarray" and first.shape and len({i.shape[0] for i in infos}) > 1:
        return FieldInfo("ndarray", first.dtype, (None, *first.shape[1:]), first.role)
    return first


class Column:
    """A field over a dataset's files, in record order."""

    def __init__(self, name: str, files: list[FileColumn], starts: np.ndarray):
        self.name, self.files, self.starts = name, files, starts
        self.info = merge_infos(name, [f.info for f in files], [f.path for f in files])

    def whole(self) -> Any:
        """The column: a read-only (N, *shape) array for a fixed field (zero-copy for one
        file), else a sequence of the records' values."""
        if self.info.fixed and any(f.encoding for f in self.files):
            out = self.rows(np.arange(int(self.starts[-1]), dtype=np.int64))
            out.flags.writeable = False
            return out
        if self.info.fixed:
            if len(self.files) == 1:
                return self.files[0].array
            out = np.concatenate([f.array for f in self.files])
            out.flags.writeable = False
            return out
        return FieldValues(self)

    def value(self, i: int) -> Any:
        k = int(np.searchsorted(self.starts, i, side="right") - 1)
        return self.files[k].value(i - int(self.starts[k]))

    def _split(self, idx: np.ndarray) -> Iterator[tuple[FileColumn, np.ndarray, np.ndarray]]:
        if len(self.files) == 1:
            yield self.files[0], np.arange(len(idx)), idx
            return
        k = np.searchsorted(self.starts, idx, side="right") - 1
        for f in np.unique(k):
            rows = np.flatnonzero(k == f)
            yield self.files[int(f)], rows, idx[rows] - self.starts[f]

    def rows(self, idx: np.ndarray, out: np.ndarray | None = None) -> Any:
        """Records `idx`' values: an array (B, *shape) for a fixed field (into `out` when
        given), else a list."""
        if self.info.fixed:
            if out is None:
                out = np.empty((len(idx), *self.info.shape), self.info.dtype)
            for f, rows, local in self._split(idx):
                if f.encoding is not None and len(rows) == len(idx) and out.flags.c_contiguous:
                    f.decode(local, out.reshape(-1).view(np.uint8))  # straight into the batch
                elif f.encoding is not None:
                    out[rows] = np.stack(f.decoded(local))
                elif len(rows) == len(idx):
                    np.take(f.array, local, axis=0, out=out)
                else:
                    out[rows] = f.array[local]
            return out
        vals: list[Any] = [None] * len(idx)
        for f, rows, local in self._split(idx):
            if f.encoding is not None:  # one parallel decode per file
                for r, v in zip(rows.tolist(), f.decoded(local)):
                    vals[r] = v
                continue
            for r, j in zip(rows.tolist(), local.tolist()):
                vals[r] = f.value(j)
        return vals

    def padded(self, idx: np.ndarray, length: int, out: np.ndarray, lengths: np.ndarray) -> None:
        """A ragged field's records `idx` cut or zero-padded to `length` rows into `out`
        (B, length, *trail), their true lengths into `lengths` (B,). One gather per file, no
        per-record Python: the producer thread builds this every step."""
        steps = np.arange(length)
        for f, rows, local in self._split(idx):
            if f.encoding is not None:  # a compressed map read whole (not a geometric serve)
                for r, v in zip(rows.tolist(), f.decoded(local)):
                    k = min(len(v), length)
                    lengths[r] = len(v)
                    out[r, :k] = v[:k]
                    out[r, k:] = 0
                continue
            if f.info.fixed:  # one file's records all of one length k: ragged over the shards
                k = f.info.shape[0]
                flat = f.array.reshape(-1, *f.info.shape[1:])
                lo, hi = local * k, local * k + k
            else:
                f.check_offsets()
                flat, lo, hi = f.array, f.offsets[local], f.offsets[local + 1]
            lengths[rows] = hi - lo
            keep = steps[None, :] < (hi - lo)[:, None]  # (b, length): the rows a record has
            if not flat.shape[0]:  # every record of this file is empty
                out[rows] = 0
                continue
            vals = flat[np.where(keep, lo[:, None] + steps[None, :], 0)]
            vals[~keep] = 0
            out[rows] = vals


class FieldValues(Sequence):
    """A str, json or ragged field's column as a read-only sequence (values read on access)."""

    def __init__(self, column: Column):
        self._column = column

    def __len__(self) -> int:
        return int(self._column.starts[-1])

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"record {i} out of range for a field of {n} records")
        return self._column.value(i % n)

    def __repr__(self) -> str:
        return f"<field {self._column.name!r}: {len(self)} {self._column.info.kind} values>"


def open_columns(files, metas, starts) -> dict[str, "Column"]:
    """The field columns of shard `files` (their parsed dataset blocks `metas`; record k of file
    j is record starts[j] + k): one `Column` per field, the blocks mapped, not read."""
    # The blocks are mapped, not read: O(1) per field whatever the size.
    names = list(metas[0].get("fields", {})) if metas else []
    for f, meta in zip(files[1:], metas[1:]):
        if list(meta.get("fields", {})) != names:
            raise ValueError(
                f"{f.path} has fields {list(meta.get('fields', {}))}, "
                f"{files[0].path} has {names}: the shard files disagree"
            )
    return {
        name: Column(
            name,
            [
                FileColumn(name, meta["fields"][name], f.file_view(), f.num_records, f.path)
                for f, meta in zip(files, metas)
            ],
            starts,
        )
        for name in names
    }

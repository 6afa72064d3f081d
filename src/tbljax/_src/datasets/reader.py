"""`open` a TBL file (or shard files read as one) as a `Dataset`: per-record
info, labels, keys, class names and the conversion recipe, zero-copy views of RAW records and
decoded reads of any record format, checksum verification, and the dataset's fingerprint.

The byte layout, validation and checksums live in the C++ core (`ffi/core/tbl_format.*`); the
metadata block's encoding lives in `file/format.py`.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np
import numpy.lib.recfunctions  # noqa: F401 - np.lib.recfunctions.repack_fields

from tbljax import _core
from tbljax._src.datasets import decoding, stats
from tbljax._src.file.field_columns import Column, open_columns
from tbljax._src.file.fields import FIELD_BLOCKS
from tbljax._src.file.format import (
    FORMAT_NAMES,
    FORMATS,
    INDEX_DTYPE,
    RUN_KEYS,
    PathLike,
    as_path,
    is_compact,
    keys_of,
    labels_of,
    parse_dataset_json,
)
from tbljax._src.rules.contract import DEFAULT_RESIZE, SQUARE_RESIZE_MODES, check_threads, record_numbers
from tbljax._src.rules.dataset import FieldInfo, RecordDataset, Records, is_path, paths_or_dataset, record_number
from tbljax._src.rules.record_geometry import RecordGeometry

__all__ = ["NOT_FINGERPRINTED", "Dataset", "RecordInfo", "as_dataset", "open"]

NOT_FINGERPRINTED = RUN_KEYS  # the recipe's keys about the run (file/format.py), not the data


@dataclasses.dataclass(frozen=True)
class RecordInfo:
    """What the index says about one record."""

    file: str
    offset: int
    size: int
    uncompressed_size: int
    width: int
    height: int
    format: str
    lz4: bool
    crc16: int


class Dataset(RecordDataset):
    """One TBL file, or several shard files read as one dataset (records in file order).

    Opening validates every file's header and index in C++ and maps it; nothing per record
    runs in Python, so opening is fast whatever the size.

    >>> ds = tbljax.open("train.tbl")
    >>> len(ds), ds.image_shape, ds.labels[:4]
    >>> pixels = ds.read(0)            # (H, W, 3) uint8, any record format
    >>> batch = ds.view()[[3, 1, 4]]   # zero-copy (N, H, W, 3) view of a RAW file
    """

    def __init__(self, paths: Sequence[PathLike]):
        if not paths:
            raise ValueError("tbljax.open: no paths given")
        paths = [as_path(p) for p in paths]
        for p in paths:
            if not os.path.exists(p):
                raise FileNotFoundError(errno.ENOENT, "tbljax.open: no such file", p)
        self._files = [_core.TblFile(p) for p in paths]
        counts = np.array([f.num_records for f in self._files], dtype=np.int64)
        # starts[k] is the global index of file k's first record; starts[-1] == len(self).
        self._starts = np.concatenate([[0], np.cumsum(counts)])

    @cached_property
    def _meta(self) -> list[dict[str, Any]]:
        # Parsed on first use: keys of a large dataset are megabytes of JSON.
        return [parse_dataset_json(f) for f in self._files]

    # ---- basics ----
    def __len__(self) -> int:
        return int(self._starts[-1])

    def __repr__(self) -> str:
        shape = self.image_shape
        return f"Dataset({len(self)} records, {self.record_format}, image_shape={shape}, files={self.paths!r})"

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self._files]

    def _locate(self, i: int) -> tuple[int, int]:
        i = record_number(i, len(self))
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        return k, i - int(self._starts[k])

    # ---- the index ----
    @cached_property
    def index(self) -> np.ndarray:
        """The index of all files as one structured array (fields of INDEX_DTYPE)."""
        parts = [f.index_bytes().view(INDEX_DTYPE).reshape(-1) for f in self._files]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def info(self, i: int) -> RecordInfo:
        k, j = self._locate(i)
        e = self._files[k].index_bytes()[j].view(INDEX_DTYPE)[0]
        return RecordInfo(
            file=self._files[k].path,
            offset=int(e["offset"]),
            size=int(e["size"]),
            uncompressed_size=int(e["uncompressed_size"]),
            width=int(e["width"]),
            height=int(e["height"]),
            format=FORMAT_NAMES.get(int(e["format"]), "UNKNOWN"),
            lz4=bool(e["flags"] & _core.RECORD_LZ4),
            crc16=int(e["crc16"]),
        )

    @cached_property
    def record_format(self) -> str:
        """'raw' (uncompressed RAW_U8), 'lz4' (RAW_U8, LZ4-compressed where that was smaller),
        'jpeg', 'mixed' or 'empty'."""
        idx = self.index
        if len(idx) == 0:
            return "empty"
        fmt = idx["format"]
        lz4 = (idx["flags"] & _core.RECORD_LZ4) != 0
        raw = fmt == FORMATS["RAW_U8"]
        if np.all(raw & ~lz4):
            return "raw"
        if np.all(raw):
            return "lz4"
        if np.all(fmt == FORMATS["JPEG"]):
            return "jpeg"
        return "mixed"

    @property
    def image_shape(self) -> tuple[int, int] | None:
        """(H, W) when every record is uniform RAW (zero-copy servable), else the recipe's
        output size when it has one, else None."""
        shapes = {f.raw_shape for f in self._files if f.uniform_raw}
        if len(shapes) == 1 and all(f.uniform_raw for f in self._files):
            return shapes.pop()
        size = self.recipe.get("image_size")
        if size and self.recipe.get("resize", DEFAULT_RESIZE) in SQUARE_RESIZE_MODES:
            return (int(size), int(size))
        return None

    @cached_property
    def compact(self) -> bool:
        """True for compact records: JPEGs re-encoded at the served geometry (decoded in the
        kernel, box by box), with those a raw budget kept as pixels stored RAW (uncompressed);
        False for the original JPEG bytes and for RAW/LZ4 records."""
        if not is_compact(self.recipe) or self.record_format not in ("jpeg", "mixed"):
            return False
        if self.record_format == "jpeg":
            return True
        fmt, flags = self.index["format"], self.index["flags"]
        raw = (fmt == FORMATS["RAW_U8"]) & ((flags & _core.RECORD_LZ4) == 0)
        return bool(np.all((fmt == FORMATS["JPEG"]) | raw))

    @cached_property
    def geometry(self) -> RecordGeometry:
        """The (height, width) every record is served at: for RAW, LZ4 and compact records
        the size the index holds; for original JPEG bytes the recipe's output size (the index
        holds the source photo's size). Pass this, not ``index["height"]``, to
        `tbljax.augment.sample` and `tbljax.ops.gather_normalize`."""
        if self.image_shape is not None:
            return RecordGeometry(*self.image_shape)
        if len(self) == 0:
            raise ValueError(f"{self!r} holds no records")
        idx = self.index
        try:
            return RecordGeometry(idx["height"], idx["width"])
        except ValueError as e:
            raise ValueError(f"{self!r}: {e}") from None

    @cached_property
    def fingerprint(self) -> str:
        """Identifies the data, not the run that wrote it: the record count and a CRC-32 over
        every record's index entry except its byte offset (sizes, shape, format, checksum of
        the pixels), the labels, the keys, the class names and the recipe without the fields
        that say when, where from and by which version it was made (`NOT_FINGERPRINTED`).
        Converting the same data again with the same recipe gives the same fingerprint, so a
        saved loader state stays valid."""
        idx = self.index
        fields = [f for f in INDEX_DTYPE.names if f != "offset"]
        entries = np.lib.recfunctions.repack_fields(idx[fields]) if len(idx) else idx
        crc = _core.crc32(np.frombuffer(np.ascontiguousarray(entries).tobytes(), np.uint8), 0)
        crc = _core.crc32(np.frombuffer(self.labels.astype("<i8").tobytes(), np.uint8), crc)
        crc = _core.crc32(np.frombuffer("\0".join(self.keys).encode(), np.uint8), crc)
        recipe = {k: v for k, v in self.recipe.items() if k not in NOT_FINGERPRINTED}
        described = {"classes": self.classes, "recipe": recipe}
        if self._columns:  # what the fields hold, by the CRC-32s of their blocks
            described["fields"] = [
                [
                    name,
                    col.info.kind,
                    str(col.info.dtype),
                    list(col.info.shape),
                    [[fc.meta[b]["crc32"] for b in FIELD_BLOCKS if b in fc.meta] for fc in col.files],
                ]
                for name, col in self._columns.items()
            ]
        described = json.dumps(described, sort_keys=True)
        crc = _core.crc32(np.frombuffer(described.encode(), np.uint8), crc)
        return f"{len(self)}-{crc:08x}"

    # ---- dataset metadata ----
    @cached_property
    def labels(self) -> np.ndarray:
        """int64 (N,) labels, -1 where a record has none."""
        return labels_of(self._files, self._meta)

    @cached_property
    def keys(self) -> list[str]:
        """Per-record keys (WebDataset __key__ or source file name); '' where unknown."""
        return keys_of(self._files, self._meta)

    @property
    def classes(self) -> list[str] | None:
        """Class names (label i is classes[i]) when the conversion knew them."""
        return self._meta[0].get("classes") if self._meta else None

    @property
    def recipe(self) -> dict[str, Any]:
        """How the file was made: image_size, resize mode, record format, sources, ..."""
        return dict(self._meta[0].get("recipe", {})) if self._meta else {}

    @property
    def skipped(self) -> list[dict[str, str]]:
        """Source items the conversion skipped, each {'key', 'source', 'reason'}."""
        return [s for m in self._meta for s in m.get("skipped", [])]

    # ---- fields besides the image ----
    @cached_property
    def _columns(self) -> dict[str, Column]:
        return open_columns(self._files, self._meta, self._starts)

    @property
    def fields(self) -> dict[str, FieldInfo]:
        """The records' other fields: {name: FieldInfo(kind, dtype, shape)}, shape holding None
        for a ragged field's first dimension; {} when the file has none."""
        return {name: col.info for name, col in self._columns.items()}

    def _column(self, name: str) -> Column:
        if name not in self._columns:
            raise KeyError(f"{self!r} has no field {name!r}; its fields: {list(self._columns)}")
        return self._columns[name]

    def field(self, name: str) -> Any:
        """The whole column of field `name`: a read-only (N, *shape) array for a fixed
        ndarray field (zero-copy for one file; shard files are concatenated), else a read-only
        sequence of the records' values (str, JSON values, arrays of a ragged field)."""
        return self._column(name).whole()

    def field_rows(self, name: str, indices, out: np.ndarray | None = None) -> Any:
        col = self._column(name)
        idx = record_numbers(indices, len(self))
        self.check_unchanged(self.files_of(idx) if len(idx) else [])
        return col.rows(idx, out)

    def field_padded(self, name: str, indices, length: int, out: np.ndarray, lengths: np.ndarray) -> None:
        col = self._column(name)
        idx = record_numbers(indices, len(self))
        self.check_unchanged(self.files_of(idx) if len(idx) else [])
        col.padded(idx, length, out, lengths)

    # ---- pixels ----
    def records(self) -> Records:
        """Where every record lies (`tbljax._src.rules.dataset.Records`): one read-only 1-D uint8
        view of each file's mapping, records per file, each record's byte offset in its file
        and size (int64), its height and width in the index (int32), and 1 (uint8) where it is
        uncompressed RAW (opening the file checked that such a record holds exactly its
        pixels)."""
        return self._records

    @cached_property
    def _records(self) -> Records:
        idx = self.index
        raw = (idx["format"] == FORMATS["RAW_U8"]) & ((idx["flags"] & _core.RECORD_LZ4) == 0)
        checked = all(f.header_flags & _core.FLAG_HAS_CHECKSUMS for f in self._files)
        return Records(
            [f.file_view() for f in self._files],
            np.diff(self._starts).astype(np.int64),
            np.ascontiguousarray(idx["offset"], dtype=np.int64),
            np.ascontiguousarray(idx["size"], dtype=np.int64),
            idx["height"].astype(np.int32),
            idx["width"].astype(np.int32),
            raw.astype(np.uint8),
            idx["crc16"] if checked else None,
        )

    def locate(self, i: int) -> tuple[str, int]:
        """(the file that holds record i, the record's number within that file)."""
        k, j = self._locate(i)
        return self._files[k].path, j

    def view(self) -> np.ndarray:
        """Zero-copy read-only (N, H, W, 3) uint8 view of a single uniform RAW file."""
        if len(self._files) != 1:
            raise ValueError(f"a dataset of {len(self._files)} files has no single view: use shard_views()")
        return self._files[0].raw_view()

    def read(self, i: int) -> np.ndarray:
        """Decoded pixels of record i as (H, W, 3) uint8, for any record format.

        RAW records come back as they are stored (a read-only view for uncompressed RAW);
        JPEG records holding the original bytes are decoded and, when the file records a
        recipe, resized by it, giving exactly the pixels a RAW conversion of the same source
        holds; compact JPEG records (stored at the converted geometry) are decoded as they are
        (`datasets/decoding.py`).
        """
        k, j = self._locate(i)
        return decoding.read_record(self._files[k], j, lambda: self._meta[k].get("recipe", {}))

    def read_into(self, indices: np.ndarray, out: np.ndarray, threads: int = 0) -> np.ndarray:
        """Decodes records `indices` into `out` (B, H, W, 3) uint8 with the file's recipe,
        JPEG decodes running in parallel in the C++ pool. For serving non-RAW files."""
        indices = decoding.check_batch(indices, out)
        touched = self.files_of(indices)
        self.check_unchanged(touched)
        decoding.read_batch(self._files, self._locate, self.read, lambda: self.recipe, indices, out, threads)
        self.check_unchanged(touched)
        return out

    def check_unchanged(self, files: Sequence[int] | None = None) -> None:
        """Raises CorruptFileError if a file (all, or those numbered `files`) was truncated or
        rewritten in place since it was opened. Replacing a file by renaming a new one over
        it is safe: the open dataset keeps serving the old file. Readers call this around
        every read; call it yourself around work on `view()`."""
        for k in range(len(self._files)) if files is None else files:
            self._files[int(k)].check_unchanged()

    def verify(self, threads: int = 0) -> list[tuple[str, int, str]]:
        """Checks every record's checksum; returns [(file, record, problem)] (empty: all good).

        threads: None or 0 for the default pool, else 1..MAX_THREADS (`contract.check_threads`)."""
        threads = check_threads(threads)
        self.check_unchanged()
        bad = [(f.path, int(i), msg) for f in self._files for i, msg in f.verify(int(threads))]
        for col in self._columns.values():  # the field blocks' CRC-32s (record -1: a block)
            bad += [(fc.path, -1, f"{fc.path}: {msg}") for fc in col.files for msg in fc.verify()]
        self.check_unchanged()
        return bad

    def describe(self) -> dict[str, Any]:
        """What `tbljax info` prints (`datasets/stats.py`): the record count, format and shape, bytes
        on disk and stored per image (and their ratio to RAW records), the five commonest
        served sizes, labels and classes, the recipe, the skipped sources, the fields and the
        fingerprint.

        >>> d = tbljax.open("train.tbl").describe()
        >>> d["records"], d["bytes_per_image"], d["fingerprint"]
        """
        return stats.describe(self)

    def field_bytes(self, name: str) -> int:
        """Bytes field `name` takes in the files (its values and offsets blocks)."""
        return sum(fc.meta[b]["bytes"] for fc in self._column(name).files for b in FIELD_BLOCKS if b in fc.meta)


def open(paths: PathLike | Sequence[PathLike]) -> Dataset:  # noqa: A001 - the natural name
    """Opens a TBL file, or a list of shard files read as one dataset (in the order given).

    >>> ds = tbljax.open("train.tbl")
    >>> ds = tbljax.open(["part-0.tbl", "part-1.tbl"])
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, Sequence):
        raise TypeError(f"tbljax.open takes a path or a list of paths, got {type(paths).__name__}")
    return Dataset([as_path(p) for p in paths])


def as_dataset(path_or_dataset, what: str = "tbljax.loader") -> RecordDataset:
    """A dataset from what a loader accepts: a TBL path, a list of shard paths, or a dataset
    (anything implementing `tbljax._src.rules.dataset.RecordDataset`: a `Dataset`, a host part)."""
    given = paths_or_dataset(path_or_dataset, what)
    if isinstance(given, RecordDataset):
        return given
    return open(path_or_dataset if is_path(path_or_dataset) else given)

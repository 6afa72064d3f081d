"""The dataset contract: everything downstream of the reader (the serving engine, the adapters,
the resident dataset, `show`, `bench`) asks a dataset for what it needs through this one
interface, and nothing probes a dataset with ``hasattr``. A single TBL file and a list of
shard files (`tbljax.Dataset`) and a host's part of either (`io/host_part.py`) implement all
of it; so must every dataset kind added later. An abstract member left out is a TypeError when
the class is instantiated, not an AttributeError in the middle of an epoch.

Record ``i`` of a dataset is its i-th record in its own numbering (0 .. len-1). Where records
lie on disk (`raw_records`, `jpeg_records`) is given per *file* of `paths`, so the kernel reads
the memory maps in place.

>>> isinstance(tbljax.open("train.tbl"), RecordDataset)
True
"""
from __future__ import annotations

import abc
import operator
from typing import Any, NamedTuple

import numpy as np

from tbljax._src.rules.augment import RecordGeometry

__all__ = ["FIELD_KINDS", "FieldInfo", "JpegRecords", "RawRecords", "RecordDataset", "RECORD_FORMATS"]

# What `RecordDataset.record_format` may say: uncompressed RAW_U8; RAW_U8 LZ4-compressed where
# that was smaller; JPEG; records of several formats; no record at all.
RECORD_FORMATS = ("raw", "lz4", "jpeg", "mixed", "empty")

# The kinds of a record's fields besides its image: UTF-8 text, a JSON value, a numeric array.
FIELD_KINDS = ("str", "json", "ndarray")


class FieldInfo(NamedTuple):
    """A field's kind, dtype (ndarray fields; None otherwise) and per-record shape (`()` for
    str/json; None at the first place for a ragged ndarray field)."""

    kind: str
    dtype: np.dtype | None
    shape: tuple[int | None, ...]

    @property
    def ragged(self) -> bool:
        return self.kind == "ndarray" and bool(self.shape) and self.shape[0] is None

    @property
    def fixed(self) -> bool:
        """A fixed ndarray field: served as an array (B, *shape)."""
        return self.kind == "ndarray" and not self.ragged


class RawRecords(NamedTuple):
    """Where uncompressed RAW records of different sizes lie, for the kernel."""

    views: list        # one read-only 1-D uint8 view of each file's mapping
    counts: np.ndarray  # records per file (int64)
    offsets: np.ndarray  # each record's byte offset in its file (int64)
    heights: np.ndarray  # int32
    widths: np.ndarray   # int32


class JpegRecords(NamedTuple):
    """Where compact records lie, for the kernel's JPEG source."""

    views: list
    counts: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray    # each record's byte count (int64)
    heights: np.ndarray  # the size the index gives (int32): the served size for compact records
    widths: np.ndarray
    stored_raw: np.ndarray  # uint8, 1 where the record is its pixels stored RAW (raw_budget=)


class RecordDataset(abc.ABC):
    """What a dataset offers the serving engine and the tools. See the module docstring."""

    # ---- what it is ----
    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of records."""

    @property
    @abc.abstractmethod
    def paths(self) -> list[str]:
        """The files it reads, in record order (file k holds `jpeg_records().counts[k]` records)."""

    @property
    @abc.abstractmethod
    def fingerprint(self) -> str:
        """Identifies the records it serves (content, not the run that wrote them): a loader
        state saved on one dataset resumes only on a dataset of the same fingerprint."""

    @property
    @abc.abstractmethod
    def labels(self) -> np.ndarray:
        """int64 (N,) labels, -1 where a record has none."""

    @property
    @abc.abstractmethod
    def classes(self) -> list[str] | None:
        """Class names (label i is classes[i]) when known."""

    @property
    @abc.abstractmethod
    def record_format(self) -> str:
        """One of `RECORD_FORMATS`."""

    @property
    @abc.abstractmethod
    def compact(self) -> bool:
        """True when the records are JPEGs stored at the served geometry (compact records,
        decoded in the kernel box by box), some of them perhaps stored RAW under a raw budget
        (`jpeg_records().stored_raw`); False for original JPEG bytes and RAW/LZ4."""

    @property
    @abc.abstractmethod
    def geometry(self) -> RecordGeometry:
        """The (height, width) every record is *served* at (for original JPEG bytes: the size
        the recipe resizes them to, not the source's). ValueError naming the dataset when it
        cannot know (a file of foreign JPEG records without a recipe)."""

    @property
    @abc.abstractmethod
    def image_shape(self) -> tuple[int, int] | None:
        """(H, W) when every record is served at one size, else None."""

    # ---- where the records are ----
    @abc.abstractmethod
    def shard_views(self) -> list[np.ndarray]:
        """Zero-copy read-only (N_k, H, W, 3) uint8 views, one per file (uniform RAW only)."""

    @abc.abstractmethod
    def raw_records(self) -> RawRecords:
        """Where its RAW records lie (uncompressed RAW only; ValueError otherwise)."""

    @abc.abstractmethod
    def jpeg_records(self) -> JpegRecords:
        """Where its JPEG records lie (JPEG records only; ValueError otherwise)."""

    @abc.abstractmethod
    def checksums(self) -> np.ndarray | None:
        """Each record's CRC-16/MODBUS of its payload as stored (uint16, the index's: what
        `verify` checks), or None when a file was written without per-record checksums."""

    @abc.abstractmethod
    def byte_ranges(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file number, byte offset, byte count) of records `indices`: what reading ahead asks
        the disk for."""

    # ---- reading ----
    @abc.abstractmethod
    def read(self, i: int) -> np.ndarray:
        """Record i's served pixels, (H, W, 3) uint8, for any record format."""

    @abc.abstractmethod
    def read_into(self, indices, out: np.ndarray, threads: int = 0) -> np.ndarray:
        """Decodes records `indices` into `out` (B, H, W, 3) uint8 (one served size)."""

    @abc.abstractmethod
    def locate(self, i: int) -> tuple[str, int]:
        """(the file that holds record i, the record's number within that file)."""

    @abc.abstractmethod
    def files_of(self, indices) -> np.ndarray:
        """The numbers of the files (in `paths`) that hold records `indices`."""

    @abc.abstractmethod
    def check_unchanged(self, files=None) -> None:
        """CorruptFileError if a file (all, or those numbered `files`) was truncated or
        rewritten in place since it was opened."""

    # ---- fields besides the image ----
    @property
    @abc.abstractmethod
    def fields(self) -> dict[str, FieldInfo]:
        """Every record's other fields, by name, in the order the file lists them ({} for none)."""

    @abc.abstractmethod
    def field_rows(self, name: str, indices, out: np.ndarray | None = None) -> Any:
        """Records `indices`' values of field `name`: a (B, *shape) array for a fixed ndarray
        field (written into `out` when given), else a list (str, JSON values, or arrays of a
        ragged field). KeyError naming the fields there are when it has no such field."""

    def field_padded(self, name: str, indices, length: int, out: np.ndarray,
                     lengths: np.ndarray) -> None:
        """A ragged field's records `indices` cut or zero-padded to `length` rows into `out`
        (B, length, *trail); each record's true length (before any cut) into `lengths` (B,)."""
        out[...] = 0
        for r, v in enumerate(self.field_rows(name, indices)):
            lengths[r] = len(v)
            out[r, :min(len(v), length)] = v[:length]

    def describe_record(self, i: int) -> str:
        """``"<file>: record <j>"``: how errors name record i."""
        path, j = self.locate(int(i))
        return f"{path}: record {j}"

    def served_bytes(self) -> int:
        """Bytes of every record's served pixels (H·W·3 summed): the decoded dataset's size."""
        g = self.geometry
        per = g.heights.astype(np.int64) * g.widths * 3
        return int(per.sum()) if g.shape is None else int(per[0]) * len(self)


def record_number(i, n: int, what: str = "a dataset") -> int:
    """Record index `i` of `n` records as an int in [0, n) (negative i counts from the end):
    TypeError for a non-integer (a bool included), IndexError naming `what` past either end."""
    if isinstance(i, (bool, np.bool_)):
        raise TypeError(f"record index must be an integer, got {i!r}")
    try:
        i = operator.index(i)
    except TypeError:
        raise TypeError(f"record index must be an integer, got {type(i).__name__} {i!r}") from None
    if not -n <= i < n:
        raise IndexError(f"record {i} out of range for {what} of {n} records")
    return i % n


def members() -> list[str]:
    """The names every dataset kind implements (for the test that proves each one does)."""
    return sorted(n for n in dir(RecordDataset) if not n.startswith("_") or n == "__len__")


def require(dataset: Any, what: str) -> RecordDataset:
    """`dataset` itself if it implements the contract, else TypeError naming what took it."""
    if not isinstance(dataset, RecordDataset):
        raise TypeError(f"{what} takes a TBL path, a list of shard paths or a tbljax.Dataset, "
                        f"got {type(dataset).__name__} {dataset!r}"[:300])
    return dataset

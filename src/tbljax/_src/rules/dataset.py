"""The dataset contract: everything downstream of the reader (the serving engine, the adapters,
the resident dataset, `show`, `bench`) asks a dataset for what it needs through this one
interface, and nothing probes a dataset with ``hasattr`` or asks for its concrete type.

The contract is narrow: what serving needs, and no more (the abstract members below). The
heart of it is one value, `Records` (``records()``): where every record lies in the files'
memory maps. A host part *slices* it (`Records.take`), shard files and a mixture's sources
*concatenate* it (`Records.concat`); everything else about where records are (zero-copy
views, RAW and JPEG sources for the kernel, byte ranges for reading ahead, the files of a
batch) is derived from it here, once, for every kind (`shard_views`, `raw_records`,
`jpeg_records`, `byte_ranges`, `files_of`). So is a record with all it holds
(`read_record`, ``ds[i]``). A mixture is a dataset like any other in the contract, and says
that its rows are drawn by weight with `draws_by_weight` (the engine dispatches on it,
never on a type). The kinds: `tbljax.Dataset` (a TBL file, or shard files read as one), a
host's part of it (`datasets/host_part.py`) and `tbljax.mix` (`datasets/mixture.py`); so must
every kind added later. An abstract member left out is a TypeError when the class is
instantiated, not an AttributeError in the middle of an epoch.

Record ``i`` of a dataset is its i-th record in its own numbering (0 .. len-1). Where records
lie on disk is given per *file* of `paths`, so the kernel reads the memory maps in place.

>>> isinstance(tbljax.open("train.tbl"), RecordDataset)
True
"""

from __future__ import annotations

import abc
import operator
import os
from typing import Any, NamedTuple

import numpy as np

from tbljax._src.rules.errors import shown
from tbljax._src.rules.record_geometry import RecordGeometry

__all__ = [
    "FIELD_KINDS",
    "FieldInfo",
    "JpegRecords",
    "RawRecords",
    "RecordDataset",
    "Records",
    "RECORD_FORMATS",
    "WeightedDataset",
]

# What `RecordDataset.record_format` may say: uncompressed RAW_U8; RAW_U8 LZ4-compressed where
# that was smaller; JPEG; records of several formats; no record at all.
RECORD_FORMATS = ("raw", "lz4", "jpeg", "mixed", "empty")

# The kinds of a record's fields besides its image: UTF-8 text, a JSON value, a numeric array.
FIELD_KINDS = ("str", "json", "ndarray")


class FieldInfo(NamedTuple):
    """A field's kind, dtype (ndarray fields; None otherwise) and per-record shape (`()` for
    str/json; None at the first place for a ragged ndarray field); `role`: a geometric
    field's role as its metadata holds it ({"role": "mask", "ignore": 255}, {"role": "boxes",
    "format": "xyxy", "labels": ...}, ...; docs/reference.md "Geometric fields"), else None."""

    kind: str
    dtype: np.dtype | None
    shape: tuple[int | None, ...]
    role: dict | None = None

    @property
    def ragged(self) -> bool:
        return self.kind == "ndarray" and bool(self.shape) and self.shape[0] is None

    @property
    def fixed(self) -> bool:
        """A fixed ndarray field: served as an array (B, *shape)."""
        return self.kind == "ndarray" and not self.ragged


class RawRecords(NamedTuple):
    """Where uncompressed RAW records of different sizes lie, for the kernel's
    `variable_source`: `Records` without sizes and stored_raw."""

    views: list  # one read-only 1-D uint8 view of each file's mapping
    counts: np.ndarray  # records per file (int64)
    offsets: np.ndarray  # each record's byte offset in its file (int64)
    heights: np.ndarray  # int32
    widths: np.ndarray  # int32


class JpegRecords(NamedTuple):
    """Where JPEG records lie, in the order the kernel's `jpeg_source` takes: `Records` less
    the checksums."""

    views: list
    counts: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    heights: np.ndarray
    widths: np.ndarray
    stored_raw: np.ndarray


class Records(NamedTuple):
    """Where every record of a dataset lies: the one storage value of the contract (its first
    seven fields are `JpegRecords`, what the kernel's `jpeg_source` takes). Record r of the dataset is in file
    ``file_of(r)`` (a file of `views`) at byte ``offsets[r]``, ``sizes[r]`` bytes."""

    views: list  # one read-only 1-D uint8 view of each file's mapping
    counts: np.ndarray  # records per file (int64)
    offsets: np.ndarray  # each record's byte offset in its file (int64)
    sizes: np.ndarray  # each record's byte count (int64)
    heights: np.ndarray  # the size the index gives (int32): the served size but for original JPEGs
    widths: np.ndarray
    stored_raw: np.ndarray  # uint8, 1 where the record is its pixels, uncompressed RAW
    # Each record's CRC-16/MODBUS of its payload as stored (uint16, the index's: what `verify`
    # checks), or None when some file was written without per-record checksums.
    crc16: np.ndarray | None = None

    def take(self, lo: int, hi: int) -> "Records":
        """Records [lo, hi) of a single file: a host part of records."""
        if len(self.views) != 1:
            raise ValueError(f"a part of {len(self.views)} files holds whole files, not records [{lo}, {hi})")
        cut = slice(lo, hi)
        return Records(
            self.views,
            np.array([hi - lo], np.int64),
            self.offsets[cut],
            self.sizes[cut],
            self.heights[cut],
            self.widths[cut],
            self.stored_raw[cut],
            None if self.crc16 is None else self.crc16[cut],
        )

    @staticmethod
    def concat(parts: "list[Records]") -> "Records":
        """The records of `parts` one after another (shard files, a mixture's sources)."""
        crc = None if any(p.crc16 is None for p in parts) else np.concatenate([p.crc16 for p in parts])
        return Records(
            [v for p in parts for v in p.views],
            *(
                np.concatenate([getattr(p, f) for p in parts])
                for f in ("counts", "offsets", "sizes", "heights", "widths", "stored_raw")
            ),
            crc,
        )

    def file_of(self, indices) -> np.ndarray:
        """The file (a number into `views`) of each of records `indices` (0 <= i < len)."""
        ends = np.cumsum(self.counts)
        return np.searchsorted(ends, np.asarray(indices, np.int64), side="right")


class RecordDataset(abc.ABC):
    """What a dataset offers the serving engine and the tools. See the module docstring."""

    # ---- what it is ----
    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of records."""

    @property
    @abc.abstractmethod
    def paths(self) -> list[str]:
        """The files it reads, in record order (file k holds `records().counts[k]` records)."""

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
    def keys(self) -> list[str]:
        """Per-record keys (WebDataset __key__ or source file name); '' where unknown."""

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
        (`records().stored_raw`); False for original JPEG bytes and RAW/LZ4."""

    @property
    @abc.abstractmethod
    def geometry(self) -> RecordGeometry:
        """The (height, width) every record is *served* at (for original JPEG bytes: the size
        the recipe resizes them to, not the source's). ValueError naming the dataset when it
        cannot know (a file of foreign JPEG records without a recipe)."""

    @property
    def draws_by_weight(self) -> bool:
        """True for a mixture (`tbljax.mix`): its rows are drawn from its sources by weight,
        not in the order of its own numbering. The engine dispatches on this."""
        return False

    # ---- where the records are ----
    @abc.abstractmethod
    def records(self) -> Records:
        """Where every record lies in the files' mappings (`Records`)."""

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

    # ---- derived from the members above, once, for every kind ----
    @property
    def image_shape(self) -> tuple[int, int] | None:
        """(H, W) when every record is served at one size, else None."""
        return self.geometry.shape

    def shard_views(self) -> list[np.ndarray]:
        """Zero-copy read-only (N_k, H, W, 3) uint8 views, one per file (uniform RAW only)."""
        shape = self.image_shape if self.record_format == "raw" else None
        if shape is None:
            raise ValueError(
                f"{self!r}: only RAW records of one size have (N, H, W, 3) views "
                f"(it holds {self.record_format} records of image_shape {self.image_shape})"
            )
        r, row = self.records(), shape[0] * shape[1] * 3
        views, first = [], 0
        for view, count in zip(r.views, r.counts.tolist()):
            start = int(r.offsets[first]) if count else 0
            if count and np.any(np.diff(r.offsets[first : first + count]) != row):
                raise ValueError(f"{self!r}: its RAW records are not laid out one after another")
            views.append(view[start : start + count * row].reshape(count, *shape, 3))
            first += count
        return views

    def raw_records(self) -> RawRecords:
        """Where its RAW records lie, for the kernel (uncompressed RAW only; ValueError otherwise)."""
        if self.record_format != "raw":
            raise ValueError(
                f"{self!r}: only uncompressed RAW records are gathered in place (it holds {self.record_format} records)"
            )
        r = self.records()
        return RawRecords(r.views, r.counts, r.offsets, r.heights, r.widths)

    def jpeg_records(self) -> JpegRecords:
        """Where its JPEG records lie, for the kernel's JPEG source (JPEG records, and compact
        records with some stored RAW, only; ValueError otherwise)."""
        if not (self.record_format == "jpeg" or self.compact):
            raise ValueError(
                f"{self!r}: only JPEG records are served from their bytes (it holds {self.record_format} records)"
            )
        return JpegRecords(*self.records()[:7])

    def checksums(self) -> np.ndarray | None:
        """Each record's CRC-16 of its stored payload (`Records.crc16`), or None when some file
        was written without per-record checksums: what ``verify_records=True`` checks."""
        return self.records().crc16

    def byte_ranges(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file number, byte offset, byte count) of records `indices`: what reading ahead asks
        the disk for."""
        idx = np.asarray(indices, np.int64)
        r = self.records()
        return r.file_of(idx), r.offsets[idx], r.sizes[idx]

    def files_of(self, indices) -> np.ndarray:
        """The numbers of the files (in `paths`) that hold records `indices` (negative ones
        count from the end)."""
        r = self.records()
        if len(r.counts) == 1:
            return np.zeros(1, np.int64)
        idx = np.asarray(indices, np.int64)
        return np.unique(r.file_of(np.where(idx < 0, idx + len(self), idx)))

    def field_padded(self, name: str, indices, length: int, out: np.ndarray, lengths: np.ndarray) -> None:
        """A ragged field's records `indices` cut or zero-padded to `length` rows into `out`
        (B, length, *trail); each record's true length (before any cut) into `lengths` (B,)."""
        out[...] = 0
        for r, v in enumerate(self.field_rows(name, indices)):
            lengths[r] = len(v)
            out[r, : min(len(v), length)] = v[:length]

    def read_record(self, i: int) -> dict[str, Any]:
        """Record i with everything it holds: {'image': (H, W, 3) uint8, 'label', 'key', and
        every field by name}."""
        i = record_number(i, len(self), repr(self))
        out: dict[str, Any] = {"image": self.read(i), "label": int(self.labels[i]), "key": self.keys[i]}
        for name in self.fields:
            out[name] = self.field_rows(name, [i])[0]
        return out

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Record i as a dict, as a Hugging Face or Grain source gives it (negative i counts from
        the end): ``{"image": a fresh, writable (H, W, 3) uint8 array, "label", "key", and every
        field}``. With ``len(ds)``, a random-access source for Grain, a torch ``Dataset`` or
        plain Python; `read` gives the pixels alone."""
        record = self.read_record(i)
        record["image"] = np.array(record["image"])
        return record

    def describe_record(self, i: int) -> str:
        """``"<file>: record <j>"``: how errors name record i."""
        path, j = self.locate(int(i))
        return f"{path}: record {j}"

    def served_bytes(self) -> int:
        """Bytes of every record's served pixels (H·W·3 summed): the decoded dataset's size."""
        g = self.geometry
        per = g.heights.astype(np.int64) * g.widths * 3
        return int(per.sum()) if g.shape is None else int(per[0]) * len(self)


class WeightedDataset(RecordDataset):
    """What a dataset whose rows are drawn from its sources by weight (`tbljax.mix`) offers
    the engine besides the dataset contract, over its records numbered one source after
    another (`rules/mixing.py` draws the rows)."""

    @property
    def draws_by_weight(self) -> bool:
        return True

    @property
    @abc.abstractmethod
    def datasets(self) -> list[RecordDataset]:
        """The sources, opened, in order."""

    @property
    @abc.abstractmethod
    def spec(self) -> Any:
        """The weights and each source's record count (`rules/mixing.MixSpec`)."""

    @property
    @abc.abstractmethod
    def processes(self) -> tuple[int, int]:
        """(this process's index, the number of processes): (0, 1) without host parts."""

    @abc.abstractmethod
    def steps_per_epoch(self, batch: int) -> int:
        """Steps of an epoch at global batch `batch`."""

    @abc.abstractmethod
    def split(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(source, record in that source) of records `indices`."""

    @abc.abstractmethod
    def global_index(self, source, record) -> np.ndarray:
        """The whole mixture's numbering (``"index"``) of record `record` of source `source`."""

    @abc.abstractmethod
    def local_index(self, indices) -> np.ndarray:
        """`global_index`'s inverse: this dataset's records of whole-mixture `indices`."""

    @abc.abstractmethod
    def source_geometry(self, k: int) -> RecordGeometry:
        """Source k's geometry in the whole mixture's numbering (`global_index`)."""


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
    """The names every dataset kind offers (for the test that calls each on every kind)."""
    return sorted(n for n in dir(RecordDataset) if not n.startswith("_") or n in ("__len__", "__getitem__"))


def require(dataset: Any, what: str) -> RecordDataset:
    """`dataset` itself if it implements the contract, else TypeError naming what took it."""
    if not isinstance(dataset, RecordDataset):
        raise TypeError(
            f"{what} takes a TBL path, a list of shard paths or a tbljax.Dataset, "
            f"got {type(dataset).__name__} {shown(repr(dataset))}"
        )
    return dataset


def is_path(value: Any) -> bool:
    return isinstance(value, (str, bytes, os.PathLike))


def paths_or_dataset(value: Any, what: str) -> list | RecordDataset:
    """The one rule for what a loader, a mixture's source or a host part is given: a TBL path or
    a list of shard paths (as a list of paths), or a dataset (itself). An empty list is a
    ValueError and anything else a TypeError, each naming `what`."""
    if is_path(value):
        return [value]
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{what} was given an empty list of paths (a glob that matched nothing?)")
        if all(map(is_path, value)):
            return list(value)
    return require(value, what)

"""The TBL file from Python: `open` a file (or shard files) as a `Dataset`, and `Writer`.

The byte layout, validation and checksums live in the C++ core (`ffi/core/tbl_format.*`); this
module adds what users touch: per-record info, labels, keys, class names, the conversion
recipe, zero-copy views of RAW data and decoded reads of any record format.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import operator
import os
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np

from tbljax import _core

FORMATS: dict[str, int] = dict(_core.FORMATS)
FORMAT_NAMES: dict[int, str] = {v: k for k, v in FORMATS.items()}
METADATA_VERSION = 1

# The 24-byte index entry as a numpy structured dtype (little-endian, packed).
INDEX_DTYPE = np.dtype(
    [("offset", "<u8"), ("size", "<u4"), ("uncompressed_size", "<u4"), ("width", "<u2"),
     ("height", "<u2"), ("format", "u1"), ("flags", "u1"), ("crc16", "<u2")]
)
assert INDEX_DTYPE.itemsize == _core.INDEX_ENTRY_BYTES

PathLike = str | os.PathLike


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


def _encode_labels(labels: np.ndarray) -> dict[str, str]:
    arr = np.ascontiguousarray(labels, dtype="<i8")
    return {"dtype": "<i8", "base64": base64.b64encode(arr.tobytes()).decode("ascii")}


def _decode_labels(obj: dict[str, str], n: int, path: str) -> np.ndarray:
    raw = base64.b64decode(obj["base64"], validate=True)
    arr = np.frombuffer(raw, dtype=obj.get("dtype", "<i8")).astype(np.int64)
    if arr.shape != (n,):
        raise _core.CorruptFileError(f"{path}: dataset metadata holds {arr.size} labels for {n} records")
    return arr


def _check_meta(meta: dict[str, Any], n: int, path: str) -> None:
    """Raises CorruptFileError naming the field when dataset metadata does not have the shape
    Writer gives it: the JSON comes from the file, so it is as untrusted as its bytes."""

    def bad(field: str, want: str) -> None:
        raise _core.CorruptFileError(f"{path}: dataset metadata field {field!r} must be {want}, "
                                     f"got {json.dumps(meta[field])[:80]}")

    labels = meta.get("labels")
    if labels is not None:
        dtype = labels.get("dtype", "<i8") if isinstance(labels, dict) else None
        if not (isinstance(labels, dict) and isinstance(labels.get("base64"), str)
                and dtype in _LABEL_DTYPES):
            bad("labels", f"{{'dtype': one of {sorted(_LABEL_DTYPES)}, 'base64': str}}")
        try:
            _decode_labels(labels, n, path)
        except ValueError as e:  # bad base64, or a byte count that is no whole label
            if isinstance(e, _core.CorruptFileError):
                raise
            bad("labels", f"base64 of {n} integers ({e})")
    for field in ("keys", "classes"):
        v = meta.get(field)
        if v is not None and not (isinstance(v, list) and all(isinstance(k, str) for k in v)):
            bad(field, "a list of strings")
    if meta.get("keys") is not None and len(meta["keys"]) != n:
        raise _core.CorruptFileError(f"{path}: metadata holds {len(meta['keys'])} keys for {n} records")
    recipe = meta.get("recipe")
    if recipe is not None:
        if not isinstance(recipe, dict):
            bad("recipe", "an object")
        size = recipe.get("image_size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                 or not 1 <= size <= 65535):
            bad("recipe", "an object whose image_size is an integer in [1, 65535]")
        if recipe.get("resize", "center_crop") not in _core.RESIZE_MODES:
            bad("recipe", f"an object whose resize is one of {list(_core.RESIZE_MODES)}")
    skipped = meta.get("skipped")
    if skipped is not None and not (isinstance(skipped, list) and all(isinstance(x, dict) for x in skipped)):
        bad("skipped", "a list of objects")


_LABEL_DTYPES = frozenset({"<i8", "<i4", "<i2", "|i1", "<u4", "<u2", "|u1"})


class Dataset:
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
        self._files = [_core.TblFile(_path(p)) for p in paths]
        counts = np.array([f.num_records for f in self._files], dtype=np.int64)
        # starts[k] is the global index of file k's first record; starts[-1] == len(self).
        self._starts = np.concatenate([[0], np.cumsum(counts)])

    @cached_property
    def _meta(self) -> list[dict[str, Any]]:
        # Parsed on first use: keys of a large dataset are megabytes of JSON.
        return [self._parse_dataset_json(f) for f in self._files]

    # ---- basics ----
    def __len__(self) -> int:
        return int(self._starts[-1])

    def __repr__(self) -> str:
        shape = self.image_shape
        return (f"Dataset({len(self)} records, {self.record_format}, image_shape={shape}, "
                f"files={self.paths!r})")

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self._files]

    def _locate(self, i: int) -> tuple[int, int]:
        if isinstance(i, (bool, np.bool_)):
            raise TypeError(f"record index must be an integer, got {i!r}")
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(f"record index must be an integer, got {type(i).__name__} {i!r}") from None
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} out of range for a dataset of {n} records")
        i %= n
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        return k, i - int(self._starts[k])

    @staticmethod
    def _parse_dataset_json(f: Any) -> dict[str, Any]:
        raw = f.dataset_json
        if not raw:
            return {}
        try:
            meta = json.loads(raw)
        except ValueError as e:
            raise _core.CorruptFileError(f"{f.path}: dataset metadata is not valid JSON ({e})") from None
        if not isinstance(meta, dict):
            raise _core.CorruptFileError(f"{f.path}: dataset metadata is not a JSON object")
        _check_meta(meta, f.num_records, f.path)
        return meta

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
            file=self._files[k].path, offset=int(e["offset"]), size=int(e["size"]),
            uncompressed_size=int(e["uncompressed_size"]), width=int(e["width"]),
            height=int(e["height"]), format=FORMAT_NAMES.get(int(e["format"]), "UNKNOWN"),
            lz4=bool(e["flags"] & _core.RECORD_LZ4), crc16=int(e["crc16"]))

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
        if size and self.recipe.get("resize", "center_crop") in ("center_crop", "squash"):
            return (int(size), int(size))
        return None

    @property
    def fingerprint(self) -> str:
        """Identifies the file(s): record count and a CRC-32 of every header and index."""
        crc = 0
        for f in self._files:
            crc = _core.crc32(np.frombuffer(f.index_bytes().tobytes(), np.uint8), crc)
            crc = _core.crc32(np.frombuffer(f.dataset_json, np.uint8), crc)
        return f"{len(self)}-{crc:08x}"

    # ---- dataset metadata ----
    @cached_property
    def labels(self) -> np.ndarray:
        """int64 (N,) labels, -1 where a record has none."""
        parts = []
        for f, meta in zip(self._files, self._meta):
            n = f.num_records
            if "labels" in meta and meta["labels"] is not None:
                parts.append(_decode_labels(meta["labels"], n, f.path))
            elif f.header_flags & _core.FLAG_HAS_METADATA:
                parts.append(self._scan_sample_metadata(f)[0])
            else:
                parts.append(np.full(n, -1, np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @cached_property
    def keys(self) -> list[str]:
        """Per-record keys (WebDataset __key__ or source file name); '' where unknown."""
        out: list[str] = []
        for f, meta in zip(self._files, self._meta):
            keys = meta.get("keys")
            if keys is None and f.header_flags & _core.FLAG_HAS_METADATA and not meta:
                keys = self._scan_sample_metadata(f)[1]
            keys = keys if keys is not None else [""] * f.num_records
            if len(keys) != f.num_records:
                raise _core.CorruptFileError(f"{f.path}: metadata holds {len(keys)} keys for {f.num_records} records")
            out.extend(keys)
        return out

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

    @staticmethod
    def _scan_sample_metadata(f: Any) -> tuple[np.ndarray, list[str] | None]:
        # Files from other writers (turboloader's add_metadata) carry one JSON block per
        # sample: a linear scan, done once and only when labels or keys are asked for.
        n = f.num_records
        labels = np.full(n, -1, np.int64)
        keys: list[str] = [""] * n
        found_key = False
        sec = f.metadata_section()
        pos, hdr = 0, _core.META_BLOCK_HEADER_BYTES
        while pos + hdr <= len(sec):
            sample = int.from_bytes(sec[pos:pos + 8], "little")
            size = int.from_bytes(sec[pos + 8:pos + 12], "little")
            mtype = int.from_bytes(sec[pos + 12:pos + 14], "little")
            payload = sec[pos + hdr:pos + hdr + size]
            if len(payload) != size:
                raise _core.CorruptFileError(f"{f.path}: metadata block at byte {pos} runs past the section end")
            pos += hdr + size
            if mtype != _core.META_JSON or sample >= n:
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                continue  # foreign free-form metadata: not ours to judge
            if isinstance(obj, dict):
                lab = obj.get("label", obj.get("cls"))
                if isinstance(lab, int) and not isinstance(lab, bool):
                    if not -(1 << 63) <= lab < 1 << 63:
                        raise _core.CorruptFileError(f"{f.path}: metadata of record {sample}: label "
                                                     f"{lab} does not fit in int64")
                    labels[sample] = lab
                key = obj.get("key", obj.get("__key__"))
                if isinstance(key, str):
                    keys[sample] = key
                    found_key = True
        return labels, (keys if found_key else None)

    # ---- pixels ----
    def shard_views(self) -> list[np.ndarray]:
        """Zero-copy read-only (N_k, H, W, 3) uint8 views, one per file (uniform RAW only)."""
        return [f.raw_view() for f in self._files]

    def view(self) -> np.ndarray:
        """Zero-copy read-only (N, H, W, 3) uint8 view of a single uniform RAW file."""
        if len(self._files) != 1:
            raise ValueError(f"a dataset of {len(self._files)} files has no single view: use shard_views()")
        return self._files[0].raw_view()

    def read(self, i: int) -> np.ndarray:
        """Decoded pixels of record i as (H, W, 3) uint8, for any record format.

        RAW records come back as they are stored (a read-only view for uncompressed RAW);
        JPEG records are decoded and, when the file records a recipe, resized by it, giving
        exactly the pixels a RAW conversion of the same source holds.
        """
        k, j = self._locate(i)
        f = self._files[k]
        f.check_unchanged()
        e = f.index_bytes()[j].view(INDEX_DTYPE)[0]
        fmt = int(e["format"])
        if fmt == FORMATS["RAW_U8"]:
            if f.uniform_raw:
                return f.raw_view()[j]
            data = f.read_payload(j)
            f.check_unchanged()
            return np.frombuffer(data, np.uint8).reshape(int(e["height"]), int(e["width"]), 3)
        if fmt == FORMATS["JPEG"]:
            data = f.read_payload(j)
            f.check_unchanged()
            return self._decode_encoded(k, data, j)
        raise NotImplementedError(f"{f.path}: record {j} has format {FORMAT_NAMES.get(fmt, fmt)}, "
                                  "which tbljax does not decode (RAW_U8 and JPEG are served)")

    def _decode_encoded(self, k: int, data: bytes, j: int) -> np.ndarray:
        recipe = self._meta[k].get("recipe", {})
        size, mode = recipe.get("image_size"), recipe.get("resize", "center_crop")
        try:
            if size:
                return _core.decode_resize(data, int(size), mode)
            return _core.decode_jpeg(data)
        except _core.DecodeError as e:
            raise _core.DecodeError(f"{self._files[k].path}: record {j}: {e}") from None

    def read_into(self, indices: np.ndarray, out: np.ndarray, threads: int = 0) -> np.ndarray:
        """Decodes records `indices` into `out` (B, H, W, 3) uint8 with the file's recipe,
        JPEG decodes running in parallel in the C++ pool. For serving non-RAW files."""
        indices = np.asarray(indices)
        if indices.dtype.kind not in "iu" or indices.ndim != 1:
            raise TypeError(f"indices must be a 1-D array of integers, got {indices.dtype} of shape "
                            f"{indices.shape}")
        indices = indices.astype(np.int64)
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
        if out.dtype != np.uint8 or out.ndim != 4 or out.shape[0] != len(indices) or out.shape[3] != 3:
            raise ValueError(f"out must be uint8 (B, H, W, 3) with B={len(indices)}, got {out.dtype} {out.shape}")
        if not out.flags.writeable:
            raise ValueError("out is read-only")
        touched = self._files_of(indices)
        self.check_unchanged(touched)
        jpeg_rows, payloads = [], []
        for row, i in enumerate(indices.tolist()):
            k, j = self._locate(i)
            f = self._files[k]
            e = f.index_bytes()[j].view(INDEX_DTYPE)[0]
            if int(e["format"]) == FORMATS["JPEG"]:
                jpeg_rows.append(row)
                payloads.append(f.read_payload(j))
            else:
                img = self.read(i)
                if img.shape != out.shape[1:]:
                    raise ValueError(f"{f.path}: record {j} is {img.shape}, batch rows are {out.shape[1:]}")
                out[row] = img
        if payloads:
            mode = self.recipe.get("resize", "center_crop")
            if out.shape[1] != out.shape[2]:
                raise ValueError(f"JPEG records decode to square images; out rows are {out.shape[1:3]}")
            tmp = out if len(jpeg_rows) == len(indices) else np.empty((len(payloads),) + out.shape[1:], np.uint8)
            errors = _core.decode_resize_into(payloads, tmp, mode, threads)
            for row, err in zip(jpeg_rows, errors):
                if err is not None:
                    k, j = self._locate(int(indices[row]))
                    raise _core.DecodeError(f"{self._files[k].path}: record {j}: {err}")
            if tmp is not out:
                out[jpeg_rows] = tmp
        self.check_unchanged(touched)
        return out

    def _files_of(self, indices: np.ndarray) -> np.ndarray:
        """The files that hold records `indices` (valid, possibly negative, indices)."""
        if len(self._files) == 1:
            return np.zeros(1, np.int64)
        i = np.where(indices < 0, indices + len(self), indices)
        return np.unique(np.searchsorted(self._starts, i, side="right") - 1)

    def check_unchanged(self, files: Sequence[int] | None = None) -> None:
        """Raises CorruptFileError if a file (all, or those numbered `files`) was truncated or
        rewritten in place since it was opened. Replacing a file by renaming a new one over
        it is safe: the open dataset keeps serving the old file. Readers call this around
        every read; call it yourself around work on `view()`."""
        for k in range(len(self._files)) if files is None else files:
            self._files[int(k)].check_unchanged()

    def verify(self, threads: int = 0) -> list[tuple[str, int, str]]:
        """Checks every record's checksum; returns [(file, record, problem)] (empty: all good).

        threads: 0 for the default pool, else 1..1024."""
        if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) \
                or not 0 <= threads <= 1024:
            raise ValueError(f"threads must be an integer in [0, 1024] (0: the default pool), got {threads!r}")
        self.check_unchanged()
        bad = [(f.path, int(i), msg) for f in self._files for i, msg in f.verify(int(threads))]
        self.check_unchanged()
        return bad


def open(paths: PathLike | Sequence[PathLike]) -> Dataset:  # noqa: A001 - the natural name
    """Opens a TBL file, or a list of shard files read as one dataset (in the order given).

    >>> ds = tbljax.open("train.tbl")
    >>> ds = tbljax.open(["part-0.tbl", "part-1.tbl"])
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    if not isinstance(paths, Sequence):
        raise TypeError(f"tbljax.open takes a path or a list of paths, got {type(paths).__name__}")
    return Dataset([_path(p) for p in paths])


def _path(p: Any) -> str:
    """A str path from str, bytes or os.PathLike, refusing what the OS would misread."""
    if not isinstance(p, (str, bytes, os.PathLike)):
        raise TypeError(f"a path must be str, bytes or os.PathLike, got {type(p).__name__} {p!r}")
    s = os.fsdecode(os.fspath(p))
    if "\0" in s:
        raise ValueError(f"path {s!r} contains a NUL byte")
    return s


class Writer:
    """Streams records into a new TBL file that appears at `dst` only when complete.

    Use as a context manager: an exception inside the block leaves nothing at `dst`.

    >>> with tbljax.format.Writer("out.tbl", capacity=len(images)) as w:
    ...     for img in images:
    ...         w.add_raw(img)
    ...     w.set_metadata(labels=labels)
    """

    def __init__(self, dst: PathLike, capacity: int, *, overwrite: bool = False):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or not 0 <= capacity <= 1 << 40:
            raise ValueError(f"capacity must be an integer in [0, 2**40], got {capacity!r}")
        self.dst = _path(dst)
        self._w = _core.TblWriter(self.dst, int(capacity), bool(overwrite))
        self._meta: dict[str, Any] = {}

    def __len__(self) -> int:
        return self._w.num_records

    def add_raw(self, img: np.ndarray, *, lz4: bool = False) -> None:
        """Appends an (H, W, 3) uint8 image as a RAW_U8 record (LZ4-compressed if lz4)."""
        img = np.asarray(img)
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(f"add_raw takes (H, W, 3) uint8, got {img.dtype} {img.shape}")
        flat = np.ascontiguousarray(img).reshape(-1)
        self._w.add(flat, FORMATS["RAW_U8"], img.shape[1], img.shape[0], lz4)

    def add_encoded(self, data: bytes, format: str, width: int, height: int) -> None:
        """Appends an encoded image (e.g. the original JPEG bytes) as it is."""
        if format not in FORMATS:
            raise ValueError(f"unknown record format {format!r}; known: {sorted(FORMATS)}")
        for name, v in (("width", width), ("height", height)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= 65535:
                raise ValueError(f"{name} must be an integer in [0, 65535], got {v!r}")
        self._w.add(np.frombuffer(data, np.uint8), FORMATS[format], int(width), int(height), False)

    def set_metadata(self, *, labels: Sequence[int] | np.ndarray | None = None,
                     keys: Sequence[str] | None = None, classes: Sequence[str] | None = None,
                     recipe: dict[str, Any] | None = None,
                     skipped: Sequence[dict[str, str]] | None = None) -> None:
        """Dataset metadata stored in one block, read back in O(1) at open."""
        if labels is not None:
            arr = np.asarray(labels)
            if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                raise ValueError(f"labels must be a 1-D sequence of integers, got {arr.dtype} of "
                                 f"shape {arr.shape}")
            self._meta["labels"] = arr.astype(np.int64)
        if keys is not None:
            self._meta["keys"] = [str(k) for k in keys]
        if classes is not None:
            self._meta["classes"] = [str(c) for c in classes]
        if recipe is not None:
            self._meta["recipe"] = dict(recipe)
        if skipped is not None:
            self._meta["skipped"] = [dict(s) for s in skipped]

    def finalize(self) -> None:
        n = len(self)
        meta: dict[str, Any] = {"tbljax_metadata": METADATA_VERSION, "num_records": n}
        for name in ("labels", "keys"):
            if name in self._meta and len(self._meta[name]) != n:
                raise ValueError(f"{len(self._meta[name])} {name} given for {n} records")
        if "labels" in self._meta:
            meta["labels"] = _encode_labels(self._meta["labels"])
        for name in ("keys", "classes", "recipe", "skipped"):
            if name in self._meta:
                meta[name] = self._meta[name]
        self._w.finalize(json.dumps(meta, separators=(",", ":")))

    def abort(self) -> None:
        self._w.abort()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
            return
        try:
            self.finalize()
        except BaseException:
            self.abort()  # release the file now, not whenever the writer is collected
            raise

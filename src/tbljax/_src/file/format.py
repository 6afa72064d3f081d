"""The TBL file as bytes, from Python. Record format codes, the index entry's
dtype, the dataset-level metadata block (labels, keys, class names, the conversion recipe: how
it is encoded and what a valid one holds), and `Writer`, which streams records into a new file.
Reading a file is `datasets/reader.py`'s job.

The byte layout, validation and checksums live in the C++ core (`ffi/core/tbl_format.*`).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from tbljax import _core
from tbljax._src.file.field_meta import check_field_meta
from tbljax._src.rules.contract import DEFAULT_RESIZE, MAX_SIDE, RESIZE_MODES, is_integer
from tbljax._src.rules.errors import shown

FORMATS: dict[str, int] = dict(_core.FORMATS)
FORMAT_NAMES: dict[int, str] = {v: k for k, v in FORMATS.items()}
METADATA_VERSION = 1
# A recipe's "stored" key says what its JPEG records hold: the source's own bytes ("original",
# also when the key is absent) or images re-encoded at the converted geometry ("resized":
# compact records, which the kernel decodes box by box).
STORED_KEY = "stored"
STORED_ORIGINAL, STORED_RESIZED = "original", "resized"


def is_compact(recipe: dict[str, Any]) -> bool:
    """Whether a conversion recipe says its JPEG records are compact (re-encoded at the
    converted geometry), not the source's own bytes."""
    return recipe.get(STORED_KEY) == STORED_RESIZED


def stored_entry(compact: bool) -> dict[str, str]:
    """The recipe's "stored" entry for records that are compact or the source's bytes."""
    return {STORED_KEY: STORED_RESIZED if compact else STORED_ORIGINAL}


# The recipe's keys about the run, not the data (left out of `Dataset.fingerprint`): `shard` and
# the per-part statistics (`source_sizes`, `label_errors` counts) differ between the parts of a
# `convert --shard i/n` job and the single-job file, whose records and labels are the same.
RUN_KEYS = frozenset({"created", "sources", "tbljax", "shard", "source_sizes", "label_errors"})


def run_entries(sources: Any, **run: Any) -> dict[str, Any]:
    """The recipe's entries about the run that writes it: where from (`sources`), by which
    tbljax and when (UTC), and `run`'s (shard, per-part statistics), each one of `RUN_KEYS`."""
    unknown = set(run) - RUN_KEYS
    if unknown:  # a new one belongs in RUN_KEYS, or the fingerprint would change with the run
        raise ValueError(f"{sorted(unknown)} are not recipe run keys ({sorted(RUN_KEYS)})")
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"sources": sources, **run, "tbljax": _core.native_info()["version"], "created": created}


# The 24-byte index entry as a numpy structured dtype (little-endian, packed).
INDEX_DTYPE = np.dtype(
    [
        ("offset", "<u8"),
        ("size", "<u4"),
        ("uncompressed_size", "<u4"),
        ("width", "<u2"),
        ("height", "<u2"),
        ("format", "u1"),
        ("flags", "u1"),
        ("crc16", "<u2"),
    ]
)
assert INDEX_DTYPE.itemsize == _core.INDEX_ENTRY_BYTES

PathLike = str | os.PathLike


def encode_labels(labels: np.ndarray) -> dict[str, str]:
    arr = np.ascontiguousarray(labels, dtype="<i8")
    return {"dtype": "<i8", "base64": base64.b64encode(arr.tobytes()).decode("ascii")}


def decode_labels(obj: dict[str, str], n: int, path: str) -> np.ndarray:
    raw = base64.b64decode(obj["base64"], validate=True)
    arr = np.frombuffer(raw, dtype=obj.get("dtype", "<i8")).astype(np.int64)
    if arr.shape != (n,):
        raise _core.CorruptFileError(f"{path}: dataset metadata holds {arr.size} labels for {n} records")
    return arr


def check_metadata(meta: dict[str, Any], n: int, path: str) -> None:
    """Raises CorruptFileError naming the field when dataset metadata does not have the shape
    Writer gives it: the JSON comes from the file, so it is as untrusted as its bytes."""

    def bad(field: str, want: str) -> None:
        raise _core.CorruptFileError(
            f"{path}: dataset metadata field {field!r} must be {want}, got {shown(json.dumps(meta[field]), 80)}"
        )

    labels = meta.get("labels")
    if labels is not None:
        dtype = labels.get("dtype", "<i8") if isinstance(labels, dict) else None
        if not (isinstance(labels, dict) and isinstance(labels.get("base64"), str) and dtype in LABEL_DTYPES):
            bad("labels", f"{{'dtype': one of {sorted(LABEL_DTYPES)}, 'base64': str}}")
        try:
            decode_labels(labels, n, path)
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
        if size is not None and (not is_integer(size) or not 1 <= size <= MAX_SIDE):
            bad("recipe", f"an object whose image_size is an integer in [1, {MAX_SIDE}]")
        if recipe.get("resize", DEFAULT_RESIZE) not in RESIZE_MODES:
            bad("recipe", f"an object whose resize is one of {list(RESIZE_MODES)}")
        if recipe.get(STORED_KEY, STORED_ORIGINAL) not in (STORED_ORIGINAL, STORED_RESIZED):
            bad("recipe", f"an object whose {STORED_KEY} is {STORED_ORIGINAL!r} or {STORED_RESIZED!r}")
    fields = meta.get("fields")
    if fields is not None:
        if not isinstance(fields, dict):
            bad("fields", "an object")
        for name, fmeta in fields.items():
            check_field_meta(name, fmeta, path)
    skipped = meta.get("skipped")
    if skipped is not None and not (isinstance(skipped, list) and all(isinstance(x, dict) for x in skipped)):
        bad("skipped", "a list of objects")


LABEL_DTYPES = frozenset({"<i8", "<i4", "<i2", "|i1", "<u4", "<u2", "|u1"})


def as_path(p: Any) -> str:
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

    >>> with tbljax.Writer("out.tbl", capacity=len(images)) as w:
    ...     for img in images:
    ...         w.add_raw(img)
    ...     w.set_metadata(labels=labels)
    """

    def __init__(self, dst: PathLike, capacity: int, *, overwrite: bool = False):
        if not is_integer(capacity) or not 0 <= capacity <= 1 << 40:
            raise ValueError(f"capacity must be an integer in [0, 2**40], got {capacity!r}")
        self.dst = as_path(dst)
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
            if not is_integer(v) or not 0 <= v <= MAX_SIDE:
                raise ValueError(f"{name} must be an integer in [0, {MAX_SIDE}], got {v!r}")
        self._w.add(np.frombuffer(data, np.uint8), FORMATS[format], int(width), int(height), False)

    def add_block(self, pieces: Any, align: int = 64) -> dict[str, int]:
        """Appends a block of bytes after every record (`pieces`: bytes-like chunks, written
        back to back); returns {'offset', 'bytes', 'crc32'} for the dataset metadata. Records
        cannot be added after it."""
        offset, size, crc = None, 0, 0
        for piece in pieces:
            data = np.frombuffer(piece, np.uint8)
            at = self._w.add_extra(data, align if offset is None else 1)
            offset = at if offset is None else offset
            size += data.size
            crc = _core.crc32(data, crc)
        if offset is None:
            offset = self._w.add_extra(np.zeros(0, np.uint8), align)
        return {"offset": int(offset), "bytes": size, "crc32": crc}

    def set_fields(self, fields: dict[str, dict[str, Any]]) -> None:
        """The record fields' metadata (`fields.ColumnWriter.write` gives each)."""
        self._meta["fields"] = dict(fields)

    def set_metadata(
        self,
        *,
        labels: Sequence[int] | np.ndarray | None = None,
        keys: Sequence[str] | None = None,
        classes: Sequence[str] | None = None,
        recipe: dict[str, Any] | None = None,
        skipped: Sequence[dict[str, str]] | None = None,
    ) -> None:
        """Dataset metadata stored in one block, read back in O(1) at open."""
        if labels is not None:
            arr = np.asarray(labels)
            if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                raise ValueError(f"labels must be a 1-D sequence of integers, got {arr.dtype} of shape {arr.shape}")
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
            meta["labels"] = encode_labels(self._meta["labels"])
        for name in ("keys", "classes", "recipe", "skipped", "fields"):
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


def parse_dataset_json(f: Any) -> dict[str, Any]:
    """A file's dataset metadata block as a checked dict ({} when it has none); CorruptFileError
    naming the file when it is not a valid JSON object of ours."""
    raw = f.dataset_json
    if not raw:
        return {}
    try:
        meta = json.loads(raw)
    except ValueError as e:
        raise _core.CorruptFileError(f"{f.path}: dataset metadata is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise _core.CorruptFileError(f"{f.path}: dataset metadata is not a JSON object")
    check_metadata(meta, f.num_records, f.path)
    return meta


def scan_sample_metadata(f: Any) -> tuple[np.ndarray, list[str] | None]:
    """(labels, keys or None) from the one-JSON-block-per-sample metadata other writers
    (turboloader's add_metadata) leave: a linear scan, done once and only when asked for."""
    # Files from other writers (turboloader's add_metadata) carry one JSON block per
    # sample: a linear scan, done once and only when labels or keys are asked for.
    n = f.num_records
    labels = np.full(n, -1, np.int64)
    keys: list[str] = [""] * n
    found_key = False
    sec = f.metadata_section()
    pos, hdr = 0, _core.META_BLOCK_HEADER_BYTES
    while pos + hdr <= len(sec):
        sample = int.from_bytes(sec[pos : pos + 8], "little")
        size = int.from_bytes(sec[pos + 8 : pos + 12], "little")
        mtype = int.from_bytes(sec[pos + 12 : pos + 14], "little")
        payload = sec[pos + hdr : pos + hdr + size]
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
            if is_integer(lab):
                if not -(1 << 63) <= lab < 1 << 63:
                    raise _core.CorruptFileError(
                        f"{f.path}: metadata of record {sample}: label {lab} does not fit in int64"
                    )
                labels[sample] = lab
            key = obj.get("key", obj.get("__key__"))
            if isinstance(key, str):
                keys[sample] = key
                found_key = True
    return labels, (keys if found_key else None)


def labels_of(files, metas) -> np.ndarray:
    """int64 labels of every record of `files` (their parsed dataset blocks `metas`), -1 where a
    record has none: from the dataset block, else from foreign per-sample blocks."""
    parts = []
    for f, meta in zip(files, metas):
        n = f.num_records
        if "labels" in meta and meta["labels"] is not None:
            parts.append(decode_labels(meta["labels"], n, f.path))
        elif f.header_flags & _core.FLAG_HAS_METADATA:
            parts.append(scan_sample_metadata(f)[0])
        else:
            parts.append(np.full(n, -1, np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def keys_of(files, metas) -> list[str]:
    """Every record's key ('' where unknown), as `labels_of` finds labels."""
    out: list[str] = []
    for f, meta in zip(files, metas):
        keys = meta.get("keys")
        if keys is None and f.header_flags & _core.FLAG_HAS_METADATA and not meta:
            keys = scan_sample_metadata(f)[1]
        keys = keys if keys is not None else [""] * f.num_records
        if len(keys) != f.num_records:
            raise _core.CorruptFileError(f"{f.path}: metadata holds {len(keys)} keys for {f.num_records} records")
        out.extend(keys)
    return out

"""Record fields besides the image: their kinds, how a source's raw value becomes a field value
(`parse_field_value`, the one place every source's values are checked), how a conversion
streams a field into columnar blocks of the file (`ColumnWriter`, `Columns`); the metadata a
file holds for a field is checked in `file/field_meta.py`, and reading them back is
`file/field_columns.py`.

A field is `str` (UTF-8 text), `json` (any JSON value) or `ndarray` (numeric; one shape in
every record: fixed; a first dimension that varies: ragged). In the file a fixed field is one
(N, *shape) block; the others are an (N+1,) int64 offsets block and one values block (UTF-8
or JSON text bytes, or the rows of a ragged array back to back). The blocks lie after the
records where no index entry points (turboloader ignores them) and the dataset metadata's
"fields" entry says where, with a CRC-32 of each. A map field declared `compress="lz4"` has
"encoding": "lz4": its values block holds each record's bytes as one LZ4 block, back to back,
and a "blocks" block the (N+1,) int64 byte offsets of those blocks (its offsets, if any, still
count rows).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile
from array import array
from typing import Any

import numpy as np

from tbljax import _core
from tbljax._src.rules import contract
from tbljax._src.rules.dataset import FIELD_KINDS, FieldInfo
from tbljax._src.rules.errors import FieldError  # re-exported
from tbljax._src.rules.errors import FieldsNotFound as FieldsNotFound
from tbljax._src.rules.geometry import BOX_FORMATS, INTERPOLATIONS

__all__ = [
    "COPY_BYTES",
    "ENCODINGS",
    "FIELD_BLOCKS",
    "FIELD_KINDS",
    "GEOMETRIC_ROLES",
    "Boxes",
    "ColumnWriter",
    "Columns",
    "DenseMap",
    "FieldError",
    "FieldInfo",
    "Keypoints",
    "Mask",
    "kind_for_extension",
    "kind_of_value",
    "parse_field_value",
]

BLOCK_ALIGN = 64  # a fixed field's (N, ...) view starts on a cache line
COPY_BYTES = 16 << 20  # spill → file in pieces of this size: memory flat in the field's size
ENCODINGS = ("lz4",)  # how a map field's records may be stored besides raw (`compress=`)
FIELD_BLOCKS = ("values", "offsets", "blocks")  # the blocks a field may hold in the file
# Names a batch or a record already uses (a mixture's batch holds "source").
_RESERVED = ("image", "label", "index", "key", "mask", "valid", "source")


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier() or name in _RESERVED or name.endswith("_length"):
        raise ValueError(
            f"field name {name!r} must be a Python identifier, not ending in '_length' and not one of {list(_RESERVED)}"
        )
    return name


def kind_for_extension(ext: str) -> str:
    """The kind of a TAR member or sidecar file by its extension: .txt → str, .json → json,
    .npy and .png (its one channel of pixels) → ndarray (the extension may hold a dot:
    'emb.npy', 'en.txt', 'mask.png')."""
    last = ext.lower().rsplit(".", 1)[-1]
    kinds = {"txt": "str", "json": "json", "npy": "ndarray", "png": "ndarray"}
    if last not in kinds:
        raise ValueError(
            f"field extension {ext!r}: a field is read from a .txt (str), .json (json), .npy or .png (ndarray) member"
        )
    return kinds[last]


# ---- geometric fields: a field that follows the image (issue 48; rules/geometry.py) ----------


@dataclasses.dataclass(frozen=True)
class _Declared:
    """Where a geometric field is read from: `ext`, the TAR member's or sidecar file's extension
    (img1.jpg + img1.mask.png); with `folder=`, of the file at the photo's relative path in that
    parallel folder (VOC's JPEGImages/x.jpg + SegmentationClass/x.png); `key=`, the dict key,
    Hugging Face column or TFDS feature (default: the field's name). `items.check_declared`."""

    ext: str | None = None
    key: str | None = dataclasses.field(default=None, kw_only=True)
    folder: str | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self):
        if isinstance(self.folder, os.PathLike):
            object.__setattr__(self, "folder", os.fspath(self.folder))
        bad = [
            w
            for w in ("ext", "key", "folder")
            if getattr(self, w) is not None
            and (not isinstance(getattr(self, w), str) or not getattr(self, w).strip("."))
        ]
        if bad or (self.folder is not None and self.ext is None) or (self.key is not None and self.ext is not None):
            raise ValueError(
                f"{type(self).__name__}({', '.join(bad) or 'ext, key, folder'}=): give ext= (a "
                f"non-empty str), with folder= or not, or key= alone; got {self!r}"
            )


@dataclasses.dataclass(frozen=True)
class Mask(_Declared):
    """A label map that follows the image: resized by the nearest rule (labels never
    blended), `ignore` where the output has no source pixel. Read from a one-channel .png
    (mode L or P: uint8; I;16: uint16) or an (H, W) .npy of integers. compress="lz4": each
    record's mask stored as one LZ4 block (4-10x smaller; decoded when served), None: raw.

    >>> tbljax.convert("voc/", "voc.tbl", image_size=256, fields={"mask": tbljax.Mask("png", ignore=255)})
    """

    ignore: int = 255
    compress: str | None = None

    def __post_init__(self):
        super().__post_init__()
        _check_compress(self)
        if not contract.is_integer(self.ignore) or not 0 <= self.ignore < 1 << 16:
            raise ValueError(f"Mask(ignore=) must be an int in [0, 65535], got {self.ignore!r}")

    def role(self) -> dict[str, Any]:
        return {"role": "mask", "ignore": int(self.ignore)}


@dataclasses.dataclass(frozen=True)
class DenseMap(_Declared):
    """A dense map (depth, flow) that follows the image: interpolation "nearest" (the mask's
    rule) or "linear" (bilinear, float32), samples equal to `invalid` given no weight;
    compress="lz4" as `Mask`'s."""

    interpolation: str = "nearest"
    invalid: float | None = None
    compress: str | None = None

    def __post_init__(self):
        super().__post_init__()
        _check_compress(self)
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"DenseMap(interpolation=) must be one of {INTERPOLATIONS}, got {self.interpolation!r}")
        if self.invalid is not None and not contract.is_real(self.invalid):
            raise ValueError(f"DenseMap(invalid=) must be a number or None, got {self.invalid!r}")

    def role(self) -> dict[str, Any]:
        return {"role": "dense", "interpolation": self.interpolation, "invalid": self.invalid}


@dataclasses.dataclass(frozen=True)
class Boxes(_Declared):
    """Boxes that follow the image, in `format` (xyxy, xywh, cxcywh, yxyx: TFDS's order) in the
    source's pixels (normalized=True: fractions of its width and height, as TFDS's BBoxFeature)
    as an (n, 4) array or a JSON list, or {"boxes": [...], "labels": [...]}; stored float32 xyxy
    at the record's geometry. labels: the name of a field for each box's integer label."""

    format: str = "xyxy"  # noqa: A003 - torchvision's word
    labels: str | None = None
    normalized: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.format not in BOX_FORMATS or not isinstance(self.normalized, bool):
            raise ValueError(
                f"Boxes(format=) must be one of {BOX_FORMATS} and normalized= True or False, got "
                f"{self.format!r}, {self.normalized!r}"
            )
        if self.labels is not None:
            check_name(self.labels)

    def role(self) -> dict[str, Any]:
        return {"role": "boxes", "format": "xyxy", "labels": self.labels}


@dataclasses.dataclass(frozen=True)
class Keypoints(_Declared):
    """Keypoints that follow the image: (K, 2|3) or (n, K, 2|3) as (x, y[, visibility]),
    K = len(flip_permutation); stored as float32 (n, K, 3), visibility 0 outside the record.
    flip_permutation: point k of a mirrored image is point flip_permutation[k] (left ↔ right)."""

    flip_permutation: tuple[int, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        perm = tuple(self.flip_permutation)
        if not perm or sorted(perm) != list(range(len(perm))) or not all(contract.is_integer(k) for k in perm):
            raise ValueError(f"Keypoints(flip_permutation=) must be a permutation of 0..K-1, got {perm!r}")
        object.__setattr__(self, "flip_permutation", tuple(int(k) for k in perm))

    def role(self) -> dict[str, Any]:
        return {"role": "keypoints", "flip_permutation": list(self.flip_permutation)}


def _check_compress(spec: Any) -> None:
    if spec.compress is not None and spec.compress not in ENCODINGS:
        raise ValueError(
            f"{type(spec).__name__}(compress=) must be None (raw) or one of {ENCODINGS}, got {spec.compress!r}"
        )


GEOMETRIC_ROLES = {"mask": Mask, "dense": DenseMap, "boxes": Boxes, "keypoints": Keypoints}


def _png_pixels(raw: bytes) -> np.ndarray:
    """A .png member's one channel of pixels (L, P: uint8; I;16: uint16; I: int32)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.mode not in ("L", "P", "I;16", "I"):
                raise FieldError(f"a .png field holds one channel (mode L, P, I;16 or I), got mode {im.mode}")
            return np.asarray(im).copy()
    except FieldError:
        raise
    except (OSError, ValueError, SyntaxError) as e:
        raise FieldError(f"not a readable .png ({e})") from None


def kind_of_value(value: Any) -> str:
    """The kind of an in-memory value (a dict source's entry, a table's cell): str → str, an
    array or NumPy scalar → ndarray, anything else → json."""
    if isinstance(value, str):
        return "str"
    if isinstance(value, (np.ndarray, np.generic)) or (
        hasattr(value, "__array__") and hasattr(value, "dtype") and hasattr(value, "shape")
    ):
        return "ndarray"
    return "json"


def parse_field_value(kind: str, raw: Any) -> Any:
    """A field value of `kind` from what a source holds: bytes (a member's or sidecar's
    content: UTF-8 text, JSON text, an .npy file) or a value (str, a JSON-able value, an
    array). Returns str, the JSON value, or a NumPy array; FieldError saying what is wrong."""
    if kind not in FIELD_KINDS:
        raise ValueError(f"field kind must be one of {list(FIELD_KINDS)}, got {kind!r}")
    is_bytes = isinstance(raw, (bytes, bytearray, memoryview))
    if kind == "str":
        if is_bytes:
            try:
                return bytes(raw).decode("utf-8")
            except UnicodeDecodeError as e:
                raise FieldError(f"not UTF-8 text ({e})") from None
        if isinstance(raw, str):
            return raw
        raise FieldError(f"a str field takes text, got {type(raw).__name__}")
    if kind == "json":
        if is_bytes:
            try:
                return json.loads(bytes(raw).decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise FieldError(f"not valid JSON ({e})") from None
        try:
            json.dumps(raw)
        except (TypeError, ValueError) as e:
            raise FieldError(f"not a JSON value ({e})") from None
        return raw
    if is_bytes and bytes(raw[:8]) == b"\x89PNG\r\n\x1a\n":
        arr = _png_pixels(bytes(raw))
    elif is_bytes:
        try:
            arr = np.load(io.BytesIO(bytes(raw)), allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise FieldError(f"not a readable .npy array ({e})") from None
    else:
        try:
            arr = np.asarray(raw)
        except (TypeError, ValueError) as e:
            raise FieldError(f"not an array ({e})") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf" or arr.dtype.itemsize > 8:
        raise FieldError(
            f"an ndarray field takes a numeric array (bool, int, uint, float), "
            f"got {getattr(arr, 'dtype', type(arr).__name__)}"
        )
    return arr


class ColumnWriter:
    """One field of a conversion: values are checked (`problem`), then appended (`append`) to
    an unnamed spill file beside the output, so memory stays flat in N; `write` copies them
    into the TBL file's blocks at the end and returns the field's metadata."""

    def __init__(self, name: str, kind: str, spill_dir: str, encoding: str | None = None):
        self.name, self.kind, self.encoding = check_name(name), kind, encoding
        self.blocks = array("q")  # encoded: each record's block bytes
        self.dtype: np.dtype | None = None
        self.trail: tuple[int, ...] | None = None  # ndarray: the shape after the first dimension
        self.ndim: int | None = None
        self.lengths = array("q")  # bytes (str/json) or rows (ndarray) of each record
        self.spill = tempfile.TemporaryFile(dir=spill_dir, prefix=".tbljax-field-", buffering=1 << 20)

    def problem(self, value: Any) -> str | None:
        """Why `value` cannot join this field (dtype or shape disagrees), else None."""
        if self.kind != "ndarray":
            return None
        if value.dtype.byteorder == ">":
            value = value.astype(value.dtype.newbyteorder("<"))
        if self.dtype is None:
            return None
        if value.dtype != self.dtype:
            return f"dtype {value.dtype} where the field's is {self.dtype}"
        if value.ndim != self.ndim or value.shape[1:] != self.trail:
            want = "()" if self.ndim == 0 else f"(n,) + {self.trail}"
            return f"shape {value.shape} where the field's records are {want}"
        return None

    def expect(self, value: Any) -> None:
        """The first good record sets an ndarray field's dtype and trailing shape."""
        if self.kind == "ndarray" and self.dtype is None:
            self.dtype, self.ndim, self.trail = value.dtype.newbyteorder("<"), value.ndim, value.shape[1:]

    def append(self, value: Any) -> None:
        if self.kind == "ndarray":
            data = np.ascontiguousarray(value, dtype=self.dtype)
            self.lengths.append(data.shape[0] if data.ndim else 1)
            raw = data.reshape(-1).view(np.uint8)
            if self.encoding == "lz4":
                raw = _core.lz4_compress(raw)
                self.blocks.append(len(raw))
            self.spill.write(memoryview(raw).cast("B") if isinstance(raw, np.ndarray) else raw)
            return
        data = (value if self.kind == "str" else json.dumps(value, ensure_ascii=False, separators=(",", ":"))).encode(
            "utf-8"
        )
        self.lengths.append(len(data))
        self.spill.write(data)

    def write(self, w: Any) -> dict[str, Any]:
        """Writes the blocks through `w` (a `format.Writer`); returns the field's metadata."""
        self.spill.flush()
        self.spill.seek(0)
        lengths = np.frombuffer(self.lengths, np.int64) if len(self.lengths) else np.zeros(0, np.int64)
        meta: dict[str, Any] = {"kind": self.kind}
        if self.kind == "ndarray":
            meta["dtype"] = self.dtype.str
            fixed = self.ndim == 0 or len(np.unique(lengths)) <= 1
            first = int(lengths[0]) if len(lengths) and self.ndim else None
            meta["shape"] = [] if self.ndim == 0 else [first if fixed else None, *self.trail]
            if self.ndim and first is None:  # no record at all: a ragged field of no rows
                meta["shape"] = [None, *self.trail]
        else:
            meta["dtype"], meta["shape"] = None, []
        meta["values"] = w.add_block(iter(lambda: self.spill.read(COPY_BYTES), b""), BLOCK_ALIGN)
        if self.encoding is not None:
            meta["encoding"] = self.encoding
            starts = np.zeros(len(self.blocks) + 1, "<i8")
            np.cumsum(np.frombuffer(self.blocks, np.int64), out=starts[1:])
            meta["blocks"] = w.add_block([starts.view(np.uint8)], BLOCK_ALIGN)
        if not (self.kind == "ndarray" and meta["shape"][:1] != [None]):
            offsets = np.zeros(len(lengths) + 1, "<i8")
            np.cumsum(lengths, out=offsets[1:])
            meta["offsets"] = w.add_block([offsets.view(np.uint8)], BLOCK_ALIGN)
        self.spill.close()
        return meta

    def close(self) -> None:
        self.spill.close()


class Columns:
    """The fields of one conversion: `parse` checks an item's fields (a reason string when one
    fails: the record is skipped), `append` stores a written record's values, `write` puts the
    blocks and their metadata into the file. A context manager: the spill files go at exit."""

    def __init__(
        self,
        kinds: dict[str, str],
        exts: dict[str, str],
        out_dir: str,
        roles: dict[str, dict[str, Any]] | None = None,
        encodings: dict[str, str] | None = None,
    ):
        self.exts, self.roles = exts, dict(roles or {})  # roles: a geometric field's metadata
        self.kinds = kinds  # as the source holds them; a geometric field is stored as an ndarray
        encodings = encodings or {}  # a map field's compress=
        self.writers = {
            name: ColumnWriter(name, "ndarray" if name in self.roles else kind, out_dir, encodings.get(name))
            for name, kind in kinds.items()
        }
        self.found: set[str] = set()

    def parse(self, item: Any, transform: Any = None) -> dict[str, Any] | str:
        """The item's field values, or why one fails; `transform(values)` (values or a
        reason) takes them to the record's geometry before the dtype and shape checks."""
        values = {}
        for name in self.writers:
            if "of" in self.roles.get(name, {}):
                self.found.add(name)
                continue  # a derived field (the boxes' labels): the transform makes it
            if name not in item.fields:
                where = f" (no .{self.exts[name]} member or sidecar file)" if name in self.exts else ""
                return f"field {name!r}: missing{where}"
            self.found.add(name)
            try:
                v = parse_field_value(self.kinds[name], item.fields[name])
            except FieldError as e:
                return f"field {name!r}: {e}"
            values[name] = v
        if transform is not None:
            values = transform(values)
            if isinstance(values, str):
                return values
        for name, v in values.items():
            problem = self.writers[name].problem(v)
            if problem:
                return f"field {name!r}: {problem}"
        for name, v in values.items():
            self.writers[name].expect(v)
        return values

    def append(self, values: dict[str, Any]) -> None:
        for name, v in values.items():
            self.writers[name].append(v)

    def check_found(self, dst: str) -> None:
        """ConversionError-worthy: a field that no item had (a misspelt extension)."""
        missing = [n for n in self.writers if n not in self.found]
        if missing and self.exts:
            n = missing[0]
            raise FieldsNotFound(
                f"fields= names {n!r} = .{self.exts.get(n, '?')}, which no record has "
                f"(no such member or sidecar file); {dst} was not written"
            )

    def write(self, w: Any) -> None:
        if self.writers:
            w.set_fields(
                {
                    name: {**col.write(w), **({"role": self.roles[name]} if name in self.roles else {})}
                    for name, col in self.writers.items()
                }
            )

    def __enter__(self) -> Columns:
        return self

    def __exit__(self, *exc: Any) -> None:
        for col in self.writers.values():
            col.close()

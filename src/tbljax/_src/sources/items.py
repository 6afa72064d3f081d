"""What every conversion source yields and the label rules they share: `Item` (one source
image with its key, label and fields), the image and label member extensions, the classes
table, label parsing, the contiguous share of a sharded conversion, and the expansion of
paths and patterns that name one kind of file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tbljax._src.remote import remote
from tbljax._src.rules.braces import expand_braces
from tbljax._src.rules.contract import is_integer
from tbljax._src.rules.errors import shown
from tbljax._src.rules.partition import host_part

# Image files by extension (a folder's other files are left out and listed); .jfif is a JPEG.
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "jfif", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "gif"})
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
# Members read for a label, in this order (the first present wins): `.cls`, `.cls2`, `.label`
# hold an integer id or a class name; `.json` a bare id or name, or an object with a
# "label", "cls" or "class" field. `.txt` is not among them: in WebDataset it is usually a
# caption, and captions taken as class names make one class per sample (convert's
# label_ext="txt" reads it when it does hold class names).
LABEL_EXTENSIONS = ("cls", "cls2", "label", "json")
JSON_LABEL_FIELDS = ("label", "cls", "class")

Label = int | str
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1  # labels are stored as int64


@dataclasses.dataclass
class Item:
    """One source image: encoded bytes or decoded pixels, with its key and label."""

    key: str
    source: str  # the file it came from (a shard, an image file, "<array>")
    data: bytes | np.ndarray | None
    label: Label = -1  # an integer id, a class name, or -1 for none
    error: str | None = None  # set when the item is known bad before decoding
    label_error: str | None = None  # set when a label member exists but could not be read
    # The record's other fields, by field name, as the source holds them: a TAR member's or a
    # sidecar file's bytes, or a value (a dict source's entry, a table's cell). Conversion
    # parses and checks them against the field's kind.
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)


def share(seq: Sequence[Any], i: int, n: int, what: str) -> list[Any]:
    """Share i of n of seq by the rule of `partition.host_part` (contiguous, near-equal shares
    that in order concatenate to seq); an empty share is an error."""
    mine = host_part(len(seq), i, n)
    part = list(seq[mine.start : mine.stop])
    if not part:
        raise ValueError(
            f"shard {i}/{n} is empty: {len(seq)} {what} split {n} ways leaves share "
            f"{i} nothing; use at most {len(seq)} shares"
        )
    return part


# ---- labels --------------------------------------------------------------------------------


def load_classes(classes: Sequence[str] | str | os.PathLike | None) -> list[str] | None:
    """A classes table from a list of names or a text file of one name per line (blank lines
    skipped); checked: names non-empty, single-line and unique."""
    if classes is None:
        return None
    if isinstance(classes, (str, os.PathLike)):
        path = os.fspath(classes)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"classes file not found: {path}")
        with open(path, encoding="utf-8") as f:
            names = [line.strip() for line in f]
        names = [n for n in names if n]
        where = f"classes file {path}"
    elif isinstance(classes, Sequence) or isinstance(classes, np.ndarray):
        names = list(classes)
        where = "classes"
        for c in names:
            if not isinstance(c, str):
                raise TypeError(
                    f"classes must be a list of str names or a file path, got an item {type(c).__name__} {c!r}"
                )
    else:
        raise TypeError(
            f"classes must be a list of str names or a path to a file of one name per "
            f"line, got {type(classes).__name__}"
        )
    if not names:
        raise ValueError(f"{where} holds no class name")
    seen: dict[str, int] = {}
    for i, c in enumerate(names):
        if not c.strip() or "\n" in c or "\r" in c:
            raise ValueError(f"{where}: class {i} is {c!r}; names must be non-empty single lines")
        if c in seen:
            raise ValueError(f"{where}: class name {c!r} appears twice (ids {seen[c]} and {i})")
        seen[c] = i
    return names


def parse_label(ext: str, payload: bytes, required: bool = True) -> tuple[Label, str | None]:
    """(label, problem) from one label member's bytes: an int id, a class name, or -1 with the
    reason it could not be read. required=False: a JSON object without a label field is
    metadata, not a label (-1, no problem)."""
    try:
        text = payload.decode("utf-8").strip()
    except UnicodeDecodeError:
        return -1, f".{ext} label is not UTF-8 text"
    if ext == "json":
        try:
            obj = json.loads(text)
        except ValueError:
            return -1, ".json label member is not valid JSON"
        field = ""
        if isinstance(obj, dict):
            present = [f for f in JSON_LABEL_FIELDS if f in obj]
            if not present:
                return -1, (f".json has none of the fields {list(JSON_LABEL_FIELDS)}" if required else None)
            field = f" field {present[0]!r}"
            obj = obj[present[0]]
        if is_integer(obj):
            if not _INT_MIN <= obj <= _INT_MAX:
                return -1, f".json{field} label {obj} does not fit in int64"
            return obj, None
        if isinstance(obj, str) and obj.strip() and "\n" not in obj.strip():
            return obj.strip(), None
        return -1, f".json{field} label is {shown(json.dumps(obj), 60)}, not an integer id or a class name"
    if not text:
        return -1, f".{ext} label member is empty"
    if re.fullmatch(r"[+-]?[0-9]+", text):
        v = int(text)
        return (v, None) if _INT_MIN <= v <= _INT_MAX else (-1, f".{ext} label {text} does not fit in int64")
    if "\n" in text or "\r" in text:
        return -1, f".{ext} label member holds several lines, not one class name"
    return text, None


def label_list(labels: Any, n: int) -> list[Label]:
    """labels= for arrays and file lists as a list of int ids / class names, shape (n,) or
    (n, 1) (Keras' CIFAR labels)."""
    if isinstance(labels, (list, tuple)):  # not np.asarray: it would turn [1, "cat"] into strings
        values = [v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v for v in labels]
        shape: tuple[int, ...] = (len(values),)
    else:
        arr = np.asarray(labels)
        if arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        values, shape = arr.tolist(), arr.shape
    if shape != (n,):
        raise ValueError(f"labels must have shape ({n},) to match the {n} images, got {shape}")
    out: list[Label] = []
    for v in values:
        if isinstance(v, np.generic):
            v = v.item()
        if is_integer(v):
            out.append(v)
        elif isinstance(v, str) and v.strip():
            out.append(v.strip())
        else:
            raise TypeError(f"labels must be integer ids or class names (str), got {type(v).__name__} {v!r}")
    return out


def table_for(labels: Sequence[Label], classes: list[str] | None) -> list[str] | None:
    """The classes table of a label list known before converting: `classes` when given (every
    name must be in it, every id in range), else the sorted names when labels are names."""
    names = {v for v in labels if isinstance(v, str)}
    ids = [v for v in labels if not isinstance(v, str)]
    if classes is not None:
        unknown = sorted(names - set(classes))
        if unknown:
            raise ValueError(f"label {unknown[0]!r} is not in classes ({len(unknown)} unknown names)")
        bad = [v for v in ids if not -1 <= v < len(classes)]
        if bad:
            raise ValueError(f"label id {bad[0]} is out of range for {len(classes)} classes")
        return classes
    if names and ids:
        raise ValueError(
            f"labels mix integer ids ({ids[0]}) and class names ({sorted(names)[0]!r}); "
            "give names only, or ids with classes="
        )
    return sorted(names) if names else None


def paths_of(sources: Any, is_kind: Callable[[list[str]], bool]) -> list[str] | None:
    """Paths and patterns (braces, globs; local or URLs) expanded when every word names a file
    of the kind `is_kind` accepts, else None (the sources are another kind's)."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if (
        not isinstance(sources, (list, tuple))
        or not sources
        or not all(isinstance(s, (str, os.PathLike)) for s in sources)
    ):
        return None
    words = [w for s in map(os.fspath, sources) for w in expand_braces(s)]
    if not is_kind(words):
        return None
    paths = [p for w in words for p in remote.expand(w)]
    if not paths:
        raise ValueError(f"convert: the pattern matched no file: {shown(repr(sources))}")
    return paths


# ---- where a geometric field is read from -----------------------------------------------

# What each kind of source reads a geometric declaration's field by (`fields._Declared`):
# the attributes it takes, the first one required.
DECLARED_BY = {
    "TAR shards": ("ext",),
    "an image folder": ("ext", "folder"),
    "a dict source": ("key",),
    "a Hugging Face dataset or Parquet file": ("key",),
    "TFRecord / ArrayRecord files": ("key",),
}


def check_declared(geometric: dict[str, Any], source: str) -> dict[str, str]:
    """{field name: the key it is read by} for `source`'s kind (a DECLARED_BY key); a
    declaration naming what that kind has not (an ext= for a dict, a key= for a TAR) is refused
    by name, as is a file source's declaration without ext=."""
    takes = DECLARED_BY[source]
    for name, g in geometric.items():
        given = [w for w in ("ext", "key", "folder") if getattr(g, w) is not None and w not in takes]
        if given or (takes[0] == "ext" and g.ext is None):
            what = f"{given[0]}=" if given else "no ext="
            raise ValueError(
                f"fields[{name!r}] = {g!r} gives {what}; {source} read a geometric field by "
                + " / ".join(f"{t}=" for t in takes)
                + (" (ext= required)" if takes[0] == "ext" else " (default: the field's name)")
            )
    return {name: g.key or name for name, g in geometric.items()}

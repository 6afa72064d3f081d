"""Where convert's images come from: WebDataset TAR shards (local, or at a URL through fsspec:
io/remote.py), an image folder (one subfolder per class), a list of image files, or numpy
arrays. Each source yields `Item`s in a fixed order and knows an upper bound of its count
before reading (it sizes the TBL index).

Labels travel as the sources hold them: an integer id, a class name (str), or -1 when the item
has none; `tbljax.convert` turns names into ids against one classes table.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tbljax._src.io import remote
from tbljax._src.io.fields import check_name, kind_for_extension, kind_of_value
from tbljax._src.rules.braces import expand_braces
from tbljax._src.rules.partition import host_part

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "gif"})
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
    source: str                  # the file it came from (a shard, an image file, "<array>")
    data: bytes | np.ndarray | None
    label: Label = -1            # an integer id, a class name, or -1 for none
    error: str | None = None     # set when the item is known bad before decoding
    label_error: str | None = None  # set when a label member exists but could not be read
    # The record's other fields, by field name, as the source holds them: a TAR member's or a
    # sidecar file's bytes, or a value (a dict source's entry, a table's cell). Conversion
    # parses and checks them against the field's kind.
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)


def _share(seq: Sequence[Any], i: int, n: int, what: str) -> list[Any]:
    """Share i of n of seq by the rule of `partition.host_part` (contiguous, near-equal shares
    that in order concatenate to seq); an empty share is an error."""
    mine = host_part(len(seq), i, n)
    part = list(seq[mine.start:mine.stop])
    if not part:
        raise ValueError(f"shard {i}/{n} is empty: {len(seq)} {what} split {n} ways leaves share "
                         f"{i} nothing; use at most {len(seq)} shares")
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
                raise TypeError(f"classes must be a list of str names or a file path, got an item "
                                f"{type(c).__name__} {c!r}")
    else:
        raise TypeError(f"classes must be a list of str names or a path to a file of one name per "
                        f"line, got {type(classes).__name__}")
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
        if isinstance(obj, int) and not isinstance(obj, bool):
            if not _INT_MIN <= obj <= _INT_MAX:
                return -1, f".json{field} label {obj} does not fit in int64"
            return obj, None
        if isinstance(obj, str) and obj.strip() and "\n" not in obj.strip():
            return obj.strip(), None
        return -1, f".json{field} label is {json.dumps(obj)[:60]}, not an integer id or a class name"
    if not text:
        return -1, f".{ext} label member is empty"
    if re.fullmatch(r"[+-]?[0-9]+", text):
        v = int(text)
        return (v, None) if _INT_MIN <= v <= _INT_MAX else (-1, f".{ext} label {text} does not fit in int64")
    if "\n" in text or "\r" in text:
        return -1, f".{ext} label member holds several lines, not one class name"
    return text, None


def _label_list(labels: Any, n: int) -> list[Label]:
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
        if isinstance(v, int) and not isinstance(v, bool):
            out.append(v)
        elif isinstance(v, str) and v.strip():
            out.append(v.strip())
        else:
            raise TypeError(f"labels must be integer ids or class names (str), got {type(v).__name__} {v!r}")
    return out


def _table_for(labels: Sequence[Label], classes: list[str] | None) -> list[str] | None:
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
        raise ValueError(f"labels mix integer ids ({ids[0]}) and class names ({sorted(names)[0]!r}); "
                         "give names only, or ids with classes=")
    return sorted(names) if names else None


# ---- sources -------------------------------------------------------------------------------

def _split_key(name: str) -> tuple[str, str]:
    # WebDataset: the key is the path up to the first dot of the file name.
    d, base = os.path.split(name)
    stem, _, ext = base.partition(".")
    return (f"{d}/{stem}" if d else stem), ext.lower()


def _is_image_member(name: str) -> bool:
    return _split_key(name)[1].rsplit(".", 1)[-1] in IMAGE_EXTENSIONS


def _count_shard(path: str, retry: remote.Retry = remote.DEFAULT_RETRY) -> tuple[int, str | None]:
    """Image members of one shard, and why counting stopped early (None: it did not). A plain
    .tar is read header by header, seeking over the data (tarfile does so for uncompressed
    files; at a URL the seeks are ranged reads of fsspec's blocks, so small members cost about
    one download of the shard); a compressed one is decompressed once."""
    n = 0
    try:
        with remote.open_input(path, retry) as f, tarfile.open(fileobj=f, mode="r:*") as tf:
            for m in tf:
                n += m.isfile() and _is_image_member(m.name)
    except (tarfile.TarError, EOFError, OSError) as e:
        return n, f"{type(e).__name__}: {e}"  # its readable members were counted
    return n, None


class TarSource:
    """WebDataset shards: members grouped by key; `.cls`/`.json` (or `label_ext`) give the label.
    Shards at a URL are streamed through `remote.RetryingReader`: a dropped connection is
    retried as `retry` says and resumed at the byte where it broke."""

    # Where labels come from: convert says it when no record has one.
    LABELS_FROM = ("TAR shards take labels from a .cls, .cls2, .label or .json member beside each image "
                   "(label_ext= / --label-ext names another)")

    def __init__(self, paths: Sequence[str], classes: list[str] | None = None,
                 label_ext: str | None = None, retry: remote.Retry = remote.DEFAULT_RETRY,
                 fields: dict[str, str] | None = None):
        self.paths = list(paths)
        self.field_exts = dict(fields or {})  # field name -> member extension
        self.field_kinds = {k: kind_for_extension(e) for k, e in self.field_exts.items()}
        self.retry = retry
        missing = _missing(self.paths, retry)
        if missing:
            more = f" (and {len(missing) - 1} more of {len(self.paths)})" if len(missing) > 1 else ""
            raise FileNotFoundError(f"TAR shard not found: {missing[0]}{more}")
        self.classes = classes
        self.label_ext = label_ext
        # Shards whose count stopped early: (images counted, why). Reading such a shard stops
        # there too, even if the network is back by then: the count sized the file's index.
        self.cut_short: dict[str, tuple[int, str]] = {}

    def select(self, i: int, n: int) -> TarSource:
        """Shard i of n: a contiguous share of whole TAR files."""
        return TarSource(_share(self.paths, i, n, "TAR files"), self.classes, self.label_ext, self.retry,
                         self.field_exts)

    def describe(self) -> list[str]:
        return self.paths

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        """An upper bound of the records (image members; skipped items take no index slot),
        shards counted in parallel (reads overlap; zlib/bz2/lzma release the GIL)."""
        total = 0
        with ThreadPoolExecutor(min(8, len(self.paths)), thread_name_prefix="tbljax-count") as ex:
            for k, (p, (n, problem)) in enumerate(zip(self.paths, ex.map(
                    lambda p: _count_shard(p, self.retry), self.paths))):
                total += n
                if problem is not None:
                    self.cut_short[p] = (n, problem)
                if report is not None:
                    report(k + 1, len(self.paths))
        return total

    @property
    def count_is_slow(self) -> bool:
        """Whether count() reads data (compressed shards, or shards at a URL) rather than
        seeking over it."""
        return not all(p.endswith(".tar") and not remote.is_url(p) for p in self.paths)

    def __iter__(self) -> Iterator[Item]:
        for p in self.paths:
            if p not in self.cut_short:
                yield from self._iter_shard(p)
                continue
            left, problem = self.cut_short[p]
            last = "start"
            for item in self._iter_shard(p):
                if item.data is not None:
                    if left == 0:
                        yield Item(f"<after {last}>", p, None, error=f"unreadable TAR data while counting "
                                   f"({problem}); rest of shard skipped")
                        break
                    left -= 1
                last = item.key
                yield item

    def _label(self, group: dict[str, bytes]) -> tuple[Label, str | None]:
        if self.label_ext is not None:
            if self.label_ext not in group:
                return -1, f"no .{self.label_ext} member"
            return parse_label(self.label_ext, group[self.label_ext])
        for ext in LABEL_EXTENSIONS:
            if ext in group:
                return parse_label(ext, group[ext], required=ext != "json")
        return -1, None

    def _iter_shard(self, path: str) -> Iterator[Item]:
        group_key: str | None = None
        group: dict[str, bytes] = {}

        def flush() -> Iterator[Item]:
            if group_key is None:
                return
            images = [e for e in group if e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS]
            label, problem = self._label(group)
            if not images:
                yield Item(group_key, path, None, label, error="no image member in this sample")
            else:
                fields = {k: group[e] for k, e in self.field_exts.items() if e in group}
                yield Item(group_key, path, group[sorted(images)[0]], label, label_error=problem,
                           fields=fields)

        try:
            # One pass in order; member reads go straight to the file (or the URL's block cache).
            with remote.open_input(path, self.retry) as f, tarfile.open(fileobj=f, mode="r:*") as tf:
                for m in tf:
                    if not m.isfile():
                        continue
                    key, ext = _split_key(m.name)
                    if key != group_key:
                        yield from flush()
                        group_key, group = key, {}
                    f = tf.extractfile(m)
                    group[ext] = f.read() if f is not None else b""
                yield from flush()
        except (tarfile.TarError, EOFError, OSError) as e:
            yield from flush()
            yield Item(f"<after {group_key or 'start'}>", path, None,
                       error=f"unreadable TAR data ({type(e).__name__}: {e}); rest of shard skipped")


def _missing(paths: Sequence[str], retry: remote.Retry) -> list[str]:
    """The shards that do not exist: local ones by a stat, URLs by asking their size (in
    parallel: one round trip each)."""
    missing = [p for p in paths if not remote.is_url(p) and not os.path.isfile(p)]
    urls = [p for p in paths if remote.is_url(p)]

    def absent(url: str) -> bool:
        try:
            remote.size_of(url, retry)
        except (FileNotFoundError, IsADirectoryError):
            return True
        return False

    if urls:
        with ThreadPoolExecutor(min(16, len(urls)), thread_name_prefix="tbljax-stat") as ex:
            missing += [u for u, gone in zip(urls, ex.map(absent, urls)) if gone]
    return missing


def _is_image_file(p: Path) -> bool:
    return p.is_file() and p.suffix.lower().lstrip(".") in IMAGE_EXTENSIONS


def _shard_pattern(root: Path, names: list[str]) -> str:
    """How to name these TAR files as sources: a brace pattern when they are numbered in one
    run (train-000.tar ... train-009.tar), else a shell glob."""
    runs = [re.fullmatch(r"(.*?)(\d+)(\.tar(?:\.\w+)?|\.tgz)", n) for n in names]
    if all(runs) and len({(m[1], m[3], len(m[2])) for m in runs}) == 1:
        nums = [int(m[2]) for m in runs]
        if nums == list(range(nums[0], nums[0] + len(nums))):
            first, last = runs[0], runs[-1]
            return f"'{root / first[1]}{{{first[2]}..{last[2]}}}{first[3]}'"
    return f"{root}/*.tar (a shell expands it into the list of files)"


class FolderSource:
    """An image folder with one subfolder per class: the label is the subfolder's name, its id
    its place in `classes` (sorted subfolder names unless given)."""

    # Where labels come from: convert says it when no record has one.
    LABELS_FROM = "an image folder takes its labels from one subfolder per class, named after it"

    def __init__(self, root: str, classes: list[str] | None = None, fields: dict[str, str] | None = None):
        self.root = Path(root)
        # Field name -> extension of the sidecar file beside each image (a/img1.jpg + a/img1.txt).
        self.field_exts = dict(fields or {})
        self.field_kinds = {k: kind_for_extension(e) for k, e in self.field_exts.items()}
        subdirs = sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if classes is not None and subdirs:
            unknown = [d for d in subdirs if d not in set(classes)]
            if unknown:
                raise ValueError(f"image folder {root} has subfolder {unknown[0]!r}, which is not in "
                                 f"classes ({len(unknown)} such subfolders)")
        self.classes: list[str] | None = classes if classes is not None else (subdirs or None)
        if subdirs:
            self.files: list[tuple[Path, Label]] = [
                (f, name) for name in subdirs
                for f in sorted((self.root / name).rglob("*")) if _is_image_file(f)]
        else:
            self.files = [(f, -1) for f in sorted(self.root.iterdir()) if _is_image_file(f)]
        if not self.files:
            tars = sorted(f.name for f in self.root.iterdir() if f.is_file() and f.name.endswith(TAR_SUFFIXES))
            if tars:
                raise ValueError(f"image folder {root} holds no images but {len(tars)} TAR file"
                                 f"{'s' if len(tars) > 1 else ''} ({tars[0]}{', ...' if len(tars) > 1 else ''}): "
                                 f"pass the shards themselves, e.g. {_shard_pattern(self.root, tars)}")

    def select(self, i: int, n: int) -> FolderSource:
        """Shard i of n: a contiguous share of the files; classes stay those of the whole folder."""
        part = copy.copy(self)
        part.files = _share(self.files, i, n, "image files")
        return part

    def describe(self) -> list[str]:
        return [str(self.root)]

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        return len(self.files)

    count_is_slow = False

    def __iter__(self) -> Iterator[Item]:
        for f, label in self.files:
            key = str(f.relative_to(self.root))
            try:
                data = f.read_bytes()
            except OSError as e:
                yield Item(key, str(f), None, label, error=f"cannot read: {e}")
                continue
            yield Item(key, str(f), data, label, fields=self._sidecars(f))

    def _sidecars(self, f: Path) -> dict[str, bytes]:
        out = {}
        for name, ext in self.field_exts.items():
            side = f.with_name(f"{f.with_suffix('').name}.{ext}")
            try:
                out[name] = side.read_bytes()
            except FileNotFoundError:
                pass  # the conversion reports the record as missing the field
        return out


class FileListSource:
    """Explicit image files, labels given alongside (or none)."""

    LABELS_FROM = "image files take labels from labels=, one per file"

    def __init__(self, paths: Sequence[str], labels: Sequence[Label] | None, classes: list[str] | None = None):
        self.paths = [str(p) for p in paths]
        self.labels: list[Label] = list(labels) if labels is not None else [-1] * len(self.paths)
        if len(self.labels) != len(self.paths):
            raise ValueError(f"{len(self.labels)} labels given for {len(self.paths)} files")
        self.classes = classes
        self.field_kinds: dict[str, str] = {}

    def select(self, i: int, n: int) -> FileListSource:
        return FileListSource(_share(self.paths, i, n, "image files"),
                              self.labels[len(self.paths) * i // n:len(self.paths) * (i + 1) // n], self.classes)

    def describe(self) -> list[str]:
        return [f"{len(self.paths)} image files"]

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        return len(self.paths)

    count_is_slow = False

    def __iter__(self) -> Iterator[Item]:
        for p, label in zip(self.paths, self.labels):
            try:
                data = Path(p).read_bytes()
            except OSError as e:
                yield Item(p, p, None, label, error=f"cannot read: {e}")
                continue
            yield Item(p, p, data, label)


class ArraySource:
    """Decoded images in memory: an (N, H, W[, C]) uint8 array, or a sequence whose elements
    are (H, W[, C]) images or (B, H, W, C) batches, read in order."""

    LABELS_FROM = "arrays take labels from labels=, one per image"

    def __init__(self, images: Any, labels: Sequence[Label] | None, classes: list[str] | None = None,
                 _rows: list[tuple[int, int]] | None = None, fields: dict[str, Any] | None = None,
                 _first: int = 0):
        self.images = images
        # Field name -> a column of one value per image (a dict source's other keys).
        self.fields = dict(fields or {})
        self.field_kinds = {k: _column_kind(k, v) for k, v in self.fields.items()}
        self.first = _first  # this share's first row in the columns
        # Row r is images[k] (k, -1) or images[k][j] (k, j) for elements that are batches.
        self.rows = _rows if _rows is not None else _array_rows(images)
        n = len(self.rows)
        self.labels: list[Label] = list(labels) if labels is not None else [-1] * n
        if len(self.labels) != n:
            raise ValueError(f"labels must have shape ({n},) to match the {n} images, got ({len(self.labels)},)")
        self.classes = classes

    def select(self, i: int, n: int) -> ArraySource:
        rows = _share(self.rows, i, n, "images")
        mine = host_part(len(self.rows), i, n)
        lo, hi = mine.start, mine.stop
        return ArraySource(self.images, self.labels[lo:hi], self.classes, rows, self.fields,
                           self.first + lo)

    def describe(self) -> list[str]:
        return [f"<{len(self.rows)} arrays>"]

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        return len(self.rows)

    count_is_slow = False

    def __iter__(self) -> Iterator[Item]:
        for r, ((k, j), label) in enumerate(zip(self.rows, self.labels)):
            img = np.asarray(self.images[k] if j < 0 else self.images[k][j])
            err = None
            if img.dtype != np.uint8 or img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] not in (1, 3, 4)):
                err = f"array of {img.dtype} {img.shape} is not an (H, W[, 1|3|4]) uint8 image"
            fields = {name: col[self.first + r] for name, col in self.fields.items()}
            yield Item(str(r), "<array>", img, label, error=err, fields=fields)


def _column_kind(name: str, column: Any) -> str:
    """A dict source's field column: one value per image; its kind is its first value's."""
    check_name(name)
    if isinstance(column, (str, bytes)) or not hasattr(column, "__len__") or not hasattr(column, "__getitem__"):
        raise TypeError(f"field {name!r} of a dict source must hold one value per image (a list or an "
                        f"array of N rows), got {type(column).__name__}")
    if len(column) == 0:
        raise ValueError(f"field {name!r} of a dict source is empty")
    return kind_of_value(column[0])


# ---- what convert's `sources` argument may be ---------------------------------------------

IMAGE_KEYS = ("image", "images", "img")
LABEL_KEYS = ("label", "labels")
ACCEPTED_FORMS = (
    "a path or brace pattern ('train-{000..099}.tar'), a list of paths (TAR shards or image "
    "files), an image folder, a uint8 array (N, H, W, 3) or (N, H, W), a list of (H, W[, C]) "
    "images or (B, H, W, C) batches, a tuple (images, labels), or a dict "
    "{'image': images, 'label': labels} ('images'/'img', 'labels' also accepted)")


def _is_array(x: Any) -> bool:
    """numpy arrays and what converts to one without guessing (jax, torch, tf tensors)."""
    return isinstance(x, np.ndarray) or (
        hasattr(x, "__array__") and hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (str, bytes)))


def _check_batch(arr: np.ndarray, what: str) -> None:
    """A whole array of images is checked up front: one clear error, not N skipped items."""
    if arr.ndim not in (3, 4):
        raise ValueError(f"{what} must be (N, H, W, C) or (N, H, W) images, got shape {tuple(arr.shape)}")
    if arr.ndim == 4 and arr.shape[3] not in (1, 3, 4):
        hint = (f" (it looks channels-first: pass {what}.transpose(0, 2, 3, 1))"
                if arr.shape[1] in (1, 3, 4) else "")
        raise ValueError(f"{what} of shape {tuple(arr.shape)} is not channels-last (N, H, W, 1|3|4){hint}")
    if np.dtype(arr.dtype) != np.uint8:
        raise ValueError(f"{what} must be uint8 pixels 0..255, got {arr.dtype} (for floats in [0, 1]: "
                         "np.rint(x * 255).astype(np.uint8))")


def _array_rows(images: Any) -> list[tuple[int, int]]:
    if _is_array(images):
        _check_batch(images, "images")
        return [(i, -1) for i in range(len(images))]
    rows: list[tuple[int, int]] = []
    for k, x in enumerate(images):
        if not _is_array(x):
            raise TypeError(f"element {k} of the image list is {type(x).__name__}, not an array; "
                            f"sources may be {ACCEPTED_FORMS}")
        if x.ndim == 4:
            _check_batch(x, f"element {k} (a batch)")
            rows.extend((k, j) for j in range(len(x)))
        elif x.ndim in (2, 3):
            rows.append((k, -1))
        else:
            raise TypeError(f"element {k} of the image list has shape {tuple(x.shape)}: each must be an "
                            "(H, W[, C]) image or a (B, H, W, C) batch (for (images, labels) pass a tuple)")
    return rows


def _is_label_vector(x: Any) -> bool:
    if isinstance(x, (str, bytes)) or not (_is_array(x) or isinstance(x, (list, tuple))):
        return False
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError):
        return False
    return (arr.ndim == 1 or (arr.ndim == 2 and arr.shape[1] == 1)) and arr.dtype.kind in "iuUO"


def _split_images_labels(sources: Any, labels: Any) -> tuple[Any, Any] | None:
    """(images, labels) for the in-memory spellings, or None when sources are paths."""
    if isinstance(sources, Mapping):
        ik = [k for k in IMAGE_KEYS if k in sources]
        lk = [k for k in LABEL_KEYS if k in sources]
        if len(ik) != 1 or len(lk) > 1:
            raise TypeError(f"a dict of sources needs exactly one image key of {list(IMAGE_KEYS)} and at "
                            f"most one label key of {list(LABEL_KEYS)}, got keys {sorted(map(str, sources))}")
        if lk and labels is not None:
            raise ValueError(f"labels given twice: the dict's {lk[0]!r} and labels=")
        return sources[ik[0]], (sources[lk[0]] if lk else labels)
    if (isinstance(sources, tuple) and len(sources) == 2 and _is_label_vector(sources[1])
            and (_is_array(sources[0]) or (isinstance(sources[0], (list, tuple)) and sources[0]
                                           and _is_array(sources[0][0])))
            and len(sources[0]) == len(sources[1])):
        if labels is not None:
            raise ValueError("labels given twice: the (images, labels) tuple and labels=")
        return sources
    if _is_array(sources):
        return sources, labels
    if isinstance(sources, (list, tuple)) and sources and all(_is_array(x) for x in sources):
        return sources, labels
    return None


def resolve(sources: Any, labels: Sequence[Label] | None = None, classes: list[str] | None = None,
            label_ext: str | None = None, retry: remote.Retry = remote.DEFAULT_RETRY,
            fields: dict[str, str] | None = None,
            ) -> TarSource | FolderSource | FileListSource | ArraySource:
    """Turns convert's `sources` argument into a source object (see ACCEPTED_FORMS). URLs name
    TAR shards (braces expanded; glob characters matched where the filesystem can list)."""
    split = _split_images_labels(sources, labels)
    if label_ext is not None and split is not None:
        raise ValueError("label_ext is for TAR shards; arrays take labels=")
    if split is not None:
        images, labels = split
        columns = ({k: v for k, v in sources.items() if k not in IMAGE_KEYS + LABEL_KEYS}
                   if isinstance(sources, Mapping) else {})
        if fields:
            raise ValueError("fields= names TAR members or sidecar files; a dict source's keys besides "
                             "image and label are its fields (as {'image': ..., 'caption': [...]})")
        src = ArraySource(images, None, fields=columns)
        for name, col in columns.items():
            if len(col) != len(src.rows):
                raise ValueError(f"field {name!r} holds {len(col)} values for {len(src.rows)} images")
        if labels is not None:
            src.labels = _label_list(labels, len(src.rows))
        src.classes = _table_for(src.labels, classes)
        return src
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not isinstance(sources, (list, tuple)) or not all(isinstance(s, (str, os.PathLike)) for s in sources):
        raise TypeError(f"convert's sources must be {ACCEPTED_FORMS}; got {type(sources).__name__} "
                        f"{sources!r}"[:700])
    paths = [p for s in map(os.fspath, sources)
             for p in (remote.expand(s) if remote.is_url(s) else expand_braces(s))]
    if not paths:
        raise ValueError(f"convert: no sources given (or the pattern matched no file: {sources!r})"[:300])
    _refuse_duplicates(paths)
    is_tar = [remote.name_of(p).endswith(TAR_SUFFIXES) for p in paths]
    if any(map(remote.is_url, paths)) and not all(is_tar):
        other = paths[is_tar.index(False)]
        raise ValueError(f"sources at a URL must be TAR shards ({', '.join(TAR_SUFFIXES)}); {other!r} is not")
    if len(paths) == 1 and os.path.isdir(paths[0]):
        if labels is not None:
            raise ValueError("labels= is for arrays and file lists; an image folder takes labels from subfolders")
        if label_ext is not None:
            raise ValueError("label_ext is for TAR shards; an image folder takes labels from subfolders")
        return FolderSource(paths[0], classes, fields)
    if all(is_tar):
        if labels is not None:
            raise ValueError("labels= is for arrays and file lists; TAR shards carry .cls/.json labels")
        return TarSource(paths, classes, label_ext, retry, fields)
    if label_ext is not None:
        raise ValueError("label_ext is for TAR shards; image files take labels=")
    if fields:
        raise ValueError("fields= is for TAR shards (members) and image folders (sidecar files)")
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FileNotFoundError(f"source not found: {missing[0]}{more}")
    if all(Path(p).suffix.lower().lstrip(".") in IMAGE_EXTENSIONS for p in paths):
        lab = _label_list(labels, len(paths)) if labels is not None else None
        return FileListSource(paths, lab, _table_for(lab or [], classes))
    raise ValueError(f"cannot tell what kind of source {paths[0]!r} is: give TAR shards (.tar), "
                     "an image folder, image files or numpy arrays")


def _refuse_duplicates(paths: list[str]) -> None:
    """A source named twice (by the pattern, or two spellings of one file) is duplicated data."""
    seen: dict[str, str] = {}
    for p in paths:
        real = p if remote.is_url(p) else os.path.realpath(p)
        if real in seen:
            same = "" if seen[real] == p else f" (as {seen[real]!r} and {p!r})"
            raise ValueError(f"source {p!r} is named twice{same}: it would be converted twice")
        seen[real] = p

"""Where convert's images come from: WebDataset TAR shards (local, or at a URL through fsspec:
remote/remote.py), an image folder (one subfolder per class), a list of image files, or numpy
arrays. Each source yields `Item`s in a fixed order and knows an upper bound of its count
before reading (it sizes the TBL index).

Labels travel as the sources hold them: an integer id, a class name (str), or -1 when the item
has none; `tbljax.convert` turns names into ids against one classes table.
"""

from __future__ import annotations

import copy
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tbljax._src.file.fields import kind_for_extension
from tbljax._src.remote import remote
from tbljax._src.rules.braces import expand_braces
from tbljax._src.rules.contract import Arg, ArgumentError
from tbljax._src.rules.errors import shown
from tbljax._src.sources.arrays import ACCEPTED_FORMS, IMAGE_KEYS, LABEL_KEYS, ArraySource, split_images_labels
from tbljax._src.sources.items import (
    IMAGE_EXTENSIONS,
    LABEL_EXTENSIONS,
    TAR_SUFFIXES,
    Item,
    Label,
    check_declared,
    label_list,
    parse_label,
    share,
    table_for,
)

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
    LABELS_FROM = (
        "TAR shards take labels from a .cls, .cls2, .label or .json member beside each image (",
        Arg("label_ext", ...),
        " names another)",
    )

    def __init__(
        self,
        paths: Sequence[str],
        classes: list[str] | None = None,
        label_ext: str | None = None,
        retry: remote.Retry = remote.DEFAULT_RETRY,
        fields: dict[str, str] | None = None,
    ):
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
        return TarSource(
            share(self.paths, i, n, "TAR files"), self.classes, self.label_ext, self.retry, self.field_exts
        )

    def describe(self) -> list[str]:
        return self.paths

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        """An upper bound of the records (image members; skipped items take no index slot),
        shards counted in parallel (reads overlap; zlib/bz2/lzma release the GIL)."""
        total = 0
        with ThreadPoolExecutor(min(8, len(self.paths)), thread_name_prefix="tbljax-count") as ex:
            for k, (p, (n, problem)) in enumerate(
                zip(self.paths, ex.map(lambda p: _count_shard(p, self.retry), self.paths))
            ):
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
                        yield Item(
                            f"<after {last}>",
                            p,
                            None,
                            error=f"unreadable TAR data while counting ({problem}); rest of shard skipped",
                        )
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
            taken = set(self.field_exts.values())  # a field's member (mask.png) is no image
            images = [e for e in group if e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS and e not in taken]
            label, problem = self._label(group)
            if not images:
                yield Item(group_key, path, None, label, error="no image member in this sample")
            else:
                fields = {k: group[e] for k, e in self.field_exts.items() if e in group}
                yield Item(group_key, path, group[sorted(images)[0]], label, label_error=problem, fields=fields)

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
            yield Item(
                f"<after {group_key or 'start'}>",
                path,
                None,
                error=f"unreadable TAR data ({type(e).__name__}: {e}); rest of shard skipped",
            )


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
    LABELS_FROM = ("an image folder takes its labels from one subfolder per class, named after it",)

    def __init__(
        self,
        root: str,
        classes: list[str] | None = None,
        fields: dict[str, str] | None = None,
        folders: dict[str, str] | None = None,
    ):
        self.root = Path(root)
        # Field name -> extension of the sidecar file beside each image (a/img1.jpg + a/img1.txt),
        # or of the file at the image's relative path in a parallel folder (`folders`).
        self.field_exts = dict(fields or {})
        self.folders = {n: Path(f) for n, f in (folders or {}).items()}
        for name, f in self.folders.items():
            if not f.is_dir():
                raise FileNotFoundError(f"field {name!r}: folder {f} (Mask(folder=)) is not a directory")
            if f.resolve().is_relative_to(self.root.resolve()):  # its files would be listed as images
                raise ValueError(
                    f"field {name!r}: folder {f} lies inside the image folder {root}; "
                    "a parallel folder must lie outside it"
                )
        self.field_kinds = {k: kind_for_extension(e) for k, e in self.field_exts.items()}
        subdirs = sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if classes is not None and subdirs:
            unknown = [d for d in subdirs if d not in set(classes)]
            if unknown:
                raise ValueError(
                    f"image folder {root} has subfolder {unknown[0]!r}, which is not in "
                    f"classes ({len(unknown)} such subfolders)"
                )
        self.classes: list[str] | None = classes if classes is not None else (subdirs or None)
        found = (
            [(f, name) for name in subdirs for f in sorted((self.root / name).rglob("*")) if f.is_file()]
            if subdirs
            else [(f, -1) for f in sorted(self.root.iterdir()) if f.is_file()]
        )
        # A field's sidecar file (a/img1.mask.png beside a/img1.jpg) is no image.
        sidecar = {"." + e.lower() for n, e in self.field_exts.items() if n not in self.folders}
        self.files: list[tuple[Path, Label]] = [
            (f, label)
            for f, label in found
            if _is_image_file(f) and not any(f.name.lower().endswith(s) for s in sidecar if s.count(".") > 1)
        ]
        # Files left out for their extension (summary.left_out), but not a field's sidecar files
        # or hidden ones (.DS_Store).
        self.left_out: list[str] = [
            str(f.relative_to(self.root))
            for f, _ in found
            if not _is_image_file(f)
            and not f.name.startswith(".")
            and not any(f.name.lower().endswith(s) for s in sidecar)
        ]
        if not self.files:
            tars = sorted(f.name for f in self.root.iterdir() if f.is_file() and f.name.endswith(TAR_SUFFIXES))
            if tars:
                raise ValueError(
                    f"image folder {root} holds no images but {len(tars)} TAR file"
                    f"{'s' if len(tars) > 1 else ''} ({tars[0]}{', ...' if len(tars) > 1 else ''}): "
                    f"pass the shards themselves, e.g. {_shard_pattern(self.root, tars)}"
                )

    def select(self, i: int, n: int) -> FolderSource:
        """Shard i of n: a contiguous share of the files; classes stay those of the whole folder."""
        part = copy.copy(self)
        part.files = share(self.files, i, n, "image files")
        part.left_out = self.left_out if i == 0 else []  # the folder's, reported once
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
            if name in self.folders:  # the same relative path in the parallel folder
                side = self.folders[name] / side.relative_to(self.root)
            try:
                out[name] = side.read_bytes()
            except FileNotFoundError:
                pass  # the conversion reports the record as missing the field
        return out


class FileListSource:
    """Explicit image files, labels given alongside (or none)."""

    LABELS_FROM = ("image files take labels from ", Arg("labels", ...), ", one per file")

    def __init__(self, paths: Sequence[str], labels: Sequence[Label] | None, classes: list[str] | None = None):
        self.paths = [str(p) for p in paths]
        self.labels: list[Label] = list(labels) if labels is not None else [-1] * len(self.paths)
        if len(self.labels) != len(self.paths):
            raise ValueError(f"{len(self.labels)} labels given for {len(self.paths)} files")
        self.classes = classes
        self.field_kinds: dict[str, str] = {}

    def select(self, i: int, n: int) -> FileListSource:
        return FileListSource(
            share(self.paths, i, n, "image files"),
            self.labels[len(self.paths) * i // n : len(self.paths) * (i + 1) // n],
            self.classes,
        )

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


def resolve(
    sources: Any,
    labels: Sequence[Label] | None = None,
    classes: list[str] | None = None,
    label_ext: str | None = None,
    retry: remote.Retry = remote.DEFAULT_RETRY,
    fields: dict[str, str] | None = None,
    geometric: dict[str, Any] | None = None,
) -> TarSource | FolderSource | FileListSource | ArraySource:
    """Turns convert's `sources` argument into a source object (see ACCEPTED_FORMS). URLs name
    TAR shards (braces expanded; glob characters matched where the filesystem can list).
    `geometric`: fields='s geometric declarations (`items.check_declared`)."""
    geometric = dict(geometric or {})
    split = split_images_labels(sources, labels)
    if label_ext is not None and split is not None:
        raise ArgumentError(Arg("label_ext"), " is for TAR shards; arrays take ", Arg("labels", ...))
    if split is not None:
        images, labels = split
        columns = (
            {k: v for k, v in sources.items() if k not in IMAGE_KEYS + LABEL_KEYS}
            if isinstance(sources, Mapping)
            else {}
        )
        keys = check_declared(geometric, "a dict source")
        if fields or (geometric and not columns):
            raise ArgumentError(
                Arg("fields", ...),
                " names TAR members or sidecar files; a dict source's keys besides "
                "image and label are its fields (as {'image': ..., 'caption': [...]}), and "
                "fields= only says which of them are geometric ({'seg': tbljax.Mask()})",
            )
        missing = sorted(k for k in keys.values() if k not in columns)
        if missing:
            raise ValueError(
                f"fields= declares the dict source's key {missing[0]!r}, which it does not have "
                f"(its fields: {sorted(columns)})"
            )
        renamed = {k for n, k in keys.items() if k != n}  # key= read under the field's name
        columns = {**{k: v for k, v in columns.items() if k not in renamed}, **{n: columns[k] for n, k in keys.items()}}
        src = ArraySource(images, None, fields=columns)
        for name, col in columns.items():
            if len(col) != len(src.rows):
                raise ValueError(f"field {name!r} holds {len(col)} values for {len(src.rows)} images")
        if labels is not None:
            src.labels = label_list(labels, len(src.rows))
        src.classes = table_for(src.labels, classes)
        return src
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not isinstance(sources, (list, tuple)) or not all(isinstance(s, (str, os.PathLike)) for s in sources):
        raise TypeError(
            f"convert's sources must be {ACCEPTED_FORMS}; got {type(sources).__name__} {shown(repr(sources), 600)}"
        )
    paths = [p for s in map(os.fspath, sources) for p in (remote.expand(s) if remote.is_url(s) else expand_braces(s))]
    if not paths:
        raise ValueError(f"convert: no sources given (or the pattern matched no file: {shown(repr(sources))})")
    _refuse_duplicates(paths)
    is_tar = [remote.name_of(p).endswith(TAR_SUFFIXES) for p in paths]
    if any(map(remote.is_url, paths)) and not all(is_tar):
        other = paths[is_tar.index(False)]
        raise ValueError(f"sources at a URL must be TAR shards ({', '.join(TAR_SUFFIXES)}); {other!r} is not")
    if len(paths) == 1 and os.path.isdir(paths[0]):
        if labels is not None:
            raise ArgumentError(
                Arg("labels", ...), " is for arrays and file lists; an image folder takes labels from subfolders"
            )
        if label_ext is not None:
            raise ArgumentError(Arg("label_ext"), " is for TAR shards; an image folder takes labels from subfolders")
        check_declared(geometric, "an image folder")
        return FolderSource(
            paths[0], classes, fields, {n: g.folder for n, g in geometric.items() if g.folder is not None}
        )
    if all(is_tar):
        if labels is not None:
            raise ArgumentError(Arg("labels", ...), " is for arrays and file lists; TAR shards carry .cls/.json labels")
        check_declared(geometric, "TAR shards")
        return TarSource(paths, classes, label_ext, retry, fields)
    if label_ext is not None:
        raise ArgumentError(Arg("label_ext"), " is for TAR shards; image files take ", Arg("labels", ...))
    if fields or geometric:
        raise ArgumentError(Arg("fields", ...), " is for TAR shards (members) and image folders (sidecar files)")
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FileNotFoundError(f"source not found: {missing[0]}{more}")
    if all(Path(p).suffix.lower().lstrip(".") in IMAGE_EXTENSIONS for p in paths):
        lab = label_list(labels, len(paths)) if labels is not None else None
        return FileListSource(paths, lab, table_for(lab or [], classes))
    raise ValueError(
        f"cannot tell what kind of source {paths[0]!r} is: give TAR shards (.tar), "
        "an image folder, image files or numpy arrays"
    )


def _refuse_duplicates(paths: list[str]) -> None:
    """A source named twice (by the pattern, or two spellings of one file) is duplicated data."""
    seen: dict[str, str] = {}
    for p in paths:
        real = p if remote.is_url(p) else os.path.realpath(p)
        if real in seen:
            same = "" if seen[real] == p else f" (as {seen[real]!r} and {p!r})"
            raise ValueError(f"source {p!r} is named twice{same}: it would be converted twice")
        seen[real] = p

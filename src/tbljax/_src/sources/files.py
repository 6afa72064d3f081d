"""Where convert's images come from: WebDataset TAR shards (`tar_shards.py`), an image folder
(one subfolder per class), a list of image files, or numpy arrays (`arrays.py`); `resolve`
picks among them. Each source yields `Item`s in a fixed order and knows an upper bound of its
count before reading (it sizes the TBL index).

Labels travel as the sources hold them: an integer id, a class name (str), or -1 when the item
has none; `tbljax.convert` turns names into ids against one classes table.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    TAR_SUFFIXES,
    Item,
    Label,
    check_declared,
    label_list,
    share,
    table_for,
)
from tbljax._src.sources.tar_shards import TarSource


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

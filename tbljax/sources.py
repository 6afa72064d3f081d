"""Where convert's images come from: WebDataset TAR shards, an image folder (one subfolder per
class), a list of image files, or numpy arrays. Each source yields `Item`s in a fixed order
and knows an upper bound of its count before reading (it sizes the TBL index)."""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "gif"})
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


@dataclasses.dataclass
class Item:
    """One source image: encoded bytes or decoded pixels, with its key and label."""

    key: str
    source: str                  # the file it came from (a shard, an image file, "<array>")
    data: bytes | np.ndarray | None
    label: int = -1
    error: str | None = None     # set when the item is known bad before decoding


def expand_braces(pattern: str) -> list[str]:
    """Expands shell-style braces: 'train-{000..002}.tar' -> train-000.tar, ..., and '{a,b}'."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    head, tail, body = pattern[: m.start()], pattern[m.end():], m.group(1)
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        a, b = rng.groups()
        width = len(a) if a.startswith("0") or len(a) == len(b) else 0
        lo, hi = int(a), int(b)
        step = 1 if hi >= lo else -1
        choices = [str(v).zfill(width) for v in range(lo, hi + step, step)]
    else:
        choices = body.split(",")
    return [p for c in choices for p in expand_braces(head + c + tail)]


def parse_shard(shard: tuple[int, int] | str) -> tuple[int, int]:
    """'i/n' or (i, n) -> (i, n), checked: 0 <= i < n."""
    if isinstance(shard, str):
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError:
            raise ValueError(f"shard must look like 'i/n' (e.g. '3/16'), got {shard!r}") from None
    else:
        i, n = shard
    if not (isinstance(i, int) and isinstance(n, int) and 0 <= i < n):
        raise ValueError(f"shard i/n needs 0 <= i < n, got {i}/{n}")
    return i, n


def _share(seq: Sequence[Any], i: int, n: int) -> list[Any]:
    """The i-th of n contiguous, near-equal shares of seq (shares in order concatenate to seq)."""
    return list(seq[len(seq) * i // n:len(seq) * (i + 1) // n])


def _split_key(name: str) -> tuple[str, str]:
    # WebDataset: the key is the path up to the first dot of the file name.
    d, base = os.path.split(name)
    stem, _, ext = base.partition(".")
    return (f"{d}/{stem}" if d else stem), ext.lower()


LABEL_EXTENSIONS = ("cls", "cls2", "label", "json")


def _label_from(ext: str, payload: bytes) -> int | None:
    if ext not in LABEL_EXTENSIONS:
        return None  # never decode an image's bytes as text: that once cost more than the JPEG decode
    text = payload.decode("utf-8", "replace").strip()
    if ext != "json":
        try:
            return int(text)
        except ValueError:
            return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if isinstance(obj, int):
        return obj
    if isinstance(obj, dict):
        for name in ("label", "cls", "class"):
            if isinstance(obj.get(name), int):
                return obj[name]
    return None


class TarSource:
    """WebDataset shards: members grouped by key; `.cls`/`.json` give the label."""

    def __init__(self, paths: Sequence[str]):
        self.paths = list(paths)
        for p in self.paths:
            if not os.path.isfile(p):
                raise FileNotFoundError(f"TAR shard not found: {p}")
        self.classes: list[str] | None = None

    def select(self, i: int, n: int) -> TarSource:
        """Shard i of n: a contiguous share of whole TAR files."""
        return TarSource(_share(self.paths, i, n))

    def describe(self) -> list[str]:
        return self.paths

    def count(self) -> int:
        # Image members bound the records written; skipped items take no index slot.
        n = 0
        for p in self.paths:
            try:
                with tarfile.open(p, "r:*") as tf:
                    for m in tf:
                        n += m.isfile() and _split_key(m.name)[1].rsplit(".", 1)[-1] in IMAGE_EXTENSIONS
            except (tarfile.TarError, EOFError, OSError):
                pass  # a damaged shard: its readable members were counted; the error is reported later
        return n

    def __iter__(self) -> Iterator[Item]:
        for p in self.paths:
            yield from self._iter_shard(p)

    def _iter_shard(self, path: str) -> Iterator[Item]:
        group_key: str | None = None
        group: dict[str, bytes] = {}

        def flush() -> Iterator[Item]:
            if group_key is None:
                return
            images = [e for e in group if e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS]
            label = -1
            for ext, payload in group.items():
                lab = _label_from(ext, payload)
                if lab is not None:
                    label = lab
                    break
            if not images:
                yield Item(group_key, path, None, label, error="no image member in this sample")
            else:
                yield Item(group_key, path, group[sorted(images)[0]], label)

        try:
            with tarfile.open(path, "r:*") as tf:  # one pass in order; member reads go straight to the file
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


def _is_image_file(p: Path) -> bool:
    return p.is_file() and p.suffix.lower().lstrip(".") in IMAGE_EXTENSIONS


class FolderSource:
    """An image folder with one subfolder per class (sorted names give labels 0..C-1)."""

    def __init__(self, root: str):
        self.root = Path(root)
        subdirs = sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("."))
        self.classes: list[str] | None = subdirs or None
        if subdirs:
            self.files = [(f, c) for c, name in enumerate(subdirs)
                          for f in sorted((self.root / name).rglob("*")) if _is_image_file(f)]
        else:
            self.files = [(f, -1) for f in sorted(self.root.iterdir()) if _is_image_file(f)]

    def select(self, i: int, n: int) -> FolderSource:
        """Shard i of n: a contiguous share of the files; classes stay those of the whole folder."""
        part = copy.copy(self)
        part.files = _share(self.files, i, n)
        return part

    def describe(self) -> list[str]:
        return [str(self.root)]

    def count(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[Item]:
        for f, label in self.files:
            key = str(f.relative_to(self.root))
            try:
                data = f.read_bytes()
            except OSError as e:
                yield Item(key, str(f), None, label, error=f"cannot read: {e}")
                continue
            yield Item(key, str(f), data, label)


class FileListSource:
    """Explicit image files, labels given alongside (or none)."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int] | None):
        self.paths = [str(p) for p in paths]
        self.labels = list(labels) if labels is not None else [-1] * len(self.paths)
        if len(self.labels) != len(self.paths):
            raise ValueError(f"{len(self.labels)} labels given for {len(self.paths)} files")
        self.classes: list[str] | None = None

    def select(self, i: int, n: int) -> FileListSource:
        return FileListSource(_share(self.paths, i, n), _share(self.labels, i, n))

    def describe(self) -> list[str]:
        return [f"{len(self.paths)} image files"]

    def count(self) -> int:
        return len(self.paths)

    def __iter__(self) -> Iterator[Item]:
        for p, label in zip(self.paths, self.labels):
            try:
                data = Path(p).read_bytes()
            except OSError as e:
                yield Item(p, p, None, int(label), error=f"cannot read: {e}")
                continue
            yield Item(p, p, data, int(label))


class ArraySource:
    """Decoded images in memory: an (N, H, W, 3) or (N, H, W) uint8 array, or a list of them."""

    def __init__(self, images: Any, labels: Sequence[int] | None):
        self.images = images
        n = len(images)
        self.labels = np.asarray(labels, np.int64) if labels is not None else np.full(n, -1, np.int64)
        if self.labels.shape != (n,):
            raise ValueError(f"labels must have shape ({n},) to match the images, got {self.labels.shape}")
        self.classes: list[str] | None = None

    def select(self, i: int, n: int) -> ArraySource:
        lo, hi = len(self.images) * i // n, len(self.images) * (i + 1) // n
        return ArraySource(self.images[lo:hi], self.labels[lo:hi])

    def describe(self) -> list[str]:
        return [f"<{len(self.images)} arrays>"]

    def count(self) -> int:
        return len(self.images)

    def __iter__(self) -> Iterator[Item]:
        for i in range(len(self.images)):
            img = np.asarray(self.images[i])
            err = None
            if img.dtype != np.uint8 or img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] not in (1, 3, 4)):
                err = f"array of {img.dtype} {img.shape} is not an (H, W[, 1|3|4]) uint8 image"
            yield Item(str(i), "<array>", img, int(self.labels[i]), error=err)


def resolve(sources: Any, labels: Sequence[int] | None = None) -> TarSource | FolderSource | FileListSource | ArraySource:
    """Turns convert's `sources` argument into a source object."""
    if isinstance(sources, np.ndarray) or (
        isinstance(sources, (list, tuple)) and sources and isinstance(sources[0], np.ndarray)
    ):
        return ArraySource(sources, labels)
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not isinstance(sources, (list, tuple)) or not all(isinstance(s, (str, os.PathLike)) for s in sources):
        raise TypeError("convert's sources must be a path, a brace pattern, a list of paths or numpy "
                        f"arrays, got {type(sources).__name__} {sources!r}"[:300])
    paths = [p for s in sources for p in expand_braces(os.fspath(s))]
    if not paths:
        raise ValueError("convert: no sources given")
    if len(paths) == 1 and os.path.isdir(paths[0]):
        if labels is not None:
            raise ValueError("labels= is for arrays and file lists; an image folder takes labels from subfolders")
        return FolderSource(paths[0])
    if all(p.endswith(TAR_SUFFIXES) for p in paths):
        if labels is not None:
            raise ValueError("labels= is for arrays and file lists; TAR shards carry .cls/.json labels")
        return TarSource(paths)
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"source not found: {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if all(Path(p).suffix.lower().lstrip(".") in IMAGE_EXTENSIONS for p in paths):
        return FileListSource(paths, labels)
    raise ValueError(f"cannot tell what kind of source {paths[0]!r} is: give TAR shards (.tar), "
                     "an image folder, image files or numpy arrays")

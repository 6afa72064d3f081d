"""WebDataset TAR shards as a conversion source (local, or at a URL through fsspec:
remote/remote.py): members grouped by key, the label from a `.cls`/`.json` member (or
`label_ext`), fields from other members; shards counted in parallel, a shard cut short while
counting read as far as it was counted. `files.resolve` chooses this source.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from tbljax._src.file.fields import kind_for_extension
from tbljax._src.remote import remote
from tbljax._src.rules.contract import Arg
from tbljax._src.sources.items import IMAGE_EXTENSIONS, LABEL_EXTENSIONS, Item, Label, parse_label, share

__all__ = ["TarSource"]


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

"""Files at a URL (gs://, s3://, http(s)://, file://, memory://, any fsspec
protocol) opened through fsspec, read by a reader that survives dropped connections.

`RetryingReader` is a seekable binary file over one URL. When a read fails with a transient
error (a dropped connection, a timeout, a 5xx answer) it waits, re-opens the file, seeks to the
byte where the read broke and goes on, so the bytes it hands out are exactly the file's, none
twice and none missing. Waits grow exponentially (`Retry`); after `Retry.attempts` failures in a
row with no byte read between them it raises `RemoteReadError` naming the URL and the byte.
Reads go through fsspec's block cache, so memory is bounded by the block size, never the file's.
"""

from __future__ import annotations

import dataclasses
import glob as _glob
import io
import os
import re
import time
from typing import Any
from urllib.parse import urlsplit

from tbljax._src.rules.braces import expand_braces
from tbljax._src.rules.contract import is_integer, is_real
from tbljax._src.rules.errors import Arg, ArgumentError, RemoteReadError

__all__ = [
    "DEFAULT_RETRY",
    "EXTRAS",
    "RemoteReadError",
    "Retry",
    "RetryingReader",
    "expand",
    "filesystem",
    "is_url",
    "name_of",
    "open_input",
    "size_of",
]

# The tbljax extra that installs each protocol's fsspec backend.
EXTRAS = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "s3a": "s3", "http": "http", "https": "http"}
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclasses.dataclass(frozen=True)
class Retry:
    """How a remote read retries: up to `attempts` failures in a row (no byte read between
    them), waiting `backoff` seconds before the first retry and doubling up to `max_backoff`."""

    attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if not is_integer(self.attempts) or self.attempts < 0:
            raise ArgumentError(Arg("retries"), f" must be an integer >= 0, got {self.attempts!r}")
        for field, name in (("backoff", "retry_backoff"), ("max_backoff", "max_backoff")):  # as callers name them
            v = getattr(self, field)
            if not is_real(v) or not v >= 0:
                raise ArgumentError(Arg(name), f" must be a number of seconds >= 0, got {v!r}")

    def wait(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failure in a row (1-based)."""
        return min(self.max_backoff, self.backoff * 2 ** (failures - 1))


DEFAULT_RETRY = Retry()


def is_url(path: Any) -> bool:
    """Whether `path` names a file through a protocol (`scheme://...`), not a local path."""
    return isinstance(path, str) and _URL.match(path) is not None


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for a URL; a missing backend is an ImportError that
    names the tbljax extra (or the package) to install."""
    try:
        import fsspec.core
    except ImportError:  # a core dependency; only a broken install lacks it
        raise ImportError(f"reading {url} needs fsspec: pip install fsspec") from None
    protocol = url.split("://", 1)[0].lower()
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        extra = EXTRAS.get(protocol)
        how = f"pip install 'tbljax[{extra}]'" if extra else f"install the fsspec backend for {protocol}://"
        raise ImportError(
            f"reading {protocol}:// URLs ({url}) needs a package that is not installed: {how} ({e})"
        ) from None
    except ValueError as e:  # an unknown protocol
        raise ValueError(f"{url}: {e}") from None


def expand(pattern: str) -> list[str]:
    """The files a pattern names: braces expanded as bash does, then glob characters (`*`, `?`,
    `[`) matched against the filesystem's listing, sorted (for URLs, where the filesystem can
    list: gs://, s3://, file://, memory://, and http(s):// pages that link their files). A
    brace-only pattern names files without checking that they exist."""
    out: list[str] = []
    for word in expand_braces(pattern):
        if not _GLOB_CHARS.search(_path_part(word)):
            out.append(word)
        elif is_url(word):
            fs, path = filesystem(word)
            try:
                found = fs.glob(path)
            except NotImplementedError:
                raise ValueError(
                    f"{word}: this filesystem cannot list files, so glob patterns do not "
                    "work on it; name the files with braces, e.g. train-{0000..0099}.tar"
                ) from None
            out.extend(sorted(f if is_url(f) else fs.unstrip_protocol(f) for f in found))
        else:
            out.extend(sorted(_glob.glob(word)))
    return out


def _path_part(word: str) -> str:
    """The part of a path or URL that may hold a glob (not a URL's query string)."""
    return urlsplit(word).path if is_url(word) else word


def name_of(path: str) -> str:
    """The file name a path or URL ends with (without a URL's query string)."""
    return os.path.basename(_path_part(path).rstrip("/"))


def _permanent(e: BaseException) -> bool:
    """Errors that another try cannot fix: a missing file, no permission, a bad request or a
    server without range support (fsspec raises ValueError for it)."""
    if isinstance(
        e,
        (
            FileNotFoundError,
            PermissionError,
            IsADirectoryError,
            NotADirectoryError,
            ValueError,
            TypeError,
            ImportError,
            NotImplementedError,
        ),
    ):
        return True
    status = getattr(e, "status", None)  # aiohttp's ClientResponseError carries the HTTP status
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)


def _call(what: str, url: str, retry: Retry, fn: Any) -> Any:
    """fn() retried on transient errors as `retry` says; RemoteReadError when they persist."""
    failures = 0
    while True:
        try:
            return fn()
        except Exception as e:
            if _permanent(e):
                raise
            failures += 1
            if failures > retry.attempts:
                raise RemoteReadError(
                    f"{url}: {what} failed {failures} times in a row; last error {type(e).__name__}: {e}"
                ) from e
            time.sleep(retry.wait(failures))


def size_of(url: str, retry: Retry = DEFAULT_RETRY) -> int:
    """The size in bytes of the file at `url` (FileNotFoundError names it when missing)."""
    fs, path = filesystem(url)
    info = _call("asking its size", url, retry, lambda: fs.info(path))
    if info.get("type") == "directory":
        raise IsADirectoryError(f"{url} is a directory, not a file")
    if info.get("size") is None:
        raise ValueError(f"{url}: the server does not say the file's size")
    return int(info["size"])


class RetryingReader(io.RawIOBase):
    """A seekable binary file over one URL that re-opens and resumes where a read broke.

    cache_type/block_size go to fsspec's open: 'readahead' (default) suits streaming a TAR;
    'none' makes each read one ranged request of its size (copying in large chunks)."""

    def __init__(
        self, url: str, retry: Retry = DEFAULT_RETRY, *, cache_type: str = "readahead", block_size: int | None = None
    ):
        super().__init__()
        self.url, self.retry = url, retry
        self._fs, self._path = filesystem(url)
        self._options = {"cache_type": cache_type} | ({"block_size": block_size} if block_size else {})
        self._pos = 0
        self._file: Any = None
        self._size: int | None = None
        # Once retries are spent the reader stays failed: a caller that catches the error and
        # reads on (tarfile trying one compression after another does) gets it again.
        self._failed: RemoteReadError | None = None
        self._open_at(0)

    def _open_at(self, pos: int) -> None:
        def reopen() -> Any:
            f = self._fs.open(self._path, "rb", **self._options)
            if pos:
                f.seek(pos)
            return f

        self._drop()
        self._file = _call(f"opening at byte {pos}", self.url, self.retry, reopen)

    def _drop(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except Exception:  # a broken connection may fail to close too; it is being replaced
                pass
            self._file = None

    @property
    def size(self) -> int:
        if self._size is None:
            self._size = int(getattr(self._file, "size", None) or size_of(self.url, self.retry))
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self._failed is not None:
            raise self._failed
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: None}[whence]
        pos = offset + (self.size if base is None else base)
        if pos < 0:
            raise ValueError(f"{self.url}: seek to negative position {pos}")
        self._file.seek(pos)
        self._pos = pos
        return pos

    def readinto(self, buffer: Any) -> int:
        """Fills `buffer` fully, or up to the end of the file, retrying as `retry` says."""
        if self._failed is not None:
            raise self._failed
        view = memoryview(buffer).cast("B")
        done, failures = 0, 0
        while done < len(view):
            try:
                chunk = self._file.read(len(view) - done)
            except Exception as e:
                if _permanent(e):
                    raise
                failures += 1
                if failures > self.retry.attempts:
                    self._failed = RemoteReadError(
                        f"{self.url}: reading at byte {self._pos} failed {failures} times in a row "
                        f"with no byte read; last error {type(e).__name__}: {e}"
                    )
                    raise self._failed from e
                time.sleep(self.retry.wait(failures))
                try:
                    self._open_at(self._pos)
                except RemoteReadError as e:
                    self._failed = e
                    raise
                continue
            if not chunk:
                break
            view[done : done + len(chunk)] = chunk
            done += len(chunk)
            self._pos += len(chunk)
            failures = 0
        return done

    def close(self) -> None:
        self._drop()
        super().close()


def open_input(path: str, retry: Retry = DEFAULT_RETRY, **options: Any) -> Any:
    """A binary file to read: a local path opened directly, a URL through `RetryingReader`
    (`options` go to it). file:// URLs are local files."""
    if is_url(path):
        if path.lower().startswith("file://"):
            return open(filesystem(path)[1], "rb")  # noqa: SIM115 - the caller closes it
        return RetryingReader(path, retry, **options)
    return open(path, "rb")  # noqa: SIM115 - the caller closes it

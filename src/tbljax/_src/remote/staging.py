"""`stage` copies TBL shard files from a URL (or a local path) to a local cache
directory, this process's part only when asked, each file verified and published atomically.

A file is copied to a hidden partial name in the cache (`.NAME.partial`, locked while a copy
writes it), verified (same size as the source; it opens with `tbljax.open`, so header CRC,
index and metadata are sound; every record's CRC passes `Dataset.verify`), synced, and renamed
to its final name. So a copy killed at any moment leaves no half file under a final name, and
a rerun picks up where it stopped:

- a file already at its final name with the source's size that opens (header CRC-32, index
  bounds, metadata: what `tbljax.open` checks; record CRCs are not re-read) is kept as it is;
  one that fails that check is copied again;
- a partial copy is continued from its end when it is shorter than the source and its last
  64 KiB equal the source's bytes at the same offsets; otherwise it is started over. The full
  verification after the copy catches any other difference, and then the file is copied once
  more from the start.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tbljax import _core
from tbljax._src.datasets.reader import open as open_dataset
from tbljax._src.jax.collectives import host_part
from tbljax._src.remote import remote
from tbljax._src.rules.contract import Arg, ArgumentError, is_integer
from tbljax._src.rules.partition import parse_part

__all__ = ["COPY_CHUNK", "parse_partition", "parse_size", "stage"]

COPY_CHUNK = 4 << 20  # bytes per ranged read while copying: memory per download, not per file
_TAIL = 64 << 10  # bytes of a partial copy compared with the source before continuing it
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def parse_size(text: str | int) -> int:
    """Bytes from a size such as '500G', '1.5TiB', '200MB' or '4096' (K, M, G, T, P and KiB..
    are powers of 1024, KB, MB.. powers of 1000, as in GNU coreutils)."""
    if is_integer(text):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGTP]?)(i?B?)\s*", str(text), re.IGNORECASE)
        if not m:
            raise ValueError(f"a size must look like 4096, 500M, 1.5G or 2TiB, got {text!r}")
        unit = m[2].upper()
        scale = 1000 ** "KMGTP".index(unit) * 1000 if unit and m[3].upper() == "B" else _UNITS[unit]
        value = int(float(m[1]) * scale)
    if value < 0:
        raise ValueError(f"a size must be >= 0 bytes, got {text!r}")
    return value


def parse_partition(partition: Any, count: int) -> range:
    """The files (indices among `count`) of a partition: None (all), 'host' (this JAX process's
    part, `partition.host_part`), (i, n) or 'i/n' (part i of n by the same rule).

    'host' needs `jax.distributed` initialized: asking an uninitialized JAX for the process
    index would start a one-process backend (the part would be every file) and make a later
    `jax.distributed.initialize()` fail."""
    if partition is None:
        return range(count)
    if partition == "host":
        import jax

        if not jax.distributed.is_initialized():
            raise ArgumentError(
                Arg("partition", "host"),
                " stages this process's part of a multi-process "
                "JAX job, but jax.distributed is not initialized in this process: call "
                "jax.distributed.initialize() before tbljax.stage (no arguments needed "
                "on Slurm, TPU pods and Open MPI), or give the part as (i, n) or 'i/n'",
            )
        return host_part(count)
    i, n = parse_part(partition, "partition", forms="None, 'host', (i, n) or 'i/n'")
    return host_part(count, i, n)


def _sources(url_or_pattern: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    patterns = [url_or_pattern] if isinstance(url_or_pattern, (str, os.PathLike)) else list(url_or_pattern)
    files = [f for p in map(os.fspath, patterns) for f in remote.expand(p)]
    if not files:
        raise FileNotFoundError(f"tbljax.stage: no file matches {url_or_pattern!r}")
    names: dict[str, str] = {}
    for f in files:
        name = remote.name_of(f)
        if not name or name.startswith("."):
            raise ValueError(f"tbljax.stage: {f!r} does not end with a file name to stage it under")
        if name in names:
            raise ValueError(f"tbljax.stage: {names[name]!r} and {f!r} would both be staged as {name!r}")
        names[name] = f
    return files


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _partial(cache_dir: str, name: str) -> str:
    return os.path.join(cache_dir, f".{name}.partial")


def _intact(path: str, size: int) -> bool:
    """The quick check of a staged file: the source's size, and it opens (header CRC, index)."""
    try:
        if os.path.getsize(path) != size:
            return False
        open_dataset(path)
    except (OSError, ValueError):  # CorruptFileError is a ValueError
        return False
    return True


def _resumable(src: str, partial: str, size: int, retry: remote.Retry) -> int:
    """Bytes of `partial` to keep: all when they end like the source's same bytes, else 0."""
    try:
        have = os.path.getsize(partial)
    except FileNotFoundError:
        return 0
    if not 0 < have < size:
        return 0
    start = max(0, have - _TAIL)
    with open(partial, "rb") as f:
        f.seek(start)
        mine = f.read()
    with remote.open_input(src, retry, cache_type="none") as f:
        f.seek(start)
        theirs = f.read(have - start)
    return have if mine == theirs else 0


def _fill(src: str, out: Any, start: int, size: int, retry: remote.Retry) -> None:
    """Writes the source's bytes [start, size) at `start` of the open partial file."""
    out.truncate(start)
    out.seek(start)
    with remote.open_input(src, retry, cache_type="none") as f:
        f.seek(start)
        while start < size:
            chunk = f.read(min(COPY_CHUNK, size - start))
            if not chunk:
                break
            out.write(chunk)
            out.flush()  # a kill keeps what was written: the rerun continues from it
            start += len(chunk)
    os.fsync(out.fileno())


def _copy(src: str, dst: str, size: int, retry: remote.Retry) -> None:
    """src -> cache path dst through its partial name: resumed, verified, synced, renamed."""
    partial = _partial(os.path.dirname(dst), os.path.basename(dst))
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+b") as out:
        try:
            fcntl.flock(out, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(errno.EBUSY, f"tbljax.stage: another process is copying {src} to {partial}") from None
        kept = _resumable(src, partial, size, retry)
        _fill(src, out, kept, size, retry)
        problem = _check_copy(src, partial, size)
        if problem and kept:  # the kept bytes were stale after all: once more, whole
            _fill(src, out, 0, size, retry)
            problem = _check_copy(src, partial, size)
        if problem:
            os.unlink(partial)
            raise _core.CorruptFileError(problem)
        os.replace(partial, dst)  # under the lock: no other copy can write the partial meanwhile
    dir_fd = os.open(os.path.dirname(dst), os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def _check_copy(src: str, partial: str, size: int) -> str | None:
    """Why a finished copy is not sound (None when it is): size, open, every record's CRC."""
    got = os.path.getsize(partial)
    if got != size:
        return f"copy of {src} has {got} bytes, the source {size} (the source changed while copying?)"
    try:
        bad = open_dataset(partial).verify()
    except (OSError, ValueError) as e:
        return f"copy of {src} is not a sound TBL file: {e}"
    if bad:
        return f"copy of {src} fails verification ({len(bad)} records), first record {bad[0][1]}: {bad[0][2]}"
    return None


def _check_room(part: list[tuple[str, str, int]], need: int, cache_dir: str, budget: int | None, where: str) -> None:
    total = sum(size for _, _, size in part)
    if budget is not None and total > budget:
        raise ValueError(
            f"tbljax.stage: {where} is {len(part)} files of {_human(total)} ({total} bytes), "
            f"more than the budget of {_human(budget)} ({budget} bytes)"
        )
    free = shutil.disk_usage(cache_dir).free
    if need > free:
        raise OSError(
            errno.ENOSPC,
            f"tbljax.stage: {where} needs {_human(need)} ({need} bytes) more in "
            f"{cache_dir}, whose disk has {_human(free)} ({free} bytes) free",
        )


def stage(
    url_or_pattern: str | os.PathLike | Sequence[str | os.PathLike],
    cache_dir: str | os.PathLike,
    *,
    partition: None | str | tuple[int, int] = None,
    budget_bytes: int | str | None = None,
    retries: int = 5,
    retry_backoff: float = 0.5,
    workers: int = 4,
) -> list[str]:
    """Copies TBL shard files to `cache_dir`, verified, and returns the local paths of all of them.

    url_or_pattern: a URL or local path, a brace pattern ('gs://b/train-{0000..1023}.tbl'), a
      glob where the filesystem can list ('s3://b/train-*.tbl'), or a list of these. The files,
      in this order, are the dataset's global order; their names must differ.
    partition: None copies every file; 'host' only this JAX process's part
      (`tbljax.host_part(len(files))`: jax.process_index() of jax.process_count();
      call `jax.distributed.initialize()` first, else ValueError); (i, n) or 'i/n' part i of
      n by the same rule (e.g. ``(int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]))``).
    budget_bytes: the most the part may take in the cache (an int, or '500G'); a part larger
      than it, or than the free space of the cache's disk, is refused before copying anything.
    retries, retry_backoff: as for `tbljax.convert`: a dropped connection is re-opened and
      resumed at the byte where it broke.
    workers: files copied at once.

    Returns the local path of *every* file of the pattern, in the global order; when
    partitioned, only this process's part is on disk. The host-local loader
    (`tbljax.loader(paths, partition="host")`) opens only its part by the same rule, so the
    same list serves every host.

    >>> paths = tbljax.stage("gs://bucket/train-{0000..0063}.tbl", "/local/cache", partition="host")
    >>> loader = tbljax.loader(paths, batch_size=1024, partition="host")
    """
    retry = remote.Retry(retries, retry_backoff)
    if not is_integer(workers) or not 1 <= workers <= 256:
        raise ArgumentError(Arg("workers"), f" must be an integer in [1, 256], got {workers!r}")
    budget = None if budget_bytes is None else parse_size(budget_bytes)
    cache_dir = os.fspath(cache_dir)
    files = _sources(url_or_pattern)
    mine = parse_partition(partition, len(files))
    os.makedirs(cache_dir, exist_ok=True)
    local = [os.path.join(cache_dir, remote.name_of(f)) for f in files]
    with ThreadPoolExecutor(min(16, max(1, len(mine))), thread_name_prefix="tbljax-stat") as ex:
        sizes = list(ex.map(lambda k: remote.size_of(files[k], retry), mine))
    part = [(files[k], local[k], size) for k, size in zip(mine, sizes)]
    todo = [(src, dst, size) for src, dst, size in part if not _intact(dst, size)]
    need = sum(size - _partial_size(dst) for _, dst, size in todo)
    where = (
        "the whole dataset"
        if partition is None
        else f"part {partition!r} (files {mine.start}..{mine.stop - 1} of {len(files)})"
    )
    _check_room(part, need, cache_dir, budget, where)

    with ThreadPoolExecutor(workers, thread_name_prefix="tbljax-stage") as ex:
        list(ex.map(lambda job: _copy(*job, retry), todo))
    return local


def _partial_size(dst: str) -> int:
    try:
        return os.path.getsize(_partial(os.path.dirname(dst), os.path.basename(dst)))
    except FileNotFoundError:
        return 0

"""A cold source read into the page cache in the background, front to back, in large requests.

An epoch in a random order asks the disk for each record alone (`RecordSource.read_ahead`):
one page-cache insert and one block request per record. On compact records of ~9 KB that
cost 8.5 us of kernel CPU a record (posix_fadvise WILLNEED, measured), 0.96 s of a 1 GB
epoch, on the cores that decode. The same gigabyte asked for front to back, 128 KiB a call,
took 0.18 s of CPU and was in the page cache in 0.5 s (benchmarks/README.md, "Cold epochs").
So when an epoch finds its records cold and they fit in memory, `FileSweep` asks for all of
them this way, in a thread of its own; the per-step read-ahead goes on meanwhile, so the
first steps do not wait for the sweep.

Only the speed depends on this: the kernel reads the records from the mappings either way.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from tbljax._src.engine import memory

__all__ = ["FileSweep", "byte_runs", "memory_for_sweeps", "source_runs"]

# One request's size: WILLNEED reads at most the device's read-ahead window per call (Linux's
# default window is 128 KiB; a larger request is cut to it, silently), so the sweep asks for
# no more than that at a time.
CHUNK = 128 << 10
# Records closer than this are swept as one run (the bytes between them are read too).
MERGE_GAP = 1 << 20
# How long a pass that ends waits for its sweep to stop (it stops within one request, or
# once it has worked out its runs: 14 ms for 112,581 records).
JOIN_S = 10.0


def byte_runs(files, offsets, sizes, gap: int = MERGE_GAP) -> list[tuple[int, int, int]]:
    """(file number, first byte, end byte) runs covering the byte ranges of some records
    (`Dataset.byte_ranges`), sorted, each run's ranges at most `gap` bytes apart."""
    files, offsets = np.asarray(files, np.int64), np.asarray(offsets, np.int64)
    ends = offsets + np.asarray(sizes, np.int64)
    runs: list[tuple[int, int, int]] = []
    for k in np.unique(files).tolist():
        mine = files == k
        o, e = offsets[mine], ends[mine]
        by = np.argsort(o, kind="stable")
        o, e = o[by], np.maximum.accumulate(e[by])
        # A new run where a record starts more than `gap` past every byte before it.
        new = np.flatnonzero(o[1:] > e[:-1] + gap) + 1
        starts, stops = np.concatenate([[0], new]), np.concatenate([new, [len(o)]])
        runs += [(k, int(o[a]), int(e[b - 1])) for a, b in zip(starts.tolist(), stops.tolist())]
    return runs


def memory_for_sweeps() -> int | None:
    """Bytes a sweep may fill: half of what this process may fill (`engine/memory.py`: the
    cgroup's limit counted); None where that is unknown (not Linux)."""
    avail = memory.available_bytes()
    return None if avail is None else avail // 2


def source_runs(byte_ranges, n: int, block: int = 1 << 20) -> list[tuple[int, int, int]]:
    """`byte_runs` of records 0..n-1, where ``byte_ranges(indices)`` gives their (file, offset,
    size) (`Dataset.byte_ranges`); `block` records at a time, so memory stays bounded."""
    runs = np.array(
        [
            r
            for a in range(0, n, block)
            for r in byte_runs(*byte_ranges(np.arange(a, min(n, a + block), dtype=np.int64)))
        ],
        np.int64,
    ).reshape(-1, 3)
    # Once more over the blocks' runs: runs of neighbouring blocks may touch.
    return byte_runs(runs[:, 0], runs[:, 1], runs[:, 2] - runs[:, 1])


class FileSweep:
    """Asks the disk for records 0..n-1 of a source (``byte_ranges``: `Dataset.byte_ranges`)
    in files `paths`, front to back, CHUNK bytes a call, in a daemon thread, if their bytes
    (`source_runs`) are at most `budget`; `stop()` ends it early. The thread works out the runs
    itself (14 ms for 112,581 records here), so the draw stage that starts it does not wait. It holds
    the dataset's `byte_ranges` and the paths, never a loader (dropping the loader stops the
    pass, which stops the sweep). A file that cannot be opened is skipped: only the speed
    depends on the sweep. ``bytes``: what it asked for (0 until the runs are known, and when
    over the budget)."""

    def __init__(self, paths, byte_ranges, n: int, budget: int):
        self._stop = threading.Event()
        self.bytes = 0
        self._thread = threading.Thread(
            target=self._run, args=(list(paths), byte_ranges, n, budget), name="tbljax-file-sweep", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Waits for the sweep to end; True if it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self, paths, byte_ranges, n, budget) -> None:
        try:
            runs = source_runs(byte_ranges, n)
        except Exception:  # noqa: BLE001 - e.g. a dataset closed meanwhile: the loader reports
            return  # its own errors; a sweep only ever changes the speed
        total = sum(end - start for _, start, end in runs)
        if total <= budget and not self._stop.is_set():
            self.bytes = total
            _sweep(paths, runs, self._stop)


def _sweep(paths, runs, stop: threading.Event) -> None:
    fds: dict[int, int] = {}
    try:
        for k, start, end in runs:
            if k not in fds:
                try:
                    fds[k] = os.open(paths[k], os.O_RDONLY)
                except OSError:
                    fds[k] = -1
            if fds[k] < 0:
                continue
            for at in range(start, end, CHUNK):
                if stop.is_set():
                    return
                os.posix_fadvise(fds[k], at, min(CHUNK, end - at), os.POSIX_FADV_WILLNEED)
    except OSError:
        pass  # a file replaced or gone: the kernel's reads report it, not the sweep
    finally:
        for fd in fds.values():
            if fd >= 0:
                os.close(fd)

"""The ring of host buffers batches are built in: 4 KiB-aligned memory (`aligned_empty`), a
`Slot` per batch laid out by this process's row ranges (`rows.RowLayout`), and the `Ring` that
hands slots out round-robin and never overwrites one still read. Framework-free: the JAX room
(`jax/arrays.py`) turns a slot's views into global `jax.Array`s without copying on CPU.

Lifetime contract. On CPU, `jax.device_put` of a 64-byte-aligned NumPy array does not copy: the
jax.Array reads the ring's memory, and XLA keeps a reference to the NumPy array for as long as
any buffer aliases it (the jax.Array, arrays derived from it, `np.asarray` views of it, a
computation still running on it). On GPU/TPU the same reference is held until the host-to-device
copy has finished. So a slot is free exactly when nothing but the ring refers to its memory:
`Slot.in_use` checks the reference count of the slot's memory, and `Ring.acquire` never hands
out a slot in use; instead it retires it (its memory lives on, owned by whoever still views it)
and allocates a fresh one. A user who keeps every batch therefore keeps correct batches (and
the memory they hold); one who drops them recycles a fixed set of buffers.
"""

from __future__ import annotations

import mmap
import sys
import time
import weakref

import numpy as np

from tbljax._src.engine.rows import RowLayout

__all__ = ["ALIGN", "aligned_empty", "Slot", "Ring"]

ALIGN = 4096  # a page: also satisfies XLA's 64-byte zero-copy requirement


HUGE_PAGE = 2 << 20


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """An uninitialized 1-D uint8 array of `nbytes` whose data address is a multiple of `align`.

    Buffers of a huge page or more are mapped with transparent huge pages where the kernel
    offers them: first-touching a fresh 78 MB float32 batch took 8-163 ms in 4 KiB pages on a
    2-core VM, and 7-9 ms in 2 MiB pages (benchmarks/probe.py first-touch).

    >>> aligned_empty(100).ctypes.data % 4096
    0
    """
    if nbytes >= HUGE_PAGE and align <= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
        m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = np.frombuffer(m, np.uint8)  # owns the mapping: unmapped when the last view dies
        start = -raw.ctypes.data % HUGE_PAGE
        try:
            m.madvise(mmap.MADV_HUGEPAGE, start, nbytes - nbytes % HUGE_PAGE)
        except OSError:
            pass  # no THP in this kernel: 4 KiB pages, just slower to touch the first time
        return raw[start : start + nbytes]
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start : start + nbytes]


class Slot:
    """Host memory for this process's rows of one batch: one aligned region per row range.

    ``alloc(nbytes)`` returns the ALIGN-aligned 1-D uint8 memory (default `aligned_empty`; the
    torch adapter passes one that returns page-locked memory when CUDA is present).
    ``row_shape`` is the largest row the slot holds: `views` may view it at any row shape of
    no more bytes (the sizes of a schedule share one ring).
    """

    def __init__(self, rows: RowLayout, row_shape: tuple[int, ...], dtype, alloc=aligned_empty):
        self.row_shape = tuple(row_shape)
        self.dtype = np.dtype(dtype)
        row_bytes = int(np.prod(self.row_shape)) * self.dtype.itemsize
        self._regions = []  # (byte offset, rows); every region starts on an ALIGN boundary
        offset = 0
        for a, b in rows.ranges:
            self._regions.append((offset, b - a))
            offset += -(-(b - a) * row_bytes // ALIGN) * ALIGN
        mem = alloc(max(offset, ALIGN))
        if mem.dtype != np.uint8 or mem.ndim != 1 or mem.ctypes.data % ALIGN or not isinstance(mem.base, np.ndarray):
            raise ValueError(f"alloc must return a 1-D uint8 view of an array, aligned to {ALIGN} bytes")
        # Every view of `mem` (and so every jax.Array aliasing it) holds a reference to its
        # owner; counting those references tells whether anything still reads this memory.
        self._owner = mem.base
        self._mem = mem
        self._idle_refs = sys.getrefcount(self._owner)
        self._row_bytes = row_bytes
        self._watched: list[weakref.ref] = []  # see watch

    def views(self, row_shape: tuple[int, ...] | None = None, rows=None) -> list[np.ndarray]:
        """Fresh typed (rows, *row_shape) views, one per range (default: the slot's row shape;
        `rows`: each range's row count, when a step's differ from the slot's, in no more bytes).
        Drop them once handed to JAX."""
        shape = self.row_shape if row_shape is None else tuple(row_shape)
        row_bytes = int(np.prod(shape)) * self.dtype.itemsize
        counts = [r for _, r in self._regions] if rows is None else list(rows)
        if any(c * row_bytes > r * self._row_bytes for c, (_, r) in zip(counts, self._regions)):
            raise ValueError(f"{counts} rows of {shape} do not fit this slot's rows of {self.row_shape}")
        return [
            self._mem[o : o + c * row_bytes].view(self.dtype).reshape(c, *shape)
            for (o, _), c in zip(self._regions, counts)
        ]

    @property
    def owner(self) -> np.ndarray:
        """The array that owns this slot's memory (the base of what ``alloc`` returned)."""
        return self._owner

    def in_use(self) -> bool:
        """Whether anything but the ring still refers to this slot's memory."""
        return sys.getrefcount(self._owner) > self._idle_refs

    def watch(self, viewers) -> None:
        """Remembers (weakly) the objects handed to the consumer that view this slot."""
        self._watched = []
        for x in viewers:
            try:
                self._watched.append(weakref.ref(x))
            except TypeError:
                pass  # not weakly referenceable: the ring just waits, as for a computation

    def held_by_consumer(self) -> bool:
        """Whether an object handed out for this slot is still alive: kept on purpose, so
        waiting for it is pointless. (Once they are all gone, what still holds the memory is
        a computation in flight, which ends.)"""
        return any(w() is not None for w in self._watched)


def _release_dropped_buffers():
    """Lets jaxlib drop host references it holds for buffers already deleted.

    jaxlib defers those releases to its next call (or to a Python gc pass, which jax hooks),
    so a reference count can be stale by one step: stale means "in use", the safe side. This
    only spares a needless reallocation; without the hook the ring stays correct.
    """
    jaxlib = sys.modules.get("jaxlib._jax")  # not loaded: no JAX buffer can hold a slot
    collect = getattr(jaxlib, "collect_garbage", None)
    if collect is not None:
        collect()


class Ring:
    """A fixed set of slots handed out round-robin; a slot still in use is never overwritten.

    When the next slot is still viewed, but no longer by what was handed to the consumer
    (`Slot.watch`), `acquire` first waits up to `patience` seconds for it to be released:
    with JAX's asynchronous dispatch a training loop runs ahead of the device and its queued
    steps hold their batches until they run, so this wait is the loader's
    back-pressure (memory stays at the ring's size, and no fresh memory is faulted in per
    step). A slot not released in time is replaced by fresh memory (the old one lives on,
    owned by whoever views it: a batch kept on purpose); after `max_timeouts` such waits the
    ring stops waiting, since that consumer keeps its batches.

    ``before_reuse()``, when given, runs before a slot that was handed out is written again
    (the torch adapter waits there for asynchronous device copies that may still read it).
    """

    def __init__(
        self,
        rows: RowLayout,
        row_shape,
        dtype,
        size: int,
        *,
        alloc=aligned_empty,
        before_reuse=None,
        patience: float = 1.0,
        max_timeouts: int = 2,
    ):
        if size < 1:
            raise ValueError(f"ring size must be >= 1, got {size}")
        self._make = lambda: Slot(rows, row_shape, dtype, alloc)
        self._before_reuse = before_reuse
        self._used = [False] * size  # handed out since it was made
        self._slots = [self._make() for _ in range(size)]
        self._next = 0
        self._patience = patience
        self._timeouts_left = max_timeouts
        self.replaced = 0  # slots retired because a jax.Array still viewed them
        # Time acquire spent waiting for the consumer to release a slot: (total of finished
        # waits, start of the wait in progress or None), one attribute so that another thread
        # reads a consistent pair.
        self._waits: tuple[float, float | None] = (0.0, None)

    @property
    def slots(self) -> tuple[Slot, ...]:
        """The slots now in the ring, in hand-out order (a replaced slot is no longer here)."""
        return tuple(self._slots)

    @property
    def wait_seconds(self) -> float:
        return self._waits[0]

    def blocked_seconds(self, now: float) -> float:
        """Total time spent waiting for slots up to `now`, the wait in progress included."""
        total, since = self._waits
        return total + (now - since if since is not None else 0.0)

    def _wait_released(self, slot: Slot, stop) -> None:
        t0 = time.perf_counter()
        self._waits = (self._waits[0], t0)
        nap = 1e-4
        while slot.in_use():
            now = time.perf_counter()
            if now - t0 > self._patience:
                self._timeouts_left -= 1
                break
            if stop is not None and stop.is_set():
                break
            time.sleep(nap)
            nap = min(2 * nap, 2e-3)
            _release_dropped_buffers()
        self._waits = (self._waits[0] + time.perf_counter() - t0, None)

    def acquire(self, stop=None) -> Slot:
        """The next slot to write; `stop` (a threading.Event) cuts a wait short."""
        i = self._next
        self._next = (i + 1) % len(self._slots)
        slot = self._slots[i]
        if slot.in_use():
            _release_dropped_buffers()
        if slot.in_use() and self._timeouts_left > 0 and not slot.held_by_consumer():
            self._wait_released(slot, stop)
        if slot.in_use():
            self._slots[i] = self._make()
            self._used[i] = False
            self.replaced += 1
        if self._used[i] and self._before_reuse is not None:
            self._before_reuse()
        self._used[i] = True
        return self._slots[i]

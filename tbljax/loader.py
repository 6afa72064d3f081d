"""tbljax.loader: the iterator users hold. Wires a dataset, the order, the kernel and the host
ring together and yields dicts of global `jax.Array`s; keeps the resumable state, the metrics,
and the background producer (one thread, or two pipelined ones: see `_produce`) that always
shuts down cleanly.

Data flows one way: `order` says which sample each row holds → `augment` says its crop and flip
→ the kernel (`tbljax.kernels.gather`, GIL released) writes the rows into a ring slot →
`batch` hands the slot to JAX (no copy on CPU) → the consumer receives it from a queue.

Two layers: `HostLoader` is framework-free (order, kernel, ring, producer thread, state,
metrics) and yields `HostBatch`es of NumPy views into the ring; `Loader` is one thin layer on
top that assembles global `jax.Array`s. The torch and MLX adapters (`tbljax.torch`,
`tbljax.mlx`) are other thin layers on the same `HostLoader`.

Example:
    >>> import tbljax
    >>> loader = tbljax.loader("train.tbl", batch_size=256, seed=0, augment="rrc_flip")
    >>> for batch in loader:
    ...     state, loss = train_step(state, batch["image"], batch["label"])
    ...     if step % 1000 == 0:
    ...         save(state, loader.state_dict())   # {version, seed, epoch, position, fingerprint}
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib
import math
import os
import queue
import threading
import time
import warnings
import weakref

import numpy as np

from tbljax import augment as _augment
from tbljax import batch as _batch
from tbljax import order

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "HostBatch", "HostLoader", "Loader",
           "LoaderOptions", "loader"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "uint8": "uint8"}
_LAYOUTS = ("NHWC", "NCHW")
# Slots beyond the prefetch queue: one being filled, one the consumer holds, one still read by
# a step in flight. A slot still viewed is waited for, then replaced (see tbljax.batch.Ring),
# never overwritten.
_RING_EXTRA = 3
_POLL_S = 0.05  # how often blocked queue calls look at the stop flag
_JOIN_S = 30.0  # how long close() waits for each producer thread


def _dtype_name(dtype) -> str:
    try:
        name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    except TypeError:
        name = None
    if name is None:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return name


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _triple(name, value, positive):
    try:
        v = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        v = ()
    if len(v) != 3 or not all(math.isfinite(x) and (x > 0 or not positive) for x in v):
        need = "three finite numbers > 0" if positive else "three finite numbers"
        raise ValueError(f"{name} must be {need} (one per RGB channel), got {value!r}")
    return v


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """Everything that decides what a loader yields, validated once. See `loader` for meanings."""

    batch_size: int
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None
    dtype: str = "float32"
    layout: str = "NHWC"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    augment: _augment.Augment | None = None
    drop_remainder: bool = True
    prefetch: int = 2
    threads: int | None = None

    def __post_init__(self):
        def integer(v):
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        if not integer(self.batch_size) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not integer(self.seed) or not 0 <= self.seed < 1 << 64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if self.num_epochs is not None and (not integer(self.num_epochs) or self.num_epochs < 1):
            raise ValueError(f"num_epochs must be None (endless) or an integer >= 1, got "
                             f"{self.num_epochs!r}")
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        if self.layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {self.layout!r}")
        object.__setattr__(self, "mean", _triple("mean", self.mean, positive=False))
        object.__setattr__(self, "std", _triple("std", self.std, positive=True))
        object.__setattr__(self, "augment", _augment.Augment.from_spec(self.augment))
        if not integer(self.prefetch) or self.prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {self.prefetch!r}")
        if self.threads is not None and (not integer(self.threads) or self.threads < 1):
            raise ValueError(f"threads must be None (the pool's default) or an integer >= 1, "
                             f"got {self.threads!r}")
        for flag in ("shuffle", "drop_remainder"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False, got {getattr(self, flag)!r}")


class _Source:
    """The one place that knows the Dataset API: size, labels, stored image size, fingerprint,
    and how to write rows of a batch (RAW: the kernel gathers from the zero-copy views;
    JPEG/LZ4: the dataset decodes into a scratch buffer that the kernel then reads)."""

    def __init__(self, ds, threads):
        self.n = len(ds)
        if self.n == 0:
            raise ValueError(f"{ds!r} holds no records")
        if self.n > np.iinfo(np.int32).max:
            raise ValueError(f"{ds!r} holds {self.n} records; the loader's int32 `index` "
                             f"supports up to {np.iinfo(np.int32).max}")
        self.labels = np.asarray(ds.labels, dtype=np.int64)
        self.fingerprint = str(ds.fingerprint)
        self.shape = ds.image_shape or self._uniform_record_size(ds)
        if self.shape is None:
            raise ValueError(f"{ds!r} has no single image size (records of different sizes and "
                             "no resize recipe): convert it with an image_size to serve it")
        self.shape = tuple(int(v) for v in self.shape)
        self._raw = ds.record_format == "raw"
        self._ds = ds
        if self._raw:
            views = ds.shard_views()
            kernels = importlib.import_module("tbljax.kernels")
            # Built once: the native view over the shards (the kernel takes it as is).
            make = getattr(kernels, "raw_source", None)
            self._src = make(views) if make is not None else views
        else:
            self._scratch = np.empty((0, *self.shape, 3), np.uint8)
        self._threads = threads or 0

    @staticmethod
    def _uniform_record_size(ds):
        # image_shape is None for LZ4 files written without a recipe even when every record
        # has one size; the index says so (O(N) numpy, once, only for such files).
        index = getattr(ds, "index", None)
        if index is None or not len(index):
            return None
        h, w = np.unique(index["height"]), np.unique(index["width"])
        return (int(h[0]), int(w[0])) if len(h) == 1 and len(w) == 1 else None

    def fill(self, indices, out, *, layout, crop, flip, mean, std):
        kernels = importlib.import_module("tbljax.kernels")
        kw = dict(layout=layout, crop=crop, flip=flip, mean=mean, std=std)
        if self._raw:
            # The kernel reads the files' mappings directly: a file truncated or rewritten in
            # place since it was opened must fail the batch, not fill it with other bytes.
            # Checked before (no read past a truncated end) and after (no batch mixed from two
            # versions of a file). A truncation landing inside the gather itself is the one
            # case left: reading a page past the new end raises SIGBUS.
            check = getattr(self._ds, "check_unchanged", None)
            files_of = getattr(self._ds, "_files_of", None)
            files = files_of(indices) if files_of is not None else None
            if check is not None:
                check(files)
            kernels.gather(self._src, indices, out, **kw)
            if check is not None:
                check(files)
            return
        b = len(indices)
        if len(self._scratch) < b:
            self._scratch = np.empty((b, *self.shape, 3), np.uint8)
        scratch = self._scratch[:b]
        self._ds.read_into(indices, scratch, self._threads)
        kernels.gather(scratch, np.arange(b, dtype=np.int64), out, **kw)


@dataclasses.dataclass(frozen=True)
class HostBatch:
    """This process's rows of one step, in host memory, before any framework sees them.

    One entry per row range of the layout (`tbljax.batch.Layout.ranges`; a single range unless
    a JAX sharding puts this process's rows on several devices). ``images`` are views of a
    ring slot: the slot is not rewritten while any view of it (or an array built on it without
    a copy) is alive. ``labels`` and ``indices`` are int32, -1 on padding rows; ``valids`` is
    None with drop_remainder (no padding), else bool masks.

    >>> ld = HostLoader(tbljax.open("train.tbl"), LoaderOptions(batch_size=256))
    >>> hb = next(iter(ld))
    >>> hb.image.shape, hb.index[:4], (hb.epoch, hb.position)
    """

    epoch: int
    position: int  # global position of the step's first row
    ranges: tuple[tuple[int, int], ...]
    images: tuple[np.ndarray, ...]
    labels: tuple[np.ndarray, ...]
    indices: tuple[np.ndarray, ...]
    valids: tuple[np.ndarray, ...] | None

    def _one(self, name):
        parts = getattr(self, name)
        if parts is None:
            return None
        if len(parts) != 1:
            raise ValueError(f"this batch has {len(parts)} row ranges: use .{name}")
        return parts[0]

    @property
    def image(self) -> np.ndarray:
        return self._one("images")

    @property
    def label(self) -> np.ndarray:
        return self._one("labels")

    @property
    def index(self) -> np.ndarray:
        return self._one("indices")

    @property
    def valid(self) -> np.ndarray | None:
        return self._one("valids")


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the producer needs to build any step: immutable, so it is safe to share."""

    source: _Source
    layout: _batch.Layout
    opts: LoaderOptions
    row_shape: tuple[int, ...]
    start: tuple[int, int]  # cursor (epoch, position) the iteration starts from
    end_epoch: int | None   # the pass stops before this epoch (None: never)
    # HostBatch -> what the consumer receives; runs in a producer thread (so a transfer to a
    # device overlaps the step; `_finish` when pipelined). Must not refer to the loader: see
    # _produce.
    finish: object = None

    def steps(self):
        """(epoch, first position) of every step from the cursor to the end (or forever)."""
        n, g = self.source.n, self.layout.global_batch
        epoch, position = self.start
        while self.end_epoch is None or epoch < self.end_epoch:
            count = order.steps_in_epoch(n, g, drop_remainder=self.opts.drop_remainder,
                                         start=position)
            for s in range(count):
                yield epoch, position + s * g
            epoch, position = epoch + 1, 0

    def build_host(self, ring, epoch, first, stop=None) -> tuple[HostBatch, _batch.Slot]:
        """This process's rows of the step starting at position `first`, in a ring slot (the
        second item)."""
        src, opts, aug = self.source, self.opts, self.opts.augment
        normalize = opts.dtype != "uint8"
        slot = ring.acquire(stop)
        views = slot.views()
        labels, indices, valid = [], [], []
        for (a, b), out in zip(self.layout.ranges, views):
            rows = b - a
            nvalid = int(np.clip(src.n - (first + a), 0, rows))
            idx = order.permute(np.arange(first + a, first + a + nvalid, dtype=np.int64), src.n,
                                opts.seed, epoch, shuffle=opts.shuffle)
            if nvalid:
                boxes, flip = (None, None) if aug is None else _augment.sample(
                    aug, idx, height=src.shape[0], width=src.shape[1], seed=opts.seed, epoch=epoch)
                src.fill(idx, out[:nvalid], layout=opts.layout, crop=boxes, flip=flip,
                         mean=opts.mean if normalize else None, std=opts.std if normalize else None)
            out[nvalid:] = 0  # padding rows (only in the last step without drop_remainder)
            pad = rows - nvalid
            indices.append(np.concatenate([idx, np.full(pad, -1)]).astype(np.int32))
            labels.append(np.concatenate([src.labels[idx], np.full(pad, -1)]).astype(np.int32))
            valid.append(np.arange(rows) < nvalid)
        return HostBatch(epoch, first, self.layout.ranges, tuple(views), tuple(labels),
                         tuple(indices), None if opts.drop_remainder else tuple(valid)), slot

    def finish_host(self, host: HostBatch, slot: _batch.Slot):
        """What the consumer receives for `host`; the slot learns what views it."""
        result = host if self.finish is None else self.finish(host)
        slot.watch(_slot_viewers(result))
        return result


def _slot_viewers(result) -> list:
    """What a finisher handed out that views the ring slot: the images (a HostBatch's views,
    the JAX dict's "image", an adapter Batch's first item)."""
    if isinstance(result, HostBatch):
        return list(result.images)
    if isinstance(result, dict):
        return [result["image"]]
    if isinstance(result, tuple):
        return [result[0]]
    return []


def _to_jax(layout: _batch.Layout, row_shape, host: HostBatch) -> dict:
    """The JAX layer: a HostBatch → a dict of global jax.Arrays (no copy on CPU)."""
    result = {"image": layout.to_global(host.images, row_shape),
              "label": layout.to_global(host.labels),
              "index": layout.to_global(host.indices)}
    if host.valids is not None:
        result["valid"] = layout.to_global(host.valids)
    return result


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


_END = object()


@dataclasses.dataclass
class _Metrics:
    steps: int = 0             # batches handed to the consumer
    images: int = 0            # rows this process built (padding included)
    produce_seconds: float = 0.0
    wait_seconds: float = 0.0  # consumer time blocked waiting for a batch
    last_wait_seconds: float = 0.0
    slots_replaced: int = 0
    slot_wait_seconds: float = 0.0  # producer waiting for the consumer to release a ring slot


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            pass
    return False


def _produce(plan: _Plan, ring: _batch.Ring, q: queue.Queue, stop: threading.Event,
             metrics: _Metrics, room: threading.Semaphore | None = None) -> None:
    """The producer: builds each step's host batch (permutation, augmentation, the kernel with
    the GIL released) and puts it on `q`. Holds no reference to the iterator, so dropping the
    iterator (break, exception, del, garbage collection) can always stop it.

    Pipelined (`room` given), `q` feeds `_finish`, a second thread that turns host batches
    into what the consumer receives, so the Python of one step overlaps the kernel of the
    next (the kernel alone nearly fills memory bandwidth on one core). `room` lets this
    thread start a batch only once `_finish` has taken the previous one: one batch in the
    pipeline at a time, as many ring slots as unpipelined. Otherwise `q` gets the finished
    batches directly."""
    try:
        rows = plan.layout.local_rows
        for epoch, first in plan.steps():
            while room is not None and not room.acquire(timeout=_POLL_S):
                if stop.is_set():
                    return
            if stop.is_set():
                return
            t0, waited = time.perf_counter(), ring.wait_seconds
            host, slot = plan.build_host(ring, epoch, first, stop)
            # Producing, not waiting for the consumer to release a slot.
            metrics.produce_seconds += time.perf_counter() - t0 - (ring.wait_seconds - waited)
            metrics.images += rows
            metrics.slots_replaced = ring.replaced
            metrics.slot_wait_seconds = ring.wait_seconds
            # Pipelined, the slot travels with its batch to `_finish`, which watches it.
            item = (epoch, first, host, slot) if room is not None else \
                (epoch, first, plan.finish_host(host, slot))
            if not _put(q, item, stop):
                return
            del item, host, slot
        _put(q, _END, stop)
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
        _put(q, _Failure(e), stop)


def _finish(plan: _Plan, built: queue.Queue, room: threading.Semaphore, q: queue.Queue,
            stop: threading.Event) -> None:
    """The second stage of a pipelined producer (see `_produce`), in step order."""
    try:
        while not stop.is_set():
            try:
                item = built.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            room.release()
            if item is not _END and not isinstance(item, _Failure):
                epoch, first, host, slot = item
                item = (epoch, first, plan.finish_host(host, slot))
                del host, slot
            if not _put(q, item, stop) or item is _END or isinstance(item, _Failure):
                return
            del item
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
        stop.set()  # the builder stops too; the consumer then sees this failure
        _put_anyway(q, _Failure(e))


def _put_anyway(q: queue.Queue, item) -> None:
    """Puts `item` even though `stop` is set, making room by dropping queued batches."""
    while True:
        try:
            q.put_nowait(item)
            return
        except queue.Full:
            try:
                q.get_nowait()
            except queue.Empty:
                pass


_LIVE: "weakref.WeakSet[_Iterator]" = weakref.WeakSet()


@atexit.register
def _close_all():
    for it in list(_LIVE):
        it.close()


class _Iterator:
    """One pass over a `Loader`: owns the producer thread(s) and the prefetch queue."""

    def __init__(self, owner: "Loader", plan: _Plan, ring: _batch.Ring):
        self._owner = owner
        self._n, self._g = plan.source.n, plan.layout.global_batch
        self._drop = plan.opts.drop_remainder
        self._metrics = owner._metrics
        self._ring = ring
        self._stop = threading.Event()
        self._closed = False
        prefetch = plan.opts.prefetch
        if plan.finish is not None and prefetch >= 2:
            # Two stages (see _produce); the batch in the second stage counts as prefetched.
            self._queue: queue.Queue = queue.Queue(maxsize=prefetch - 1)
            built: queue.Queue = queue.Queue(maxsize=1)
            room = threading.Semaphore(1)
            stages = [(_produce, (plan, ring, built, self._stop, self._metrics, room)),
                      (_finish, (plan, built, room, self._queue, self._stop))]
        else:
            self._queue = queue.Queue(maxsize=prefetch)
            stages = [(_produce, (plan, ring, self._queue, self._stop, self._metrics))]
        self._threads = [threading.Thread(target=f, args=a, name="tbljax-loader", daemon=True)
                         for f, a in stages]
        for t in self._threads:
            t.start()
        _LIVE.add(self)

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed:
            raise StopIteration
        t0 = time.perf_counter()
        held0 = self._ring.blocked_seconds(t0)
        try:
            while True:
                try:
                    item = self._queue.get(timeout=_POLL_S)
                    break
                except queue.Empty:
                    if not self._threads[-1].is_alive():
                        # It may have put its last item just before ending: look once more.
                        try:
                            item = self._queue.get_nowait()
                            break
                        except queue.Empty:
                            raise RuntimeError("tbljax loader: the producer thread ended "
                                               "without a result") from None
        except BaseException:
            self.close()
            raise
        t1 = time.perf_counter()
        # Waiting for data counts only if the producer was never held back meanwhile. If it
        # waited for a ring slot that one of the consumer's own queued computations still
        # read (back-pressure under asynchronous dispatch), the device had that work and
        # the ones queued after it to run: it was busy, not starved.
        waited = t1 - t0 if self._ring.blocked_seconds(t1) == held0 else 0.0
        m = self._metrics
        m.wait_seconds += waited
        m.last_wait_seconds = waited
        if item is _END:
            self._owner._pass_ended()
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        epoch, first, result = item
        # The state counts what was handed over, not what the producer prefetched.
        self._owner._cursor = order.advance(epoch, first + self._g, self._n, self._g,
                                            drop_remainder=self._drop)
        m.steps += 1
        return result

    def close(self) -> None:
        """Stops the producer and waits for it; idempotent, safe from any thread."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            while True:  # drop prefetched batches now so their ring slots are released
                self._queue.get_nowait()
        except queue.Empty:
            pass
        for t in self._threads:
            if threading.current_thread() is not t:
                # A producer stops within one kernel call and a poll interval; a bound keeps
                # a Ctrl-C or exit from ever hanging on one that does not (it is a daemon).
                t.join(timeout=_JOIN_S)
                if t.is_alive():
                    warnings.warn(f"tbljax loader: a producer thread did not stop within "
                                  f"{_JOIN_S:.0f} s; leaving it (daemon) behind", RuntimeWarning,
                                  stacklevel=2)
        _LIVE.discard(self)

    def __del__(self):
        self.close()


class HostLoader:
    """The framework-free loader: order, kernel, ring, producer thread, state and metrics.

    Yields `HostBatch`es (NumPy views of the ring) for the rows `layout` gives this process;
    `Loader` (JAX) and the torch and MLX adapters are thin layers over it that override
    `_finisher` (what the producer makes of a HostBatch) and `_pass_bounds` (where a pass
    starts and ends). Iterating runs from the cursor (epoch, position) to the end of epoch
    ``num_epochs - 1`` (or forever); a pass that ran to its end makes the next one start over
    at epoch 0; a restored state that is at the end yields nothing.

    ``alloc`` and ``before_reuse`` go to the ring (`tbljax.batch.Ring`).

    >>> from tbljax.batch import Layout
    >>> ld = HostLoader(tbljax.open("train.tbl"), LoaderOptions(batch_size=256, num_epochs=1),
    ...                 Layout.for_rank(256, rank=0, world_size=1))
    >>> for hb in ld:
    ...     hb.image, hb.label       # (256, H, W, 3) float32 view of the ring, int32 labels
    """

    def __init__(self, dataset, opts: LoaderOptions, layout: _batch.Layout | None = None, *,
                 alloc=_batch.aligned_empty, before_reuse=None):
        self.options = opts
        self._source = _Source(dataset, opts.threads)
        self._layout = layout if layout is not None else _batch.Layout.for_rank(
            opts.batch_size, 0, 1)
        h, w = self._source.shape
        aug = opts.augment
        oh, ow = aug.size if aug is not None and aug.size is not None else (h, w)
        self._row_shape = (oh, ow, 3) if opts.layout == "NHWC" else (3, oh, ow)
        if len(self) == 0:
            raise ValueError(f"batch_size {self._layout.global_batch} is larger than the dataset "
                             f"({self._source.n} samples) with drop_remainder=True: no step "
                             "would run; use a smaller batch_size or drop_remainder=False")
        self._cursor = (0, 0)
        self._finished = False  # the last pass ran to its end: the next one starts over
        self._metrics = _Metrics()
        self._active = None  # weakref to the live _Iterator
        # Kept across passes (one pass runs at a time), so its memory is reused, not
        # page-faulted in again for every evaluation pass.
        self._ring = _batch.Ring(self._layout, self._row_shape, _np_dtype(opts.dtype),
                                 opts.prefetch + _RING_EXTRA, alloc=alloc,
                                 before_reuse=before_reuse)

    # ---- what a layer on top decides ----
    def _finisher(self):
        """A function HostBatch -> what iteration yields, run in the producer thread; it must
        not refer to `self` (the producer may not keep the loader alive). None: the HostBatch."""
        return None

    def _pass_bounds(self) -> tuple[tuple[int, int], int | None]:
        """(cursor the next pass starts from, epoch it stops before)."""
        if self._finished:
            self._cursor, self._finished = (0, 0), False
        return self._cursor, self.options.num_epochs

    def _pass_ended(self) -> None:
        self._finished = True

    # ---- the iterator protocol and the state ----
    def __len__(self) -> int:
        """Steps in one epoch."""
        return order.steps_in_epoch(self._source.n, self._layout.global_batch,
                                    drop_remainder=self.options.drop_remainder)

    @property
    def num_samples(self) -> int:
        return self._source.n

    def __iter__(self) -> _Iterator:
        self._close_active()
        start, end_epoch = self._pass_bounds()
        plan = _Plan(self._source, self._layout, self.options, self._row_shape, start, end_epoch,
                     self._finisher())
        it = _Iterator(self, plan, self._ring)
        self._active = weakref.ref(it)
        return it

    def _close_active(self):
        it = self._active() if self._active is not None else None
        if it is not None:
            it.close()
        self._active = None

    def close(self) -> None:
        """Stops a running iteration (also done on break, error, del and interpreter exit)."""
        self._close_active()

    @staticmethod
    def _check_epoch(epoch) -> int:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) \
                or not 0 <= epoch < 1 << 32:
            raise ValueError(f"epoch must be an integer in [0, 2**32), got {epoch!r}")
        return int(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Moves the cursor to the start of `epoch`; the next iteration begins there."""
        epoch = self._check_epoch(epoch)
        self._close_active()
        self._cursor, self._finished = (epoch, 0), False

    def state_dict(self) -> dict:
        """{version, seed, epoch, position, fingerprint}: position counts the samples of
        `epoch` already handed out. Restore with `load_state_dict`, with any batch size or
        process count: the stream continues with nothing repeated and nothing skipped."""
        epoch, position = self._cursor
        return order.make_state(seed=self.options.seed, epoch=epoch, position=position,
                                fingerprint=self._source.fingerprint)

    def load_state_dict(self, state: dict) -> None:
        """Restores a `state_dict`; the next iteration continues from it. Raises ValueError
        for another format version, another dataset or another seed."""
        epoch, position = order.check_state(state, seed=self.options.seed,
                                            fingerprint=self._source.fingerprint,
                                            n=self._source.n)
        self._close_active()
        self._finished = False  # a restored end state yields nothing, as the original run
        self._cursor = order.advance(epoch, position, self._source.n, self._layout.global_batch,
                                     drop_remainder=self.options.drop_remainder)

    def metrics(self) -> dict:
        """Counters since creation: steps handed out, images built by this process and the
        producer's rate, consumer wait time (total and last step), producer wait time for
        ring slots still held by the consumer, and ring slots replaced."""
        m = self._metrics
        d = dataclasses.asdict(m)
        d["produced_img_per_s"] = m.images / m.produce_seconds if m.produce_seconds else 0.0
        return d

    def __repr__(self) -> str:
        o = self.options
        return (f"{type(self).__name__}({self._source.n} samples, "
                f"batch_size={self._layout.global_batch}, steps/epoch={len(self)}, "
                f"dtype={o.dtype}, layout={o.layout}, augment={o.augment}, "
                f"cursor={self._cursor})")


class Loader(HostLoader):
    """Serves a dataset to JAX as sharded global batches. Create it with `tbljax.loader`.

    Iterating yields ``{"image", "label", "index"}`` (+ ``"valid"`` without drop_remainder),
    each a global `jax.Array` whose leading axis is the global batch. Iteration starts at the
    loader's cursor (epoch, position) and runs to the end of epoch ``num_epochs - 1`` (or
    forever). Iterating again after a pass that ran to its end starts over at epoch 0 (an
    evaluation loader serves the whole set each time); a restored state that is at the end
    yields nothing, as the original run would have.

    Lifetime: a batch's image may share memory with the loader's host ring (on CPU it does).
    The loader never rewrites memory that a live jax.Array (or anything derived from it) still
    reads: hold batches as long as you like; batches you drop are recycled.
    """

    def __init__(self, dataset, opts: LoaderOptions, sharding=None):
        self.sharding = _batch.batch_shardings(sharding)
        super().__init__(dataset, opts, _batch.Layout.create(self.sharding, opts.batch_size))

    def _finisher(self):
        return functools.partial(_to_jax, self._layout, self._row_shape)


def _open(path_or_dataset):
    from tbljax import format as _format

    if isinstance(path_or_dataset, (str, bytes, os.PathLike)) or (
            isinstance(path_or_dataset, (list, tuple)) and path_or_dataset
            and all(isinstance(p, (str, bytes, os.PathLike)) for p in path_or_dataset)):
        return _format.open(path_or_dataset)
    # A Dataset, or anything shaped like one (what _Source reads).
    if isinstance(path_or_dataset, _format.Dataset) or all(
            hasattr(path_or_dataset, a) for a in ("__len__", "labels", "fingerprint", "record_format")):
        return path_or_dataset
    raise TypeError("tbljax.loader takes a TBL path, a list of shard paths or a tbljax.Dataset, "
                    f"got {type(path_or_dataset).__name__} {path_or_dataset!r}"[:300])


def loader(path_or_paths, batch_size: int, *, seed: int = 0, shuffle: bool = True,
           num_epochs: int | None = None, sharding=None, dtype="float32", layout: str = "NHWC",
           mean=IMAGENET_MEAN, std=IMAGENET_STD, augment=None, drop_remainder: bool = True,
           prefetch: int = 2, threads: int | None = None) -> Loader:
    """Serves a TBL dataset to JAX as sharded global batches.

    Args:
      path_or_paths: a TBL file, a list of shard files read as one dataset, or an open
        `tbljax.Dataset`.
      batch_size: the global batch G over all processes; it must split evenly over the batch
        shards of `sharding`. Step s of an epoch holds shuffled positions [s*G, (s+1)*G).
      seed, shuffle: the order of epoch e is a fixed bijection of (seed, e); shuffle=False
        serves samples in file order.
      num_epochs: None to iterate forever, or the number of epochs to serve.
      sharding: None (batch axis over all devices), a `Mesh` or a `NamedSharding` that
        partitions only the leading axis. Each process builds only its devices' rows.
      dtype: "float32", "bfloat16" (normalized with mean/std) or "uint8" (raw pixels).
      layout: "NHWC" or "NCHW".
      mean, std: per-channel, on the 0..1 scale: value = (x/255 - mean) / std.
      augment: None, "flip", "rrc_flip" or an `Augment`; a sample's crop and flip depend only
        on (seed, epoch, sample index).
      drop_remainder: True drops the last partial batch; False pads it (index and label -1,
        zero image) and adds a bool `valid` mask, so every sample is served exactly once.
      prefetch: batches prepared ahead of the consumer.
      threads: threads for decoding non-RAW records (None: the pool's default).

    >>> loader = tbljax.loader("val.tbl", batch_size=500, shuffle=False, num_epochs=1,
    ...                        drop_remainder=False)
    >>> correct = sum(int(((predict(b["image"]) == b["label"]) & b["valid"]).sum())
    ...               for b in loader)
    """
    opts = LoaderOptions(batch_size=batch_size, seed=seed, shuffle=shuffle,
                         num_epochs=num_epochs, dtype=dtype, layout=layout, mean=mean, std=std,
                         augment=augment, drop_remainder=drop_remainder, prefetch=prefetch,
                         threads=threads)
    return Loader(_open(path_or_paths), opts, sharding)

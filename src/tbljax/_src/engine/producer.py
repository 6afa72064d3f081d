"""One pass over a loader. Background threads build each step with a `Plan` (engine/plan.py):
`_draw` draws each step's rows one step ahead (and asks the disk for those of the steps
after), `_produce` builds the batch (and `_finish`, when
pipelined, turns it into what the consumer receives), handing it over a bounded queue; `Pass` is
the iterator the consumer holds. It counts the metrics, and always
shuts down cleanly: on break, error, del, garbage collection and interpreter exit.
"""

from __future__ import annotations

import atexit
import dataclasses
import queue
import threading
import time
import warnings
import weakref

from tbljax._src.engine.plan import Plan
from tbljax._src.engine.ring import Ring

__all__ = ["Metrics", "Pass"]

_POLL_S = 0.05  # how often blocked queue calls look at the stop flag
_JOIN_S = 30.0  # how long close() waits for each producer thread
_START_S = 1.0  # how long close() waits for a thread whose start() was interrupted to run


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


_END = object()


@dataclasses.dataclass
class Metrics:
    """A loader's counters since it was made (`HostLoader.metrics`)."""

    steps: int = 0  # batches handed to the consumer
    images: int = 0  # rows this process built (padding included)
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


def _get(q: queue.Queue, stop: threading.Event):
    """The next item of `q`, or None once `stop` is set."""
    while not stop.is_set():
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            pass
    return None


def _acquire(sem: threading.Semaphore, stop: threading.Event) -> bool:
    """Takes `sem`; False, without it, once `stop` is set."""
    while not sem.acquire(timeout=_POLL_S):
        if stop.is_set():
            return False
    return not stop.is_set()


def _draw(plan: Plan, q: queue.Queue, go: threading.Semaphore, stop: threading.Event) -> None:
    """The first stage: (epoch, first, `plan.draw` of the step) for every step, on `q`, one step
    ahead of `_produce`. Each draw after the first waits for `go`, which `_produce` releases
    just before its kernel call (GIL released): the permutation, crops and flips of the next
    step are then drawn on the GIL the kernel left free, not between two kernel calls, where
    they left the pool idle (1.0-1.4 ms of a 37 ms step of 256 compact records on 2 threads).
    A draw started any earlier would hold the GIL that the producer needs to start its kernel.
    The disk is asked for the records of the steps ahead (`plan.steps()`, read_ahead) here too,
    after each draw, while the kernel runs: 256 posix_fadvise calls on a cold file took 1.6 ms
    of CPU and up to 3.8 ms of wall time, which between two kernel calls left the pool idle
    for 16% of a cold compact epoch."""
    try:
        for epoch, first in plan.steps():
            if not _acquire(go, stop) or not _put(q, (epoch, first, plan.draw(epoch, first)), stop):
                return
        _put(q, _END, stop)
    except BaseException as e:  # noqa: BLE001 - handed on to the consumer, which re-raises it
        _put(q, _Failure(e), stop)


def _produce(
    plan: Plan,
    ring: Ring,
    drawn: queue.Queue,
    go: threading.Semaphore,
    q: queue.Queue,
    stop: threading.Event,
    metrics: Metrics,
    room: threading.Semaphore | None = None,
) -> None:
    """The producer: builds each step's host batch from its rows (`_draw`, on `drawn`), the
    kernel running with the GIL released, and puts it on `q`. Holds no reference to the
    iterator, so dropping the iterator (break, exception, del, garbage collection) can always
    stop it.

    Pipelined (`room` given), `q` feeds `_finish`, a second thread that turns host batches
    into what the consumer receives, so the Python of one step overlaps the kernel of the
    next (the kernel alone nearly fills memory bandwidth on one core). `room` lets this
    thread start a batch only once `_finish` has taken the previous one: one batch in the
    pipeline at a time, as many ring slots as unpipelined. Otherwise `q` gets the finished
    batches directly."""
    try:
        # The steps `_draw` runs through too (it reads ahead; this does not).
        for step in plan.positions():
            item = _get(drawn, stop)
            if item is None:
                return
            if isinstance(item, _Failure):
                _put(q, item, stop)
                return
            epoch, first, step_rows = item
            assert (epoch, first) == step, "internal: the draw and the build went out of step"
            if (room is not None and not _acquire(room, stop)) or stop.is_set():
                return
            t0, waited = time.perf_counter(), ring.wait_seconds
            host, slot = plan.build_host(ring, epoch, first, stop, drawn=step_rows, started=go.release)
            # Producing, not waiting for the consumer to release a slot.
            metrics.produce_seconds += time.perf_counter() - t0 - (ring.wait_seconds - waited)
            metrics.images += sum(b - a for a, b in host.ranges)
            metrics.slots_replaced = ring.replaced
            metrics.slot_wait_seconds = ring.wait_seconds
            # Pipelined, the slot travels with its batch to `_finish`, which watches it.
            item = (epoch, first, host, slot) if room is not None else (epoch, first, plan.finish_host(host, slot))
            if not _put(q, item, stop):
                return
            del item, host, slot
        _put(q, _END, stop)
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
        _put(q, _Failure(e), stop)


def _finish(plan: Plan, built: queue.Queue, room: threading.Semaphore, q: queue.Queue, stop: threading.Event) -> None:
    """The second stage of a pipelined producer (see `_produce`), in step order."""
    try:
        while (item := _get(built, stop)) is not None:
            room.release()
            if item is not _END and not isinstance(item, _Failure):
                epoch, first, host, slot = item
                item = (epoch, first, plan.finish_host(host, slot))
                del host, slot
            if not _put(q, item, stop) or item is _END or isinstance(item, _Failure):
                return
            del item
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
        # After the batches already queued (the consumer gets every step before the failing
        # one); only a consumer that has stopped gives up on it. Then the builder stops too.
        _put(q, _Failure(e), stop)
        stop.set()


def _as_interrupt(e: BaseException) -> BaseException:
    """The Ctrl-C behind `e`, when `e` is CPython's "release unlocked lock": on 3.11 a
    KeyboardInterrupt that lands while `Condition.wait` takes its lock back leaves the lock
    released, and the `with` around the wait then fails with that RuntimeError, the interrupt
    only its context. The user pressed Ctrl-C: that is what they get."""
    if isinstance(e, RuntimeError) and isinstance(e.__context__, KeyboardInterrupt):
        return e.__context__
    return e


class _Stage(threading.Thread):
    """A daemon thread running one stage `fn(*args)` of a pass, that the pass can always join.

    A Ctrl-C can land inside `start()`: before the OS thread is made, or after it is made but
    before it has said it runs, when `Thread.join` raises. `join_stopped` copes with both: it
    waits (briefly) for the thread to enter `run`, then for it to end. A stage that enters after
    its pass stopped returns at once, so no thread of a closed pass reaches the kernel.

    The end is an Event the thread sets, not `Thread.join`: on CPython 3.11 a join that a Ctrl-C
    interrupts marks a thread that is still running as stopped (`_wait_for_tstate_lock` calls
    `_stop()` whenever the lock is held, and a running thread holds it), after which
    `is_alive()` says False and `join()` returns at once while it is still inside the kernel."""

    def __init__(self, fn, args, stop: threading.Event):
        super().__init__(name="tbljax-loader", daemon=True)
        self._work = (fn, args)
        self._pass_stop = stop
        self._entered = threading.Event()
        self._ended = threading.Event()
        self._launched = False  # start() was called: the OS thread may exist
        self._running = False  # start() returned: it exists and join() works

    def start(self) -> None:
        self._launched = True
        try:
            super().start()
        except RuntimeError as e:
            if _as_interrupt(e) is not e:
                raise _as_interrupt(e) from None
            raise
        self._running = True

    def run(self) -> None:
        try:
            self._entered.set()
            fn, args = self._work
            self._work = None  # the thread holds the pass's objects only while it runs
            if not self._pass_stop.is_set():
                fn(*args)
            del fn, args
        finally:
            self._ended.set()

    def join_stopped(self, timeout: float) -> bool:
        """Waits up to `timeout` s for the thread to end; True if it has, or never ran."""
        if not self._launched:
            return True
        if not self._running and not self._entered.wait(_START_S):
            return True  # never made (or it enters later, sees the stop flag and returns)
        if not self._ended.wait(timeout):
            return False
        self.join()  # past its last line: this returns at once
        return True


_LIVE: "weakref.WeakSet[Pass]" = weakref.WeakSet()


@atexit.register
def _close_all():
    for it in list(_LIVE):
        it.close()


class Pass:
    """One pass over a loader: owns the producer thread(s) and the prefetch queue.

    ``metrics`` is updated in place. ``on_step(cursor)`` runs in the consumer's thread for
    every batch handed over, with the cursor (epoch, position) just after it; ``on_end()``
    when the pass ran to its end. The producer threads hold neither callback."""

    def __init__(self, plan: Plan, ring: Ring, metrics: Metrics, *, on_step, on_end):
        # What close() reads comes first, so that it can run on a Pass half made (an
        # interrupt or error below; __del__ of what that leaves).
        self._stop = threading.Event()
        self._closed = self._joined = False
        self._threads: list[_Stage] = []
        self._queue: queue.Queue = queue.Queue()  # the last of these: see __del__
        self._on_step, self._on_end = on_step, on_end
        self._plan = plan  # its next_cursor: the state after each step handed out
        self._metrics = metrics
        self._ring = ring
        prefetch = plan.opts.prefetch
        drawn: queue.Queue = queue.Queue(maxsize=1)
        go = threading.Semaphore(1)  # the first step is drawn at once
        stages = [(_draw, (plan, drawn, go, self._stop))]
        if plan.finish is not None and prefetch >= 2:
            # Two stages (see _produce); the batch in the second stage counts as prefetched.
            self._queue = queue.Queue(maxsize=prefetch - 1)
            built: queue.Queue = queue.Queue(maxsize=1)
            room = threading.Semaphore(1)
            stages += [
                (_produce, (plan, ring, drawn, go, built, self._stop, self._metrics, room)),
                (_finish, (plan, built, room, self._queue, self._stop)),
            ]
        else:
            self._queue = queue.Queue(maxsize=prefetch)
            stages.append((_produce, (plan, ring, drawn, go, self._queue, self._stop, self._metrics)))
        # Owned before any thread runs: a Ctrl-C landing between two starts (or inside one)
        # leaves threads that close() stops and joins, here, from __del__ or at exit.
        _LIVE.add(self)
        try:
            for f, a in stages:
                t = _Stage(f, a, self._stop)
                self._threads.append(t)
                t.start()
        except BaseException:
            self.close()
            raise

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed:
            raise StopIteration
        try:
            return self._next()
        except BaseException as e:  # the end, an error or a Ctrl-C anywhere in here: stop the threads
            self.close()
            if _as_interrupt(e) is not e:
                raise _as_interrupt(e) from None
            raise

    def _next(self):
        t0 = time.perf_counter()
        held0 = self._ring.blocked_seconds(t0)
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
                        raise RuntimeError("tbljax loader: the producer thread ended without a result") from None
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
            self._on_end()
            raise StopIteration
        if isinstance(item, _Failure):
            raise item.exc
        epoch, first, result = item
        # The state counts what was handed over, not what the producer prefetched.
        self._on_step(self._plan.next_cursor(epoch, first))
        m.steps += 1
        return result

    def close(self) -> None:
        """Stops the producer and waits for it; idempotent, safe from any thread. A Ctrl-C
        that lands while it joins is held until the threads have stopped (within one kernel
        call; the wait is bounded), then raised: the interrupt never leaves a thread behind.
        A close cut short otherwise is finished by the next call: at the latest `_close_all`
        at exit, before the interpreter goes away under a thread inside a native call."""
        if self._joined:
            return
        self._closed = True
        self._stop.set()
        try:
            while True:  # drop prefetched batches now so their ring slots are released
                self._queue.get_nowait()
        except queue.Empty:
            pass
        interrupt = None
        for t in self._threads:
            if threading.current_thread() is t:
                continue
            deadline = time.monotonic() + _JOIN_S
            while True:
                try:
                    stopped = t.join_stopped(max(0.0, deadline - time.monotonic()))
                    break
                except KeyboardInterrupt as e:  # raised below, once every thread has stopped
                    interrupt = e
            # A producer stops within one kernel call and a poll interval; the bound keeps a
            # Ctrl-C or exit from ever hanging on one that does not (it is a daemon).
            if not stopped:
                warnings.warn(
                    f"tbljax loader: a producer thread did not stop within {_JOIN_S:.0f} s; leaving it (daemon) behind",
                    RuntimeWarning,
                    stacklevel=2,
                )
        self._joined = True
        _LIVE.discard(self)
        if interrupt is not None:
            raise interrupt

    def __del__(self):
        if "_queue" in vars(self):  # else __init__ was interrupted before it made anything
            self.close()

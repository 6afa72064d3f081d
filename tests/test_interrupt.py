"""Ctrl-C at any moment of a training loop that makes a loader per pass: every interrupt is a
plain KeyboardInterrupt that leaves no loader thread behind, and the last one, not caught,
ends the process as Python does (killed by SIGINT, the traceback ending in KeyboardInterrupt),
with nothing leaked and nothing printed from a destructor or a dying native thread.

A child process per loader kind (JAX, torch, MLX, a `tbljax.mix` mixture) makes a loader,
serves its one-step pass, and again, forever; the parent interrupts it at random moments,
the child catches all but the last interrupt and reports the loader threads still alive. The
moments that broke it (engine/producer.py, `Pass`): between two thread starts, inside one,
while a pass closes, and when the interpreter exits under a thread inside a native call."""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tbljax

TESTS = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import gc, signal, sys, threading
# A shell that started pytest in the background ignores SIGINT, and children inherit that.
signal.signal(signal.SIGINT, signal.default_int_handler)
import tbljax
kind, compact, raw, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
aug = tbljax.Augment(size=(32, 32))
if kind == "torch":
    import tbljax.torch
    make = lambda: tbljax.torch.loader(compact, 64, augment=aug)
elif kind == "mlx":
    import tbljax.mlx
    make = lambda: tbljax.mlx.loader(compact, 64, augment=aug)
elif kind == "mix":
    make = lambda: tbljax.loader(tbljax.mix({"c": compact, "r": raw}, {"c": 1, "r": 1},
                                            steps_per_epoch=1), 64, augment=aug, num_epochs=1)
else:
    make = lambda: tbljax.loader(compact, 64, augment=aug, num_epochs=1)

def loader_threads():
    return sum(t.name == "tbljax-loader" and t.is_alive() for t in threading.enumerate())

def serve_forever():
    while True:
        for batch in make():
            pass

for batch in make():  # every import done (an interrupt inside `import jax` is jax's to lose)
    pass
for k in range(rounds):
    print("ready", flush=True)
    try:
        serve_forever()
    except KeyboardInterrupt:
        pass
    # Counted once the interrupt is handled: inside the except block its traceback still holds
    # the frames, and a pass interrupted between two batches (in the loop's own code, where no
    # loader code runs) is still the loop's; it stops when they go.
    gc.collect()
    print("caught", loader_threads(), flush=True)
print("ready", flush=True)
serve_forever()  # the last interrupt ends the process
"""

# What a clean end must not print: a thread destroyed while joinable or unwound through a
# noexcept frame at exit, objects a stray thread kept alive, errors in __del__.
BAD_OUTPUT = ("terminate called", "leaked", "Exception ignored", "cannot join thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("interrupt")
    images = np.random.default_rng(0).integers(0, 256, (64, 80, 80, 3), dtype=np.uint8)
    labels = np.arange(64) % 5
    compact, raw = d / "compact.tbl", d / "raw.tbl"
    tbljax.convert((images, labels), compact, image_size=64, format="jpeg", quality=90, progress=False)
    tbljax.convert((images, labels), raw, image_size=64, progress=False)
    assert tbljax.open(compact).compact
    return str(compact), str(raw)


def _interrupt(kind, files, rounds, seed):
    """Runs the child for `kind`, interrupts it rounds + 1 times at random moments; returns
    (the live loader-thread counts it reported after each caught interrupt, return code,
    stderr, how many presses were lost). CPython drops an exception raised inside a weakref
    callback, a ``__del__`` or a gc callback ("Exception ignored in: ..."): a Ctrl-C that lands
    there is lost in any Python program, so a press that nothing answers within 30 s is made
    again, as a user would, and `_check` accepts that only with CPython's own message."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [TESTS, env.get("PYTHONPATH", "")] if p)
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, *files, str(rounds)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rng, left, err, lost = random.Random(seed), [], [], 0
    lines: queue.Queue = queue.Queue()
    # Both pipes are read as they come: a child writing a lot never blocks, and a line that
    # does not come is a time-out here, not a hang.
    readers = [
        threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True),
        threading.Thread(target=lambda: [lines.put(x.strip()) for x in p.stdout], daemon=True),
    ]
    for r in readers:
        r.start()

    def line(timeout):
        try:
            return lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def press_until(want, timeout=30):
        nonlocal lost
        for _ in range(4):
            p.send_signal(signal.SIGINT)
            got = line(timeout)
            if got is not None or p.poll() is not None:
                return got
            lost += 1
        return None

    try:
        for k in range(rounds + 1):
            if line(120) != "ready":
                break
            # A pass of this loop is 30-300 ms: moments spread over several passes.
            time.sleep(rng.uniform(0.05, 0.6))
            if k < rounds:
                got = press_until("caught")
                if got is None or not got.startswith("caught"):
                    break
                left.append(int(got.split()[1]))
                continue
            p.send_signal(signal.SIGINT)  # the last interrupt ends the process
            for _ in range(3):
                try:
                    p.wait(timeout=20)
                    break
                except subprocess.TimeoutExpired:
                    lost += 1
                    p.send_signal(signal.SIGINT)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        for r in readers:
            r.join(10)
        p.stdout.close()
        p.stderr.close()
    return left, p.returncode, "".join(err), lost


def _check(kind, files, rounds, seed):
    left, rc, err, lost = _interrupt(kind, files, rounds, seed)
    if lost:  # each lost press is CPython's: an "Exception ignored in" whose exception is the Ctrl-C
        blocks = err.split("Exception ignored in")[1:]
        assert blocks and all("KeyboardInterrupt" in b[:2000] for b in blocks), (
            f"{kind}: {lost} Ctrl-C lost without CPython's message:\n{err[-3000:]}"
        )
        err = err.replace("Exception ignored in", "(CPython dropped a Ctrl-C in)")
    assert left == [0] * rounds, f"{kind}: loader threads alive after each caught Ctrl-C: {left}\n{err[-3000:]}"
    # Python ends on an uncaught KeyboardInterrupt by killing itself with SIGINT (a shell
    # shows status 130), after printing the traceback.
    assert rc == -signal.SIGINT, f"{kind}: return code {rc}\n{err[-3000:]}"
    assert err.rstrip().splitlines()[-1] == "KeyboardInterrupt", f"{kind}:\n{err[-3000:]}"
    bad = [w for w in BAD_OUTPUT if w in err]
    assert not bad, f"{kind}: stderr says {bad}:\n{err[-3000:]}"


KINDS = ["jax", "torch", "mlx", "mix"]


def _run_all(files, rounds, seed):
    """Every kind at once (a child each, on threads here): their imports overlap."""
    kinds = [k for k in KINDS if k not in ("torch", "mlx") or _importable(k)]
    failures = {}

    def one(kind):
        try:
            _check(kind, files, rounds, seed)
        except AssertionError as e:
            failures[kind] = str(e)

    threads = [threading.Thread(target=one, args=(k,)) for k in kinds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, "\n\n".join(failures.values())


def _importable(kind):
    import importlib.util

    return importlib.util.find_spec("torch" if kind == "torch" else "mlx") is not None


def test_ctrl_c_at_random_moments_is_a_plain_keyboard_interrupt(files):
    """5 interrupts a loader kind (4 caught, 1 not), the kinds at once: ~4 s."""
    _run_all(files, rounds=4, seed=1)


def test_ctrl_c_at_random_moments_many_times(files):
    """The long version: 60 interrupts a loader kind (slow: conftest.SLOW_CASES)."""
    _run_all(files, rounds=59, seed=2)

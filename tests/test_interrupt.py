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
    stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [TESTS, env.get("PYTHONPATH", "")] if p)
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, *files, str(rounds)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rng, left, err, extra = random.Random(seed), [], [], 0
    # stderr is read as it comes, so that a child writing a lot never blocks on a full pipe.
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    reader.start()
    try:
        for _ in range(rounds + 1):
            if p.stdout.readline().strip() != "ready":
                break
            # A pass of this loop is 30-300 ms: moments spread over several passes.
            time.sleep(rng.uniform(0.05, 0.6))
            p.send_signal(signal.SIGINT)
            line = p.stdout.readline() if len(left) < rounds else ""
            if line.startswith("caught"):
                left.append(int(line.split()[1]))
        for _ in range(3):  # the last interrupt ends the process
            try:
                p.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                # jax's garbage-collection callback can swallow a Ctrl-C that lands in it
                # ("Exception ignored in: <function _xla_gc_callback"): press it again, as a
                # user would; _check accepts that only with jax's own message on stderr.
                extra += 1
                p.send_signal(signal.SIGINT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        reader.join(10)
        p.stdout.close()
        p.stderr.close()
    return left, p.returncode, "".join(err), extra


def _check(kind, files, rounds, seed):
    left, rc, err, extra = _interrupt(kind, files, rounds, seed)
    if extra:  # a swallowed Ctrl-C is jax's (its gc callback), never tbljax's
        assert "_xla_gc_callback" in err, f"{kind}: a Ctrl-C was swallowed without jax's message:\n{err[-3000:]}"
        err = "\n".join(x for x in err.splitlines() if "_xla_gc_callback" not in x and "Exception ignored" not in x)
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
    """10 interrupts a loader kind (9 caught, 1 not), the kinds at once: ~15 s."""
    _run_all(files, rounds=9, seed=1)


def test_ctrl_c_at_random_moments_many_times(files):
    """The long version: 60 interrupts a loader kind (slow: conftest.SLOW_CASES)."""
    _run_all(files, rounds=59, seed=2)

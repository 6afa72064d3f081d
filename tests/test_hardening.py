"""Hardening: fuzz-found inputs replayed through the Python API, conversions killed at random
moments, leaks over a thousand loader and dataset lifetimes, and many readers of one file at
once. (Hostile arguments, case by case, are in test_hostile.py.)"""

from __future__ import annotations

import gc
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import tbljax
from tbljax import _core

from _loader_testing import images, write_tbl

REGRESSIONS = Path(__file__).resolve().parent / "regressions"


# ---------------------------------------------------------------------------------------------
# Inputs that once failed (fuzz/README.md), each with the error it must give now.

TBL_REGRESSIONS = {
    # An LZ4 record whose index claims 1.6 GB from 12 stored bytes: verify() allocated it.
    "tbl-lz4-claims-1.6GB.bin": "LZ4 record claims 1660944383 bytes from 12 stored bytes",
}


@pytest.mark.parametrize("name", sorted(TBL_REGRESSIONS))
def test_fuzz_regression_tbl(name):
    with pytest.raises(tbljax.CorruptFileError, match=TBL_REGRESSIONS[name]):
        tbljax.open(REGRESSIONS / name)


def test_every_regression_file_is_tested():
    listed = set(TBL_REGRESSIONS)
    on_disk = {p.name for p in REGRESSIONS.glob("*.bin")}
    assert on_disk == listed, "add each file under tests/regressions/ to a table above"


_BIG_HEADER_CHILD = r"""
import resource, sys, numpy as np
from tbljax import _core
def claim(jpeg, w, h):  # the same bytes with a start-of-frame claiming w x h pixels
    j, i = bytearray(jpeg), 2
    while j[i + 1] not in (0xC0, 0xC2):
        i += 2 + int.from_bytes(j[i + 2:i + 4], "big")
    j[i + 5:i + 9] = h.to_bytes(2, "big") + w.to_bytes(2, "big")
    return bytes(j)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for progressive in (False, True):
    bad = claim(_core.encode_jpeg(np.zeros((16, 16, 3), np.uint8), 90, "420", progressive), 16384, 16384)
    for call in (lambda: _core.decode_jpeg(bad), lambda: _core.decode_resize(bad, 4096, "squash")):
        try:
            call()
            sys.exit("decoded a truncated image")
        except _core.DecodeError:
            pass
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_small_jpeg_claiming_a_huge_image_costs_little_memory():
    # Regression: a 631-byte JPEG whose header claims 16384 x 16384 made decode_jpeg zero-fill
    # an 805 MB buffer (0.7 s) before finding its data missing, per decoding thread.
    r = subprocess.run([sys.executable, "-c", _BIG_HEADER_CHILD], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert int(r.stdout) < 100, f"peak memory grew by {int(r.stdout)} MB"


# ---------------------------------------------------------------------------------------------
# Crash mid-write: SIGKILL a conversion at random moments.

_CONVERT_CHILD = r"""
import sys, tbljax
src, dst, overwrite = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
print("ready", flush=True)
tbljax.convert(src, dst, image_size=24, overwrite=overwrite, threads=1, progress=False)
"""
_N_SOURCE = 1500


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory):
    """An image folder of small JPEGs (3 classes), and how long converting it takes."""
    root = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(0)
    for i in range(_N_SOURCE):
        d = root / f"class{i % 3}"
        d.mkdir(exist_ok=True)
        (d / f"{i:05d}.jpg").write_bytes(_core.encode_jpeg(rng.integers(0, 256, (48, 40, 3), np.uint8), 80))
    t0 = time.perf_counter()
    tbljax.convert(root, root.parent / "timing.tbl", image_size=24, threads=1, progress=False)
    return root, time.perf_counter() - t0


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _temps(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if ".tbljax-tmp-" in p.name)


def _check_complete(dst: Path):
    ds = tbljax.open(dst)
    assert len(ds) == _N_SOURCE and ds.verify() == []
    assert np.bincount(ds.labels).tolist() == [_N_SOURCE // 3] * 3


def _kill_trials(src, seconds, out_dir: Path, trials: int, seed: int, env: dict) -> list[str]:
    """Starts `trials` conversions into out_dir/out.tbl and SIGKILLs each after a random delay
    (from the moment the child is ready to convert). Returns what each trial left."""
    rng = np.random.default_rng(seed)
    dst = out_dir / "out.tbl"
    outcomes = []
    for t in range(trials):
        # Both publish paths: even trials make a new file (link), odd ones replace (rename).
        overwrite = t % 2 == 1
        if not overwrite and dst.exists():
            dst.unlink()
        child = subprocess.Popen(
            [sys.executable, "-c", _CONVERT_CHILD, str(src), str(dst), str(int(overwrite))],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert child.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0, 1.3 * seconds))
        child.send_signal(signal.SIGKILL)
        rc = child.wait()
        child.stdout.close()
        if dst.exists():
            _check_complete(dst)  # complete and valid, never a partial file
        others = sorted(p.name for p in out_dir.iterdir() if p.name != "out.tbl" and ".tbljax-tmp-" not in p.name)
        assert others == []
        outcomes.append(f"rc={rc} dst={'yes' if dst.exists() else 'no'} temps={len(_temps(out_dir))}")
    return outcomes


@pytest.mark.parametrize("named_temp", [False, True], ids=["O_TMPFILE", "named-temp"])
def test_sigkill_mid_conversion_leaves_nothing_or_a_complete_file(jpeg_folder, tmp_path, named_temp, monkeypatch):
    src, seconds = jpeg_folder
    before = _tree_hash(src)
    if named_temp:  # the writer's path for filesystems without O_TMPFILE
        monkeypatch.setenv("TBLJAX_NO_O_TMPFILE", "1")
    outcomes = _kill_trials(
        src,
        seconds,
        tmp_path,
        trials=10 if not named_temp else 6,
        seed=1 if not named_temp else 2,
        env=dict(os.environ),
    )
    assert _tree_hash(src) == before, "the sources changed"
    # Running again succeeds, and removes the hidden files of the writers that were killed.
    tbljax.convert(src, tmp_path / "out.tbl", image_size=24, overwrite=True, progress=False)
    _check_complete(tmp_path / "out.tbl")
    assert _temps(tmp_path) == [], outcomes
    assert _tree_hash(src) == before


@pytest.mark.parametrize("named_temp", [False, True], ids=["O_TMPFILE", "named-temp"])
def test_failed_conversion_keeps_the_file_it_would_replace(tmp_path, named_temp, monkeypatch):
    """overwrite=True replaces dst only when the new file is complete: a conversion that stops
    (no record written, strict, a label table it cannot make) leaves the old file as it was."""
    if named_temp:
        monkeypatch.setenv("TBLJAX_NO_O_TMPFILE", "1")
    dst = tmp_path / "train.tbl"
    tbljax.convert(images(3), dst, image_size=8, progress=False)
    before = dst.read_bytes()
    failures = [
        dict(sources=[np.zeros((8, 8), np.float32)] * 3),  # every item bad
        dict(sources=[images(1)[0], np.zeros((8, 8), np.float32)], strict=True),  # strict stops
        dict(sources=images(2), labels=[1, "cat"]),  # ids and names mixed
    ]
    for kw in failures:
        with pytest.raises((tbljax.ConversionError, ValueError)):
            tbljax.convert(kw.pop("sources"), dst, image_size=8, overwrite=True, progress=False, **kw)
        assert dst.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["train.tbl"]
    assert len(tbljax.open(dst)) == 3


def test_named_temp_path_is_used_and_cleaned_on_abort(tmp_path, monkeypatch):
    monkeypatch.setenv("TBLJAX_NO_O_TMPFILE", "1")
    w = tbljax.Writer(tmp_path / "a.tbl", 1)
    names = _temps(tmp_path)
    host = socket.gethostname().replace("/", "_")
    assert len(names) == 1 and names[0].startswith(f".a.tbl.tbljax-tmp-{os.getpid()}-")
    assert names[0].endswith(f"-{host}")
    w.abort()
    assert list(tmp_path.iterdir()) == []
    with tbljax.Writer(tmp_path / "a.tbl", 1) as w:
        w.add_raw(images(1)[0])
    assert [p.name for p in tmp_path.iterdir()] == ["a.tbl"]


def test_stale_temp_cleanup_removes_only_dead_writers_of_this_host(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its PID names no process (PID reuse within this test is not a worry)
    host = socket.gethostname().replace("/", "_")
    names = {
        f".a.tbl.tbljax-tmp-{dead.pid}-0-{host}": False,  # killed writer here: removed
        f".a.tbl.tbljax-tmp-{dead.pid}-7-{host}": False,
        f".a.tbl.tbljax-tmp-{os.getpid()}-3-{host}": True,  # a live writer: kept
        f".a.tbl.tbljax-tmp-{dead.pid}-0-other-host": True,  # another host's: kept
        f".b.tbl.tbljax-tmp-{dead.pid}-0-{host}": True,  # another file's: kept
        f".a.tbl.tbljax-tmp-x{dead.pid}-0-{host}": True,  # not our form: kept
        "a.tbl.bak": True,
    }
    for n in names:
        (tmp_path / n).write_bytes(b"partial")
    with tbljax.Writer(tmp_path / "a.tbl", 1) as w:
        w.add_raw(images(1)[0])
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {n for n, kept in names.items() if kept} | {"a.tbl"}


# ---------------------------------------------------------------------------------------------
# Leaks: a thousand lifetimes of loaders and datasets.


def _counts():
    proc = psutil.Process()
    return dict(
        threads=threading.active_count(),
        tasks=len(os.listdir("/proc/self/task")),
        fds=len(os.listdir("/proc/self/fd")),
        rss=proc.memory_info().rss,
    )


@pytest.mark.slow  # about a minute on 2 cores; test_no_leaks_over_1000_dataset_lifetimes stays in the default run
def test_no_leaks_over_1000_loader_lifetimes(tmp_path):
    p = write_tbl(tmp_path / "a.tbl", images(64, 32, 32), np.arange(64))
    ds = tbljax.open(p)

    def cycle(k):
        ld = tbljax.loader(ds if k % 2 else p, 16, seed=k, augment="rrc_flip", prefetch=2)
        for step, batch in enumerate(ld):
            batch["image"].block_until_ready()
            if step == 2:
                break

    for k in range(50):  # warm-up: JAX's client, the kernel pool, allocator arenas
        cycle(k)
    gc.collect()
    base = _counts()
    for k in range(1000):
        cycle(k)
    gc.collect()
    end = _counts()
    # Each loader owns a producer thread and a ring of 5 host buffers of 196 KiB: a leak of
    # either would show as +1000 threads or ~1 GB.
    assert end["threads"] == base["threads"], (base, end)
    assert end["tasks"] <= base["tasks"] + 1, (base, end)
    assert end["fds"] <= base["fds"], (base, end)
    assert end["rss"] - base["rss"] < 48 << 20, (base, end)


def test_no_leaks_over_1000_dataset_lifetimes(tmp_path):
    p = write_tbl(tmp_path / "leak.tbl", images(8), np.arange(8))

    def mapped():
        with open("/proc/self/maps") as f:
            return sum(str(p) in line for line in f)

    base = _counts()
    for _ in range(1000):
        ds = tbljax.open(p)
        v = ds.view()
        assert int(v[3].sum()) >= 0 and ds.labels[7] == 7 and mapped() == 1
        ds.read_into(np.array([1, 2]), np.empty((2, 6, 5, 3), np.uint8))
        del ds, v
        assert mapped() == 0  # the mapping goes with its last user
    end = _counts()
    assert end["fds"] == base["fds"] and end["threads"] == base["threads"]
    assert end["rss"] - base["rss"] < 16 << 20, (base, end)


# ---------------------------------------------------------------------------------------------
# Concurrency: 4 processes and 4 threads read one file at once, each with its own seed.

_READER_CHILD = r"""
import sys, numpy as np, tbljax
path, refs, seed = sys.argv[1], np.load(sys.argv[2]), int(sys.argv[3])
ld = tbljax.loader(path, 16, seed=seed, num_epochs=2, augment="rrc_flip")
n = 0
for k, b in enumerate(ld):
    for key in ("image", "label", "index"):
        if not np.array_equal(np.asarray(b[key]), refs[f"{seed}/{k}/{key}"]):
            sys.exit(f"seed {seed}: batch {k} {key} differs from the single-reader reference")
    n += 1
print(n)
"""


def _batches(path, seed):
    ld = tbljax.loader(path, 16, seed=seed, num_epochs=2, augment="rrc_flip")
    return [{k: np.asarray(b[k]) for k in ("image", "label", "index")} for b in ld]


def test_four_processes_and_four_threads_read_one_file(tmp_path):
    p = write_tbl(tmp_path / "shared.tbl", images(200, 24, 24, seed=3), np.arange(200) % 7)
    seeds = range(8)
    refs = {s: _batches(p, s) for s in seeds}  # one reader at a time: the references
    assert all(len(r) == 24 for r in refs.values())
    np.savez(
        tmp_path / "refs.npz",
        **{f"{s}/{k}/{key}": v for s in seeds for k, b in enumerate(refs[s]) for key, v in b.items()},
    )

    children = [
        subprocess.Popen(
            [sys.executable, "-c", _READER_CHILD, str(p), str(tmp_path / "refs.npz"), str(s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for s in seeds[4:]
    ]
    results, errors = {}, []

    def read(seed):
        try:
            results[seed] = _batches(p, seed)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=read, args=(s,)) for s in seeds[:4]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for s in seeds[:4]:
        for k, (got, want) in enumerate(zip(results[s], refs[s], strict=True)):
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"seed {s} batch {k} {key}")
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err.decode()[-2000:]
        assert out.split()[-1] == b"24"

"""tbljax.stage against a real HTTP server on localhost (and fsspec's memory://): every file
staged is byte-identical to its source and verified; a rerun skips intact files, re-copies
damaged ones and resumes partial ones; a dropped connection is resumed where it broke; a
`tbljax stage` killed with SIGKILL mid-copy leaves no half file under a final name and a rerun
completes it; partitions over 2 and 3 processes are disjoint and cover all files; a part that
does not fit the budget is refused naming the sizes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tbljax
from tbljax._src.remote import staging

pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (pip install 'tbljax[http]')")

from _http_testing import Drop, Server  # noqa: E402 - after the skip


def make_tbls(root: Path, files: int = 5, records: int = 4, side: int = 64, seed: int = 0) -> list[Path]:
    """TBL shard files of random RAW records, labels and keys, written by tbljax.Writer."""
    rng = np.random.default_rng(seed)
    paths = []
    for f in range(files):
        p = root / f"train-{f:02d}.tbl"
        with tbljax.Writer(p, records) as w:
            for _ in range(records):
                w.add_raw(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
            w.set_metadata(labels=np.arange(records) + 10 * f, keys=[f"f{f}-{k}" for k in range(records)])
        paths.append(p)
    return paths


def assert_staged(cache: Path, sources: list[Path], present: list[Path] | None = None) -> None:
    """The cache holds exactly the `present` files (default: all), each equal to its source."""
    present = sources if present is None else present
    assert sorted(os.listdir(cache)) == sorted(p.name for p in present)
    for p in present:
        assert (cache / p.name).read_bytes() == p.read_bytes(), p.name
        assert tbljax.open(cache / p.name).verify() == []


@pytest.fixture
def server(tmp_path):
    (tmp_path / "www").mkdir()
    s = Server(tmp_path / "www")
    yield s
    s.close()


def stage(src, cache, **kw):
    return tbljax.stage(src, cache, retry_backoff=0.01, **kw)


def test_stage_copies_verifies_and_returns_every_path(server, tmp_path):
    srcs = make_tbls(server.root)
    cache = tmp_path / "cache"
    paths = stage(f"{server.url}/train-{{00..04}}.tbl", cache)
    assert paths == [str(cache / p.name) for p in srcs]
    assert_staged(cache, srcs)
    ds = tbljax.open(paths)
    assert ds.keys == [f"f{f}-{k}" for f in range(5) for k in range(4)]
    # A rerun asks only each file's size: every file is there and intact.
    gets = sum(len(server.gets(p.name)) for p in srcs)
    assert stage(f"{server.url}/train-*.tbl", cache) == paths
    assert sum(len(server.gets(p.name)) for p in srcs) == gets


def test_damaged_files_are_copied_again(server, tmp_path):
    srcs = make_tbls(server.root)
    cache = tmp_path / "cache"
    stage(f"{server.url}/train-{{00..04}}.tbl", cache)
    header = bytearray((cache / "train-01.tbl").read_bytes())
    header[9] ^= 0xFF  # the record count, under the header's CRC-32
    (cache / "train-01.tbl").write_bytes(bytes(header))
    (cache / "train-03.tbl").write_bytes(srcs[3].read_bytes()[:1000])  # truncated
    gets = {p.name: len(server.gets(p.name)) for p in srcs}
    stage(f"{server.url}/train-{{00..04}}.tbl", cache)
    assert_staged(cache, srcs)
    again = [p.name for p in srcs if len(server.gets(p.name)) > gets[p.name]]
    assert again == ["train-01.tbl", "train-03.tbl"]


def test_partial_copy_is_resumed_or_restarted(server, tmp_path):
    srcs = make_tbls(server.root, files=2, records=8, side=128)  # ~400 KB each
    cache = tmp_path / "cache"
    cache.mkdir()
    half = len(srcs[0].read_bytes()) // 2
    (cache / ".train-00.tbl.partial").write_bytes(srcs[0].read_bytes()[:half])  # a true prefix
    (cache / ".train-01.tbl.partial").write_bytes(os.urandom(half))  # stale bytes
    stage(f"{server.url}/train-{{00..01}}.tbl", cache)
    assert_staged(cache, srcs)
    # train-00: its tail compared (from half - 64 KiB), then only the rest asked for.
    assert server.gets("train-00.tbl") == [half - (64 << 10), half]
    assert server.gets("train-01.tbl") == [half - (64 << 10), 0]


def test_dropped_connection_is_resumed_where_it_broke(server, tmp_path, monkeypatch):
    srcs = make_tbls(server.root, files=2, records=8, side=128)
    monkeypatch.setattr(staging, "COPY_CHUNK", 100_000)  # several ranged reads per file
    server.drops["train-01.tbl"] = Drop(at=250_000, times=2)
    cache = tmp_path / "cache"
    stage(f"{server.url}/train-{{00..01}}.tbl", cache)
    assert_staged(cache, srcs)
    assert server.gets("train-01.tbl")[:5] == [0, 100_000, 200_000, 200_000, 200_000]


def test_source_that_keeps_failing_raises_naming_it(server, tmp_path):
    make_tbls(server.root, files=2)
    server.drops["train-01.tbl"] = Drop(at=100, times=-1)
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match=r"train-01\.tbl.*failed 3 times in a row"):
        stage(f"{server.url}/train-{{00..01}}.tbl", cache, retries=2)
    assert not (cache / "train-01.tbl").exists()


@pytest.mark.parametrize("n", [2, 3])
def test_partitions_are_disjoint_and_cover_all_files(server, tmp_path, n):
    srcs = make_tbls(server.root, files=7)
    seen: list[str] = []
    lists = []
    for i in range(n):
        cache = tmp_path / f"host{i}"
        lists.append(stage(f"{server.url}/train-{{00..06}}.tbl", cache, partition=(i, n)))
        here = sorted(os.listdir(cache))
        seen += here
        # Process i of n owns the contiguous block [i*7//n, (i+1)*7//n) (tbljax.host_part's rule).
        assert here == [p.name for p in srcs[i * 7 // n : (i + 1) * 7 // n]]
        assert_staged(cache, srcs, present=[p for p in srcs if p.name in here])
    assert sorted(seen) == sorted(p.name for p in srcs) and len(set(seen)) == 7
    assert [[os.path.basename(p) for p in paths] for paths in lists] == [[p.name for p in srcs]] * n


def test_host_partition_needs_the_jax_job(server, tmp_path):
    """'host' without jax.distributed (this test process) is refused before anything is copied,
    naming the ways out, instead of staging everything as a one-process job (tests/test_pod.py
    stages host parts in a real multi-process job)."""
    make_tbls(server.root, files=3)
    with pytest.raises(ValueError, match=r"jax.distributed is not initialized.*\(i, n\) or 'i/n'"):
        stage(f"{server.url}/train-{{00..02}}.tbl", tmp_path / "c", partition="host")
    assert not (tmp_path / "c").exists()
    assert staging.parse_partition("1/3", 7) == range(2, 4)
    for bad in ("3/3", "x", (1,), (-1, 2), "host2"):
        with pytest.raises(ValueError, match="partition"):
            staging.parse_partition(bad, 7)


def test_budget_and_sizes(server, tmp_path):
    srcs = make_tbls(server.root, files=4)
    total = sum(p.stat().st_size for p in srcs)
    cache = tmp_path / "cache"
    with pytest.raises(
        ValueError,
        match=rf"4 files of .* \({total} bytes\), more than the budget of "
        rf".* \({total - 1} bytes\)",
    ):
        stage(f"{server.url}/train-{{00..03}}.tbl", cache, budget_bytes=total - 1)
    assert os.listdir(cache) == []  # refused before copying anything
    half = sum(p.stat().st_size for p in srcs[2:])
    stage(f"{server.url}/train-{{00..03}}.tbl", cache, budget_bytes=half, partition=(1, 2))
    assert_staged(cache, srcs, present=srcs[2:])
    assert [staging.parse_size(s) for s in ("4096", "2K", "1.5M", "3G", "2KB", "1MiB", "1TB")] == [
        4096,
        2048,
        3 << 19,
        3 << 30,
        2000,
        1 << 20,
        10**12,
    ]
    with pytest.raises(ValueError, match="a size must look like"):
        staging.parse_size("12 parsecs")


def test_memory_url_and_local_path(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    (tmp_path / "src").mkdir()
    srcs = make_tbls(tmp_path / "src", files=3)
    mem = fsspec.filesystem("memory")
    for p in srcs:
        mem.pipe(f"/tbljax-stage/{p.name}", p.read_bytes())
    try:
        stage("memory://tbljax-stage/train-*.tbl", tmp_path / "m")
    finally:
        mem.rm("/tbljax-stage", recursive=True)
    assert_staged(tmp_path / "m", srcs)
    stage(str(tmp_path / "src" / "train-{00..02}.tbl"), tmp_path / "l")
    assert_staged(tmp_path / "l", srcs)


def test_not_a_tbl_file_is_refused_and_not_left(server, tmp_path):
    (server.root / "notes.tbl").write_bytes(b"not a TBL file" * 100)
    with pytest.raises(tbljax.CorruptFileError, match=r"notes\.tbl"):
        stage(f"{server.url}/notes.tbl", tmp_path / "c")
    assert os.listdir(tmp_path / "c") == []


def test_sigkill_mid_copy_then_rerun_completes(server, tmp_path):
    """`tbljax stage` killed with SIGKILL while copying over a slow link: no half file under a
    final name; the rerun resumes the partial copies and leaves exactly the files."""
    srcs = make_tbls(server.root, files=3, records=48, side=256)  # ~9.4 MB each: three ranged reads
    server.bytes_per_second = 3e6
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "tbljax", "stage", f"{server.url}/train-{{00..02}}.tbl", str(cache)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    partials: list[str] = []
    while time.monotonic() < deadline and proc.poll() is None:
        partials = (
            [n for n in os.listdir(cache) if n.endswith(".partial") and os.path.getsize(cache / n) > 0]
            if cache.is_dir()
            else []
        )
        if partials:
            break
        time.sleep(0.05)
    assert partials and proc.poll() is None, "the copy should be under way"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for p in srcs:  # whatever is under a final name is the whole file
        if (cache / p.name).exists():
            assert (cache / p.name).read_bytes() == p.read_bytes()
    kept = {n[1 : -len(".partial")]: os.path.getsize(cache / n) for n in os.listdir(cache) if n.endswith(".partial")}
    assert any(kept.values()) and all(size < srcs[0].stat().st_size for size in kept.values())
    server.bytes_per_second = None
    server.log.clear()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(cache / p.name) for p in srcs]
    assert_staged(cache, srcs)
    for name, size in kept.items():
        if size:  # resumed: the rerun read the tail it kept, then only the rest, in order
            gets = server.gets(name)
            assert gets[:2] == [size - (64 << 10), size] and gets[1:] == sorted(gets[1:]), (name, size, gets)


def test_cli_errors_are_one_line(server, tmp_path, capsys):
    from tbljax._src.tools.cli import main

    make_tbls(server.root, files=2)
    assert main(["stage", f"{server.url}/train-{{00..01}}.tbl", str(tmp_path / "c"), "--budget", "1K"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than the budget of 1.0 KiB (1024 bytes)" in err[0], err
    assert main(["stage", f"{server.url}/train-{{00..02}}.tbl", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train-02.tbl" in err[0], err
    assert main(["stage", f"{server.url}/train-{{00..01}}.tbl", str(tmp_path / "c"), "--partition", "1/2"]) == 0
    out = capsys.readouterr()
    assert out.out.split() == [str(tmp_path / "c" / f"train-{k:02d}.tbl") for k in range(2)]
    assert "1 of 2 files" in out.err and os.listdir(tmp_path / "c") == ["train-01.tbl"]

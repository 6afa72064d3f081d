"""Reading ahead (`LoaderOptions.read_ahead`, engine/plan.py): the batches are the same bit for bit
with it on or off (one file, shards, several processes); before step s is drawn (in the
producer's draw stage, a step ahead of its build) exactly the records of steps s..s+k have been
requested from the disk (posix_fadvise spied on and mapped back to record numbers), never more;
a warm file is not advised; JPEG/LZ4 files are not.

The sweep (engine/file_sweep.py): a cold source that fits in memory is asked for whole, front
to back, in the background, when this process reads all of it. A file dropped from the page
cache is resident again (mincore) after one step and the sweep; the requests are spied on and
compared with the records' bytes from the index (a host part: only its records); no sweep with
read_ahead=0, for a rank that reads part of each batch, or past the memory budget; closing the
loader stops it."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time

import numpy as np
import pytest

import tbljax
from tbljax import RowLayout
from tbljax._src.datasets.host_part import PartDataset
from tbljax._src.engine import file_sweep
from tbljax._src.engine.plan import Plan
from tbljax._src.engine.record_source import RecordSource
from tbljax._src.rules import order

import _loader_testing as T

N, H, W, G = 37, 6, 5, 8

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")


@pytest.fixture(params=[1, 3], ids=["one-file", "three-shards"])
def paths(request, tmp_path):
    imgs, labels = T.images(N, H, W, seed=5), (np.arange(N) * 3) % 7
    if request.param == 1:
        return [T.write_tbl(tmp_path / "a.tbl", imgs, labels)]
    cuts = [0, 10, 11, 37]  # uneven shards, one of a single record
    return [T.write_tbl(tmp_path / f"s{i}.tbl", imgs[a:b], labels[a:b]) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]


@pytest.fixture
def cold(monkeypatch):
    """Every step counts as not resident, so it is advised (small test files are always warm).
    The whole-source sweep is off: these tests count the per-step requests."""
    monkeypatch.setattr(RecordSource, "resident", lambda self, indices: False)
    monkeypatch.setattr(RecordSource, "sweep", lambda self: None)


@pytest.fixture
def advised(monkeypatch):
    """Every posix_fadvise call, in order, with the draws of the steps between them (the same
    thread makes both): ("advise", inode, offset, length, advice) and ("draw", records)."""
    log = []
    real = os.posix_fadvise

    def spy(fd, offset, length, advice):
        log.append(("advise", os.fstat(fd).st_ino, offset, length, advice))
        return real(fd, offset, length, advice)

    real_draw = Plan.draw

    def draw(self, epoch, first):
        drawn = real_draw(self, epoch, first)
        log.append(("draw", np.concatenate([records for *_, records in drawn])))
        return drawn

    monkeypatch.setattr(os, "posix_fadvise", spy)
    monkeypatch.setattr(Plan, "draw", draw)
    return log


def records_of(log, ds):
    """Translates the spied advise calls to global record indices (file by inode, then offset)."""
    starts = np.concatenate([[0], np.cumsum([len(v) for v in ds.shard_views()])[:-1]])
    inode = {os.stat(p).st_ino: k for k, p in enumerate(ds.paths)}
    where = {}
    for k in range(len(ds.paths)):
        for j in range(len(ds.shard_views()[k])):
            e = ds.index[starts[k] + j]
            where[(k, int(e["offset"]))] = (starts[k] + j, int(e["size"]))
    out = []
    for entry in log:
        if entry[0] == "draw":
            out.append(entry)
            continue
        _, ino, offset, length, advice = entry
        assert advice == os.POSIX_FADV_WILLNEED
        i, size = where[(inode[ino], offset)]
        assert length == size
        out.append(("advise", int(i)))
    return out


def serve(paths, read_ahead, layout=None, **kw):
    opts = tbljax.LoaderOptions(batch_size=G, seed=3, num_epochs=2, read_ahead=read_ahead, prefetch=1, **kw)
    ld = tbljax.HostLoader(tbljax.open(paths), opts, layout)
    return [
        (
            hb.epoch,
            hb.position,
            [np.array(x) for x in hb.images],
            [np.array(x) for x in hb.indices],
            [np.array(x) for x in hb.labels],
        )
        for hb in ld
    ]


@pytest.mark.parametrize(
    "kw",
    [dict(dtype="uint8"), dict(dtype="float32", augment="rrc_flip", drop_remainder=False)],
    ids=["u8", "f32-rrc-padded"],
)
def test_batches_are_the_same_with_read_ahead_on_and_off(paths, cold, kw):
    off = serve(paths, 0, **kw)
    for k in (1, 2, 5):
        on = serve(paths, k, **kw)
        assert len(on) == len(off) > 0
        for a, b in zip(on, off):
            assert a[:2] == b[:2]
            for xs, ys in zip(a[2:], b[2:]):
                for x, y in zip(xs, ys):
                    assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("rank,world", [(0, 1), (1, 2)], ids=["1-process", "rank1-of-2"])
def test_read_ahead_requests_exactly_the_next_k_steps(paths, cold, advised, k, rank, world):
    layout = RowLayout.for_rank(G, rank=rank, world_size=world)
    ld_steps = serve(paths, k, layout, drop_remainder=False)
    ds = tbljax.open(paths)
    log = records_of(advised, ds)
    # The steps of the pass (padded: the last one of each epoch is partial), this rank's rows.
    steps = [(e, first) for e in range(2) for first in range(0, N, G)]
    assert [(e, p) for e, p, *_ in ld_steps] == steps
    ((a, b),) = layout.ranges

    def rows(e, first):
        pos = np.arange(first + a, min(first + b, N), dtype=np.int64)
        return order.permute(pos, N, 3, e).tolist()

    draws = [i for i, entry in enumerate(log) if entry[0] == "draw"]
    assert len(draws) == len(steps)
    for s, at in enumerate(draws):
        asked = [entry[1] for entry in log[:at] if entry[0] == "advise"]
        want = [r for step in steps[: s + k + 1] for r in rows(*step)]
        assert asked == want, f"before step {s}"  # exactly steps 0..s+k, never further
        assert log[at][1].tolist() == rows(*steps[s])
    assert [entry[1] for entry in log if entry[0] == "advise"] == [
        r for step in steps for r in rows(*step)
    ]  # each record once, none past the end


def test_read_ahead_0_is_off_and_a_warm_file_is_not_advised(paths, advised):
    serve(paths, 0)
    assert not [e for e in advised if e[0] == "advise"]
    for p in paths:  # read every page: the file is resident now
        with open(p, "rb") as f:
            while f.read(1 << 20):
                pass
    serve(paths, 2)
    assert not [e for e in advised if e[0] == "advise"]


def test_lz4_files_are_not_advised_and_serve_the_same(tmp_path, cold, advised):
    imgs, labels = np.repeat(T.images(N, 1, W, seed=2), H, axis=1), np.arange(N) % 4
    raw, lz4 = T.write_tbl(tmp_path / "raw.tbl", imgs, labels), tmp_path / "lz4.tbl"
    with tbljax.Writer(lz4, N) as w:
        for im in imgs:
            w.add_raw(im, lz4=True)
        w.set_metadata(labels=labels)
    got, want = serve([lz4], 2, threads=1), serve([raw], 0)
    assert not [e for e in advised if e[0] == "advise"]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for xs, ys in zip(a[2:], b[2:]):
            for x, y in zip(xs, ys):
                np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_read_ahead_is_validated(bad):
    with pytest.raises(ValueError, match="read_ahead must be an integer >= 0"):
        tbljax.LoaderOptions(batch_size=4, read_ahead=bad)


def test_a_warm_file_is_checked_ever_less_often(paths, monkeypatch, advised):
    checks = []

    def resident(self, indices):
        checks.append(np.array(indices))
        return True

    monkeypatch.setattr(RecordSource, "resident", resident)
    serve(paths, 2, drop_remainder=False)  # 10 steps: checked at steps 0, 2 and 6
    first = [order.permute(np.array([p]), N, 3, e)[0] for e in range(2) for p in range(0, N, G)]
    assert [c[0] for c in checks] == [first[0], first[2], first[6]]
    assert not [e for e in advised if e[0] == "advise"]


def test_the_adapters_take_read_ahead_too(paths):
    import tbljax.mlx
    import tbljax.torch

    for make in (tbljax.torch.loader, tbljax.mlx.loader):
        if make is tbljax.torch.loader:
            pytest.importorskip("torch", reason="torch is not installed")
        else:
            pytest.importorskip("mlx.core", reason="MLX is not installed")
        assert make(paths, 2, read_ahead=0).options.read_ahead == 0
        assert make(paths, 2).options.read_ahead == 2
        with pytest.raises(ValueError, match="read_ahead must be an integer >= 0"):
            make(paths, 2, read_ahead=-1)


# ---- the sweep of a cold source ----


def test_source_runs_in_blocks_are_the_runs_of_all_records():
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 50, 1000)
    files = np.repeat([0, 1, 2], [400, 350, 250])
    offsets = np.concatenate(
        [
            np.cumsum(np.r_[0, sizes[:400][:-1]]),
            np.cumsum(np.r_[0, sizes[400:750][:-1]]),
            np.cumsum(np.r_[0, sizes[750:][:-1]]),
        ]
    )
    offsets[500:750] += 2 * file_sweep.MERGE_GAP  # a hole in file 1, past the merge gap

    def byte_ranges(indices):
        return files[indices], offsets[indices], sizes[indices]

    want = [
        (0, 0, int(sizes[:400].sum())),
        (1, 0, int(offsets[499] + sizes[499])),
        (1, int(offsets[500]), int(offsets[749] + sizes[749])),
        (2, 0, int(sizes[750:].sum())),
    ]
    for block in (1, 7, 100, 1000, 5000):
        assert file_sweep.source_runs(byte_ranges, 1000, block=block) == want, block


def test_byte_runs_cover_the_records_and_merge_close_ones():
    files = [1, 0, 0, 0, 1, 0]
    offsets = [100, 5000, 0, 10, 40, 10_000]
    sizes = [50, 100, 10, 20, 30, 1]
    # File 0: [0,10) and [10,30) touch; [5000,5100) starts 4970 past them, [10000,10001) 4900
    # past that; file 1's two records are 30 apart.
    assert file_sweep.byte_runs(files, offsets, sizes, gap=4960) == [(0, 0, 30), (0, 5000, 10_001), (1, 40, 150)]
    assert file_sweep.byte_runs(files, offsets, sizes, gap=0) == [
        (0, 0, 30),
        (0, 5000, 5100),
        (0, 10_000, 10_001),
        (1, 40, 70),
        (1, 100, 150),
    ]
    # A record inside another's bytes does not end the run early.
    assert file_sweep.byte_runs([0, 0, 0], [0, 10, 200], [100, 5, 10], gap=50) == [(0, 0, 100), (0, 200, 210)]


@pytest.fixture
def sweep_spy(monkeypatch):
    """Every request the sweep thread makes: (inode, offset, length); and the sweeps started."""
    return T.spy_on_sweeps(monkeypatch)


def record_span(path, lo, hi):
    index = tbljax.open(path).index
    return int(index["offset"][lo]), int(index["offset"][hi - 1]) + int(index["size"][hi - 1])


def test_the_sweep_asks_for_every_record_in_chunks(paths, monkeypatch, sweep_spy):
    calls, started = sweep_spy
    monkeypatch.setattr(RecordSource, "resident", lambda self, indices: False)
    serve(paths, 1)
    (sw,) = started  # once a pass, at the first cold step
    assert sw is not None and sw.join(30)
    assert all(n <= file_sweep.CHUNK for _, _, n in calls)
    for p in paths:
        n = len(tbljax.open(p))
        assert T.spans(calls, os.stat(p).st_ino) == [record_span(p, 0, n)]
    assert sw.bytes == sum(np.diff(record_span(p, 0, len(tbljax.open(p))))[0] for p in paths)


def test_a_host_part_is_swept_alone(tmp_path, monkeypatch, sweep_spy):
    calls, started = sweep_spy
    path = T.write_tbl(tmp_path / "a.tbl", T.images(N, 64, 64, seed=1), np.arange(N) % 3)
    ds = tbljax.open(path)
    part = PartDataset(ds, 9, 30, ds.fingerprint)
    sw = RecordSource(part, 0).sweep()
    assert sw is not None and sw.join(30)
    assert T.spans(calls, os.stat(path).st_ino) == [record_span(path, 9, 30)]


@pytest.mark.parametrize("case", ["read_ahead=0", "rank1-of-2", "over-budget", "warm"])
def test_no_sweep_where_it_does_not_pay(paths, monkeypatch, sweep_spy, case):
    calls, started = sweep_spy
    if case != "warm":
        monkeypatch.setattr(RecordSource, "resident", lambda self, indices: False)
    if case == "over-budget":  # one byte short of the records' bytes
        size = sum(int(np.diff(record_span(p, 0, len(tbljax.open(p))))[0]) for p in paths)
        monkeypatch.setattr(file_sweep, "memory_for_sweeps", lambda: size - 1)
    if case == "warm":
        for p in paths:
            with open(p, "rb") as f:
                f.read()
    layout = RowLayout.for_rank(G, rank=1, world_size=2) if case == "rank1-of-2" else None
    serve(paths, 0 if case == "read_ahead=0" else 2, layout)
    if case == "over-budget":  # started at the first cold step, it finds the records too big
        (sw,) = started
        assert sw.join(30) and sw.bytes == 0
    else:
        assert started == []
    assert calls == []


def test_a_sweep_that_cannot_find_its_records_ends_quietly(monkeypatch):
    hooks = []
    monkeypatch.setattr(threading, "excepthook", hooks.append)

    def byte_ranges(indices):
        raise ValueError("the dataset was closed")

    sw = file_sweep.FileSweep(["/nonexistent"], byte_ranges, 5, 1 << 30)
    assert sw.join(30) and sw.bytes == 0 and hooks == []
    # A file that cannot be opened is skipped the same way.
    sw = file_sweep.FileSweep(["/nonexistent"], lambda i: (i * 0, i * 10, i * 0 + 10), 5, 1 << 30)
    assert sw.join(30) and sw.bytes == 50 and hooks == []


def test_memory_for_sweeps_is_half_of_what_is_available():
    budget = file_sweep.memory_for_sweeps()
    if budget is None:
        pytest.skip("no /proc/meminfo here")
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    assert 0 <= budget <= avail // 2 + (64 << 20)  # MemAvailable moves between the two reads


def _resident(path) -> float:
    """Share of the file's pages in the page cache (mincore on a fresh mapping)."""
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    view = np.frombuffer(m, np.uint8)  # only for the mapping's address: touches no page
    try:
        addr = view.__array_interface__["data"][0]
        vec = np.zeros(-(-size // mmap.PAGESIZE), np.uint8)
        if libc.mincore(ctypes.c_void_p(addr), size, vec.ctypes.data) != 0:
            pytest.skip("mincore failed here")
        return float(np.mean(vec & 1))
    finally:
        del view
        m.close()


def _drop(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("sweep", [True, False], ids=["swept", "control"])
def test_a_cold_file_is_in_the_page_cache_after_one_step_and_the_sweep(tmp_path, monkeypatch, sweep_spy, sweep):
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("the sweep runs where the available memory is known (Linux)")
    calls, started = sweep_spy
    if not sweep:
        monkeypatch.setattr(file_sweep, "memory_for_sweeps", lambda: 0)
    imgs = T.images(96, 256, 320, seed=4)  # 23.6 MB
    path = T.write_tbl(tmp_path / "big.tbl", imgs, np.arange(96) % 5)
    ld = tbljax.HostLoader(
        tbljax.open(path),
        tbljax.LoaderOptions(batch_size=4, seed=1, num_epochs=1, prefetch=1, dtype="uint8", read_ahead=1),
    )
    _drop(path)  # after opening: the header's pages, mapped, stay; no record is left
    if _resident(path) > 0.05:
        pytest.skip(f"{tmp_path} cannot be dropped from the page cache (tmpfs?)")
    it = iter(ld)
    hb = next(it)
    np.testing.assert_array_equal(np.array(hb.image), imgs[np.array(hb.index)])
    (sw,) = started
    if sweep:
        assert sw.join(30)
        deadline = time.monotonic() + 30  # the requests are made; the reads may still run
        while _resident(path) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _resident(path) == 1.0  # all 96 records, not just the 2 steps read ahead
    else:
        assert sw.join(30) and sw.bytes == 0  # the budget of 0: nothing asked for
        time.sleep(0.2)
        assert _resident(path) < 0.9  # without the sweep, most records are still on disk
    del it, hb


def test_closing_the_loader_stops_the_sweep(tmp_path, monkeypatch, sweep_spy):
    calls, started = sweep_spy
    path = T.write_tbl(tmp_path / "big.tbl", T.images(64, 128, 128, seed=2), np.arange(64) % 5)
    monkeypatch.setattr(RecordSource, "resident", lambda self, indices: False)
    spy = os.posix_fadvise

    def slow(fd, offset, length, advice):  # the sweep's requests take 20 ms each
        if threading.current_thread().name == "tbljax-file-sweep":
            time.sleep(0.02)
        return spy(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", slow)
    ld = tbljax.HostLoader(tbljax.open(path), tbljax.LoaderOptions(batch_size=4, num_epochs=1, prefetch=1))
    it = iter(ld)
    next(it)
    it.close()
    (sw,) = started
    assert sw.join(5)  # ends within a request of the stop
    chunks = -(-(np.diff(record_span(path, 0, 64))[0]) // file_sweep.CHUNK)
    assert len(calls) < chunks  # stopped before the end (3.1 MB: 25 chunks, 0.5 s)


def fake_system(tmp_path, avail_kib: int, cgroup_line: str | None, limit: str | None, current: int = 0):
    """A /proc/meminfo, /proc/self/cgroup and cgroup v2 tree of our own (engine/memory.Paths)."""
    from tbljax._src.engine import memory

    (tmp_path / "meminfo").write_text(f"MemTotal:       99999999 kB\nMemAvailable:   {avail_kib} kB\n")
    if cgroup_line is not None:
        (tmp_path / "cgroup").write_text(cgroup_line + "\n")
    if limit is not None:
        (tmp_path / "root" / "job").mkdir(parents=True)
        (tmp_path / "root" / "job" / "memory.max").write_text(limit + "\n")
        (tmp_path / "root" / "job" / "memory.current").write_text(f"{current}\n")
    return memory.Paths(str(tmp_path / "meminfo"), str(tmp_path / "cgroup"), str(tmp_path / "root"))


@pytest.mark.parametrize(
    "cgroup_line, limit, current, want",
    [
        ("0::/job", str(3 << 30), 1 << 30, 2 << 30),  # the container's limit, less its use, is lower
        ("0::/job", str(64 << 30), 0, 4 << 30),  # a limit above MemAvailable changes nothing
        ("0::/job", "max", 0, 4 << 30),  # no limit
        ("0::/job", None, 0, 4 << 30),  # no memory controller in the cgroup
        ("4:memory:/job", str(1 << 30), 0, 4 << 30),  # cgroup v1 only: not read
        (None, None, 0, 4 << 30),  # no cgroup file (not Linux-like)
        ("0::/job", str(1 << 30), 2 << 30, 0),  # over its limit already: nothing left
    ],
)
def test_available_memory_counts_the_cgroup_limit(tmp_path, cgroup_line, limit, current, want):
    from tbljax._src.engine import memory

    assert memory.available_bytes(fake_system(tmp_path, 4 << 20, cgroup_line, limit, current)) == want


def test_the_sweep_and_the_resident_check_use_the_cgroup_limit(tmp_path, monkeypatch):
    # Issue 44 §4: both budgets follow one rule; a container's limit below MemAvailable bounds both.
    import jax

    from tbljax._src.engine import memory
    from tbljax._src.jax.resident_host import check_device_memory

    monkeypatch.setattr(memory, "SYSTEM", fake_system(tmp_path, 64 << 20, "0::/job", str(3 << 30), 1 << 30))
    assert file_sweep.memory_for_sweeps() == 1 << 30
    one = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    check_device_memory((1, (2 << 30) - 1), one, None)  # fits the 2 GiB the cgroup leaves
    with pytest.raises(MemoryError, match=r"but only 2048.0 MiB fit \(available host RAM \(2.0 GiB\)"):
        check_device_memory((1, (2 << 30) + 1), one, None)

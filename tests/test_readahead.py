"""Reading ahead (`LoaderOptions.read_ahead`, engine/plan.py): the batches are the same bit for bit
with it on or off (one file, shards, several processes); before step s is drawn (in the
producer's draw stage, a step ahead of its build) exactly the records of steps s..s+k have been
requested from the disk (posix_fadvise spied on and mapped back to record numbers), never more;
a warm file is not advised; JPEG/LZ4 files are not."""
from __future__ import annotations

import os

import numpy as np
import pytest

import _loader_testing as T

import tbljax
from tbljax._src.rules import order
from tbljax import RowLayout
from tbljax._src.engine.plan import Plan
from tbljax._src.engine.record_source import RecordSource

N, H, W, G = 37, 6, 5, 8

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")


@pytest.fixture(params=[1, 3], ids=["one-file", "three-shards"])
def paths(request, tmp_path):
    imgs, labels = T.images(N, H, W, seed=5), (np.arange(N) * 3) % 7
    if request.param == 1:
        return [T.write_tbl(tmp_path / "a.tbl", imgs, labels)]
    cuts = [0, 10, 11, 37]  # uneven shards, one of a single record
    return [T.write_tbl(tmp_path / f"s{i}.tbl", imgs[a:b], labels[a:b])
            for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]


@pytest.fixture
def cold(monkeypatch):
    """Every step counts as not resident, so it is advised (small test files are always warm)."""
    monkeypatch.setattr(RecordSource, "resident", lambda self, indices: False)


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
    opts = tbljax.LoaderOptions(batch_size=G, seed=3, num_epochs=2, read_ahead=read_ahead,
                                prefetch=1, **kw)
    ld = tbljax.HostLoader(tbljax.open(paths), opts, layout)
    return [(hb.epoch, hb.position, [np.array(x) for x in hb.images],
             [np.array(x) for x in hb.indices], [np.array(x) for x in hb.labels]) for hb in ld]


@pytest.mark.parametrize("kw", [dict(dtype="uint8"), dict(dtype="float32", augment="rrc_flip",
                                                            drop_remainder=False)],
                         ids=["u8", "f32-rrc-padded"])
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
    (a, b), = layout.ranges

    def rows(e, first):
        pos = np.arange(first + a, min(first + b, N), dtype=np.int64)
        return order.permute(pos, N, 3, e).tolist()

    draws = [i for i, entry in enumerate(log) if entry[0] == "draw"]
    assert len(draws) == len(steps)
    for s, at in enumerate(draws):
        asked = [entry[1] for entry in log[:at] if entry[0] == "advise"]
        want = [r for step in steps[:s + k + 1] for r in rows(*step)]
        assert asked == want, f"before step {s}"  # exactly steps 0..s+k, never further
        assert log[at][1].tolist() == rows(*steps[s])
    assert [entry[1] for entry in log if entry[0] == "advise"] == \
        [r for step in steps for r in rows(*step)]  # each record once, none past the end


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

"""Helpers for the loader tests and their subprocesses: small TBL files (and resident ones of
records at many sizes), the normalization oracle (tests/oracle.py), one epoch of the host
loader and a bit-for-bit comparison of batches, the rows a process holds, a spy on the
whole-source sweep, and two host parts served side by side in threads."""

from __future__ import annotations

import os
import threading

import numpy as np

import oracle


def images(n, h=6, w=5, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def write_tbl(path, imgs, labels):
    from tbljax._src.file.format import Writer

    with Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(labels=labels)
    return path


def resident_of_sizes(path, sizes, rng, image_size):
    """A TBL file of random RGB records at `sizes` (h, w), labels i % 5 and a float16 "emb" field
    of 3, stored at their own sizes up to `image_size`: (path, its ResidentDataset)."""
    import tbljax

    src = {
        "image": [rng.integers(0, 256, (h, w, 3), np.uint8) for h, w in sizes],
        "label": np.arange(len(sizes)) % 5,
        "emb": rng.standard_normal((len(sizes), 3)).astype(np.float16),
    }
    tbljax.convert(src, path, image_size=image_size, resize="max_side", progress=False)
    return path, tbljax.ResidentDataset(path)


def normalize(pixels, mean, std, dtype=np.float32, layout="NHWC"):
    """The normalization contract (tests/oracle.py)."""
    return oracle.normalize(pixels, mean, std, dtype, layout)


def loader_epoch(path, batch_size, epoch, **kw):
    """Epoch `epoch` of the host loader `tbljax.loader(path, batch_size, **kw)`, its batches as NumPy."""
    import tbljax

    ld = tbljax.loader(path, batch_size, num_epochs=epoch + 1, **kw)
    ld.set_epoch(epoch)
    return [{k: np.asarray(v) for k, v in b.items()} for b in ld]


def same_batch(got, want, where):
    """`got` is the batch `want` bit for bit: the same keys, each of the same dtype, shape and bytes."""
    assert sorted(got) == sorted(want), where
    for k in want:
        a, b = np.asarray(got[k]), want[k]
        assert a.dtype == b.dtype and a.shape == b.shape, (where, k, a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=f"{where}: {k}")


def rows(arr):
    """A global jax.Array's rows this process holds, as {global row: numpy row}."""
    out = {}
    for shard in arr.addressable_shards:
        start = shard.index[0].start or 0
        data = np.asarray(shard.data)
        for k in range(len(data)):
            out[start + k] = data[k]
    return out


def spy_on_sweeps(monkeypatch, run_to_end=False):
    """Records every request the sweep thread makes, (inode, offset, length), and every sweep
    started (`RecordSource.sweep`'s result, None included): returns (requests, sweeps).
    `run_to_end`: a sweep ignores the pass's stop (tiny passes end before a sweep would)."""
    from tbljax._src.engine.record_source import RecordSource

    requests, sweeps = [], []
    real_advise, real_sweep = os.posix_fadvise, RecordSource.sweep

    def advise(fd, offset, length, advice):
        if threading.current_thread().name == "tbljax-file-sweep":
            requests.append((os.fstat(fd).st_ino, offset, length))
        return real_advise(fd, offset, length, advice)

    def sweep(self):
        sweeps.append(real_sweep(self))
        if run_to_end and sweeps[-1] is not None:
            sweeps[-1].stop = lambda: None
        return sweeps[-1]

    monkeypatch.setattr(os, "posix_fadvise", advise)
    monkeypatch.setattr(RecordSource, "sweep", sweep)
    return requests, sweeps


def spans(calls, inode):
    """The byte ranges asked for in one file (`spy_on_sweeps`' requests), joined where one
    ends at the next one's start: a hole or an overlap leaves two spans."""
    out = []
    for _, a, n in sorted(c for c in calls if c[0] == inode):
        if out and a == out[-1][1]:
            out[-1][1] = a + n
        else:
            out.append([a, a + n])
    return [tuple(x) for x in out]


def two_host_parts(what, opts):
    """Each rank's HostBatches of `what` (a path or a tbljax.mix) under partition="host" at 2
    ranks: two threads open their parts, exchanging their sizes as the processes of a job do."""
    import tbljax
    from tbljax._src.datasets import opening

    barrier, exchanged, got = threading.Barrier(2), [None, None], {}

    def serve(rank):
        def allgather(row):
            exchanged[rank] = np.asarray(row)
            barrier.wait()
            out = np.stack(exchanged)
            barrier.wait()  # both read before either writes its next row (a mixture: one a source)
            return out

        try:
            ds, parts = opening.open_host_part(what, opts.batch_size, rank, 2, allgather)
            layout = tbljax.RowLayout.for_rank(opts.batch_size, rank, 2).process_local(2)
            got[rank] = list(tbljax.HostLoader(ds, opts, layout, parts=parts))
        except Exception as e:  # raised in the test's thread below
            got[rank] = e
            barrier.abort()  # the other rank stops waiting for this one

    threads = [threading.Thread(target=serve, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for rank in (0, 1):
        if isinstance(got.get(rank), Exception):
            raise got[rank]
        assert got.get(rank), f"rank {rank} served nothing"
    return [got[0], got[1]]

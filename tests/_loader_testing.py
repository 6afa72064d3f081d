"""Helpers for the loader tests and their subprocesses: small TBL files, the normalization
oracle (tests/oracle.py) and the rows a process holds."""
from __future__ import annotations

import numpy as np
import oracle


def images(n, h=6, w=5, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def write_tbl(path, imgs, labels):
    from tbljax._src.io.format import Writer

    with Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(labels=labels)
    return path


def normalize(pixels, mean, std, dtype=np.float32, layout="NHWC"):
    """The normalization contract (tests/oracle.py)."""
    return oracle.normalize(pixels, mean, std, dtype, layout)


def rows(arr):
    """A global jax.Array's rows this process holds, as {global row: numpy row}."""
    out = {}
    for shard in arr.addressable_shards:
        start = shard.index[0].start or 0
        data = np.asarray(shard.data)
        for k in range(len(data)):
            out[start + k] = data[k]
    return out

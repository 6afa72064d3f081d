"""Helpers for the loader tests and their subprocesses: small TBL files and plain-NumPy
references (normalization, nearest bfloat16, the rows a process holds)."""
from __future__ import annotations

import numpy as np


def images(n, h=6, w=5, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def write_tbl(path, imgs, labels):
    from tbljax.format import Writer

    with Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(labels=labels)
    return path


def normalize(pixels, mean, std, dtype=np.float32, layout="NHWC"):
    """The normalization contract in plain NumPy: nearest `dtype` to float64 (x/255-m)/s."""
    x = (pixels.astype(np.float64) / 255.0 - np.asarray(mean)) / np.asarray(std)
    if layout == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    if np.dtype(dtype).name == "bfloat16":
        return _nearest_bfloat16(x)
    return x.astype(dtype)


def _nearest_bfloat16(x):
    """Nearest bfloat16 to each float64 (ties to even), by search over all finite bfloat16s:
    no conversion routine involved (NumPy's astype would round twice, through float32)."""
    import ml_dtypes

    bits = np.arange(1 << 16, dtype=np.uint32)
    bits = bits[((bits >> 7) & 0xFF) != 0xFF]  # finite only: exponent not all ones
    bits = bits[bits != 0x8000]                # one zero
    vals = (bits << 16).view(np.float32).astype(np.float64)  # bfloat16 = top half of float32
    order_ = np.argsort(vals)
    vals, bits = vals[order_], bits[order_]
    hi = np.clip(np.searchsorted(vals, x), 1, len(vals) - 1)
    lo = hi - 1
    d_lo, d_hi = x - vals[lo], vals[hi] - x
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (bits[hi] % 2 == 0))
    return np.where(pick_hi, bits[hi], bits[lo]).astype(np.uint16).view(ml_dtypes.bfloat16)


def rows(arr):
    """A global jax.Array's rows this process holds, as {global row: numpy row}."""
    out = {}
    for shard in arr.addressable_shards:
        start = shard.index[0].start or 0
        data = np.asarray(shard.data)
        for k in range(len(data)):
            out[start + k] = data[k]
    return out

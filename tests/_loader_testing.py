"""Helpers for the loader tests and their subprocesses: small TBL files, plain-NumPy references,
and a NumPy stand-in for `tbljax.kernels.gather`, installed only while that module is absent
from this branch (it never ships in the package)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import numpy as np


def _gather_standin(source, indices, out, *, layout="NHWC", crop=None, flip=None, mean=None,
                    std=None):
    """Same signature and contract as tbljax.kernels.gather, written plainly in NumPy."""
    shards = list(source) if isinstance(source, (list, tuple)) else [source]
    starts = np.cumsum([0] + [len(s) for s in shards])
    indices = np.asarray(indices, np.int64)
    oh, ow = (out.shape[1], out.shape[2]) if layout == "NHWC" else (out.shape[2], out.shape[3])
    for row, i in enumerate(indices):
        k = int(np.searchsorted(starts, i, side="right") - 1)
        img = shards[k][i - starts[k]].astype(np.float64)
        if crop is not None:
            y0, x0, h, w = (int(v) for v in crop[row])
            img = _bilinear(img[y0:y0 + h, x0:x0 + w], oh, ow)
        if flip is not None and flip[row]:
            img = img[:, ::-1]
        if mean is not None:
            img = (img / 255.0 - np.asarray(mean)) / np.asarray(std)
        if layout == "NCHW":
            img = img.transpose(2, 0, 1)
        out[row] = img.astype(out.dtype)
    return out


def _bilinear(img, oh, ow):
    h, w = img.shape[:2]
    ys = np.clip((np.arange(oh) + 0.5) * h / oh - 0.5, 0, h - 1)
    xs = np.clip((np.arange(ow) + 0.5) * w / ow - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    bot = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    return np.rint(top * (1 - fy) + bot * fy)


def install_kernel_standin() -> bool:
    """Makes `tbljax.kernels` importable: the real module when present, else the stand-in."""
    import tbljax

    if importlib.util.find_spec("tbljax.kernels") is not None:
        importlib.import_module("tbljax.kernels")
        return False
    mod = types.ModuleType("tbljax.kernels", "NumPy stand-in for tests (the kernel is not built).")
    mod.gather = _gather_standin
    sys.modules["tbljax.kernels"] = mod
    tbljax.kernels = mod
    return True


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

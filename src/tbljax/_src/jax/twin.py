"""The pure-JAX twin of the gather: the formulas of ffi/core/serve/kernel.h in jax.numpy (exact
int32 arithmetic, then one table look-up per value), bit-identical with the C++ kernel on every
platform, and `normalize`, the normalization contract as that look-up on its own."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tbljax._src.engine import kernels as _kernels
from tbljax._src.jax.packed import PAGE_BYTES, PackedRecords
from tbljax._src.rules import contract

__all__ = ["lookup", "normalization_table", "normalize", "out_dtype", "twin_gather", "twin_patches"]

_ONE_BITS = contract.RESIZE_WEIGHT_BITS
_ROUND_SHIFT = 2 * _ONE_BITS  # acc carries weights of 2^11 on each axis


def _max_taps(length: int, out_len: int) -> int:
    """kernel.h: an output coordinate reads at most 2*max(len, out)/out + 1 box pixels."""
    return 2 * max(length, out_len) // out_len + 1


def _axis_weights(o, length, out_len: int, taps: int):
    """kernel.h's taps of output coordinates `o` (..., O) for box lengths `length` (..., 1):
    the first box pixel (..., O) and `taps` weights each (..., O, taps), zero past the run.
    `out_len`: an int, or each row's own as an int32 array shaped like `length`.
    int32 throughout; exact (kernel.h bounds every intermediate below 2^31)."""
    m2 = 2 * jnp.maximum(length, out_len)
    c = (2 * o + 1) * length - out_len
    lo = jnp.maximum((c - m2) // (2 * out_len) + 1, 0)  # floor division, as kernel.h
    j = lo[..., None] + jnp.arange(taps, dtype=jnp.int32)
    length = length[..., None]
    n = out_len[..., None] if jnp.ndim(out_len) else out_len  # per-row sizes (NaFlex rows): (..., 1, 1)
    d = jnp.abs((2 * j + 1) * n - (2 * o[..., None] + 1) * length)
    u = jnp.where(j < length, jnp.maximum(m2[..., None] - d, 0), 0)
    total = jnp.sum(u, axis=-1, keepdims=True, dtype=jnp.int32)  # int32 under x64 too
    n = u * (1 << _ONE_BITS)
    q, r = n // total, n % total
    w = q + (r >= total - r).astype(jnp.int32) * (u > 0)
    rest = (1 << _ONE_BITS) - jnp.sum(w, axis=-1, keepdims=True, dtype=jnp.int32)
    big = jnp.argmax(w, axis=-1)[..., None]  # the first largest
    w = w + jnp.where(jnp.arange(taps, dtype=jnp.int32) == big, rest, 0)
    return lo, w


def twin_gather(data, indices, *, crop=None, flip=None, out_size=None, table=None, layout: str = "NHWC"):
    """The kernel's semantics in jax.numpy, with arguments already checked by
    `gather_normalize`: ``data`` uint8 (N, H, W, 3) or `PackedRecords`, int ``indices`` (B,),
    int32 ``crop`` (B, 4) or None (uniform data only), bool ``flip`` (B,) or None,
    ``out_size`` (OH, OW), ``table`` a (3, 256) float32/bfloat16 normalization table or None
    for uint8 output. Bit-exact with the C++ kernel by construction: exact int32 arithmetic
    (kernel.h's double sum over the filter taps), then one table look-up per value."""
    packed = isinstance(data, PackedRecords)
    if packed:
        rec = data.table[indices]  # (B, 3)
        first, rec_w = rec[:, 0, None, None], rec[:, 2, None, None]
        max_h = max_w = data.max_side

        def at(sy, sx):  # (B, OH, OW, 3) int32: pixel triplets of each sample's record
            o = (sy[:, :, None] * rec_w + sx[:, None, :]) * 3
            o = o[..., None] + jnp.arange(3, dtype=jnp.int32)
            return data.pages[first[..., None] + o // PAGE_BYTES, o % PAGE_BYTES].astype(jnp.int32)
    else:
        _, max_h, max_w, _ = data.shape
        idx = indices[:, None, None]

        def at(sy, sx):
            return data[idx, sy[:, :, None], sx[:, None, :]].astype(jnp.int32)

    oh, ow = out_size if out_size is not None else (max_h, max_w)
    # Flip mirrors output columns, so it folds into which column each output reads.
    ox = jnp.arange(ow, dtype=jnp.int32)[None, :]
    if flip is not None:
        ox = jnp.where(flip[:, None], ow - 1 - ox, ox)
    if crop is None:
        rows = jnp.arange(max_h, dtype=jnp.int32)[None, :, None]
        pix = data[idx, rows, ox[:, None, :]] if flip is not None else data[indices]
    else:
        crop = crop.astype(jnp.int32)
        oy = jnp.broadcast_to(jnp.arange(oh, dtype=jnp.int32)[None, :], (crop.shape[0], oh))
        ky, kx = _max_taps(max_h, oh), _max_taps(max_w, ow)
        ly, wy = _axis_weights(oy, crop[:, 2:3], oh, ky)  # (B, OH), (B, OH, ky)
        lx, wx = _axis_weights(ox, crop[:, 3:4], ow, kx)  # (B, OW), (B, OW, kx)
        sy0, sx0 = crop[:, :1] + ly, crop[:, 1:2] + lx
        y_last, x_last = crop[:, :1] + crop[:, 2:3] - 1, crop[:, 1:2] + crop[:, 3:4] - 1
        acc = jnp.zeros((crop.shape[0], oh, ow, 3), jnp.int32)
        for a in range(ky):  # sum over taps; a zero weight's pixel is clamped into the box
            sy = jnp.minimum(sy0 + a, y_last)
            row = jnp.zeros_like(acc)
            for b in range(kx):
                sx = jnp.minimum(sx0 + b, x_last)
                row = row + wx[:, None, :, b, None] * at(sy, sx)
            acc = acc + wy[:, :, a, None, None] * row
        pix = ((acc + (1 << (_ROUND_SHIFT - 1))) >> _ROUND_SHIFT).astype(jnp.uint8)
    out = pix if table is None else lookup(pix, table, channel_axis=-1)
    return out.transpose(0, 3, 1, 2) if layout == "NCHW" else out


def twin_patches(data, indices, crop, flip, sizes, *, patch: int, tokens: int, table=None, taps=None):
    """NaFlex rows (kernel.h's GatherRequest::patch): row b's box ``crop[b]`` resized to its own
    ``sizes[b] = (h, w)`` (int32 (B, 2), multiples of `patch`, may be traced), flipped where
    ``flip[b]``, written as its (h/p)·(w/p) patches: (B, tokens, p·p·3) NHWC, zeros past the
    grid. The resize of `twin_gather`, evaluated at each token's pixels (y = gy·p + py,
    x = gx·p + px), so it is bit-exact with the kernel's patches as twin_gather is with its rows.
    `taps`: a bound on every row's taps per axis (`naflex.max_taps` for NaFlex sizes), or None
    (any shrink to one patch): the weights are (B, T, p, taps) per axis, so a smaller bound
    holds less memory; the same bytes while the rows stay within it."""
    p, packed = patch, isinstance(data, PackedRecords)
    if packed:
        rec = data.table[indices]  # (B, 3)
        first, rec_w = rec[:, 0, None, None, None, None], rec[:, 2, None, None, None]
        max_side = data.max_side

        def at(sy, sx):  # (B, T, p) each -> (B, T, p, p, 3) int32
            o = (sy[..., :, None] * rec_w + sx[..., None, :]) * 3
            o = o[..., None] + jnp.arange(3, dtype=jnp.int32)
            return data.pages[first + o // PAGE_BYTES, o % PAGE_BYTES].astype(jnp.int32)
    else:
        idx, max_side = indices[:, None, None, None], max(data.shape[1], data.shape[2])

        def at(sy, sx):
            return data[idx, sy[..., :, None], sx[..., None, :]].astype(jnp.int32)

    crop, sizes = crop.astype(jnp.int32), sizes.astype(jnp.int32)
    h, w = (jnp.maximum(sizes[:, a, None, None], p) for a in (0, 1))  # (B, 1, 1)
    gw = w // p
    k = jnp.arange(tokens, dtype=jnp.int32)[None, :, None]
    valid = k < (h // p) * gw  # (B, T, 1)
    q = jnp.arange(p, dtype=jnp.int32)
    oy = jnp.where(valid, (k // gw) * p + q, 0)  # (B, T, p) output rows of each token's pixels
    ox = jnp.where(valid, (k % gw) * p + q, 0)
    if flip is not None:  # flip mirrors the row's own columns
        ox = jnp.where(flip[:, None, None] & valid, w - 1 - ox, ox)
    box_h, box_w = crop[:, 2, None, None], crop[:, 3, None, None]
    most = _max_taps(max_side, p)  # static: enough for any row (a side is at least p)
    taps = most if taps is None else min(int(taps), most)
    ly, wy = _axis_weights(oy, box_h, h, taps)  # (B, T, p), (B, T, p, taps)
    lx, wx = _axis_weights(ox, box_w, w, taps)
    # The rows' own tap counts bound the loops (the static bound may be far larger).
    ky = jnp.max(2 * jnp.maximum(box_h, h) // h + 1).clip(1, taps)
    kx = jnp.max(2 * jnp.maximum(box_w, w) // w + 1).clip(1, taps)
    sy0, sx0 = crop[:, 0, None, None] + ly, crop[:, 1, None, None] + lx
    y_last, x_last = crop[:, 0, None, None] + box_h - 1, crop[:, 1, None, None] + box_w - 1

    def tap_row(a, acc):
        sy = jnp.minimum(sy0 + a, y_last)
        wa = jnp.take(wy, a, axis=-1)[..., :, None, None]

        def tap(b, row):
            sx = jnp.minimum(sx0 + b, x_last)
            return row + jnp.take(wx, b, axis=-1)[..., None, :, None] * at(sy, sx)

        return acc + wa * jax.lax.fori_loop(0, kx, tap, acc * 0)

    # Zeros from the indices, so that under jax.shard_map the carry varies as the rows do.
    zero = jnp.zeros((1, tokens, p, p, 3), jnp.int32) + (indices * 0).astype(jnp.int32)[:, None, None, None, None]
    acc = jax.lax.fori_loop(0, ky, tap_row, zero)
    pix = ((acc + (1 << (_ROUND_SHIFT - 1))) >> _ROUND_SHIFT).astype(jnp.uint8)
    out = pix if table is None else lookup(pix, table, channel_axis=-1)
    out = jnp.where(valid[..., None, None], out, jnp.zeros((), out.dtype))
    return out.reshape(indices.shape[0], tokens, p * p * 3)


def lookup(pix, table, channel_axis: int):
    """table[c, x] for every uint8 value x of channel c: the normalization contract, exactly."""
    flat = jnp.asarray(table).reshape(-1)  # c * 256 + x
    shape = [1] * pix.ndim
    shape[channel_axis] = 3
    offset = (jnp.arange(3, dtype=jnp.int32) * 256).reshape(shape)
    return flat[pix.astype(jnp.int32) + offset]


def normalize(pixels, *, mean=None, std=None, dtype=jnp.float32, layout: str = "NHWC"):
    """uint8 pixels → the float32 / bfloat16 nearest to ``(x/255 - mean[c]) / std[c]``
    (computed in float64): the normalization contract of every tbljax path, bit-exact, as a
    table look-up that runs anywhere (use it on batches served as uint8, which move 4x fewer
    bytes). ``layout`` says where the channel axis is: last ("NHWC") or second ("NCHW").

    >>> normalize(jnp.full((1, 2, 2, 3), 255, jnp.uint8), mean=(0.5,) * 3, std=(0.5,) * 3)[0, 0, 0]
    Array([1., 1., 1.], dtype=float32)
    """
    out_dt = out_dtype(dtype)
    if out_dt == np.uint8:
        raise TypeError("normalize writes float32 or bfloat16, got dtype uint8")
    contract.check_layout(layout)
    pixels = jnp.asarray(pixels)
    axis = -1 if layout == "NHWC" else 1  # images (H, W, 3) too, not only batches
    if pixels.dtype != jnp.uint8 or pixels.ndim < 2 or pixels.shape[axis] != 3:
        raise ValueError(
            f"pixels must be uint8 with 3 channels on the {layout} channel axis, got "
            f"{pixels.dtype} of shape {tuple(pixels.shape)}"
        )
    table = normalization_table(*contract.normalization(mean, std), out_dt)
    return lookup(pixels, table, axis)


def out_dtype(dtype) -> np.dtype:
    """The NumPy dtype of an output dtype (a name, or a NumPy / jax.numpy dtype)."""
    return contract.np_dtype(contract.dtype_name(dtype))


@functools.lru_cache(maxsize=64)
def normalization_table(mean, std, dtype) -> np.ndarray:
    """The (3, 256) normalization table of the contract (float32 or bfloat16), read-only."""
    t = _kernels.normalize_table(mean, std, dtype)
    t.setflags(write=False)
    return t

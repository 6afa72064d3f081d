"""The affine ops of the pure-JAX pixel program (`twin_ops.apply_program`): Pillow's affine
resampling (`rules/pixel_filters.affine_transform`: bilinear in float64, or nearest by Pillow's
own sweep) in jax.numpy, bit-identical with the reference. Needs ``jax_enable_x64``: the matrices
and the sampling are float64, as Pillow's.

Exact under FMA contraction (XLA fuses ``a * b + c`` on CPU and GPU): a product with a small
integer splits the float into halves whose products are exact (`mul_small`), and the one
product of two arbitrary floats (the bilinear row blend) is rounded in integer arithmetic
(`mul_exact`), so no fused multiply-add can change a result.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from tbljax._src.rules import pixel_ops

__all__ = ["bilinear_at", "matrices", "mul_exact", "mul_small", "nearest_at", "resample"]

_NAMES = ", ".join(n for n, c in pixel_ops.CODES.items() if c in pixel_ops.AFFINE | pixel_ops.TV_AFFINE)


def matrices(matrix_bits, codes_shape):
    """float64 (B, K, 6) from uint32 (B, K, 6, 2) [low word, high word]; refused by name without
    x64 (at trace time: the affine ops cannot be exact in float32)."""
    if not jax.config.jax_enable_x64:
        raise ValueError(
            f"apply_program: the affine ops ({_NAMES}) resample in float64 to match Pillow bit for "
            "bit, and jax_enable_x64 is off: enable it (jax.config.update('jax_enable_x64', True) or "
            "JAX_ENABLE_X64=1), use the FFI backend, or pass affine=False for a program without them"
        )
    if matrix_bits is None:
        raise ValueError("apply_program: matrix_bits (B, K, 6, 2) uint32 is required when affine=True")
    bits = jnp.asarray(matrix_bits)
    want = (*codes_shape, 6, 2)
    if bits.dtype != jnp.uint32 or tuple(bits.shape) != want:
        raise ValueError(f"matrix_bits must be uint32 {want} [low, high words], got {bits.dtype} {tuple(bits.shape)}")
    word = bits.astype(jnp.uint64)
    return lax.bitcast_convert_type((word[..., 1] << 32) | word[..., 0], jnp.float64)


def mul_small(x, t):
    """float64(x * t) for float64 x and integer or half-integer t below 2**25: x split into its
    top 26 significant bits and the rest (<= 27 bits), each product exact."""
    bits = lax.bitcast_convert_type(x, jnp.uint64)
    hi = lax.bitcast_convert_type(bits & jnp.uint64(~((1 << 27) - 1) & (2**64 - 1)), jnp.float64)
    return hi * t + (x - hi) * t


def _parts(x):
    """|x| as (53-bit integer mantissa, biased exponent), zero as (0, 0); normal x only."""
    bits = lax.bitcast_convert_type(x, jnp.uint64)
    exp = (bits >> 52) & jnp.uint64(0x7FF)
    man = (bits & jnp.uint64((1 << 52) - 1)) | jnp.uint64(1 << 52)
    return jnp.where(exp == 0, jnp.uint64(0), man), exp.astype(jnp.int64)


def mul_exact(u, v):
    """float64(u * v), rounded to nearest even in integer arithmetic (the 106-bit product of the
    mantissas in 32-bit limbs), for normal or zero u, v whose product is normal or zero."""
    u64 = jnp.uint64
    mu, eu = _parts(u)
    mv, ev = _parts(v)
    m32 = u64(0xFFFFFFFF)
    a1, a0, b1, b0 = mu >> 32, mu & m32, mv >> 32, mv & m32
    lo, mid, hi = a0 * b0, a1 * b0 + a0 * b1, a1 * b1
    lo2 = lo + (mid << 32)
    hi2 = hi + (mid >> 32) + (lo2 < lo).astype(jnp.uint64)  # the product: hi2 * 2**64 + lo2
    wide = (hi2 >> 41) & u64(1)  # 106 bits (else 105): keep the top 53
    s = u64(52) + wide
    man = (hi2 << (u64(64) - s)) | (lo2 >> s)
    rem, half = lo2 & ((u64(1) << s) - u64(1)), u64(1) << (s - u64(1))
    man = man + ((rem > half) | ((rem == half) & ((man & u64(1)) == u64(1)))).astype(jnp.uint64)
    carry = man >> 53  # rounded up to 2**53
    man = jnp.where(carry == 1, man >> 1, man)
    exp = eu + ev - 1075 + s.astype(jnp.int64) + carry.astype(jnp.int64)
    sign = (lax.bitcast_convert_type(u, jnp.uint64) ^ lax.bitcast_convert_type(v, jnp.uint64)) >> 63
    bits = (sign << 63) | (exp.astype(jnp.uint64) << 52) | (man & u64((1 << 52) - 1))
    zero = (mu == 0) | (mv == 0)
    return jnp.where(zero, jnp.float64(0), lax.bitcast_convert_type(bits, jnp.float64))


def _bilinear(xi, m, fill):
    b, h, w, _ = xi.shape
    rows = jnp.arange(b)[:, None, None]
    y, x = jnp.arange(h)[None, :, None], jnp.arange(w)[None, None, :]
    return bilinear_at(m, y, x, h, w, lambda yy, xx: xi[rows, yy, xx], fill)


def bilinear_at(m, y, x, h, w, at, fill):
    """Pillow's bilinear affine sample of the pixels at int (y, x) (B, ...) (or broadcasting to
    it) of images of sizes (h, w) (ints, or (B, 1, ...) arrays), matrices ``m`` (B, 6):
    ``at(yy, xx)`` reads the int32 source pixels (..., 3); int32 (B, ..., 3)."""
    a, bb, c, d, e, f = (m[:, i].reshape((-1,) + (1,) * (jnp.ndim(y) - 1)) for i in range(6))
    y = y.astype(jnp.float64) + 0.5
    x = x.astype(jnp.float64) + 0.5
    xin = (mul_small(a, x) + mul_small(bb, y)) + c
    yin = (mul_small(d, x) + mul_small(e, y)) + f
    inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
    xs, ys = jnp.where(inside, xin, 0.5) - 0.5, jnp.where(inside, yin, 0.5) - 0.5
    x0, y0 = jnp.floor(xs), jnp.floor(ys)
    dx, dy = (xs - x0)[..., None], (ys - y0)[..., None]
    xa, xb = (jnp.clip(x0 + k, 0, w - 1).astype(jnp.int32) for k in (0, 1))
    ya, yb = (jnp.clip(y0 + k, 0, h - 1).astype(jnp.int32) for k in (0, 1))

    def at_f(yy, xx):
        return at(yy, xx).astype(jnp.float64)

    top = at_f(ya, xa) + mul_small(dx, at_f(ya, xb) - at_f(ya, xa))
    bottom = at_f(yb, xa) + mul_small(dx, at_f(yb, xb) - at_f(yb, xa))
    out = jnp.trunc(top + mul_exact(bottom - top, dy)).astype(jnp.int32)
    return jnp.where(inside[..., None], out, fill)


def _sweep(start, step, n):
    """Pillow's running sums start, start + step, ... (float64, one add at a time) on a new last
    axis of length n; start and step broadcast together."""
    start, step = jnp.broadcast_arrays(start, step)

    def add(carry, _):
        return carry + step, carry

    return jnp.moveaxis(lax.scan(add, start, None, length=n)[1], 0, -1)


def _sweep_upto(start, step, n: int, upto):
    """`_sweep` of (B,) `start` and `step` to static length `n`, the sums past the traced `upto`
    left 0: a NaFlex row's sides are far below the largest one its tokens allow."""

    def add(k, acc):
        out, carry = acc
        return lax.dynamic_update_slice_in_dim(out, carry[:, None], k, axis=1), carry + step

    # Zeros from `start`, so that under jax.shard_map the buffer varies as the rows do.
    zeros = jnp.zeros(start.shape + (n,), jnp.float64) + jnp.where(jnp.isfinite(start), start * 0, 0.0)[:, None]
    return lax.fori_loop(0, upto, add, (zeros, start))[0]


def _coord(v):
    return jnp.where(v < 0, -1, jnp.trunc(jnp.where(v < 0, 0, v))).astype(jnp.int64)


def _nearest(xi, m, fill):
    """pixel_filters._nearest's three cases, each computed and selected per row."""
    b, h, w, _ = xi.shape
    a, bb, c, d, e, f = (m[:, i] for i in range(6))
    # A pure scale: float64 sums along each axis.
    xs1 = _coord(_sweep(c + a * 0.5, a, w))[:, None, :]
    ys1 = _coord(_sweep(f + e * 0.5, e, h))[:, :, None]
    # Every corner within +-32768: 16.16 fixed point.
    corners = [(0, 0), (w, h), (0, h), (w, 0)]
    near = jnp.ones(b, bool)
    for x, y in corners:
        for p, q, r in ((a, bb, c), (d, e, f)):
            near &= jnp.abs((mul_small(p, x) + mul_small(q, y)) + r) < 32768.0
    vals = (a, bb, c + a * 0.5 + bb * 0.5, d, e, f + d * 0.5 + e * 0.5)
    fix = [jnp.floor(jnp.where(near, v, 0.0) * 65536.0 + 0.5).astype(jnp.int64)[:, None, None] for v in vals]
    yy = jnp.arange(h, dtype=jnp.int64)[None, :, None]
    xx = jnp.arange(w, dtype=jnp.int64)[None, None, :]
    xs2 = (fix[2] + xx * fix[0] + yy * fix[1]) >> 16
    ys2 = (fix[5] + xx * fix[3] + yy * fix[4]) >> 16
    # Otherwise: float64 sums down the first column, then along each row.
    x0s = _sweep(c + bb * 0.5 + a * 0.5, bb, h)
    y0s = _sweep(f + e * 0.5 + d * 0.5, e, h)
    xs3 = _coord(_sweep(x0s, a[:, None], w))
    ys3 = _coord(_sweep(y0s, d[:, None], w))
    scale = ((bb == 0) & (d == 0))[:, None, None]
    near = near[:, None, None]
    xs = jnp.where(scale, xs1, jnp.where(near, xs2, xs3))
    ys = jnp.where(scale, ys1, jnp.where(near, ys2, ys3))
    inside = (xs >= 0) & (xs < w) & (ys >= 0) & (ys < h)
    out = xi[jnp.arange(b)[:, None, None], jnp.clip(ys, 0, h - 1), jnp.clip(xs, 0, w - 1)]
    return jnp.where(inside[..., None], out, fill)


def nearest_at(m, y, x, h, w, at, fill, max_side: int):
    """`_nearest` at the pixels int (y, x) (B, N) of images of sizes (h, w) (B, 1) no side of
    which exceeds the static `max_side`: the same three cases, each sum run as Pillow runs it
    (the per-row sweeps to the pixel's own column, only where a row needs them)."""
    a, bb, c, d, e, f = (m[:, i] for i in range(6))
    hf, wf = h.astype(jnp.float64)[:, 0], w.astype(jnp.float64)[:, 0]
    xs1 = jnp.take_along_axis(_coord(_sweep_upto(c + a * 0.5, a, max_side, jnp.max(w))), x, axis=1)
    ys1 = jnp.take_along_axis(_coord(_sweep_upto(f + e * 0.5, e, max_side, jnp.max(h))), y, axis=1)
    near = jnp.ones(a.shape, bool)
    for cx, cy in ((0.0, 0.0), (wf, hf), (0.0, hf), (wf, 0.0)):
        for p, q, r in ((a, bb, c), (d, e, f)):
            near &= jnp.abs((mul_small(p, cx) + mul_small(q, cy)) + r) < 32768.0
    vals = (a, bb, c + a * 0.5 + bb * 0.5, d, e, f + d * 0.5 + e * 0.5)
    fix = [jnp.floor(jnp.where(near, v, 0.0) * 65536.0 + 0.5).astype(jnp.int64)[:, None] for v in vals]
    xx, yy = x.astype(jnp.int64), y.astype(jnp.int64)
    xs2 = (fix[2] + xx * fix[0] + yy * fix[1]) >> 16
    ys2 = (fix[5] + xx * fix[3] + yy * fix[4]) >> 16
    scale = (bb == 0) & (d == 0)

    def swept(_):  # down the first column, then x steps along the pixel's row, one add at a time
        xv = jnp.take_along_axis(_sweep_upto(c + bb * 0.5 + a * 0.5, bb, max_side, jnp.max(h)), y, axis=1)
        yv = jnp.take_along_axis(_sweep_upto(f + e * 0.5 + d * 0.5, e, max_side, jnp.max(h)), y, axis=1)

        def step(k, v):
            more = x > k
            return jnp.where(more, v[0] + a[:, None], v[0]), jnp.where(more, v[1] + d[:, None], v[1])

        xv, yv = lax.fori_loop(0, jnp.max(w), step, (xv, yv))
        return _coord(xv), _coord(yv)

    xs3, ys3 = lax.cond((~scale & ~near).any(), swept, lambda _: (xs2, ys2), None)
    scale, near = scale[:, None], near[:, None]
    xs = jnp.where(scale, xs1, jnp.where(near, xs2, xs3))
    ys = jnp.where(scale, ys1, jnp.where(near, ys2, ys3))
    inside = (xs >= 0) & (xs < w) & (ys >= 0) & (ys < h)
    out = at(jnp.clip(ys, 0, h - 1).astype(jnp.int32), jnp.clip(xs, 0, w - 1).astype(jnp.int32))
    return jnp.where(inside[..., None], out, jnp.asarray(fill).astype(jnp.int32))


def resample(xi, m, fill, nearest):
    """int32 (B, H, W, 3) through each row's float64 matrix ``m`` (B, 6), Pillow's
    (a, b, c, d, e, f), ``fill`` (3,) outside; nearest (a traced flag) or bilinear: int32."""
    fill = jnp.asarray(fill).astype(jnp.int32)
    return jnp.where(nearest != 0, _nearest(xi, m, fill), _bilinear(xi, m, fill))

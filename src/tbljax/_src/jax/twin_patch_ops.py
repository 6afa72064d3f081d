"""The pure-JAX twin's per-image ops and random erasing on NaFlex rows (issue 49): the rows that
`twin.twin_patches` writes (each its own (h, w), multiples of p, as (B, T, p·p·3) patches) run
their ops where they lie, in token space, as the kernel runs them on each row's (h, w) image
after the resize: token t's pixel (py, px) is the image's (y, x) = ((t // gw)·p + py,
(t % gw)·p + px), gw = w / p, and every pixel of a valid token is a real pixel. Pointwise ops
are `twin_ops`' own with their statistics over the valid tokens; Sharpness, GaussianBlur and
the affine ops read their source pixels through that map; the affine matrices are the program's
size-free templates finished at each row's size (gather_cpu.cpp's FinishAtSize); erasing's
noise is hashed by each pixel's y·w + x. Bit for bit the FFI handler's bytes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from tbljax._src.jax import twin_affine, twin_hue, twin_ops
from tbljax._src.jax.twin import lookup
from tbljax._src.rules import pixel_ops

__all__ = ["finish_at_size", "serve"]

_C = pixel_ops.CODES
_MAX_PIXELS = 1 << 22  # twin_ops' bound: Contrast's rounded mean stays within int32


class _Grid:
    """Every pixel's image coordinates (B, T, p·p), each row's size (B, 1, 1), the valid pixels
    and the flat index of the pixel at (y, x) of a row."""

    def __init__(self, sizes, p: int, t: int):
        b = sizes.shape[0]
        self.p, self.shape = p, (b, t, p * p)
        self.h, self.w = sizes[:, 0, None, None], sizes[:, 1, None, None]
        self.gw = self.w // p
        tok = jnp.arange(t, dtype=jnp.int32)[None, :, None]
        off = jnp.arange(p * p, dtype=jnp.int32)[None, None, :]
        self.y = (tok // self.gw) * p + off // p
        self.x = (tok % self.gw) * p + off % p
        self.valid = jnp.broadcast_to(tok < (self.h // p) * self.gw, self.shape)

    def per_row(self, v, ndim: int):
        """A (B, 1, 1) array as (B, 1, ...) of `ndim` axes."""
        return v.reshape((-1,) + (1,) * (ndim - 1))

    def index(self, y, x):
        p, gw = self.p, self.per_row(self.gw, jnp.ndim(y))
        return ((y // p) * gw + x // p) * (p * p) + (y % p) * p + x % p

    def reader(self, xi):
        """at(y, x) -> xi's pixels there ((B, ..., 3)), coordinates clamped into each row."""
        flat = xi.reshape(xi.shape[0], -1, 3)

        def at(y, x):
            n = jnp.ndim(y)
            y = jnp.clip(y, 0, self.per_row(self.h, n) - 1)
            x = jnp.clip(x, 0, self.per_row(self.w, n) - 1)
            return flat[self.per_row(jnp.arange(flat.shape[0]), n), self.index(y, x)]

        return at


def finish_at_size(code, m, h, w):
    """float64 (B, 6) size-free templates `m` of ops `code` (B,) finished at each row's (h, w)
    (B,): gather_cpu.cpp's FinishAtSize (rules/pixel_ops.affine_matrix's operations, one
    rounding each), every product exact under fused multiply-add (`twin_affine.mul_small`)."""
    mul = twin_affine.mul_small
    cx, cy = w.astype(jnp.float64) / 2.0, h.astype(jnp.float64) / 2.0
    m0, m1, m2, m3, m4, m5 = (m[:, i] for i in range(6))
    rotate = (code == _C["Rotate"]) | (code == _C["TvRotate"])
    tv = (code == _C["TvTranslateX"]) | (code == _C["TvTranslateY"])
    tx, ty = -cx - m2, -cy - m5
    c = jnp.where(rotate, (mul(m0, -cx) + mul(m1, -cy)) + cx, m2)
    c = jnp.where(code == _C["TranslateXRel"], mul(m2, w.astype(jnp.float64)), c)
    c = jnp.where(tv, (0.0 + (mul(m0, tx) + mul(m1, ty))) + cx, c)
    f = jnp.where(rotate, (mul(m3, -cx) + mul(m4, -cy)) + cy, m5)
    f = jnp.where(code == _C["TranslateYRel"], mul(m5, h.astype(jnp.float64)), f)
    f = jnp.where(tv, (0.0 + (mul(m3, tx) + mul(m4, ty))) + cy, f)
    return jnp.stack([m0, m1, c, m3, m4, f], axis=1)


def _smooth(xi, g: _Grid):
    """Pillow's SMOOTH (twin_ops' image rule) read through the grid: the border pixels kept."""
    k = (np.array([1, 1, 1, 1, 5, 1, 1, 1, 1], np.float32) / np.float32(13)).astype(np.float32)
    at = g.reader(xi.astype(jnp.float32))
    acc = None
    for r, dy in enumerate((1, 0, -1)):  # the reference's rows, bottom first
        part = twin_ops.mul(k[3 * r], at(g.y + dy, g.x - 1)) + twin_ops.mul(k[3 * r + 1], at(g.y + dy, g.x))
        part = part + twin_ops.mul(k[3 * r + 2], at(g.y + dy, g.x + 1))
        acc = part if acc is None else acc + part
    inner = (g.y >= 1) & (g.y <= g.h - 2) & (g.x >= 1) & (g.x <= g.w - 2)
    return jnp.where(inner[..., None], jnp.clip(jnp.trunc(acc + np.float32(0.5)), 0, 255).astype(jnp.int32), xi)


def _box_passes(img, n, r, ww, fw):
    """Three of pixel_filters._box_pass over int32 (B, N, 3) `img` laid out in lines of each
    row's length `n` (B, 1, 1): the window sums from prefix sums within each line, the edge
    pixels repeated past its ends, as the reference extends them."""
    size = img.shape[1]
    q = jnp.arange(size, dtype=jnp.int32)[None, :, None]
    start, j = (q // n) * n, q % n
    rows = jnp.arange(img.shape[0])[:, None, None]
    ch = jnp.arange(3)[None, None, :]
    r, ww, fw = (v[:, None, None] for v in (r, ww, fw))
    u32 = jnp.uint32

    def one(_, x):
        def at(i):
            return x[rows, jnp.clip(i, 0, size - 1), ch]

        csum = jnp.concatenate([jnp.zeros_like(x[:, :1]), jnp.cumsum(x, axis=1, dtype=jnp.int32)], axis=1)
        lo, hi = jnp.maximum(j - r, 0), jnp.minimum(j + r, n - 1)
        acc = csum[rows, jnp.clip(start + hi + 1, 0, size), ch] - csum[rows, jnp.clip(start + lo, 0, size), ch]
        acc += jnp.maximum(r - j, 0) * at(start) + jnp.maximum(j + r - (n - 1), 0) * at(start + n - 1)
        side = at(start + jnp.clip(j - r - 1, 0, n - 1)) + at(start + jnp.clip(j + r + 1, 0, n - 1))
        bulk = acc.astype(u32) * ww.astype(u32) + side.astype(u32) * fw.astype(u32)
        return ((bulk + u32(1 << 23)) >> 24).astype(jnp.int32)

    return lax.fori_loop(0, 3, one, img)


def _blur(xi, code, arg, g: _Grid):
    """pixel_filters.gaussian_blur: the row's image put in row-major lines for the passes along
    x, then column-major for those along y, and back to its tokens."""
    keep, r, ww, fw = twin_ops.blur_weights(code, arg)
    b, size = xi.shape[0], g.shape[1] * g.shape[2]
    q = jnp.arange(size, dtype=jnp.int32)[None, :, None]
    h, w = g.h, g.w
    rows, ch = jnp.arange(b)[:, None, None], jnp.arange(3)[None, None, :]
    flat = xi.reshape(b, size, 3)
    in_row = jnp.minimum(q, h * w - 1)
    lines = flat[rows, jnp.clip(g.index(in_row // w, in_row % w), 0, size - 1), ch]
    lines = _box_passes(lines, w, r, ww, fw)
    lines = lines[rows, jnp.minimum((in_row % h) * w + in_row // h, size - 1), ch]  # column-major
    lines = _box_passes(lines, h, r, ww, fw)
    out = lines[rows, jnp.clip(g.x * h + g.y, 0, size - 1).reshape(b, size, 1), ch].reshape(xi.shape)
    return jnp.where(keep[:, None, None, None], xi, out)


def _resample(xi, code, m, fill, nearest, g: _Grid, max_side: int):
    m = finish_at_size(code, m, g.h[:, 0, 0], g.w[:, 0, 0])
    b = xi.shape[0]
    y, x, h, w = g.y.reshape(b, -1), g.x.reshape(b, -1), g.h.reshape(b, 1), g.w.reshape(b, 1)
    at = g.reader(xi)
    fill = jnp.asarray(fill).astype(jnp.int32)
    out = lax.cond(  # the slot's one resampling only (nearest's sweeps are sequential)
        nearest != 0,
        lambda: twin_affine.nearest_at(m, y, x, h, w, at, fill, max_side),
        lambda: twin_affine.bilinear_at(m, y, x, h, w, at, fill),
    )
    return out.reshape(xi.shape)


def serve(pix, sizes, program, *, patch: int, table=None, erase_mode: str = "pixel", affine=True, may_draw=None):
    """uint8 NaFlex rows `pix` (B, T, p·p·3) from `twin.twin_patches` (zeros past each grid) at
    int32 `sizes` (B, 2) through the eight arrays of a size-free `program` (codes, args, matrix
    bits (B, K, 6, 2), fill, nearest, erase boxes, keys, normal table), then normalized by
    `table` (None: uint8) and erased (`erase_mode`): the kernel's patches, zeros past the grid.
    `affine` (static): whether an affine op may occur (they need jax_enable_x64)."""
    codes, args, bits, fill, nearest, boxes, keys, normal = program
    b, t, _ = pix.shape
    p = patch
    if t * p * p > _MAX_PIXELS:
        raise ValueError(f"patches with ops on the twin: T·p·p = {t * p * p} pixels a row, at most {_MAX_PIXELS}")
    g = _Grid(sizes, p, t)
    matrices = twin_affine.matrices(bits, codes.shape) if affine else jnp.zeros(codes.shape + (6,))

    def families(xi, code, arg, fill_k, nearest_k, matrix):
        out = [
            (twin_ops.LUT_OPS, lambda: twin_ops.apply_luts(xi, code, arg, g.valid)),
            (twin_ops.BLEND_OPS, lambda: twin_ops.blends(xi, code, arg, g.valid, lambda v: _smooth(v, g))),
            ((_C["Cutout"],), lambda: twin_ops.cutout(xi, arg, fill_k, (g.y, g.x, g.h[:, 0, 0], g.w[:, 0, 0]))),
            ((_C["GaussianBlur"],), lambda: _blur(xi, code, arg, g)),
            ((_C["Hue"],), lambda: twin_hue.hue(xi, arg)),
        ]
        if affine:
            out.append((twin_ops.AFFINE_OPS, lambda: _resample(xi, code, matrix, fill_k, nearest_k, g, t * p)))
        return out

    px = pix.reshape(b, t, p * p, 3)
    if codes.shape[1]:
        px = twin_ops.run_slots(px, codes, args, matrices, fill, nearest, families, may_draw)
    out = px if table is None else lookup(px, table, channel_axis=-1)
    if boxes.shape[1]:
        # The kernel writes float32 noise rounded to the output dtype: erasing a NaN canvas
        # says where, and with what.
        noise = jnp.full(px.shape, jnp.nan, jnp.float32)
        noise = twin_ops.erase_at(noise, g.y, g.x, g.w[:, 0, 0], boxes, keys, erase_mode, normal)
        out = jnp.where(jnp.isnan(noise), out, noise.astype(out.dtype))
    out = jnp.where(g.valid[..., None], out, jnp.zeros((), out.dtype))
    return out.reshape(b, t, p * p * 3)

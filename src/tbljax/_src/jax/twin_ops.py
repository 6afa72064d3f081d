"""The pure-JAX twin of the per-image ops (the C++ pixel program, for platforms without an FFI
handler): `apply_program` and `erase`, bit-identical with `rules/pixel_ops.py`'s `apply_all`
and `erase`. Rows run different ops, so each slot computes every family (LUT ops, blends,
Cutout, GaussianBlur, Hue (`twin_hue.py`), the affine resample of `twin_affine.py`) that one of
its rows uses, for the whole batch, and each row keeps the one its code names. Only the families
of the codes the policies can draw are compiled (``may_draw``); concrete unknown codes are
refused by name.

**Exact under FMA contraction.** XLA fuses ``a * b + c`` into one fused multiply-add on CPU and
GPU (it rounds once where NumPy rounds twice, and no flag of ours turns that off), so every
float product here is exact: an operand split into a high and a low part (`split`) whose
products with the other, a small integer, need no rounding; a sum of those is then the rounded
product whether or not the compiler fuses it. Everything else is integer arithmetic, with two
host tables for the float64 steps of the reference (AutoContrast's LUT, GaussianBlur's box
radius).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tbljax._src.jax import twin_affine, twin_hue
from tbljax._src.rules import order, pixel_ops

__all__ = [
    "AFFINE_OPS",
    "BLEND_OPS",
    "ERASE_MODES",
    "LUT_OPS",
    "apply_luts",
    "apply_program",
    "blends",
    "blur_weights",
    "check_codes",
    "cutout",
    "erase",
    "erase_at",
    "mul",
    "run_slots",
    "split",
]

_C = pixel_ops.CODES
LUT_OPS = tuple(_C[n] for n in ("AutoContrast", "Equalize", "Invert", "Posterize", "Solarize", "SolarizeAdd"))
BLEND_OPS = tuple(_C[n] for n in ("Color", "Contrast", "Brightness", "Sharpness", "Grayscale"))
AFFINE_OPS = tuple(sorted(pixel_ops.AFFINE | pixel_ops.TV_AFFINE))
ERASE_MODES = ("pixel", "rand", "const")
_MAX_PIXELS = 1 << 22  # Contrast's rounded mean (2 S + N) // 2N stays below 2**31 in int32
_MAX_BOX = 1024  # GaussianBlur's box radius: radii up to ~1024 (the policies allow 1000)


def split(x):
    """float32 `x` as (hi, lo), hi its top 12 significant bits, lo = x - hi (exact, <= 12 bits):
    each times an integer below 2**12 is exact, so ``hi * t + lo * t`` is float32's rounded
    ``x * t`` even where the compiler fuses one product into the sum."""
    x = jnp.asarray(x, jnp.float32)
    hi = lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFFF000), jnp.float32)
    return hi, x - hi


def mul(x, t):
    """float32(x * t) for float32 x and integer-valued float32 t, |t| < 2**12 (see `split`)."""
    hi, lo = split(x)
    return hi * t + lo * t


def _luma(xi):
    """Pillow's RGB -> L (pixel_ops' rule) on int32 (..., 3): int32 (...)."""
    return (xi[..., 0] * 19595 + xi[..., 1] * 38470 + xi[..., 2] * 7471 + 0x8000) >> 16


@functools.lru_cache(maxsize=1)
def _autocontrast_exceptions() -> np.ndarray:
    """Sorted int32 keys ``lo << 16 | hi << 8 | i`` where pixel_ops' float64 AutoContrast LUT
    (``trunc(i * s - lo * s)``, ``s = 255 / (hi - lo)``) is one below the exact
    ``(i - lo) * 255 // (hi - lo)``: the reference's rounding, found once on the host."""
    i = np.arange(256)
    keys = []
    for lo in range(255):
        hi = np.arange(lo + 1, 256)[:, None]
        scale = 255.0 / (hi - lo)
        lut = np.trunc(i * scale + -lo * scale)
        exact = np.floor_divide((i - lo) * 255, hi - lo)
        h, ii = np.nonzero((lut != exact) & (i >= lo) & (i <= hi))
        keys.append((lo << 16) | (hi[h, 0] << 8) | ii)
    return np.sort(np.concatenate(keys)).astype(np.int32)


def _luts(xi, code, arg, valid=None):
    """The LUT ops' per-row, per-channel tables (B, 3, 256) int32 (identity for other codes).
    `valid` (B, N) bool over the pixels in order, or None (all): the statistics' pixels."""
    b = xi.shape[0]
    flat = xi.reshape(b, -1, 3)
    i = jnp.arange(256, dtype=jnp.int32)
    rows = jnp.arange(b)[:, None, None]
    if valid is None:
        hist = jnp.zeros((b, 3, 256), jnp.int32).at[rows, jnp.arange(3)[None, None, :], flat].add(1)
        lo, hi = flat.min(axis=1)[..., None], flat.max(axis=1)[..., None]  # (B, 3, 1)
        count = flat.shape[1]
    else:
        v = valid.reshape(b, -1, 1)
        hist = jnp.zeros((b, 3, 256), jnp.int32).at[rows, jnp.arange(3)[None, None, :], flat].add(v.astype(jnp.int32))
        lo = jnp.where(v, flat, 255).min(axis=1)[..., None]
        hi = jnp.where(v, flat, 0).max(axis=1)[..., None]
        count = v.sum(axis=(1, 2), dtype=jnp.int32)[:, None, None]
    # AutoContrast: the exact quotient less the reference's rounding exceptions.
    keys = jnp.asarray(_autocontrast_exceptions())
    key = (lo << 16) | (hi << 8) | i
    at = jnp.minimum(jnp.searchsorted(keys, key), keys.shape[0] - 1)
    ac = jnp.floor_divide((i - lo) * 255, jnp.maximum(hi - lo, 1)) - (keys[at] == key).astype(jnp.int32)
    ac = jnp.where(hi <= lo, i, jnp.clip(ac, 0, 255))
    # Equalize: Pillow's integer LUT.
    n_used = (hist > 0).sum(axis=-1, keepdims=True)
    last = jnp.take_along_axis(hist, hi, axis=-1)
    step = jnp.where(n_used > 1, (count - last) // 255, 0)
    cum = jnp.cumsum(hist, axis=-1) - hist
    eq = jnp.where(step > 0, jnp.minimum((step // 2 + cum) // jnp.maximum(step, 1), 255), i)
    a = arg[:, None, None]
    bits = jnp.clip(a, 0, 8)
    table = {
        _C["AutoContrast"]: ac,
        _C["Equalize"]: eq,
        _C["Invert"]: 255 - i,
        _C["Posterize"]: i & (~((1 << (8 - bits)) - 1) & 0xFF),
        _C["Solarize"]: jnp.where(i < a, i, 255 - i),
        _C["SolarizeAdd"]: jnp.where(i < 128, jnp.minimum(255, i + a), i) & 0xFF,
    }
    out = jnp.broadcast_to(i, (b, 3, 256))
    for c, lut in table.items():
        out = jnp.where((code == c)[:, None, None], lut, out)
    return out


def apply_luts(xi, code, arg, valid=None):
    """The LUT ops of int32 (B, ..., 3) `xi` (statistics over `valid` (B, N) pixels, or all)."""
    b = xi.shape[0]
    flat = xi.reshape(b, -1, 3).transpose(0, 2, 1)  # (B, 3, H W)
    return jnp.take_along_axis(_luts(xi, code, arg, valid), flat, axis=-1).transpose(0, 2, 1).reshape(xi.shape)


def _smooth(xi):
    """pixel_filters.smooth: Pillow's SMOOTH, float32 taps in Pillow's order (products exact)."""
    _, h, w, _ = xi.shape
    if h < 3 or w < 3:
        return xi
    k = (np.array([1, 1, 1, 1, 5, 1, 1, 1, 1], np.float32) / np.float32(13)).astype(np.float32)
    x = xi.astype(jnp.float32)
    acc = None
    for r, dy in enumerate((2, 1, 0)):
        row = x[:, dy : dy + h - 2]
        part = mul(k[3 * r], row[:, :, 0 : w - 2]) + mul(k[3 * r + 1], row[:, :, 1 : w - 1])
        part = part + mul(k[3 * r + 2], row[:, :, 2:w])
        acc = part if acc is None else acc + part  # the reference's 0 + part is part
    inner = jnp.clip(jnp.trunc(acc + np.float32(0.5)), 0, 255).astype(jnp.int32)
    return xi.at[:, 1:-1, 1:-1].set(inner)


def blends(xi, code, arg, valid=None, smooth=None):
    """Color / Contrast / Brightness / Sharpness / Grayscale (factor 0 of Color) of int32
    (B, H, W, 3) `xi`: int32. `valid` (B, H, W) bool: Contrast's mean over those pixels only
    (None: all); `smooth`: Sharpness's SMOOTH filter, a function of `xi` (None: the image's)."""
    b, h, w, _ = xi.shape
    luma = _luma(xi)[..., None]
    if valid is None:
        n = h * w
    else:
        luma_sum = jnp.where(valid[..., None], luma, 0)
        n = valid.sum(axis=(1, 2), dtype=jnp.int32)
    mean = (2 * (luma if valid is None else luma_sum).sum(axis=(1, 2, 3)) + n) // (2 * n)  # int(mean + 0.5)
    c = code[:, None, None, None]
    d = jnp.where(c == _C["Contrast"], mean[:, None, None, None], luma)
    d = jnp.where(c == _C["Brightness"], 0, d)
    d = jnp.where(c == _C["Sharpness"], (smooth or _smooth)(xi), d)
    f = lax.bitcast_convert_type(arg, jnp.float32)
    f = jnp.where(code == _C["Grayscale"], np.float32(0), f)[:, None, None, None]
    v = d.astype(jnp.float32) + mul(f, (xi - d).astype(jnp.float32))
    return jnp.clip(jnp.trunc(v), 0, 255).astype(jnp.int32)


def cutout(xi, arg, fill, coords=None):
    """TF's cutout (pixel_ops' ``Cutout``): a clipped square about the decoded centre, filled.
    `coords`: (y, x, h, w), each pixel's coordinates shaped as ``xi[..., 0]`` and each row's
    size (B,), for pixels not laid out as (B, H, W); None: the image's."""
    if coords is None:
        _, h, w, _ = xi.shape
        y, x = jnp.arange(h)[None, :, None], jnp.arange(w)[None, None, :]
    else:
        y, x, h, w = coords
    pad, cy, cx = (arg >> 24) & 0xFF, (arg >> 12) & 0xFFF, arg & 0xFFF
    cy, cx = (cy * h) >> 12, (cx * w) >> 12
    pad, cy, cx = (v.reshape((-1,) + (1,) * (xi.ndim - 2)) for v in (pad, cy, cx))
    inside = (y >= cy - pad) & (y < cy + pad) & (x >= cx - pad) & (x < cx + pad)
    return jnp.where(inside[..., None], jnp.asarray(fill, jnp.int32), xi)


@functools.lru_cache(maxsize=1)
def _box_thresholds() -> np.ndarray:
    """float32 (K,): entry k - 1 the least sigma2 whose box radius's integer part (the
    reference's ``floor((float32(sqrt(12 sigma2 + 1)) - 1) / 2)``, in float64) is >= k, found by
    bisection over float32 bit patterns, so the twin needs no float64 square root."""

    def small_l(bits):
        s2 = bits.astype(np.uint32).view(np.float32).astype(np.float64)
        big_l = np.sqrt(12.0 * s2 + 1.0).astype(np.float32).astype(np.float64)
        return np.floor((big_l - 1.0) / 2.0)

    k = np.arange(1, _MAX_BOX + 1, dtype=np.float64)
    lo = np.zeros(k.shape, np.int64)
    hi = np.full(k.shape, np.float32(1e9).view(np.uint32), np.int64)
    while (hi - lo > 1).any():  # invariant: small_l(lo) < k <= small_l(hi)
        mid = (lo + hi) // 2
        up = small_l(mid) >= k
        hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
    return hi.astype(np.uint32).view(np.float32)


def _box_pass(x, r, ww, fw):
    """pixel_filters._box_pass along axis 1 of int32 (B, N, M) with per-row radius r and weights
    (B,), uint32 fixed point. The row is extended by N + 1 edge pixels each side, so a radius
    r' = min(r, N) reads whole slices of it ((r - r') more of each edge pixel beyond that)."""
    b, n, _ = x.shape
    first, last = x[:, :1], x[:, -1:]
    ext = jnp.concatenate([jnp.repeat(first, n + 1, axis=1), x, jnp.repeat(last, n + 1, axis=1)], axis=1)
    csum = jnp.concatenate([jnp.zeros_like(first), jnp.cumsum(ext, axis=1)], axis=1)  # csum[q]: ext[< q]
    rr = jnp.minimum(r, n)

    def rows(a, start):  # a[:, start[b] : start[b] + n] for each row b
        return jax.vmap(lambda v, s0: lax.dynamic_slice_in_dim(v, s0, n, axis=0))(a, start)

    # ext[q] is source q - n - 1 (clamped): the window p - r' .. p + r', and p - r - 1, p + r + 1.
    acc = rows(csum, rr + n + 2) - rows(csum, n + 1 - rr)
    acc += ((r - rr)[:, None, None]) * (first + last)
    left, right = rows(ext, n - rr), rows(ext, rr + n + 2)
    u32 = jnp.uint32
    ww, fw = ww.astype(u32)[:, None, None], fw.astype(u32)[:, None, None]
    bulk = acc.astype(u32) * ww + (left + right).astype(u32) * fw
    return ((bulk + u32(1 << 23)) >> 24).astype(jnp.int32)


def blur_weights(code, arg):
    """GaussianBlur's per-row box (pixel_filters.gaussian_blur) from float32 radii (the
    arguments' bits): (keep: rows left as they are, radius r, weights ww and fw), each (B,)."""
    # Other rows' arguments are not radii (NaN, negative...): radius 0 copies them.
    radius = jnp.where(code == _C["GaussianBlur"], lax.bitcast_convert_type(arg, jnp.float32), np.float32(0))
    sigma2 = (radius * radius) / np.float32(3)
    small_l = jnp.searchsorted(jnp.asarray(_box_thresholds()), sigma2, side="right").astype(jnp.float32)
    s2_hi, s2_lo = split(sigma2)
    three_s2 = s2_hi * np.float32(3) + s2_lo * np.float32(3)  # float32(3 sigma2), exactly rounded
    a = (np.float32(2) * small_l + np.float32(1)) * (small_l * (small_l + np.float32(1)) - three_s2)
    a = a / (np.float32(6) * (sigma2 - (small_l + np.float32(1)) * (small_l + np.float32(1))))
    box = small_l + a
    r = box.astype(jnp.int32)
    ww = (np.float32(1 << 24) / (box * np.float32(2) + np.float32(1))).astype(jnp.int32)
    fw = ((1 << 24) - (2 * r + 1) * ww) // 2
    return (radius == 0) | (box == 0), r, ww, fw


def _gaussian_blur(xi, code, arg):
    """pixel_filters.gaussian_blur with per-row float32 radii (the arguments' bits)."""
    keep, r, ww, fw = blur_weights(code, arg)
    bb, h, w, _ = xi.shape
    # Three passes along the rows, then three along the columns (each a loop: compiled once).
    out = xi.transpose(0, 2, 1, 3).reshape(bb, w, h * 3)
    out = lax.fori_loop(0, 3, lambda _, t: _box_pass(t, r, ww, fw), out)
    out = out.reshape(bb, w, h, 3).transpose(0, 2, 1, 3).reshape(bb, h, w * 3)
    out = lax.fori_loop(0, 3, lambda _, t: _box_pass(t, r, ww, fw), out).reshape(xi.shape)
    return jnp.where(keep[:, None, None, None], xi, out)


def _check(pixels, codes, args, fill, nearest):
    if pixels.dtype != jnp.uint8 or pixels.ndim != 4 or pixels.shape[-1] != 3:
        raise ValueError(f"pixels must be uint8 (B, H, W, 3), got {pixels.dtype} {tuple(pixels.shape)}")
    b, h, w, _ = pixels.shape
    if codes.shape != args.shape or codes.ndim != 2 or codes.shape[0] != b:
        raise ValueError(f"codes and args must both be (B={b}, K), got {tuple(codes.shape)} and {tuple(args.shape)}")
    k = codes.shape[1]
    if tuple(fill.shape) != (k, 3) or tuple(nearest.shape) != (k,):
        raise ValueError(
            f"fill must be (K={k}, 3) and nearest (K={k},), got {tuple(fill.shape)}, {tuple(nearest.shape)}"
        )
    if h * w > _MAX_PIXELS:
        raise ValueError(f"apply_program takes images of at most {_MAX_PIXELS} pixels, got {h}x{w}")


def check_codes(codes) -> None:
    """ValueError naming the first row and column of concrete (B, K) `codes` holding a code that
    is not an op code (`pixel_ops.CODES`, or 0): the twin has no rule for it."""
    codes = np.asarray(codes)
    unknown = ~np.isin(codes, [0, *_C.values()])
    if unknown.any():
        b, k = np.argwhere(unknown)[0]
        raise ValueError(
            f"ops: row {b} column {k}: op code {codes[b, k]} is not one of pixel_ops.CODES ({sorted(_C.values())})"
        )


def apply_program(pixels, codes, args, matrix_bits, fill, nearest, *, affine: bool = True, may_draw=None):
    """Each row of uint8 (B, H, W, 3) `pixels` through its ops ``codes[b, k]`` (`pixel_ops.CODES`,
    0: none) with integer arguments ``args[b, k]``, k in order: uint8, bit-identical with
    ``pixel_ops.apply_all``. ``matrix_bits`` uint32 (B, K, 6, 2): the affine ops' float64
    matrices (`pixel_ops.op_matrix`) as [low word, high word] bit patterns; ``fill`` uint8
    (K, 3) and ``nearest`` (K,) (1: nearest, 0: bilinear) per slot. `affine` (static) says
    whether an affine op may occur: they need float64 (``jax_enable_x64``); with
    ``affine=False`` an affine code leaves its row unchanged and matrix_bits may be None.
    `may_draw` (static): the codes the rows may hold (what their policies can draw), so only
    their ops are compiled; None: every code, or where `codes` is concrete, the ones it holds.
    Concrete codes that are not `pixel_ops.CODES` are refused (ValueError).

    >>> import jax.numpy as jnp
    >>> px = jnp.full((1, 2, 2, 3), 10, jnp.uint8)
    >>> codes, args = jnp.array([[3]], jnp.uint8), jnp.array([[0]], jnp.int32)
    >>> out = apply_program(px, codes, args, None, jnp.zeros((1, 3), jnp.uint8), jnp.zeros(1, jnp.uint8), affine=False)
    >>> int(out[0, 0, 0, 0])
    245
    """
    pixels, codes, args = jnp.asarray(pixels), jnp.asarray(codes), jnp.asarray(args)
    fill, nearest = jnp.asarray(fill), jnp.asarray(nearest)
    _check(pixels, codes, args, fill, nearest)
    if not isinstance(codes, jax.core.Tracer):
        check_codes(codes)
        may_draw = np.unique(np.asarray(codes)) if may_draw is None else may_draw
    matrices = twin_affine.matrices(matrix_bits, codes.shape) if affine else jnp.zeros(codes.shape + (6,))

    def families(xi, code, arg, fill_k, nearest_k, matrix):
        out = [
            (LUT_OPS, lambda: apply_luts(xi, code, arg)),
            (BLEND_OPS, lambda: blends(xi, code, arg)),
            ((_C["Cutout"],), lambda: cutout(xi, arg, fill_k)),
            ((_C["GaussianBlur"],), lambda: _gaussian_blur(xi, code, arg)),
            ((_C["Hue"],), lambda: twin_hue.hue(xi, arg)),
        ]
        if affine:
            out.append((AFFINE_OPS, lambda: twin_affine.resample(xi, matrix, fill_k, nearest_k)))
        return out

    return run_slots(pixels, codes, args, matrices, fill, nearest, families, may_draw)


def run_slots(pixels, codes, args, matrices, fill, nearest, families, may_draw):
    """uint8 `pixels` (B, ...) through the slots of a program (`apply_program`'s arrays, the
    matrices float64 (B, K, 6)): ``families(xi, code, arg, fill_k, nearest_k, matrix)`` lists
    (op codes, result thunk) for int32 `xi`; each row keeps the result its code names. Only the
    families of `may_draw` (None: every code) are compiled."""
    drawn = set(_C.values()) if may_draw is None else {int(c) for c in may_draw}
    expand = (slice(None),) + (None,) * (pixels.ndim - 1)

    def slot(xi, per_slot):  # one slot for every row: each family, kept where the code names it
        out = xi
        code = per_slot[0]
        for ops, result in families(xi, *per_slot):
            if drawn.isdisjoint(ops):  # not compiled: no row can hold these codes
                continue
            rows = jnp.isin(code, jnp.asarray(ops))
            # A family no row of this slot uses is skipped (blur and resampling cost the most).
            out = lax.cond(rows.any(), lambda o, r=rows, f=result: jnp.where(r[expand], f(), o), lambda o: o, out)
        return out, None

    # A scan over the slots: one slot's program is compiled, whatever K is.
    per_slot = (codes.T.astype(jnp.int32), args.T.astype(jnp.int32), fill, nearest, matrices.transpose(1, 0, 2))
    xi, _ = lax.scan(slot, pixels.astype(jnp.int32), per_slot)
    return xi.astype(jnp.uint8)


def erase(values, boxes, keys, mode: str, table=None):
    """Random erasing of float32 (B, H, W, 3) normalized `values` (NHWC), bit-identical with
    ``pixel_ops.erase`` on each row: int (B, E, 4) `boxes` (y0, x0, h, w; h <= 0: none) in order,
    set to 0 (``"const"``), a normal per channel (``"rand"``) or per value (``"pixel"``) from
    `table` (float32 (4096,), `pixel_ops.normal_table` when None) keyed by uint32 `keys` (B,)."""
    if mode not in ERASE_MODES:
        raise ValueError(f"mode must be one of {ERASE_MODES}, got {mode!r}")
    values = jnp.asarray(values)
    if values.dtype != jnp.float32 or values.ndim != 4 or values.shape[-1] != 3:
        raise ValueError(f"values must be float32 (B, H, W, 3), got {values.dtype} {tuple(values.shape)}")
    b, h, w, _ = values.shape
    boxes = jnp.asarray(boxes).astype(jnp.int32)
    if boxes.ndim != 3 or boxes.shape[0] != b or boxes.shape[2] != 4:
        raise ValueError(f"boxes must be (B={b}, E, 4) (y0, x0, h, w), got {tuple(boxes.shape)}")
    y, x = jnp.arange(h)[None, :, None], jnp.arange(w)[None, None, :]
    return erase_at(values, y, x, jnp.full((b,), w, jnp.int32), boxes, keys, mode, table)


def erase_at(values, y, x, w, boxes, keys, mode: str, table=None):
    """`erase` of float32 (B, ..., 3) `values` whose pixels lie at (y, x) (int, shaped as
    ``values[..., 0]`` or broadcasting to it) of images of widths `w` (B,): the same noise as
    the image's (`pixel`: hashed by each pixel's y * w + x)."""
    b, nd = values.shape[0], values.ndim
    table = jnp.asarray(pixel_ops.normal_table() if table is None else table, jnp.float32)
    key = jnp.asarray(keys).astype(jnp.uint32).reshape((b,) + (1,) * (nd - 1))
    ch = jnp.arange(3, dtype=jnp.uint32).reshape((1,) * (nd - 1) + (3,))
    y, x = y[..., None], x[..., None]
    if mode == "pixel":
        row_w = jnp.asarray(w).astype(jnp.uint32).reshape(key.shape)
        pos = y.astype(jnp.uint32) * row_w + x.astype(jnp.uint32)
    else:
        pos = jnp.uint32(0xFFFF)
    out = values
    for e in range(boxes.shape[1]):
        y0, x0, bh, bw = (boxes[:, e, i].reshape(key.shape) for i in range(4))
        inside = (bh > 0) & (y >= y0) & (y < y0 + bh) & (x >= x0) & (x < x0 + bw)
        if mode == "const":
            fill = jnp.float32(0)
        else:
            fill = table[order.hash32([key, jnp.uint32(e), ch, pos], xp=jnp) >> 20]
        out = jnp.where(inside, fill, out)
    return out

"""``Hue`` in the pure-JAX pixel program (`twin_ops.apply_program`): `pixel_ops._hue`'s rule
(Pillow's ``rgb2hsv_row``, the hue byte shifted, ``hsv2rgb``) bit for bit in 32-bit arithmetic,
without x64.

- Forward: Pillow's hue is ``h = base +- q`` with ``q = (max - mid) / (max - min)`` in float32
  (one of the three quotients is 0 and one is 1, so each branch is one rounded float32 op), and
  the hue byte a monotone function of ``h`` on [-1, 0) and on [0, 5]: found from ``h`` by host
  thresholds (`_hue_steps`, by bisection over float32 bit patterns). The saturation byte is a
  host table of (max - min, max).
- Back: each of hsv2rgb's ``p, q, t`` is ``round_half_up(v (1 - y))`` = ``v - round_half_down(v y)``
  with ``y`` = ``fs``, ``float32(fs f)`` or (t) the float64 ``fs (1 - f)`` carried as a float32
  pair from a (saturation, hue) host table: ``v y`` rounded in integer arithmetic
  (`_round_down_product`), so no fused multiply-add can change a byte.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["hue"]


def _hue_key(h: np.ndarray) -> np.ndarray:
    """pixel_ops' hue byte of float32 hue h (before the shift): fmod(h / 6 + 1, 1) in float64,
    to float32, times 255, truncated; 256 where a negative h's h / 6 + 1 rounds to 1 (byte 0),
    so that the key rises with h on [-1, 0)."""
    x = h.astype(np.float64) / 6.0 + 1.0
    wrapped = np.fmod(x, 1.0).astype(np.float32)
    byte = np.clip(np.trunc(wrapped.astype(np.float64) * 255.0), 0, 255).astype(np.int64)
    return np.where((h < 0) & (x >= 1.0), 256, byte)


def _ordered(x: np.ndarray) -> np.ndarray:
    """float32 -> int64 keys in the order of the values (negative floats' bits run backwards)."""
    bits = x.astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _unordered(k: np.ndarray) -> np.ndarray:
    return np.where(k < 0, (-k) | (1 << 31), k).astype(np.int64).astype(np.uint32).view(np.float32)


@functools.lru_cache(maxsize=1)
def _hue_steps() -> tuple[np.ndarray, np.ndarray]:
    """(float32 starts (S,), int32 bytes (S,)): for h in [starts[j], starts[j + 1]) the hue byte
    is bytes[j]; h in [-1, 5] (the branches' range), monotone on [-1, 0) and on [0, 5]."""
    starts, values = [], []
    for lo, hi in ((np.float32(-1), -np.float32(np.finfo(np.float32).smallest_subnormal)), (np.float32(0), 5.0)):
        klo, khi = int(_ordered(np.array([lo]))[0]), int(_ordered(np.array([hi], np.float32))[0])
        first, last = (int(_hue_key(np.array([v], np.float32))[0]) for v in (lo, hi))
        targets = np.arange(first + 1, last + 1)
        a = np.full(targets.shape, klo, np.int64)  # invariant: byte(a) < target <= byte(b)
        b = np.full(targets.shape, khi, np.int64)
        while (b - a > 1).any():
            mid = (a + b) // 2
            up = _hue_key(_unordered(mid)) >= targets
            a, b = np.where(up, a, mid), np.where(up, mid, b)
        starts += [lo, *_unordered(b)]
        values += [first, *targets]
    return np.array(starts, np.float32), np.array(values, np.int32) & 0xFF


@functools.lru_cache(maxsize=1)
def _tables() -> dict[str, np.ndarray]:
    """pixel_ops._hue's float steps that depend on a byte or two, as host tables."""
    u = np.arange(256)
    cr, mx = np.meshgrid(u, u, indexing="ij")
    s = (cr.astype(np.float32) / np.maximum(mx, 1).astype(np.float32)).astype(np.float32)
    sat = np.where((cr > 0) & (mx >= cr), np.trunc(s.astype(np.float64) * 255.0), 0)  # [cr, max]
    hh = u.astype(np.float64) * 6.0 / 255.0
    sector = np.floor(hh).astype(np.int64)
    rem = (hh - sector).astype(np.float32)
    fs = (u.astype(np.float64) / 255.0).astype(np.float32)
    # t's y: 1 - float64(1 - fs (1 - f)) per [us, hue byte], as its float32 head and the rest
    # scaled by the head's 2**E (`_round_down_product`).
    y = 1.0 - (1.0 - fs.astype(np.float64)[:, None] * (1.0 - rem.astype(np.float64))[None, :])
    head = y.astype(np.float32)
    scale = 2.0 ** (150 - (head.view(np.uint32) >> 23).astype(np.int64))
    tail = ((y - head.astype(np.float64)) * scale).astype(np.float32)
    return dict(sat=sat.astype(np.uint8), sector=(sector % 6).astype(np.int32), rem=rem, fs=fs, head=head, tail=tail)


def _round_down_product(v, y, tail=None):
    """round_half_down(v * y) for int32 v in [0, 255] and float32 y in [0, 1] (plus ``tail``,
    the float64 remainder in units of y's last bit): y = M 2**-E, v M < 2**32 exactly in uint32,
    its fraction compared with a half."""
    bits = lax.bitcast_convert_type(y, jnp.uint32)
    e = (bits >> 23).astype(jnp.int32)
    m = jnp.where(e > 0, (bits & 0x7FFFFF) | 0x800000, 0).astype(jnp.uint32)
    big_e = 150 - e  # y = m 2**-big_e, big_e >= 23
    x = v.astype(jnp.uint32) * m
    sh = jnp.clip(big_e, 0, 31).astype(jnp.uint32)
    whole = jnp.where(big_e >= 32, jnp.uint32(0), x >> sh)
    frac = x - jnp.where(big_e >= 32, jnp.uint32(0), whole << sh)  # < 2**big_e
    half = jnp.uint32(1) << (jnp.clip(big_e, 1, 32) - 1).astype(jnp.uint32)
    d = lax.bitcast_convert_type(frac - half, jnp.int32)  # fraction - 1/2, in y's units
    if tail is None:
        up = d > 0
    else:  # the tail moves it by at most 128 units: decide by d where it is farther than that
        delta = v.astype(jnp.float32) * tail
        up = (d > 256) | ((jnp.abs(d) <= 256) & (d.astype(jnp.float32) > -delta))
    up = up & (big_e <= 32)  # beyond: v y < 1/2
    return whole.astype(jnp.int32) + up.astype(jnp.int32)


def hue(xi, shift):
    """`pixel_ops._hue` of int32 (B, H, W, 3) `xi` with per-row int32 `shift` (B,): int32."""
    t = {k: jnp.asarray(a) for k, a in _tables().items()}
    r, g, b = xi[..., 0], xi[..., 1], xi[..., 2]
    v, minc = xi.max(axis=-1), xi.min(axis=-1)
    cr = v - minc
    # Pillow's branch: the max channel is the first equal to the max; h = base -+ q.
    top = jnp.where((r >= g) & (r >= b), 0, jnp.where(g >= b, 1, 2))
    o1 = jnp.where(top == 0, g, jnp.where(top == 1, b, r))
    o2 = jnp.where(top == 0, b, jnp.where(top == 1, r, g))
    lo_second = o2 < o1
    mid = jnp.where(lo_second, o1, o2)
    q = (v - mid).astype(jnp.float32) / jnp.maximum(cr, 1).astype(jnp.float32)
    base = (2 * top + jnp.where(lo_second, 1, -1)).astype(jnp.float32)
    h = jnp.where(lo_second, base - q, base + q)
    starts, values = _hue_steps()
    uh = jnp.asarray(values)[jnp.searchsorted(jnp.asarray(starts), h, side="right") - 1]
    us = t["sat"][cr, v].astype(jnp.int32)
    uh = (uh + shift[:, None, None]) & 0xFF
    fs, f = t["fs"][us], t["rem"][uh]
    p = v - _round_down_product(v, fs)
    qq = v - _round_down_product(v, fs * f)
    tt = v - _round_down_product(v, t["head"][us, uh], t["tail"][us, uh])
    sector = t["sector"][uh]
    sectors = [(v, tt, p), (qq, v, p), (p, v, tt), (p, qq, v), (tt, p, v), (v, p, qq)]
    out = [sum(jnp.where(sector == i, s[c], 0) for i, s in enumerate(sectors)) for c in range(3)]
    out = jnp.stack(out, axis=-1)
    return jnp.where((us == 0)[..., None], v[..., None], out)

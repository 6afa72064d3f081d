"""Pillow's pixel loops that the per-image ops call, written out in exact NumPy (the contract the
kernel's stages match byte for byte): the SMOOTH filter (`smooth`), ``ImageFilter.GaussianBlur``
(`gaussian_blur`: three extended box passes per axis) and the affine transform's sampling
(`affine_transform`: bilinear in float64, or nearest by Pillow's own sweep, `_nearest`). The op
codes and the arguments that choose them are `pixel_ops`'.

Example:
    >>> import numpy as np
    >>> img = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    >>> bool((affine_transform(img, (1.0, 0.0, 0.0, 0.0, 1.0, 0.0), "nearest", 0) == img).all())
    True
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["affine_transform", "gaussian_blur", "smooth"]


def smooth(image):
    """Pillow's ImageFilter.SMOOTH on uint8 RGB: float32 taps summed in Pillow's order, rounded."""
    k = (np.array([1, 1, 1, 1, 5, 1, 1, 1, 1], np.float32) / np.float32(13)).astype(np.float32)
    x = image.astype(np.float32)
    out = image.copy()
    h, w = image.shape[:2]
    if h < 3 or w < 3:
        return out
    acc = np.zeros((h - 2, w - 2, 3), np.float32)
    # Filter.c: rows y+1, y, y-1 with kernel rows 0, 1, 2; each row (x-1, x, x+1) summed first.
    for r, dy in enumerate((2, 1, 0)):
        row = x[dy : dy + h - 2]
        part = row[:, 0 : w - 2] * k[3 * r] + row[:, 1 : w - 1] * k[3 * r + 1]
        part = part + row[:, 2:w] * k[3 * r + 2]
        acc = acc + part
    out[1:-1, 1:-1] = np.clip(np.trunc(acc + np.float32(0.5)), 0, 255).astype(np.uint8)
    return out


def _box_radius(radius: np.float32) -> np.float32:
    """Pillow's _gaussian_blur_radius for 3 passes: float32 steps, sqrt and floor in double."""
    f = np.float32
    sigma2 = f(radius * radius) / f(3)
    big_l = f(math.sqrt(12.0 * float(sigma2) + 1.0))
    small_l = f(math.floor((float(big_l) - 1.0) / 2.0))
    a = (f(2) * small_l + f(1)) * (small_l * (small_l + f(1)) - f(3) * sigma2)
    a = a / (f(6) * (sigma2 - (small_l + f(1)) * (small_l + f(1))))
    return f(small_l + a)


def _box_pass(image, radius: np.float32):
    """One of Pillow's extended box passes along axis 1 (ImagingHorizontalBoxBlur): edge
    pixels repeated, the 2r + 1 window weighted ``ww`` and the two next ones ``fw`` (uint32 in
    24-bit fixed point), rounded: ``(acc ww + (left + right) fw + 2**23) >> 24``."""
    r = int(radius)
    ww = int(np.float32(1 << 24) / (radius * np.float32(2) + np.float32(1)))
    fw = ((1 << 24) - (2 * r + 1) * ww) // 2
    n = image.shape[1]
    x = image.astype(np.int64)
    idx = np.clip(np.arange(-r - 1, n + r + 1), 0, n - 1)
    ext = x[:, idx]  # position p is source p - r - 1
    csum = np.concatenate([np.zeros_like(ext[:, :1]), np.cumsum(ext, axis=1)], axis=1)
    acc = csum[:, 2 * r + 2 : 2 * r + 2 + n] - csum[:, 1 : 1 + n]  # window x - r .. x + r
    bulk = acc * ww + (ext[:, :n] + ext[:, 2 * r + 2 : 2 * r + 2 + n]) * fw
    return ((bulk + (1 << 23)) >> 24).astype(np.uint8)


def gaussian_blur(image, radius: float):
    """Pillow's ``ImageFilter.GaussianBlur(radius)`` on HxWx3 uint8: the float32 radius turned
    into an extended box radius, three passes along the rows, then three along the columns
    (each pass rounded to uint8); radius 0 copies."""
    radius = np.float32(radius)
    if radius == 0:
        return image.copy()
    box = _box_radius(radius)
    out = image
    if box != 0:
        for axis_first in (True, False):
            t = out if axis_first else out.swapaxes(0, 1)
            for _ in range(3):
                t = _box_pass(t, box)
            out = t if axis_first else t.swapaxes(0, 1)
    return np.array(out, copy=True)  # C order, never the input itself


def _sweep(start, step, n):
    """Pillow's running sum start, start + step, ... (float64, added one step at a time)."""
    return np.add.accumulate(np.concatenate([[start], np.full(n - 1, step)]))


def _coord(v):
    return np.where(v < 0, -1, np.trunc(np.where(v < 0, 0, v))).astype(np.int64)


def _nearest(matrix, h, w):
    """Pillow's ImagingTransformAffine with NEAREST: the source (x, y) index of every output
    pixel. A pure scale sweeps float64 sums; otherwise, when every corner maps within
    +-32768, 16.16 fixed point ``(A2 + x A0 + y A1) >> 16`` with ``A = floor(v * 65536 + 0.5)``;
    else float64 sums along each row."""
    a, b, c, d, e, f = matrix
    if b == 0 and d == 0:
        xs, ys = _coord(_sweep(c + a * 0.5, a, w)), _coord(_sweep(f + e * 0.5, e, h))
        return np.broadcast_to(xs[None, :], (h, w)), np.broadcast_to(ys[:, None], (h, w))
    corners = [(0, 0), (w, h), (0, h), (w, 0)]
    if all(abs(x * a + y * b + c) < 32768.0 and abs(x * d + y * e + f) < 32768.0 for x, y in corners):
        fix = [math.floor(v * 65536.0 + 0.5) for v in (a, b, c + a * 0.5 + b * 0.5, d, e, f + d * 0.5 + e * 0.5)]
        y, x = np.mgrid[0:h, 0:w].astype(np.int64)
        return (fix[2] + x * fix[0] + y * fix[1]) >> 16, (fix[5] + x * fix[3] + y * fix[4]) >> 16
    x0s, y0s = _sweep(c + b * 0.5 + a * 0.5, b, h), _sweep(f + e * 0.5 + d * 0.5, e, h)
    xs = np.stack([_sweep(x0, a, w) for x0 in x0s])
    ys = np.stack([_sweep(y0, d, w) for y0 in y0s])
    return _coord(xs), _coord(ys)


def affine_transform(image, matrix, interpolation, fill):
    h, w = image.shape[:2]
    a, b, c, d, e, f = matrix
    y, x = np.mgrid[0:h, 0:w].astype(np.float64) + 0.5
    xin, yin = a * x + b * y + c, d * x + e * y + f
    inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
    if interpolation == "nearest":
        xi, yi = _nearest(matrix, h, w)
        inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
        out = image[np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)]
    else:
        xs, ys = np.where(inside, xin, 0.5) - 0.5, np.where(inside, yin, 0.5) - 0.5
        x0, y0 = np.floor(xs), np.floor(ys)
        dx, dy = (xs - x0)[..., None], (ys - y0)[..., None]
        xa, xb = (np.clip(x0 + k, 0, w - 1).astype(np.intp) for k in (0, 1))
        ya, yb = (np.clip(y0 + k, 0, h - 1).astype(np.intp) for k in (0, 1))
        img = image.astype(np.float64)
        top = img[ya, xa] + (img[ya, xb] - img[ya, xa]) * dx
        bottom = img[yb, xa] + (img[yb, xb] - img[yb, xa]) * dx
        out = np.trunc(top + (bottom - top) * dy).astype(np.uint8)
    return np.where(inside[..., None], out, np.asarray(fill, np.uint8))

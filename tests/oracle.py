"""The one NumPy oracle every test compares against, written from the contracts, not from the
code: the normalization contract (DESIGN §3: the float32 / bfloat16 nearest to
(x/255 - mean)/std computed in float64; bfloat16 rounding by exact rational comparison over
every finite bfloat16), the integer crop-resize formula of ffi/core/kernel.h in int64, and the
crop boxes of torchvision's RandomResizedCrop and FFCV's center crop."""
from __future__ import annotations

import fractions
import math

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def _all_bf16():
    """Every finite bfloat16 as (sorted float64 values, their bit patterns), +0 only."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(invalid="ignore"):  # the NaN patterns
        vals = bits.view(BF16).astype(np.float64)
    keep = np.isfinite(vals) & (bits != 0x8000)
    order = np.argsort(vals[keep], kind="stable")
    return vals[keep][order], bits[keep][order]


_BF16_VALS, _BF16_BITS = _all_bf16()


def nearest_bf16_bits(v: float) -> int:
    """The bfloat16 nearest to the float64 v, ties to even, by exact rational comparison."""
    v = float(v)
    if v == 0.0:
        return 0x8000 if np.signbit(v) else 0
    hi = int(np.searchsorted(_BF16_VALS, v, side="left"))
    if hi < len(_BF16_VALS) and _BF16_VALS[hi] == v:
        return int(_BF16_BITS[hi])
    assert 0 < hi < len(_BF16_VALS), v  # values here are far from overflow
    lo = hi - 1
    fv = fractions.Fraction(v)
    dlo = fv - fractions.Fraction(float(_BF16_VALS[lo]))
    dhi = fractions.Fraction(float(_BF16_VALS[hi])) - fv
    if dlo != dhi:
        return int(_BF16_BITS[lo] if dlo < dhi else _BF16_BITS[hi])
    return int(_BF16_BITS[lo] if _BF16_BITS[lo] % 2 == 0 else _BF16_BITS[hi])


def to_bfloat16(x) -> np.ndarray:
    """Each float64 of x rounded once to the nearest bfloat16 (NumPy's astype would round twice,
    through float32)."""
    x = np.asarray(x, np.float64)
    out = np.fromiter((nearest_bf16_bits(v) for v in x.ravel()), np.uint16, x.size)
    return out.reshape(x.shape).view(BF16)


def table(mean, std, dtype) -> np.ndarray:
    """(3, 256): the nearest float32 / bfloat16 to (x/255 - mean[c]) / std[c] in float64."""
    v = np.array([[(x / 255.0 - float(mean[c])) / float(std[c]) for x in range(256)]
                  for c in range(3)], np.float64)
    return v.astype(np.float32) if np.dtype(dtype) == np.float32 else to_bfloat16(v)


def normalize(pixels, mean, std, dtype=np.float32, layout="NHWC") -> np.ndarray:
    """uint8 (..., 3) pixels → the normalization contract, channels last or (NCHW) second."""
    out = table(mean, std, dtype)[np.arange(3), np.asarray(pixels)]
    return out.transpose(0, 3, 1, 2) if layout == "NCHW" else out


def taps(out_len: int, start: int, length: int):
    """kernel.h's per-axis formula in int64: source rows s0, s1 and weights w0, w1 (of 2^11)."""
    o = np.arange(out_len, dtype=np.int64)
    n = np.maximum(0, (2 * o + 1) * length - out_len)
    i, f = n // (2 * out_len), n % (2 * out_len)
    w1 = (f * 2048 + out_len) // (2 * out_len)
    return start + i, start + np.minimum(i + 1, length - 1), 2048 - w1, w1


def crop_resize(img: np.ndarray, box, oh: int, ow: int) -> np.ndarray:
    """The box (y0, x0, h, w) of an (H, W, 3) uint8 image resized to (oh, ow), exactly."""
    y0, x0, h, w = (int(v) for v in box)
    sy0, sy1, wy0, wy1 = taps(oh, y0, h)
    sx0, sx1, wx0, wx1 = taps(ow, x0, w)
    p = img.astype(np.int64)
    wx0, wx1 = wx0[None, :, None], wx1[None, :, None]
    top = wx0 * p[sy0][:, sx0] + wx1 * p[sy0][:, sx1]
    bottom = wx0 * p[sy1][:, sx0] + wx1 * p[sy1][:, sx1]
    acc = wy0[:, None, None] * top + wy1[:, None, None] * bottom
    return ((acc + (1 << 21)) >> 22).astype(np.uint8)


def gather(records, idx, out_hw, crop=None, flip=None, dtype=np.uint8, layout="NHWC",
           mean=None, std=None) -> np.ndarray:
    """What every serving path must write: records[idx] → crop-resize → flip → dtype/layout."""
    oh, ow = out_hw
    pix = []
    for b, i in enumerate(idx):
        img = records[i]
        if crop is not None:
            img = crop_resize(img, crop[b], oh, ow)
        if flip is not None and flip[b]:
            img = img[:, ::-1]
        pix.append(img)
    pix = np.stack(pix) if pix else np.zeros((0, oh, ow, 3), np.uint8)
    if np.dtype(dtype) == np.uint8:
        out = pix
    else:
        out = normalize(pix, (0, 0, 0) if mean is None else mean, (1, 1, 1) if std is None else std,
                        dtype)
    return out if layout == "NHWC" else np.ascontiguousarray(out.transpose(0, 3, 1, 2))


# ---- crop boxes: torchvision's RandomResizedCrop.get_params and FFCV's center crop ----

def rrc_reference(u, height, width, scale, ratio):
    """torchvision's RandomResizedCrop.get_params in float64, driven by the same random words
    (uniforms taken as the centre of the word's 4096-level bin)."""
    area = height * width
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(10):
        s = scale[0] + (scale[1] - scale[0]) * ((int(u[t, 0]) >> 20) + 0.5) / 4096
        r = math.exp(lo + (hi - lo) * ((int(u[t, 1]) >> 20) + 0.5) / 4096)
        w = round(math.sqrt(area * s * r))
        h = round(math.sqrt(area * s / r))
        if 0 < w <= width and 0 < h <= height:
            y = ((int(u[t, 2]) >> 16) * (height - h + 1)) >> 16
            x = ((int(u[t, 3]) >> 16) * (width - w + 1)) >> 16
            return (y, x, h, w)
    return fallback_box(height, width, ratio)


def fallback_box(height, width, ratio):
    """torchvision's central crop when no attempt fits: the whole image clamped to the ratio."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return ((height - h) // 2, (width - w) // 2, h, w)


def torchvision_sample(rng, height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """(h, w) of torchvision's RandomResizedCrop.get_params with an independent generator."""
    for _ in range(10):
        s = rng.uniform(*scale)
        r = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = round(math.sqrt(height * width * s * r)), round(math.sqrt(height * width * s / r))
        if 0 < w <= width and 0 < h <= height:
            return h, w
    return fallback_box(height, width, ratio)[2:]


def center_crop_box(height, width, fraction):
    """FFCV's CenterCropRGBImageDecoder (get_center_crop): the central square of side
    int(fraction * min(H, W)), at least 1 pixel here, as (y0, x0, c, c)."""
    c = max(1, int(fraction * min(height, width)))
    return ((height - c) // 2, (width - c) // 2, c, c)

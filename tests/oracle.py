"""The one NumPy oracle every test compares against, written from the contracts, not from the
code: the normalization contract (DESIGN §3: the float32 / bfloat16 nearest to
(x/255 - mean)/std computed in float64; bfloat16 rounding by exact rational comparison over
every finite bfloat16), the integer crop-resize formula of ffi/core/serve/kernel.h in int64, and the
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
    v = np.array([[(x / 255.0 - float(mean[c])) / float(std[c]) for x in range(256)] for c in range(3)], np.float64)
    return v.astype(np.float32) if np.dtype(dtype) == np.float32 else to_bfloat16(v)


def normalize(pixels, mean, std, dtype=np.float32, layout="NHWC") -> np.ndarray:
    """uint8 (..., 3) pixels → the normalization contract, channels last or (NCHW) second."""
    out = table(mean, std, dtype)[np.arange(3), np.asarray(pixels)]
    return out.transpose(0, 3, 1, 2) if layout == "NCHW" else out


def axis_weights(out_len: int, length: int) -> np.ndarray:
    """kernel.h's per-axis weights as a dense (out_len, length) int64 matrix: row o holds the
    weights (of 2^11) of the box's pixels for output coordinate o. Written from the formula:
    triangle values u_j = max(0, 2M - |(2j+1) out - (2o+1) len|), M = max(len, out); weights
    round(u_j * 2048 / sum u), halves up; the remainder to the largest (first of equals)."""
    o = np.arange(out_len, dtype=np.int64)[:, None]
    j = np.arange(length, dtype=np.int64)[None, :]
    m2 = 2 * max(length, out_len)
    u = np.maximum(0, m2 - np.abs((2 * j + 1) * out_len - (2 * o + 1) * length))
    total = u.sum(axis=1, keepdims=True)
    w = (2 * u * 2048 + total) // (2 * total)  # round half up, exact in int64
    big = np.argmax(w, axis=1)  # first of the largest
    w[np.arange(out_len), big] += 2048 - w.sum(axis=1)
    assert (w >= 0).all() and (w.sum(axis=1) == 2048).all()
    return w


def crop_resize(img: np.ndarray, box, oh: int, ow: int) -> np.ndarray:
    """The box (y0, x0, h, w) of an (H, W, 3) uint8 image resized to (oh, ow), exactly."""
    y0, x0, h, w = (int(v) for v in box)
    p = img[y0 : y0 + h, x0 : x0 + w].astype(np.int64)
    wy, wx = axis_weights(oh, h), axis_weights(ow, w)
    # sum_j sum_i wy[o, j] wx[q, i] P[j, i, c], exact in int64 (at most 2^22 * 255), so summing
    # over j first and i second gives the same integers as the triple sum, in O(h w) per output
    # row instead of one einsum over every (o, q, j, i): 6.8 s -> 0.03 s for a 176 -> 160 box.
    acc = np.tensordot(np.tensordot(wy, p, axes=(1, 0)), wx, axes=(1, 1)).transpose(0, 2, 1)
    return np.ascontiguousarray(((acc + (1 << 21)) >> 22).astype(np.uint8))


def gather(
    records, idx, out_hw, crop=None, flip=None, dtype=np.uint8, layout="NHWC", mean=None, std=None
) -> np.ndarray:
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
        out = normalize(pix, (0, 0, 0) if mean is None else mean, (1, 1, 1) if std is None else std, dtype)
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

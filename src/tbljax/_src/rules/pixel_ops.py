"""The per-image ops of issue 47 (RandAugment's pixel program and affine stage, random erasing)
as exact NumPy: the contract the kernel's stages must match byte for byte. Framework-free and
slow on purpose (whole-image NumPy, a Python loop only over an image's 256-entry LUTs).

**Ops and their integer argument** (`CODES`, the ``ops`` / ``op_args`` columns of
``docs/transforms-design.md``; code 0 is "none"). Pillow's rules, as timm 1.0 calls them:

- ``Invert``: 255 - x. ``Posterize`` (arg = bits kept, 0..8): ``x & ~(2**(8 - bits) - 1)``.
  ``Solarize`` (arg = threshold, 0..256): ``x if x < t else 255 - x``. ``SolarizeAdd``
  (arg = add): ``min(255, x + add) if x < 128 else x``.
- ``AutoContrast``: per channel, lo/hi = the smallest/largest value present; LUT
  ``clip(int(i * s - lo * s), 0, 255)``, ``s = 255.0 / (hi - lo)`` in float64 (identity if
  hi <= lo). ``Equalize``: per channel, Pillow's integer LUT (``step = (N - last) // 255``,
  ``lut[i] = (step // 2 + cumsum[i-1]) // step``, identity when one value or step is 0).
- The blends (arg = the factor's float32 bits, as ``Image.blend`` casts it to C float):
  ``clip(trunc(float32(d) + f * float32(x - d)), 0, 255)``, with ``f == 0`` giving ``d`` and
  ``f == 1`` giving ``x``. The degenerate ``d``: ``Brightness`` 0; ``Color`` the luma
  ``(19595 r + 38470 g + 7471 b + 32768) >> 16`` per pixel; ``Contrast`` the luma's mean
  ``int(mean + 0.5)`` (float64), one value; ``Sharpness`` Pillow's SMOOTH filter (3x3,
  weights 1 and 5 at the centre, /13; float32 sums in Pillow's order, + 0.5 and truncated; the border
  rows and columns copied).
- The affine ops (arg = the signed magnitude's float32 bits; `affine_level` turns it into
  timm's level in float64: degrees, shear factor, pixels, or pixels from a fraction of the
  width/height for the ``Rel`` translations, so a magnitude timm is given is reproduced
  exactly): the output pixel (x, y) samples the input
  at ``M @ (x + 0.5, y + 0.5, 1)`` (float64; Pillow's ``rotate`` matrix about the centre with
  cos/sin rounded to 15 digits). Bilinear: outside [0, W) x [0, H) is ``fill``, inside the
  four clamped neighbours at ``p - 0.5`` blended in float64 (x first) and truncated; nearest:
  Pillow's own sweep (16.16 fixed point, or float64 running sums), ``fill`` outside
  (`pixel_filters.affine_transform`).
- ``Grayscale``: the luma above on all three channels (Pillow's ``convert("L")`` and back;
  ``Color`` at factor 0). ``GaussianBlur`` (arg = the radius's float32 bits): `gaussian_blur`
  (`pixel_filters`), Pillow's ``ImageFilter.GaussianBlur`` written out (three extended box
  passes per axis).
- torchvision's geometric ops on a PIL image (``TvRotate``: degrees, ``TvShearX/Y``: the shear
  factor, float32 bits; ``TvTranslateX/Y``: whole pixels): `tv_affine_matrix`, torchvision's
  ``_get_inverse_affine_matrix`` (shears about (0, 0), translations about the centre), Pillow's
  ``rotate`` for ``TvRotate``; resampled as the affine ops above.
- ``Hue`` (arg = the hue shift, 0..255): torchvision's ``adjust_hue`` on a PIL image: Pillow's
  ``convert("HSV")``, ``h + shift`` mod 256, ``convert("RGB")`` (`_hue`: Pillow's ``rgb2hsv_row``
  and ``hsv2rgb`` with their float32/float64 steps written out).
- ``Cutout`` (big_vision's RandAugment only; arg = ``pad << 24 | cy12 << 12 | cx12``): TF's
  cutout, a square of half-side ``pad`` about ``(cy12 * H >> 12, cx12 * W >> 12)``, clipped to
  the image, set to ``fill``.

**Random erasing** (`erase`, on the normalized float32 CHW values, where timm applies it):
each box gets ``0`` (``"const"``), one normal per channel (``"rand"``) or one per value
(``"pixel"``). Normals come from `normal_table`: 4096 float32 quantiles of N(0, 1) indexed by
the top 12 bits of ``order.hash32([key, box, channel, y * W + x])`` (``x = 2**16 - 1`` for the
per-channel value): exact on every path, and distributed as N(0, 1) to within 1/8192 in CDF.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from tbljax._src.rules import order, pixel_filters
from tbljax._src.rules.pixel_filters import gaussian_blur

__all__ = [
    "AFFINE",
    "CODES",
    "FLOAT_ARG",
    "INTERPOLATIONS",
    "TV_AFFINE",
    "affine_level",
    "affine_matrix",
    "apply",
    "apply_all",
    "erase",
    "f32_arg",
    "gaussian_blur",
    "normal_table",
    "op_matrix",
    "tv_affine_matrix",
]

# One home for the op codes (the kernel's enum is these numbers).
CODES = {
    "none": 0,
    "AutoContrast": 1,
    "Equalize": 2,
    "Invert": 3,
    "Posterize": 4,
    "Solarize": 5,
    "SolarizeAdd": 6,
    "Color": 7,
    "Contrast": 8,
    "Brightness": 9,
    "Sharpness": 10,
    "Rotate": 11,
    "ShearX": 12,
    "ShearY": 13,
    "TranslateX": 14,
    "TranslateY": 15,
    "TranslateXRel": 16,
    "TranslateYRel": 17,
    "Cutout": 18,
    "Grayscale": 19,
    "GaussianBlur": 20,
    "TvRotate": 21,
    "TvShearX": 22,
    "TvShearY": 23,
    "TvTranslateX": 24,
    "TvTranslateY": 25,
    "Hue": 26,
}
# torchvision's geometric ops on a PIL image (TrivialAugmentWide): the argument is the level itself.
TV_AFFINE = frozenset(CODES[n] for n in ("TvRotate", "TvShearX", "TvShearY", "TvTranslateX", "TvTranslateY"))
AFFINE = frozenset(
    CODES[n] for n in ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel")
)
FLOAT_ARG = AFFINE | {
    CODES[n]
    for n in ("Color", "Contrast", "Brightness", "Sharpness", "GaussianBlur", "TvRotate", "TvShearX", "TvShearY")
}
INTERPOLATIONS = ("bilinear", "nearest")
_NAMES = {v: k for k, v in CODES.items()}


def f32_arg(value: float) -> int:
    """A float as the int32 holding its float32 bits (the op argument of a blend or affine op)."""
    return int(np.array(value, np.float32).view(np.int32))


def _f32(arg) -> np.float32:
    return np.array(arg, np.int32).view(np.float32)[()]


def _lut(image, luts):
    """Apply per-channel 256-entry LUTs (3, 256) to an HxWx3 uint8 image."""
    luts = np.asarray(luts, np.uint8)
    return np.stack([luts[c][image[..., c]] for c in range(3)], axis=-1)


def _autocontrast(image):
    luts = []
    for c in range(3):
        present = np.flatnonzero(np.bincount(image[..., c].ravel(), minlength=256))
        lo, hi = int(present[0]), int(present[-1])
        if hi <= lo:
            luts.append(np.arange(256))
            continue
        scale = 255.0 / (hi - lo)
        offset = -lo * scale
        luts.append(np.clip(np.trunc(np.arange(256) * scale + offset), 0, 255))
    return _lut(image, luts)


def _equalize(image):
    luts = []
    for c in range(3):
        h = np.bincount(image[..., c].ravel(), minlength=256).astype(np.int64)
        used = h[h > 0]
        step = (int(used.sum()) - int(used[-1])) // 255 if len(used) > 1 else 0
        if not step:
            luts.append(np.arange(256))
            continue
        n = step // 2 + np.concatenate([[0], np.cumsum(h)[:-1]])
        luts.append(np.minimum(n // step, 255))  # Pillow's lut values stay <= 255 (clipped in C)
    return _lut(image, luts)


def _luma(image):
    """Pillow's RGB -> L: (19595 r + 38470 g + 7471 b + 0x8000) >> 16, as uint8."""
    x = image.astype(np.int64)
    return ((x[..., 0] * 19595 + x[..., 1] * 38470 + x[..., 2] * 7471 + 0x8000) >> 16).astype(np.uint8)


def _round(x):
    """C's round (half away from zero) of non-negative float64 values."""
    f = np.floor(x)
    return np.where(x - f >= 0.5, f + 1, f)


def _hue(image, shift):
    """Pillow's RGB -> HSV (``rgb2hsv_row``), ``h += shift`` in uint8, HSV -> RGB (``hsv2rgb``):
    float32 variables and float64 literals rounded where the C code rounds them."""
    f32, f64 = np.float32, np.float64
    x = image.astype(np.int64)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    maxc, minc = x.max(axis=-1), x.min(axis=-1)
    gray = maxc == minc
    cr = np.where(gray, 1, maxc - minc).astype(f32)
    s = (cr / np.maximum(maxc, 1).astype(f32)).astype(f32)
    rc, gc, bc = (((maxc - c).astype(f32) / cr).astype(f32).astype(f64) for c in (r, g, b))
    h = np.where(r == maxc, bc - gc, np.where(g == maxc, 2.0 + rc - bc, 4.0 + gc - rc)).astype(f32)
    h = np.fmod(h.astype(f64) / 6.0 + 1.0, 1.0).astype(f32)
    uh = np.where(gray, 0, np.clip(np.trunc(h.astype(f64) * 255.0), 0, 255)).astype(np.int64)
    us = np.where(gray, 0, np.clip(np.trunc(s.astype(f64) * 255.0), 0, 255)).astype(np.int64)
    uh = (uh + int(shift)) & 0xFF
    hh = uh.astype(f64) * 6.0 / 255.0
    i = np.floor(hh).astype(np.int64)
    f = (hh - i).astype(f32)
    fs = (us.astype(f64) / 255.0).astype(f32)
    v = maxc.astype(f64)
    p = np.clip(_round(v * (1.0 - fs.astype(f64))), 0, 255)
    q = np.clip(_round(v * (1.0 - (fs * f).astype(f64))), 0, 255)
    t = np.clip(_round(v * (1.0 - fs.astype(f64) * (1.0 - f.astype(f64)))), 0, 255)
    sector = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = np.stack([np.choose(i % 6, [sec[c] for sec in sector]) for c in range(3)], axis=-1)
    out = np.where((us == 0)[..., None], v[..., None], out)
    return out.astype(np.uint8)


def _blend(degenerate, image, factor):
    f = np.float32(factor)
    if f == 0:
        return np.broadcast_to(degenerate, image.shape).astype(np.uint8)
    if f == 1:
        return image.copy()
    d = np.broadcast_to(degenerate, image.shape).astype(np.int32)
    v = d.astype(np.float32) + f * (image.astype(np.int32) - d).astype(np.float32)
    return np.clip(np.trunc(v), 0, 255).astype(np.uint8)


def affine_level(code: int, magnitude: float, translate_const: float = 100.0, translate_pct: float = 0.45) -> float:
    """timm's level of an affine op for a signed magnitude (negative: negated), in float64."""
    name = _NAMES[code]
    sign, m = (-1.0 if math.copysign(1.0, magnitude) < 0 else 1.0), abs(float(magnitude))
    scale = {"Rotate": 30.0, "ShearX": 0.3, "ShearY": 0.3}.get(name)
    if scale is None:
        scale = float(translate_pct) if name.endswith("Rel") else float(translate_const)
    return sign * (m / 10 * scale)


def affine_matrix(code: int, level: float, height: int, width: int) -> tuple[float, ...]:
    """Pillow's (a, b, c, d, e, f) for an affine op: input = (a x + b y + c, d x + e y + f)."""
    name = _NAMES[code]
    if name == "Rotate":
        angle = -math.radians(level)
        m = [
            round(math.cos(angle), 15),
            round(math.sin(angle), 15),
            0.0,
            round(-math.sin(angle), 15),
            round(math.cos(angle), 15),
            0.0,
        ]
        cx, cy = width / 2.0, height / 2.0
        m[2] = m[0] * -cx + m[1] * -cy + cx
        m[5] = m[3] * -cx + m[4] * -cy + cy
        return tuple(m)
    if name == "ShearX":
        return (1.0, level, 0.0, 0.0, 1.0, 0.0)
    if name == "ShearY":
        return (1.0, 0.0, 0.0, level, 1.0, 0.0)
    if name in ("TranslateX", "TranslateXRel"):
        return (1.0, 0.0, level * width if name.endswith("Rel") else level, 0.0, 1.0, 0.0)
    return (1.0, 0.0, 0.0, 0.0, 1.0, level * height if name.endswith("Rel") else level)


def tv_affine_matrix(code: int, level: float, height: int, width: int) -> tuple[float, ...]:
    """torchvision's inverse affine matrix (``_get_inverse_affine_matrix``, float64) for a
    TrivialAugmentWide geometric op on a PIL image: shear factor `level` as the angle
    ``degrees(atan(level))`` about (0, 0), or `level` whole pixels about the centre."""
    name = _NAMES[code]
    if name == "TvRotate":
        return affine_matrix(CODES["Rotate"], level, height, width)
    shear = math.degrees(math.atan(level)) if name in ("TvShearX", "TvShearY") else 0.0
    sx, sy = (math.radians(shear), 0.0) if name == "TvShearX" else (0.0, math.radians(shear))
    tx, ty = {"TvTranslateX": (level, 0.0), "TvTranslateY": (0.0, level)}.get(name, (0.0, 0.0))
    cx, cy = (0.0, 0.0) if name in ("TvShearX", "TvShearY") else (width * 0.5, height * 0.5)
    a = math.cos(-sy) / math.cos(sy)
    b = -math.cos(-sy) * math.tan(sx) / math.cos(sy) - math.sin(0.0)
    c = math.sin(-sy) / math.cos(sy)
    d = -math.sin(-sy) * math.tan(sx) / math.cos(sy) + math.cos(0.0)
    m = [d, -b, 0.0, -c, a, 0.0]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return tuple(m)


def op_matrix(
    code: int, arg: int, height: int, width: int, translate_const: float = 100.0, translate_pct: float = 0.45
) -> tuple[float, ...]:
    """The (a, b, c, d, e, f) an affine op (`AFFINE`, `TV_AFFINE`) with integer argument `arg`
    resamples an image of `height` x `width` by (the kernel takes it built here)."""
    if code in TV_AFFINE:
        tv_translate = code in (CODES["TvTranslateX"], CODES["TvTranslateY"])  # whole pixels, not float bits
        return tv_affine_matrix(code, float(arg) if tv_translate else float(_f32(arg)), height, width)
    level = affine_level(code, float(_f32(arg)), translate_const, translate_pct)
    return affine_matrix(code, level, height, width)


def _cutout(image, arg, fill):
    h, w = image.shape[:2]
    pad, cy, cx = (arg >> 24) & 0xFF, (arg >> 12) & 0xFFF, arg & 0xFFF
    cy, cx = (cy * h) >> 12, (cx * w) >> 12
    out = image.copy()
    out[max(0, cy - pad) : min(h, cy + pad), max(0, cx - pad) : min(w, cx + pad)] = fill
    return out


def _check(interpolation):
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    return interpolation


def apply(
    image,
    code: int,
    arg: int,
    *,
    fill=(128, 128, 128),
    interpolation: str = "bilinear",
    translate_const: float = 100.0,
    translate_pct: float = 0.45,
):
    """One op (`CODES`) with its integer argument on an HxWx3 uint8 image: a new uint8 image.

    >>> img = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    >>> bool((apply(img, CODES["Invert"], 0) == 255 - img).all())
    True
    """
    image = np.asarray(image)
    code, arg = int(code), int(arg)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be HxWx3 uint8, got {image.dtype} {image.shape}")
    if code not in _NAMES:
        raise ValueError(f"op code must be one of {sorted(_NAMES)}, got {code}")
    name = _NAMES[code]
    i = np.arange(256)
    if name == "none":
        return image.copy()
    if name == "AutoContrast":
        return _autocontrast(image)
    if name == "Equalize":
        return _equalize(image)
    if name == "Invert":
        return 255 - image
    if name == "Posterize":
        return image & np.uint8(~(2 ** (8 - min(arg, 8)) - 1) & 0xFF)
    if name == "Solarize":
        return _lut(image, [np.where(i < arg, i, 255 - i)] * 3)
    if name == "SolarizeAdd":
        return _lut(image, [np.where(i < 128, np.minimum(255, i + arg), i)] * 3)
    if name == "Cutout":
        return _cutout(image, arg, fill)
    if name == "Hue":
        return _hue(image, arg)
    if name == "Grayscale":
        return np.repeat(_luma(image)[..., None], 3, axis=2)
    if code in AFFINE | TV_AFFINE:
        matrix = op_matrix(code, arg, *image.shape[:2], translate_const, translate_pct)
        return pixel_filters.affine_transform(image, matrix, _check(interpolation), fill)
    level = _f32(arg)
    if name == "GaussianBlur":
        return gaussian_blur(image, level)
    if name == "Brightness":
        degenerate = np.uint8(0)
    elif name == "Color":
        degenerate = _luma(image)[..., None]
    elif name == "Contrast":
        degenerate = np.uint8(int(float(_luma(image).mean(dtype=np.float64)) + 0.5))
    else:
        degenerate = pixel_filters.smooth(image)
    return _blend(degenerate, image, level)


def apply_all(image, codes, args, **kw):
    """A row's pixel program: its (K,) ops in order (code 0 skipped)."""
    for code, arg in zip(np.asarray(codes).tolist(), np.asarray(args).tolist()):
        if code:
            image = apply(image, code, arg, **kw)
    return image


@functools.lru_cache(maxsize=1)
def normal_table() -> np.ndarray:
    """float32 (4096,): N(0, 1) quantiles at (k + 0.5) / 4096, computed in float64."""
    from scipy.special import ndtri

    t = ndtri((np.arange(4096, dtype=np.float64) + 0.5) / 4096).astype(np.float32)
    t.setflags(write=False)
    return t


def _normals(key, box, shape, per_channel):
    c, h, w = shape
    ch = np.arange(c, dtype=np.uint32)[:, None, None]
    if per_channel:
        pos = np.full((1, 1, 1), 0xFFFF, np.uint32)
    else:
        pos = (np.arange(h, dtype=np.uint32)[:, None] * np.uint32(w) + np.arange(w, dtype=np.uint32))[None]
    words = order.hash32([np.full((1, 1, 1), key, np.uint32), np.full((1, 1, 1), box, np.uint32), ch, pos])
    return normal_table()[words >> np.uint32(20)]


def erase(values, boxes, key, mode: str):
    """Random erasing of one normalized CHW float32 image: each (y0, x0, h, w) box with h > 0
    set to 0 (``"const"``), a normal per channel (``"rand"``) or per value (``"pixel"``),
    the normals of `normal_table` keyed by `key` (uint32) and the value's position."""
    out = np.array(values, np.float32, copy=True)
    for e, (y0, x0, h, w) in enumerate(np.asarray(boxes).tolist()):
        if h <= 0:
            continue
        if mode == "const":
            out[:, y0 : y0 + h, x0 : x0 + w] = 0
        elif mode == "rand":
            out[:, y0 : y0 + h, x0 : x0 + w] = _normals(key, e, out.shape, True)
        else:
            out[:, y0 : y0 + h, x0 : x0 + w] = _normals(key, e, out.shape, False)[:, y0 : y0 + h, x0 : x0 + w]
    return out

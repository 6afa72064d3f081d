"""Source items to records, a chunk at a time: JPEGs decoded and resized in the C++ pool (GIL
released), other formats through Pillow with the same C++ resize, compact JPEG records
re-encoded at the converted geometry with restart markers; and the source-size statistics the
recipe keeps. Each item gives its record or the reason it failed."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from tbljax import _core
from tbljax._src.conversion.convert_options import FIXED_SIZE_MODES
from tbljax._src.sources.items import Item

__all__ = [
    "COMPACT_RESTART_MCUS",
    "Encoded",
    "as_rgb",
    "choose_raw",
    "decode_chunk",
    "encode_chunk",
    "is_jpeg",
    "pil_decode",
    "restart_mcus",
    "size_histogram",
    "source_size",
]

_MCU_WIDTH = {"420": 16, "444": 8}  # an MCU's width in pixels at each chroma subsampling


# Compact records carry a restart marker every COMPACT_RESTART_MCUS MCUs (1 where a row's MCU
# count is odd: segments must not span rows), so serving a crop box entropy-decodes only the
# segments it covers (ffi/core/jpeg/jpeg_restart.h). Measured here: 817 real photos (kodak, half of
# caltech101) at max side 256, q90 4:2:0, RRC boxes resized to 160 px, one thread, medians of 9
# rounds in each of 3 processes. No markers: 15.04 KiB a record, 213-216 us an image. Every MCU:
# +4.7 % bytes, 0.86-0.87x the time; every 2 (odd rows: none) +2.3 %, 0.83-0.84x; every 4 (one
# run) +1.2 %, 0.88x; every 2 (odd rows: 1) +2.7 %, 0.80-0.81x: taken. A whole-image box costs
# 1.08x (restart handling in libjpeg; every MCU: 1.09x). Again with our own entropy decoder, at
# shorter side 256 (benchmarks/probe_box_cost.py --intervals 2 1): every MCU +2.5 % bytes and
# 1.02-1.05x the time of every 2.
COMPACT_RESTART_MCUS = 2


def is_jpeg(data: Any) -> bool:
    return isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:3]) == b"\xff\xd8\xff"


def source_size(data: Any) -> tuple[int, int]:
    """(width, height) of a source image as displayed, from its header only; (0, 0) if unknown."""
    if isinstance(data, np.ndarray):
        return int(data.shape[1]), int(data.shape[0])
    if is_jpeg(data):
        info = _core.jpeg_info(data)
        return int(info["width"]), int(info["height"])
    try:
        import io

        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            return im.size
    except Exception:  # only statistics: an unreadable header just goes uncounted
        return 0, 0


SIZE_BINS = [0, 128, 256, 384, 512, 768, 1024, 2048, 4096]


def size_histogram(widths: Sequence[int], heights: Sequence[int]) -> dict[str, Any]:
    """Source-size statistics kept in the recipe (shown by `tbljax info`)."""
    w, h = np.asarray(widths, np.int64), np.asarray(heights, np.int64)
    known = (w > 0) & (h > 0)
    w, h = w[known], h[known]
    edges = SIZE_BINS + [np.iinfo(np.int64).max]
    return {
        "count": int(w.size),
        "bins": SIZE_BINS,
        "longer_side": np.histogram(np.maximum(w, h), edges)[0].tolist(),
        "shorter_side": np.histogram(np.minimum(w, h), edges)[0].tolist(),
        "median_wh": [int(np.median(w)), int(np.median(h))] if w.size else [0, 0],
        "min_wh": [int(w.min()), int(h.min())] if w.size else [0, 0],
        "max_wh": [int(w.max()), int(h.max())] if w.size else [0, 0],
    }


def pil_decode(data: bytes) -> np.ndarray:
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise ValueError("not a JPEG; other formats need Pillow (pip install 'tbljax[pil]')") from None
    import io

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return rgb8(ImageOps.exif_transpose(im))
    except Image.UnidentifiedImageError:  # its message names only an io.BytesIO; the skip names the file
        raise ValueError("cannot decode image: not an image format Pillow reads") from None
    except Exception as e:  # Pillow raises many types for bad data; all mean "cannot decode"
        raise ValueError(f"cannot decode image: {type(e).__name__}: {e}") from None


def rgb8(im: Any) -> np.ndarray:
    """A Pillow image as 8-bit RGB (docs/reference.md, "Image modes"): 16- and 32-bit integer
    gray (`I;16`, `I`) scaled from [0, 65535], float gray (`F`) from [0, 1], each rounded, values
    outside clipped; alpha dropped (the colour as stored); every other mode by Pillow's
    convert. Pillow's own convert of `I;16`/`I`/`F` clips at 255 (a 16-bit photo turns white)."""
    if im.mode.startswith("I") or im.mode == "F":
        top = 1.0 if im.mode == "F" else 65535.0
        g = np.round(np.clip(np.asarray(im, np.float64), 0, top) * (255 / top)).astype(np.uint8)
        return np.repeat(g[:, :, None], 3, axis=2)
    if im.mode in ("P", "PA"):  # a palette with transparency: Pillow warns unless through RGBA
        im = im.convert("RGBA")
    return np.asarray(im.convert("RGB"))


def as_rgb(img: np.ndarray) -> np.ndarray:
    if img.ndim == 2:
        img = img[:, :, None]
    if img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    elif img.shape[2] == 4:
        img = img[:, :, :3]
    return np.ascontiguousarray(img)


class Encoded(NamedTuple):
    """A compact record: JPEG bytes of an image at its converted geometry (and, for a raw
    budget to choose from, the pixels they encode)."""

    data: bytes
    height: int
    width: int
    pixels: np.ndarray | None = None


def encode_chunk(
    pixels: list[np.ndarray | str], quality: int, chroma: str, threads: int, keep_pixels: bool = False
) -> list[Encoded | str]:
    """Re-encodes the decoded images of a chunk (libjpeg-turbo, C++ pool, GIL released);
    failures pass through. keep_pixels: each Encoded also holds its pixels."""
    out: list[Encoded | str] = list(pixels)  # type: ignore[arg-type]
    by_interval: dict[int, list[int]] = {}
    for i, img in enumerate(pixels):
        if not isinstance(img, str):
            by_interval.setdefault(restart_mcus(img.shape[1], chroma), []).append(i)
    for interval, rows in by_interval.items():
        blobs = _core.encode_jpeg_batch([pixels[i] for i in rows], quality, chroma, threads, restart_mcus=interval)
        for i, blob in zip(rows, blobs):
            img = pixels[i]
            out[i] = Encoded(
                blob,
                int(img.shape[0]),
                int(img.shape[1]),  # type: ignore[union-attr]
                img if keep_pixels else None,
            )  # type: ignore[arg-type]
    return out


def choose_raw(jpeg_bytes: Sequence[int], raw_bytes: Sequence[int], allowance: float) -> list[int]:
    """Which records of a chunk to store RAW instead of as JPEG, adding at most `allowance`
    bytes to the file: the records with the most JPEG bytes per RAW byte first (the entropy
    decoder's share of a decode, ~70%, grows with the JPEG's bytes, while the rest of it and
    the RAW record's cost grow with the pixels), each taken if its extra bytes still fit.
    Ties go to the earlier record, so the choice is a pure function of the chunk.

    >>> choose_raw([30, 10, 20], [100, 100, 100], 150)
    [0, 2]
    """
    order = sorted(range(len(jpeg_bytes)), key=lambda i: (-jpeg_bytes[i] / raw_bytes[i], i))
    chosen = []
    for i in order:
        extra = raw_bytes[i] - jpeg_bytes[i]
        if extra <= allowance:
            allowance -= extra
            chosen.append(i)
    return sorted(chosen)


def restart_mcus(width: int, chroma: str) -> int:
    """The restart interval (in MCUs) of a compact record `width` pixels wide: COMPACT_RESTART_MCUS
    where it divides the MCUs of a row, else 1.

    >>> restart_mcus(256, "420"), restart_mcus(171, "420")
    (2, 1)
    """
    per_row = -(-width // _MCU_WIDTH[chroma])
    return COMPACT_RESTART_MCUS if per_row % COMPACT_RESTART_MCUS == 0 else 1


def decode_chunk(
    chunk: list[Item], size: int, mode: str, threads: int, pool: ThreadPoolExecutor, max_long: int = 0
) -> list[np.ndarray | str]:
    """Decoded + resized pixels for each item, or the reason it failed."""
    out: list[np.ndarray | str | None] = [None] * len(chunk)
    for i, item in enumerate(chunk):
        if item.error is not None:
            out[i] = item.error
        elif item.data is None or (not isinstance(item.data, np.ndarray) and len(item.data) == 0):
            out[i] = "empty (zero-byte) image"
    jpeg_rows = [i for i, it in enumerate(chunk) if out[i] is None and is_jpeg(it.data)]
    if jpeg_rows and mode in FIXED_SIZE_MODES:
        buf = np.empty((len(jpeg_rows), size, size, 3), np.uint8)
        errors = _core.decode_resize_into([chunk[i].data for i in jpeg_rows], buf, mode, threads)
        for k, (i, err) in enumerate(zip(jpeg_rows, errors)):
            out[i] = buf[k] if err is None else err
    rest = [i for i in range(len(chunk)) if out[i] is None]

    def one(i: int) -> np.ndarray | str:
        data = chunk[i].data
        try:
            if isinstance(data, np.ndarray):
                return _core.resize(as_rgb(data), size, mode, max_long)
            if is_jpeg(data):
                return _core.decode_resize(data, size, mode, max_long)
            return _core.resize(pil_decode(data), size, mode, max_long)
        except (ValueError, _core.DecodeError) as e:
            return str(e)

    for i, r in zip(rest, pool.map(one, rest)):
        out[i] = r
    return out  # type: ignore[return-value]

"""Compact records with restart markers: a crop box of a record whose restart interval divides
its MCUs per row is decoded from the restart segments covering the box alone
(ffi/core/jpeg/jpeg_restart.h, DecodeJpegBox), and gives exactly Pillow's whole-image decode for
every box class, subsampling, size and interval, at full size and at 1/2, 1/4 and 1/8
(dct_scale=True: Pillow's draft() decode at that scale); an interval that does not divide the
row keeps the crop-and-skip path; convert writes the markers; damaged segments and restart
markers fail with DecodeError, damage in segments the box does not need goes unnoticed.

The one-pixel margin of the part (kUpsampleMargin in ffi/core/jpeg/decode_box.cpp) is what the box-class
tests prove: built with no margin, 12 of the box tests of this file and test_compact_serve.py
fail (chroma upsampling at the part's inner edge differs from a whole decode). At 1/k the
margin is one pixel at that scale: without it 10 of the scaled tests below fail (4:2:2 at 1/2
and 1/4, and the real photos); 4:2:0 needs none there (libjpeg's IDCT scales its chroma up to
full size). A part at most 4 pixels wide at 1/k is widened (its at most 2 chroma samples
libjpeg would repeat, not smooth): without that, 6 of them fail."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from conftest import shared_dir
from PIL import Image
from test_compact_serve import box_classes, box_pixels, pil_decode, scan_start, source_of, synthetic_photos, textured

import tbljax
from tbljax import _core
from tbljax._src.engine import kernels
from tbljax._src.rules.augment import crop_boxes
from tbljax._src.rules.record_geometry import RecordGeometry

import oracle

# (MCU width, MCU height) in pixels: the unit restart intervals count.
MCU = {"420": (16, 16), "422": (16, 8), "444": (8, 8), "gray": (8, 8)}


def encode(img: np.ndarray, kind: str, restart_mcus: int) -> bytes:
    if kind == "gray":
        return _core.encode_jpeg(img[..., 1].copy(), quality=90, restart_mcus=restart_mcus)
    return _core.encode_jpeg(img, quality=90, subsampling=kind, restart_mcus=restart_mcus)


def restart_interval(jpeg: bytes) -> int:
    """The DRI marker's interval (0 when absent), read from the header's markers."""
    pos = 2
    while jpeg[pos + 1] != 0xDA:
        if jpeg[pos + 1] == 0xDD:
            return struct.unpack_from(">H", jpeg, pos + 4)[0]
        pos += 2 + struct.unpack_from(">H", jpeg, pos + 2)[0]
    return 0


def restart_segments(jpeg: bytes) -> list[tuple[int, int]]:
    """(start, end) of each entropy-coded segment: the scan split at its RSTn markers."""
    start = i = scan_start(jpeg)
    out = []
    while True:
        i = jpeg.index(b"\xff", i)
        m = jpeg[i + 1]
        if m == 0x00:  # a stuffed 0xFF data byte
            i += 2
        elif 0xD0 <= m <= 0xD7:
            out.append((start, i))
            start = i = i + 2
        elif m == 0xD9:
            out.append((start, i))
            return out
        else:  # fill before a marker
            i += 1


def per_row(w: int, kind: str) -> int:
    return -(-w // MCU[kind][0])


def intervals(n: int) -> list[int]:
    """1, 2, 3 where they divide a row of n MCUs, n itself, and one that does not divide."""
    dividing = sorted({r for r in (1, 2, 3, n) if n % r == 0})
    return dividing + [r for r in range(2, n) if n % r][:1]


@pytest.mark.parametrize("kind", ["420", "422", "444", "gray"])
@pytest.mark.parametrize("hw", [(67, 93), (33, 257), (256, 171), (16, 16), (5, 7), (8, 100), (100, 9)])
def test_box_decode_of_restart_records_is_the_whole_decode(kind, hw):
    h, w = hw
    img = textured(h, w, seed=h + w)
    for r in intervals(per_row(w, kind)):
        blob = encode(img, kind, r)
        assert restart_interval(blob) == r
        whole = pil_decode(blob)  # Pillow: libjpeg-turbo, ISLOW, fancy upsampling, whole image
        src = source_of([blob], [hw])
        for y0, x0, bh, bw in box_classes(h, w, MCU[kind][0], np.random.default_rng(h * w + r)):
            if y0 < 0 or x0 < 0 or y0 + bh > h or x0 + bw > w:
                continue
            np.testing.assert_array_equal(
                box_pixels(src, 0, (y0, x0, bh, bw)),
                whole[y0 : y0 + bh, x0 : x0 + bw],
                err_msg=f"R={r} box={(y0, x0, bh, bw)}",
            )


def zero_segment(blob: bytes, seg: tuple[int, int]) -> bytes:
    a, b = seg
    return blob[:a] + b"\0" * (b - a) + blob[b:]


@pytest.mark.parametrize("kind", ["420", "444", "gray"])
def test_only_the_boxs_segments_are_decoded(kind):
    h, w = 96, 128
    r = 2
    blob = encode(textured(h, w, seed=5), kind, r)
    whole = pil_decode(blob)
    segs = restart_segments(blob)
    mcu_w, mcu_h = MCU[kind]
    assert len(segs) == (h // mcu_h) * per_row(w, kind) // r
    bad = zero_segment(blob, segs[0])  # the top-left segment: 2 MCUs wide
    src = source_of([bad], [(h, w)])
    with pytest.raises(tbljax.DecodeError, match="corrupt"):
        box_pixels(src, 0, (0, 0, 4, 4))
    with pytest.raises(tbljax.DecodeError, match="corrupt"):
        box_pixels(src, 0, (0, 0, h, w))
    # Boxes whose segments (with the one-pixel margin) miss it: the whole decode's pixels, where
    # crop-and-skip would have entropy-decoded the damaged rows above.
    for box in [(h - 20, w - 30, 20, 30), (mcu_h + 1, 0, 10, 2 * mcu_w), (0, 2 * mcu_w + 1, 5, 9)]:
        y0, x0, bh, bw = box
        np.testing.assert_array_equal(box_pixels(src, 0, box), whole[y0 : y0 + bh, x0 : x0 + bw])


def test_an_interval_that_does_not_divide_the_row_keeps_the_usual_path():
    h, w = 64, 80  # 4:2:0: 5 MCUs a row; a segment of 2 MCUs would span rows
    blob = encode(textured(h, w, seed=6), "420", 2)
    whole = pil_decode(blob)
    src = source_of([zero_segment(blob, restart_segments(blob)[0])], [(h, w)])
    # Crop-and-skip entropy-decodes every row above the box: the damage fails it...
    with pytest.raises(tbljax.DecodeError, match="corrupt"):
        box_pixels(src, 0, (h - 20, w - 30, 20, 30))
    # ...and the undamaged record serves the whole decode's pixels.
    src = source_of([blob], [(h, w)])
    np.testing.assert_array_equal(box_pixels(src, 0, (h - 20, w - 30, 20, 30)), whole[-20:, -30:])


def test_damaged_restart_markers_fail_whatever_the_box():
    h, w = 64, 96
    blob = encode(textured(h, w, seed=7), "420", 1)
    segs = restart_segments(blob)
    marker = segs[4][1]  # the RST after segment 4 (RST4)
    assert blob[marker : marker + 2] == b"\xff\xd4"
    garbled = blob[: marker + 1] + b"\xd6" + blob[marker + 2 :]
    removed = blob[:marker] + blob[marker + 2 :]
    last = segs[-2][1]  # the last RST: without it the sequence holds, the count does not
    removed_last = blob[:last] + blob[last + 2 :]
    cut = blob[: segs[len(segs) // 2 - 1][1]] + b"\xff\xd9"  # truncated after a segment
    end = segs[-1][1]  # one marker more, numbered in sequence, before the EOI
    extra = blob[:end] + bytes([0xFF, 0xD0 + (len(segs) - 1) % 8]) + blob[end:]
    cases = [
        (garbled, "restart marker 5 is RST6, expected RST4"),
        (removed, "restart marker 5 is RST5, expected RST4"),
        (removed_last, f"holds {len(segs) - 1} restart intervals, its header implies {len(segs)}"),
        (cut, f"holds {len(segs) // 2} restart intervals, its header implies {len(segs)}"),
        (extra, f"holds {len(segs) + 1} or more restart intervals"),
    ]
    for data, message in cases:
        src = source_of([data], [(h, w)])
        for box in [(0, 0, 1, 1), (h - 1, w - 1, 1, 1), (20, 30, 10, 10), (0, 0, h, w)]:
            with pytest.raises(tbljax.DecodeError, match=message):
                box_pixels(src, 0, box)


def test_encoder_refuses_a_restart_interval_out_of_range():
    img = textured(16, 16)
    for bad in (-1, 65536):
        with pytest.raises(ValueError, match=r"restart_mcus must be in \[0, 65535\]"):
            _core.encode_jpeg(img, restart_mcus=bad)
    assert restart_interval(_core.encode_jpeg(img)) == 0  # none unless asked for


def expected_interval(w: int, chroma: str) -> int:
    return 2 if per_row(w, chroma) % 2 == 0 else 1


@pytest.mark.parametrize("chroma", ["420", "444"])
def test_convert_writes_restart_markers_into_compact_records(tmp_path, chroma):
    path = tmp_path / "c.tbl"
    tbljax.convert(
        synthetic_photos(8, 11),
        path,
        image_size=200,
        resize="max_side",
        format="jpeg",
        quality=90,
        chroma=chroma,
        progress=False,
    )
    ds = tbljax.open(path)
    seen = set()
    for i in range(len(ds)):
        info = ds.info(i)
        with open(info.file, "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.size)
        r = expected_interval(info.width, chroma)
        seen.add(r)
        assert restart_interval(blob) == r
        rows = -(-info.height // MCU[chroma][1])
        assert len(restart_segments(blob)) == rows * per_row(info.width, chroma) // r
    assert seen == {1, 2}  # both kinds of row occur in this set


def compact_photos(tmp_path, size: int, kodak: slice, caltech: slice):
    """Some real photos as a compact file at max side `size`: (dataset, each record's bytes)."""
    photos = sorted((shared_dir("kodak") / "images").glob("*.jpg"))[kodak]
    photos += sorted(shared_dir("caltech101").rglob("*.jpg"))[caltech]
    path = tmp_path / f"c{size}.tbl"
    tbljax.convert(photos, path, image_size=size, resize="max_side", format="jpeg", quality=90, progress=False)
    ds = tbljax.open(path)
    blobs = []
    for i in range(len(ds)):
        info = ds.info(i)
        with open(info.file, "rb") as f:
            f.seek(info.offset)
            blobs.append(f.read(info.size))
    return ds, blobs


def test_real_photos_with_restart_markers_serve_the_whole_decode(tmp_path):
    ds, blobs = compact_photos(tmp_path, 256, slice(5, None, 17), slice(7, None, 150))
    src = tbljax.kernels.jpeg_source(*ds.jpeg_records())
    rng = np.random.default_rng(1)
    for i, blob in enumerate(blobs):
        assert restart_interval(blob) == expected_interval(int(ds.info(i).width), "420")
        whole = pil_decode(blob)
        h, w = whole.shape[:2]
        for _ in range(20):
            bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
            y0, x0 = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
            np.testing.assert_array_equal(box_pixels(src, i, (y0, x0, bh, bw)), whole[y0 : y0 + bh, x0 : x0 + bw])


def test_original_bytes_records_are_stored_unchanged(tmp_path):
    files = []
    for k, img in enumerate(synthetic_photos(3, 12)):
        files.append(tmp_path / f"{k}.jpg")
        files[-1].write_bytes(_core.encode_jpeg(img, quality=85))
    path = tmp_path / "o.tbl"
    tbljax.convert(files, path, image_size=48, format="jpeg", progress=False)  # quality=None
    ds = tbljax.open(path)
    for i, f in enumerate(files):
        info = ds.info(i)
        with open(info.file, "rb") as fh:
            fh.seek(info.offset)
            stored = fh.read(info.size)
        assert stored == f.read_bytes() and restart_interval(stored) == 0


# ---- DCT-scaled decodes (dct_scale=True): the part is decoded at 1/k as well ----


def pil_decode_scaled(data: bytes, k: int) -> np.ndarray:
    """Pillow's whole decode at 1/k: draft() asks libjpeg-turbo for its scaled IDCT (ISLOW,
    fancy upsampling, as ours); a request of (w // k, h // k) makes it pick exactly k."""
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        im.draft(im.mode, (w // k, h // k))
        out = np.asarray(im.convert("RGB"))
    assert out.shape[:2] == (-(-h // k), -(-w // k)), "Pillow did not decode at 1/k"
    return out


def dct_scale_of(bh: int, bw: int, oh: int, ow: int) -> int:
    """The scale serve_jpeg(dct_scale=True) decodes at: the largest k whose scaled box still
    covers the output DCT_SCALE_MIN_RATIO times on both axes (ChooseDctScale, decode.h)."""
    r = _core.DCT_SCALE_MIN_RATIO
    return next((k for k in (8, 4, 2) if bw / k >= r * ow and bh / k >= r * oh), 1)


def out_size_for(bh: int, bw: int, k: int) -> tuple[int, int]:
    """An output size that makes serve_jpeg decode a bh x bw box at exactly 1/k."""
    r = _core.DCT_SCALE_MIN_RATIO
    out = int(bh / (r * k)), int(bw / (r * k))
    assert dct_scale_of(bh, bw, *out) == k
    return out


def scaled_expected(whole_k: np.ndarray, box, out_hw, k: int) -> np.ndarray:
    """The box rounded outwards to whole pixels of the 1/k decode, then the exact resize."""
    y0, x0, bh, bw = box
    ys, xs = y0 // k, x0 // k
    ye = min(whole_k.shape[0], -(-(y0 + bh) // k))
    xe = min(whole_k.shape[1], -(-(x0 + bw) // k))
    return oracle.crop_resize(whole_k, (ys, xs, ye - ys, xe - xs), *out_hw)


def served_scaled(src, i: int, box, out_hw) -> np.ndarray:
    out = np.empty((1, *out_hw, 3), np.uint8)
    kernels.serve_jpeg(src, [i], out, crop=[box], dct_scale=True)
    return out[0]


def grown(box, h: int, w: int, side: int) -> tuple[int, int, int, int]:
    """The box made at least side x side (the least a scale-k box has), kept inside the image."""
    y0, x0, bh, bw = box
    bh, bw = max(bh, side), max(bw, side)
    return min(y0, h - bh), min(x0, w - bw), bh, bw


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("kind", ["420", "422", "444", "gray"])
@pytest.mark.parametrize("hw", [(67, 93), (33, 257), (256, 171), (20, 30), (100, 40)])
def test_scaled_box_decode_of_restart_records_is_the_whole_scaled_decode(k, kind, hw):
    h, w = hw
    side = int(np.ceil(_core.DCT_SCALE_MIN_RATIO * k))  # a box of 1 output pixel at 1/k
    if min(h, w) < side:
        pytest.skip(f"no box of a {h}x{w} image is decoded at 1/{k}")
    img = textured(h, w, seed=h + w + k)
    n = per_row(w, kind)
    for r in sorted({r for r in (1, 2, n) if n % r == 0}):
        blob = encode(img, kind, r)
        assert restart_interval(blob) == r
        whole_k = pil_decode_scaled(blob, k)
        src = source_of([blob], [hw])
        for box in box_classes(h, w, MCU[kind][0], np.random.default_rng(h * w + r))[:40]:
            y0, x0, bh, bw = box
            if y0 < 0 or x0 < 0 or y0 + bh > h or x0 + bw > w:
                continue
            box = grown(box, h, w, side)
            out_hw = out_size_for(box[2], box[3], k)
            np.testing.assert_array_equal(
                served_scaled(src, 0, box, out_hw),
                scaled_expected(whole_k, box, out_hw, k),
                err_msg=f"R={r} k={k} box={box} out={out_hw}",
            )


@pytest.mark.parametrize("k", [2, 4, 8])
def test_scaled_decode_reads_only_the_boxs_segments(k):
    h, w = 96, 128
    blob = encode(textured(h, w, seed=8), "420", 2)
    whole_k = pil_decode_scaled(blob, k)
    src = source_of([zero_segment(blob, restart_segments(blob)[0])], [(h, w)])
    # A box over the damaged top-left segment fails...
    box = (0, 0, 4 * k, 4 * k)
    with pytest.raises(tbljax.DecodeError, match="corrupt"):
        served_scaled(src, 0, box, out_size_for(4 * k, 4 * k, k))
    # ...one below it serves the whole scaled decode, where the crop-and-skip path (which
    # entropy-decodes every row above the box) would have failed on the damage.
    box = (h - 40, w - 48, 40, 48) if k < 8 else (h - 48, w - 64, 48, 64)
    out_hw = out_size_for(box[2], box[3], k)
    np.testing.assert_array_equal(served_scaled(src, 0, box, out_hw), scaled_expected(whole_k, box, out_hw, k))


def test_real_photos_with_restart_markers_serve_the_whole_scaled_decode(tmp_path):
    ds, blobs = compact_photos(tmp_path, 512, slice(3, None, 40), slice(11, None, 250))
    records = ds.jpeg_records()
    src = kernels.jpeg_source(*records)
    heights, widths = records[4], records[5]
    n = len(ds)
    wholes = {}
    seen = set()
    geometry = RecordGeometry(np.asarray(heights), np.asarray(widths))
    for size in (48, 16):  # random-resized crops: at 48 px 1/1 to 1/4, at 16 px up to 1/8
        idx = np.tile(np.arange(n), 2)
        boxes = np.asarray(crop_boxes(idx, seed=size, epoch=0, geometry=geometry))
        out = np.empty((len(idx), size, size, 3), np.uint8)
        kernels.serve_jpeg(src, idx, out, crop=boxes, dct_scale=True)
        for b, (i, box) in enumerate(zip(idx.tolist(), boxes.tolist())):
            k = dct_scale_of(box[2], box[3], size, size)
            seen.add(k)
            if (i, k) not in wholes:
                wholes[i, k] = pil_decode(blobs[i]) if k == 1 else pil_decode_scaled(blobs[i], k)
            np.testing.assert_array_equal(
                out[b], scaled_expected(wholes[i, k], box, (size, size), k), err_msg=f"record {i} box {box} k={k}"
            )
    assert seen == {1, 2, 4, 8}

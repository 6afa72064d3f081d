"""Our own Huffman decoder of restart segments (ffi/core/jpeg/jpeg_entropy.h), which gives libjpeg the
coefficients of a compact record's box: every pixel it serves is libjpeg-turbo's own whole-image
decode (test_restart_decode.py proves that for every box class, subsampling, interval and scale,
against Pillow). Here: fuzzed records against libjpeg-turbo's entropy decoder (tbljax's whole
decode, which fails on every libjpeg warning), the cases it fails on and the one it is stricter
about, and the real photos at ImageNet geometry. Every test runs on every SIMD target this CPU
has: the decoder's loop is compiled for the baseline ISA and for the avx2 target
(ffi/core/jpeg/jpeg_entropy.inc), and TBLJAX_SIMD / set_kernel_target choose between them."""

from __future__ import annotations

import io

import numpy as np
import pytest
from conftest import shared_dir
from PIL import Image
from test_compact_serve import box_classes, box_pixels, pil_decode, scan_start, source_of, textured
from test_restart_decode import MCU, encode, per_row, restart_interval, restart_segments, zero_segment

import tbljax
from tbljax import _core

R = 2  # what compact records carry


@pytest.fixture(autouse=True, params=_core.supported_kernel_targets())
def simd_target(request):
    _core.set_kernel_target(request.param)
    yield request.param
    _core.set_kernel_target("auto")


def decoded(blob: bytes) -> np.ndarray | None:
    """libjpeg-turbo's whole decode (its own entropy decoder), None where it fails."""
    try:
        return np.asarray(_core.decode_jpeg(blob))
    except tbljax.DecodeError:
        return None


def mutate(blob: bytes, segs: list[tuple[int, int]], rng) -> bytes:
    """1-4 bytes of the given segments changed to random bytes that are not 0xFF and leave no
    stuffed pair broken (so the segments and markers stay where they were), or a segment's
    tail zeroed."""
    b = bytearray(blob)
    a, e = segs[int(rng.integers(len(segs)))]
    if rng.random() < 0.2:
        cut = int(rng.integers(a, e))
        b[cut:e] = b"\0" * (e - cut) if all(b[i - 1] != 0xFF for i in range(cut, e)) else b[cut:e]
        return bytes(b)
    for _ in range(int(rng.integers(1, 5))):
        i = int(rng.integers(a, e))
        if b[i] == 0xFF or b[i - 1] == 0xFF:
            continue
        b[i] = int(rng.integers(0, 255))
    return bytes(b)


@pytest.mark.parametrize("kind", ["420", "422", "444", "gray"])
def test_fuzzed_records_decode_as_libjpeg_turbo_decodes_them(kind):
    """Damage in the segments a box needs: where libjpeg-turbo decodes the record, the box is
    its pixels; where it fails, so does the box. The one difference allowed: a segment whose
    data ends a byte or more before its marker fails here, where libjpeg-turbo lets a few
    stray bytes pass (4 to 6, as its bit buffer happens to stand at the marker)."""
    h, w = 80, 112
    blob = encode(textured(h, w, seed=3), kind, R)
    segs = restart_segments(blob)
    per_seg_row = per_row(w, kind) // R
    # The box leaves out the last column of segments (the part is not the whole record, which
    # libjpeg decodes itself), and the damage goes only where the box's part reads.
    box = (0, 0, h, (per_seg_row - 1) * R * MCU[kind][0] - 1)
    inside = [s for j, s in enumerate(segs) if j % per_seg_row != per_seg_row - 1]
    rng = np.random.default_rng({"420": 1, "422": 2, "444": 3, "gray": 4}[kind])
    outcomes = {"same": 0, "both fail": 0, "stricter": 0}
    for n in range(300):
        bad = mutate(blob, inside, rng)
        ref = decoded(bad)
        try:
            got = box_pixels(source_of([bad], [(h, w)]), 0, box)
        except tbljax.DecodeError as e:
            if ref is None:
                outcomes["both fail"] += 1
                continue
            assert "extraneous bytes" in str(e), f"mutation {n}: libjpeg decodes it, we fail: {e}"
            outcomes["stricter"] += 1
            continue
        assert ref is not None, f"mutation {n}: libjpeg-turbo fails, the box decoded"
        np.testing.assert_array_equal(got, ref[: box[2], : box[3]], err_msg=f"mutation {n}")
        outcomes["same"] += 1
    # The fuzzing reached both sides: records that still decode, and damage that fails.
    assert outcomes["same"] > 20 and outcomes["both fail"] > 20, outcomes


def segment_with(blob: bytes, seg: tuple[int, int], data: bytes) -> bytes:
    a, b = seg
    return blob[:a] + data + blob[b:]


def test_the_damage_it_fails_on_is_named():
    h, w = 64, 64
    blob = encode(textured(h, w, seed=9), "420", R)
    segs = restart_segments(blob)
    box = (0, 0, 8, 8)  # the first segment's part
    # All ones: no code of the standard tables (an all-ones code is never assigned).
    ones = segment_with(blob, segs[0], b"\xff\x00" * 40)
    with pytest.raises(tbljax.DecodeError, match="bad Huffman code.*MCU rows 0-"):
        box_pixels(source_of([ones], [(h, w)]), 0, box)
    assert decoded(ones) is None  # libjpeg-turbo fails too
    a, b = segs[0]
    short = segment_with(blob, segs[0], blob[a : a + (b - a) // 2])
    with pytest.raises(tbljax.DecodeError, match="premature end of data segment"):
        box_pixels(source_of([short], [(h, w)]), 0, box)
    assert decoded(short) is None
    # Stray bytes before the marker: refused here (libjpeg-turbo passes a few of them).
    long = segment_with(blob, segs[0], blob[a:b] + b"\x00" * 12)
    with pytest.raises(tbljax.DecodeError, match="12 extraneous bytes before marker"):
        box_pixels(source_of([long], [(h, w)]), 0, box)


def test_the_first_damage_in_the_record_is_the_one_named():
    """Segments decoded together (in lockstep) that both fail: the error is that of the first
    in the record's order, as a decoder reading one segment after another reports it."""
    h, w = 64, 64
    blob = encode(textured(h, w, seed=9), "420", R)
    segs = restart_segments(blob)
    box = (0, 0, 8, 40)  # both segments of MCU row 0, decoded as a pair
    (a0, b0), (a1, b1) = segs[0], segs[1]
    ones = b"\xff\x00" * 40
    # Later segments first, so the earlier one's offsets still hold.
    short_then_bad = segment_with(segment_with(blob, segs[1], ones), segs[0], blob[a0 : a0 + (b0 - a0) // 2])
    bad_then_short = segment_with(segment_with(blob, segs[1], blob[a1 : a1 + (b1 - a1) // 2]), segs[0], ones)
    for damaged, first in [(short_then_bad, "premature end of data segment"), (bad_then_short, "bad Huffman code")]:
        assert decoded(damaged) is None  # libjpeg-turbo fails too
        with pytest.raises(tbljax.DecodeError, match=first):
            box_pixels(source_of([damaged], [(h, w)]), 0, box)


def optimized(img: np.ndarray, subsampling: int) -> bytes:
    """Pillow's encoder with Huffman tables optimized for this image, restart every 2 MCUs."""
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=85, optimize=True, subsampling=subsampling, restart_marker_blocks=R)
    if restart_interval(buf.getvalue()) != R:
        pytest.skip("this Pillow writes no restart markers (restart_marker_blocks)")
    return buf.getvalue()


def test_a_tables_change_between_records_is_seen():
    """Huffman tables are kept per thread and rebuilt when a record's differ: records with
    libjpeg's standard tables and with tables optimized per image decode alternately, each as
    libjpeg-turbo decodes it."""
    h, w = 48, 64
    blobs = [
        encode(textured(h, w, seed=1), "420", R),
        optimized(textured(h, w, seed=2), 2),
        encode(textured(h, w, seed=3), "gray", R),
        optimized(textured(h, w, seed=4), 0),
        optimized(textured(h, w, seed=5), 2),
        encode(textured(h, w, seed=6), "444", R),
    ]
    tables = [blob[blob.index(b"\xff\xc4") : scan_start(blob)] for blob in blobs]
    assert all(a != b for a, b in zip(tables, tables[1:]))  # each differs from the one before
    src = source_of(blobs, [(h, w)] * len(blobs))
    for _pass in range(2):
        for i, blob in enumerate(blobs):
            np.testing.assert_array_equal(
                box_pixels(src, i, (3, 5, 20, 30)), pil_decode(blob)[3:23, 5:35], err_msg=f"record {i}"
            )


def with_long_dc_symbol(blob: bytes) -> bytes:
    """The record with one more symbol in its first DC table: 15 (a difference of 15 extra
    bits), at code length 16, after every other code (so no other code changes and the data,
    which never uses it, decodes the same)."""
    at = blob.index(b"\xff\xc4")
    length = blob[at + 2] << 8 | blob[at + 3]
    seg = bytearray(blob[at + 4 : at + 2 + length])
    assert seg[0] == 0x00  # class 0 (DC), table 0 comes first in libjpeg's DHT
    n = sum(seg[1:17])
    seg[16] += 1  # one more code of length 16
    seg[17 + n : 17 + n] = b"\x0f"
    return blob[: at + 2] + (length + 1).to_bytes(2, "big") + bytes(seg) + blob[at + 2 + length :]


def test_tables_with_symbols_too_long_for_two_per_refill():
    """The decoder takes two symbols per refill of its 56-bit buffer when every symbol of the
    tables (code and extra bits) has at most 28 bits, as in every table libjpeg writes; a table
    with a longer one (here a DC symbol of 16 + 15 bits, never used) is decoded one symbol per
    refill, to the same pixels."""
    h, w = 64, 96
    for kind in ("420", "gray"):
        plain = encode(textured(h, w, seed=7), kind, R)
        long_ = with_long_dc_symbol(plain)
        whole = pil_decode(long_)
        np.testing.assert_array_equal(whole, pil_decode(plain))
        src = source_of([long_], [(h, w)])
        for box in ((0, 0, h, w), (5, 7, 30, 41), (17, 40, 40, 50)):
            y0, x0, bh, bw = box
            np.testing.assert_array_equal(
                box_pixels(src, 0, box), whole[y0 : y0 + bh, x0 : x0 + bw], err_msg=f"{kind} {box}"
            )


def last_coefficient_blocks(h: int, w: int, seed: int) -> np.ndarray:
    """A gray image whose every 8 x 8 block is the inverse DCT of 63 AC coefficients of +-1 (and
    a DC near mid-grey): at quality 100 (every quantizer 1) its blocks code an AC symbol at
    every position, the last coefficient included, each 2-3 bits."""
    k = np.arange(8)
    basis = np.cos((2 * k[None, :] + 1) * k[:, None] * np.pi / 16) * np.where(k == 0, 1 / np.sqrt(8), 0.5)[:, None]
    rng = np.random.default_rng(seed)
    coef = rng.choice([-1.0, 1.0], (h // 8, w // 8, 8, 8))
    coef[..., 0, 0] = rng.integers(-40, 40, (h // 8, w // 8))
    blocks = np.einsum("ux,abuv,vy->abxy", basis, coef, basis) + 128
    return np.clip(np.round(blocks), 0, 255).astype(np.uint8).transpose(0, 2, 1, 3).reshape(h, w)


def test_a_block_that_ends_at_its_last_coefficient():
    """The decoder looks a pair of AC symbols up at once where both fit in its lookup bits; when
    the first fills a block's last coefficient, the bits after it are the next block's DC and
    must not be taken as the pair's second. Blocks that all end that way, in symbols short
    enough to pair: the box's pixels are libjpeg-turbo's."""
    h, w = 48, 128
    img = last_coefficient_blocks(h, w, seed=11)
    blob = _core.encode_jpeg(img, quality=100, restart_mcus=R)
    # Dense blocks: 63 symbols of 2-3 bits and a DC each (at least 20 bytes a block), where a
    # block that ended early (an end of block) would take far fewer.
    assert len(blob) > 20 * (h // 8) * (w // 8), len(blob)
    whole = decoded(blob)
    assert whole is not None
    src = source_of([blob], [(h, w)])
    for box in ((0, 0, h, w), (3, 9, 30, 70), (17, 40, 8, 50), (40, 120, 8, 8)):
        y0, x0, bh, bw = box
        np.testing.assert_array_equal(box_pixels(src, 0, box), whole[y0 : y0 + bh, x0 : x0 + bw], err_msg=f"{box}")


def header_segments(blob: bytes) -> list[tuple[int, bytes]]:
    """(marker, the whole segment) of each marker segment from SOI to the scan (SOS last)."""
    out, pos, end = [], 2, scan_start(blob)
    while pos < end:
        length = blob[pos + 2] << 8 | blob[pos + 3]
        out.append((blob[pos + 1], blob[pos : pos + 2 + length]))
        pos += 2 + length
    return out


def one_table_each(dht: bytes) -> list[bytes]:
    """A DHT segment as one DHT segment per table it defines."""
    body, out = dht[4:], []
    while body:
        table = body[: 17 + sum(body[1:17])]
        body = body[len(table) :]
        out.append(b"\xff\xc4" + (2 + len(table)).to_bytes(2, "big") + table)
    return out


def test_huffman_tables_anywhere_in_the_header_or_none():
    """libjpeg reads a box's part with stub Huffman tables (our entropy decoder takes the
    record's own): records with their tables one per DHT segment ahead of every other segment
    (the SOF moves), and with no DHT at all (decoders then use the standard tables, the ones
    this encoder wrote), decode every box to Pillow's pixels."""
    h, w = 48, 96  # MCU rows of whole restart intervals: the boxes take the restart path
    for kind in ("420", "gray"):
        plain = encode(textured(h, w, seed=11), kind, R)
        segments = header_segments(plain)
        tables = [t for m, seg in segments if m == 0xC4 for t in one_table_each(seg)]
        others = [seg for m, seg in segments if m != 0xC4]
        assert len(tables) == (4 if kind == "420" else 2) and others[-1][1] == 0xDA
        variants = {"tables first": tables + others, "no tables": others}
        want = pil_decode(plain)
        for name, header in variants.items():
            blob = plain[:2] + b"".join(header) + plain[scan_start(plain) :]
            np.testing.assert_array_equal(pil_decode(blob), want)  # libjpeg-turbo reads it alike
            src = source_of([blob], [(h, w)])
            for y0, x0, bh, bw in ((0, 0, h, w), (5, 7, 30, 41), (17, 40, 31, 50)):
                np.testing.assert_array_equal(
                    box_pixels(src, 0, (y0, x0, bh, bw)), want[y0 : y0 + bh, x0 : x0 + bw], err_msg=f"{kind} {name}"
                )
            # Damage above the box goes unnoticed: only its restart segments were decoded.
            damaged = zero_segment(blob, restart_segments(blob)[0])
            np.testing.assert_array_equal(
                box_pixels(source_of([damaged], [(h, w)]), 0, (32, 40, 16, 56)),
                want[32:, 40:],
                err_msg=f"{kind} {name}",
            )


def test_real_photos_at_imagenet_geometry(tmp_path):
    """Kodak photos converted as the README recommends for data larger than RAM (shorter side
    256, compact q90 4:2:0): random boxes equal Pillow's whole decode."""
    kodak = shared_dir("kodak")
    files = sorted(kodak.rglob("*.jpg"))[::20]
    path = tmp_path / "c.tbl"
    tbljax.convert(
        files, str(path), image_size=256, resize="shorter_side", format="jpeg", quality=90, chroma="420", progress=False
    )
    ds = tbljax.open(str(path))
    views, _counts, offsets, sizes, hs, ws, _raw = ds.jpeg_records()
    blobs = [bytes(views[0][o : o + s]) for o, s in zip(offsets.tolist(), sizes.tolist())]
    src = source_of(blobs, list(zip(hs.tolist(), ws.tolist())))
    rng = np.random.default_rng(0)
    for i, blob in enumerate(blobs):
        whole = pil_decode(blob)
        h, w = whole.shape[:2]
        for _ in range(4):
            bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w // 2 + 1))
            y0, x0 = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
            np.testing.assert_array_equal(box_pixels(src, i, (y0, x0, bh, bw)), whole[y0 : y0 + bh, x0 : x0 + bw])


def test_fill_bytes_before_every_marker():
    """Runs of 1-70 fill bytes (0xFF) before each restart marker, which a decoder skips: every
    box is Pillow's whole decode of the same bytes, and a marker out of sequence past the
    scan's first 4 KiB is named by its number."""
    h, w = 160, 192
    blob = encode(textured(h, w, seed=12), "420", R)
    segs = restart_segments(blob)
    assert len(segs) == (h // 16) * (w // 16) // R and segs[-1][1] - segs[0][0] > 6 * 1024
    out, prev = bytearray(blob[: segs[0][0]]), segs[0][0]
    for j, (_a, b) in enumerate(segs[:-1]):
        out += blob[prev:b] + b"\xff" * (1 + (j * 37) % 70)  # fill, then the marker itself
        prev = b
    out += blob[prev:]
    filled = bytes(out)
    want = pil_decode(blob)
    np.testing.assert_array_equal(pil_decode(filled), want)  # libjpeg-turbo skips the fill
    src = source_of([filled], [(h, w)])
    for y0, x0, bh, bw in ((0, 0, h, w), (100, 60, 60, 90), (150, 170, 10, 22), (3, 5, 7, 9)):
        np.testing.assert_array_equal(box_pixels(src, 0, (y0, x0, bh, bw)), want[y0 : y0 + bh, x0 : x0 + bw])
    fill_segs = restart_segments(filled)
    k = len(fill_segs) - 3  # a marker near the end
    at = fill_segs[k][1]
    while filled[at] == 0xFF and filled[at + 1] == 0xFF:  # to the marker after the fill
        at += 1
    assert at > 4096 and filled[at + 1] == 0xD0 + k % 8
    garbled = filled[: at + 1] + bytes([0xD0 + (k + 1) % 8]) + filled[at + 2 :]
    with pytest.raises(tbljax.DecodeError, match=f"restart marker {k + 1} is RST{(k + 1) % 8}, expected RST{k % 8}"):
        box_pixels(source_of([garbled], [(h, w)]), 0, (0, 0, 8, 8))


def saturated(h: int, w: int, seed: int) -> np.ndarray:
    """Patches of the 8 corners of the RGB cube, 1-5 pixels across: chroma at its extremes,
    and luma plus chroma past [0, 255] where the colour conversion clamps."""
    rng = np.random.default_rng(seed)
    corners = np.array([[r, g, b] for r in (0, 255) for g in (0, 255) for b in (0, 255)], np.uint8)
    ys = np.cumsum(rng.integers(1, 6, h)) // 5
    xs = np.cumsum(rng.integers(1, 6, w)) // 5
    return np.ascontiguousarray(corners[rng.integers(0, 8, (ys[-1] + 1, xs[-1] + 1))][ys][:, xs])


@pytest.mark.parametrize("hw", [(67, 93), (33, 257), (16, 16), (5, 7), (100, 9), (40, 161), (9, 3), (6, 4)])
def test_420_boxes_are_the_whole_decode_on_every_target(hw):
    """YCbCr 4:2:0 at scale 1 goes through libjpeg's planes and our upsampling and colour
    conversion (ffi/core/jpeg/jpeg_color.h): every box class of textured and saturated images, at
    q90 and q100, on every SIMD target, is Pillow's whole decode. Widths of 3 and 4 pixels (2
    chroma samples, upsampled by repeating) keep libjpeg's own path."""
    h, w = hw
    for n, img in enumerate([textured(h, w, seed=h + w), saturated(h, w, seed=h * w)]):
        for quality in (90, 100):
            blob = _core.encode_jpeg(img, quality=quality, subsampling="420", restart_mcus=1)
            whole = pil_decode(blob)
            src = source_of([blob], [hw])
            for y0, x0, bh, bw in box_classes(h, w, 16, np.random.default_rng(n + quality)):
                if y0 < 0 or x0 < 0 or y0 + bh > h or x0 + bw > w:
                    continue
                np.testing.assert_array_equal(
                    box_pixels(src, 0, (y0, x0, bh, bw)),
                    whole[y0 : y0 + bh, x0 : x0 + bw],
                    err_msg=f"image {n} q{quality} box={(y0, x0, bh, bw)}",
                )


def test_a_huffman_table_whose_codes_overflow_is_refused():
    """A record whose first Huffman table has more codes of length 1 than fit (the counts of
    its lengths moved, its symbols unchanged): libjpeg refuses it, and so does the box decode,
    whose table builder checks each code before it fills the code's lookup entries (found by
    fuzz/fuzz_box.cpp: the check came after them, a write past the table)."""
    h, w = 32, 64
    blob = bytearray(encode(textured(h, w, seed=13), "420", R))
    at = blob.index(b"\xff\xc4") + 5  # the first table's 16 counts, after its class and slot
    counts = list(blob[at : at + 16])
    longer = next(i for i in range(1, 16) if counts[i] >= 3)
    counts[0] += 3
    counts[longer] -= 3
    blob[at : at + 16] = bytes(counts)
    bad = bytes(blob)
    assert decoded(bad) is None  # libjpeg-turbo: "Bogus Huffman table definition"
    for box in [(0, 0, 8, 8), (0, 0, h, w)]:
        with pytest.raises(tbljax.DecodeError, match="bad Huffman table: the codes overflow length 1"):
            box_pixels(source_of([bad], [(h, w)]), 0, box)

"""Issue 45 item 2: every image mode Pillow opens converts to the 8-bit RGB of the rule in
docs/reference.md ("Image modes"), each checked against a NumPy computation from the source
pixels (a 16-bit PNG once turned almost white: Pillow's convert("RGB") clips at 255)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest

import tbljax

Image = pytest.importorskip("PIL.Image")

H, W = 6, 8
RNG = np.random.default_rng(0)


def encoded(im, fmt="PNG", **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def gray3(g) -> np.ndarray:
    return np.repeat(np.asarray(g, np.uint8)[:, :, None], 3, axis=2)


def png16(a: np.ndarray) -> bytes:
    """A 16-bit RGB or RGBA PNG written from the PNG spec (Pillow cannot write one)."""
    h, w, c = a.shape
    rows = b"".join(b"\0" + a[y].astype(">u2").tobytes() for y in range(h))  # filter 0 per row

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, {3: 2, 4: 6}[c], 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def cmyk_jpeg(ycck: bool) -> tuple[bytes, np.ndarray]:
    """An Adobe CMYK JPEG as Pillow writes it (stored inverted, transform 0), or the same bytes
    marked YCCK (transform 2: the first three components read as YCbCr; Pillow cannot write
    one, so the marker is patched), and the RGB the rule gives from the ink amounts C, M, Y, K
    that Pillow's libjpeg decodes: R = round((255 - C)(255 - K) / 255), likewise G, B."""
    b = io.BytesIO()
    Image.fromarray(RNG.integers(0, 256, (H, W, 4)).astype(np.uint8), "CMYK").save(b, "JPEG", quality=100)
    data = bytearray(b.getvalue())
    if ycck:
        at = data.index(b"Adobe") + 11  # APP14 "Adobe": version, flags0, flags1, then transform
        assert data[at] == 0
        data[at] = 2
    with Image.open(io.BytesIO(bytes(data))) as im:
        assert im.info["adobe_transform"] == (2 if ycck else 0)
        ink = np.asarray(im).astype(np.int64)
    cmy, k = ink[:, :, :3], ink[:, :, 3:]
    return bytes(data), np.round((255 - cmy) * (255 - k) / 255)


def cases():
    g16 = RNG.integers(0, 65536, (H, W)).astype(np.uint16)
    yield "I;16", encoded(Image.fromarray(g16)), gray3(np.round(g16 * (255 / 65535)))
    g32 = RNG.integers(-100, 70000, (H, W)).astype(np.int32)
    yield "I", encoded(Image.fromarray(g32), "TIFF"), gray3(np.round(np.clip(g32, 0, 65535) * (255 / 65535)))
    f = RNG.uniform(-0.2, 1.2, (H, W)).astype(np.float32)
    yield "F", encoded(Image.fromarray(f), "TIFF"), gray3(np.round(np.clip(f.astype(np.float64), 0, 1) * 255))
    rgba = RNG.integers(0, 256, (H, W, 4)).astype(np.uint8)
    yield "RGBA", encoded(Image.fromarray(rgba)), rgba[:, :, :3]
    la = RNG.integers(0, 256, (H, W, 2)).astype(np.uint8)
    yield "LA", encoded(Image.fromarray(la, "LA")), gray3(la[:, :, 0])
    pal = RNG.integers(0, 256, (4, 3)).astype(np.uint8)
    idx = RNG.integers(0, 4, (H, W)).astype(np.uint8)
    p = Image.fromarray(idx, "P")
    p.putpalette(pal.ravel().tolist())
    yield "P+transparency", encoded(p, transparency=0), pal[idx]
    bits = RNG.integers(0, 2, (H, W)).astype(bool)
    yield "1", encoded(Image.fromarray(bits)), gray3(bits * 255)
    for c, mode in ((3, "RGB"), (4, "RGBA")):  # 16-bit: each sample's high byte (libpng's strip_16)
        a = RNG.integers(0, 65536, (H, W, c)).astype(np.uint16)
        yield f"{mode}+16bit", png16(a), (a[:, :, :3] >> 8)
    yield ("CMYK+Adobe", *cmyk_jpeg(ycck=False))  # decoded by the C++ core, not Pillow
    yield ("CMYK+YCCK", *cmyk_jpeg(ycck=True))


@pytest.mark.parametrize("mode,data,want", list(cases()), ids=[c[0] for c in cases()])
def test_mode_converts_to_rgb8_by_the_rule(tmp_path, mode, data, want):
    assert Image.open(io.BytesIO(data)).mode == mode.split("+")[0]
    path = tmp_path / ("x.tif" if data[:2] in (b"II", b"MM") else "x.jpg" if data[:2] == b"\xff\xd8" else "x.png")
    path.write_bytes(data)
    s = tbljax.convert([path], tmp_path / "o.tbl", image_size=W, resize="squash", progress=False)
    assert s.written == 1, s
    got = tbljax.open(tmp_path / "o.tbl").read(0)
    # squash to W x W from H x W is a resize: compare at the source size through the same C++ resize
    from tbljax import _core

    np.testing.assert_array_equal(got, _core.resize(np.ascontiguousarray(want, np.uint8), W, "squash", 0))

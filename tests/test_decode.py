"""JPEG decode + resize (tbljax._core) against an independent reference: Pillow.

Pillow decodes with libjpeg-turbo's ISLOW IDCT and fancy upsampling too, and its BILINEAR
resize with a box is the same antialiased triangle filter and geometry, so the tolerances
here are tight. Tests that need the real JPEGs in ../shared/data skip without them; the rest
make their images in code.
"""

from __future__ import annotations

import io
import math
import os
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from tbljax import DecodeError, _core

REPO = Path(__file__).resolve().parents[1]


def _shared_data() -> Path:
    """../shared/data beside the repository; TBLJAX_SHARED_DATA overrides it, and in a git
    worktree the main checkout's ../shared/data is found too."""
    if os.environ.get("TBLJAX_SHARED_DATA"):
        return Path(os.environ["TBLJAX_SHARED_DATA"])
    here = REPO.parent / "shared" / "data"
    git = REPO / ".git"
    if not here.is_dir() and git.is_file():  # a worktree: ".git" says "gitdir: <main>/.git/worktrees/x"
        gitdir = Path(git.read_text().partition("gitdir:")[2].strip())
        main = gitdir.parent.parent.parent if gitdir.parent.name == "worktrees" else None
        if main is not None and (main.parent / "shared" / "data").is_dir():
            return main.parent / "shared" / "data"
    return here


DATA = _shared_data()
CALTECH = sorted((DATA / "caltech101" / "images").glob("*/*.jpg"))
KODAK = sorted((DATA / "kodak" / "images").glob("*.jpg"))
needs_data = pytest.mark.skipif(
    not (CALTECH and KODAK),
    reason=f"real JPEGs not found under {DATA} (expected ../shared/data beside the repository)",
)

MODES = ("center_crop", "squash", "max_side", "shorter_side")


# ------------------------------------------------------------------ references -------------


def pil_decode(data: bytes, transpose: bool = True) -> np.ndarray:
    im = Image.open(io.BytesIO(data))
    if transpose:
        im = ImageOps.exif_transpose(im)
    return np.asarray(im.convert("RGB"))


def geometry(h: int, w: int, size: int, mode: str):
    """(out_w, out_h), source box: the documented geometry of each mode."""
    if mode == "center_crop":
        s = min(w, h)
        return (size, size), ((w - s) / 2, (h - s) / 2, (w + s) / 2, (h + s) / 2)
    if mode == "squash":
        return (size, size), (0, 0, w, h)
    long_, short = max(w, h), min(w, h)
    if mode == "shorter_side":  # shorter side S, longer side scaled with it (no cap)
        other = (2 * long_ * size + short) // (2 * short)  # round half up
        return ((other, size) if w >= h else (size, other)), (0, 0, w, h)
    other = max(1, (2 * short * size + long_) // (2 * long_))  # round half up
    return ((size, other) if w >= h else (other, size)), (0, 0, w, h)


def pil_resize(img: np.ndarray, size: int, mode: str) -> np.ndarray:
    out_size, box = geometry(img.shape[0], img.shape[1], size, mode)
    return np.asarray(Image.fromarray(img).resize(out_size, Image.BILINEAR, box=box))


def absdiff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    assert a.shape == b.shape, (a.shape, b.shape)
    return np.abs(a.astype(np.int16) - b.astype(np.int16))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def read(p: Path) -> bytes:
    return p.read_bytes()


def test_pattern(h: int = 203, w: int = 317, seed: int = 0) -> np.ndarray:
    """A photo-like RGB image with edges, gradients and noise; no symmetry, odd sizes."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // w, y * 255 // h, (x * 3 + y * 5) % 256], axis=-1).astype(np.float64)
    img[(x // 23 + y // 17) % 2 == 0] *= 0.6
    img += rng.normal(0, 8, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


test_pattern.__test__ = False  # a helper, not a test


def pil_jpeg(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kw)
    return buf.getvalue()


# ------------------------------------------------------------------ decode -----------------

# Both sides run libjpeg-turbo's ISLOW IDCT with fancy upsampling, so the pixels are
# expected to be identical (measured: max |diff| 0 on all 1,322 files). The asserted bound
# leaves one level for a future libjpeg-turbo; IFAST (up to 19) or fast upsampling (up to
# 83) would fail it by far.
DECODE_MAX_ABS = 1
DECODE_MEAN_ABS = 0.01


@needs_data
@pytest.mark.parametrize("files", [CALTECH, KODAK], ids=["caltech101", "kodak"])
def test_decode_matches_pillow(files):
    worst_max, worst_mean = 0, 0.0
    for p in files:
        data = read(p)
        ours = _core.decode_jpeg(data)
        assert ours.dtype == np.uint8 and ours.flags.c_contiguous and ours.shape[2] == 3
        d = absdiff(ours, pil_decode(data))
        worst_max, worst_mean = max(worst_max, int(d.max())), max(worst_mean, float(d.mean()))
    assert worst_max <= DECODE_MAX_ABS and worst_mean <= DECODE_MEAN_ABS, (worst_max, worst_mean)


@needs_data
def test_grayscale_becomes_rgb():
    gray = [p for p in CALTECH if Image.open(io.BytesIO(read(p))).mode == "L"]
    assert len(gray) >= 60  # the set holds 63
    for p in gray:
        data = read(p)
        ours = _core.decode_jpeg(data)
        assert (ours[..., 0] == ours[..., 1]).all() and (ours[..., 1] == ours[..., 2]).all()
        np.testing.assert_array_equal(ours[..., 0], np.asarray(Image.open(io.BytesIO(data))))
        info = _core.jpeg_info(data)
        assert info["components"] == 1 and info["color_space"] == "grayscale"


def test_grayscale_made_in_code():
    g = test_pattern()[..., 1].copy()
    data = _core.encode_jpeg(g, quality=95)
    assert Image.open(io.BytesIO(data)).mode == "L"
    ours = _core.decode_jpeg(data)
    np.testing.assert_array_equal(ours, np.repeat(np.asarray(Image.open(io.BytesIO(data)))[..., None], 3, 2))


def test_cmyk_decodes_to_the_right_colors():
    # Patches of pure inks, white, a mix; Pillow writes Adobe (inverted) CMYK with an APP14 marker.
    patches = [
        ((255, 0, 0, 0), (0, 255, 255)),  # cyan
        ((0, 255, 0, 0), (255, 0, 255)),  # magenta
        ((0, 0, 255, 0), (255, 255, 0)),  # yellow
        ((0, 0, 0, 255), (0, 0, 0)),  # black
        ((0, 0, 0, 0), (255, 255, 255)),  # white
        ((0, 128, 255, 64), (191, 95, 0)),  # (1-C)(1-K): 191, 191*127/255, 0
    ]
    im = Image.new("CMYK", (32 * len(patches), 32))
    for i, (cmyk, _) in enumerate(patches):
        im.paste(cmyk, (32 * i, 0, 32 * (i + 1), 32))
    data = pil_jpeg(im, quality=100)
    assert _core.jpeg_info(data)["color_space"] == "cmyk"
    ours = _core.decode_jpeg(data)
    assert ours.shape == (32, 32 * len(patches), 3)
    # Same libjpeg output, same (1-C)(1-K) rounding as Pillow's CMYK->RGB: identical.
    np.testing.assert_array_equal(ours, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    for i, (_, rgb) in enumerate(patches):
        centre = ours[8:24, 32 * i + 8 : 32 * i + 24].reshape(-1, 3).astype(int)
        assert np.abs(centre - rgb).max() <= 4, (i, centre.mean(0), rgb)


@needs_data
def test_cmyk_polarity_follows_the_adobe_marker():
    # Without Adobe's APP14 marker the stored values are plain ink amounts (not inverted):
    # what Pillow wrote as white (inverted zeros = 255s) then reads as full ink, black.
    im = Image.new("CMYK", (16, 16), (0, 0, 0, 0))
    data = pil_jpeg(im, quality=100)
    app14 = data.index(b"\xff\xee")
    stripped = data[:app14] + data[app14 + 2 + int.from_bytes(data[app14 + 2 : app14 + 4], "big") :]
    assert (_core.decode_jpeg(data) >= 250).all()
    assert (_core.decode_jpeg(stripped) <= 5).all()


@needs_data
def test_progressive_matches_pillow_and_baseline():
    for p in KODAK[::40] + CALTECH[::200]:
        img = pil_decode(read(p))
        for data in (
            pil_jpeg(Image.fromarray(img), quality=90, progressive=True),
            _core.encode_jpeg(img, quality=90, subsampling="444", progressive=True),
        ):
            assert _core.jpeg_info(data)["progressive"]
            np.testing.assert_array_equal(_core.decode_jpeg(data), pil_decode(data))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation(orientation):
    img = test_pattern()  # 203 x 317: odd sizes, no symmetry
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = pil_jpeg(Image.fromarray(img), quality=92, exif=exif.tobytes())
    expected = pil_decode(data)  # ImageOps.exif_transpose
    ours = _core.decode_jpeg(data)
    np.testing.assert_array_equal(ours, expected)
    info = _core.jpeg_info(data)
    assert info["orientation"] == orientation
    assert (info["height"], info["width"]) == expected.shape[:2]
    # DCT-scaled decodes are oriented the same way.
    half = _core.decode_jpeg(data, scale_denom=2)
    assert half.shape[:2] == tuple((s + 1) // 2 for s in expected.shape[:2])


# The operation that displays each EXIF orientation (the table ImageOps.exif_transpose uses).
EXIF_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


@pytest.mark.parametrize("orientation", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("size,mode", [(24, "squash"), (24, "center_crop"), (150, "squash")])
def test_orientation_with_resize(orientation, size, mode):
    # Resizing the displayed image must equal displaying the resized stored image: checks the
    # box shift for DCT-scaled decodes (size 24 decodes at 1/4; 203 and 317 are not multiples
    # of 4, so an axis that runs backwards starts with a partial block).
    img = test_pattern()
    plain = pil_jpeg(Image.fromarray(img), quality=92)
    exif = Image.Exif()
    exif[0x0112] = orientation
    tagged = pil_jpeg(Image.fromarray(img), quality=92, exif=exif.tobytes())
    stored = _core.decode_resize(plain, size, mode)
    displayed = np.asarray(Image.fromarray(stored).transpose(EXIF_TRANSPOSE[orientation]))
    ours = _core.decode_resize(tagged, size, mode)
    # Only the rounding between the two passes may differ (they swap for 5-8).
    assert absdiff(ours, displayed).max() <= 1


def test_scale_denom():
    img = test_pattern()
    data = _core.encode_jpeg(img, quality=95, subsampling="444")
    for k in (1, 2, 4, 8):
        out = _core.decode_jpeg(data, scale_denom=k)
        assert out.shape == (-(-203 // k), -(-317 // k), 3)
    with pytest.raises(ValueError, match="scale_denom"):
        _core.decode_jpeg(data, scale_denom=3)


# ------------------------------------------------------------------ resize -----------------

# Same filter and geometry as Pillow's BILINEAR with a box; only the fixed-point rounding
# differs (Pillow: horizontal pass first, 8-bit intermediate; ours: vertical first, 7 extra
# fractional bits). Measured: max |diff| 1, mean |diff| <= 0.25.
RESIZE_MAX_ABS = 1
RESIZE_MEAN_ABS = 0.3


@needs_data
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [64, 160, 224, 600])
def test_resize_matches_pillow(mode, size):
    for p in KODAK[::16] + CALTECH[::50]:
        img = _core.decode_jpeg(read(p))
        ours = _core.resize(img, size, mode)
        d = absdiff(ours, pil_resize(img, size, mode))
        assert d.max() <= RESIZE_MAX_ABS and d.mean() <= RESIZE_MEAN_ABS, (p.name, d.max(), d.mean())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(203, 317), (317, 203), (20, 30), (1, 50), (7, 7)])
@pytest.mark.parametrize("size", [1, 16, 64])
def test_resize_geometry_and_upscaling(mode, shape, size):
    img = test_pattern(*shape)
    ours = _core.resize(img, size, mode)
    ref = pil_resize(img, size, mode)
    assert ours.shape == ref.shape
    d = absdiff(ours, ref)
    assert d.max() <= RESIZE_MAX_ABS and d.mean() <= RESIZE_MEAN_ABS


def test_max_side_sizes():
    img = np.zeros((300, 400, 3), np.uint8)
    assert _core.resize(img, 160, "max_side").shape == (120, 160, 3)
    assert _core.resize(img.transpose(1, 0, 2).copy(), 160, "max_side").shape == (160, 120, 3)
    assert _core.resize(np.zeros((1, 1000, 3), np.uint8), 100, "max_side").shape == (1, 100, 3)
    assert _core.resize(np.zeros((10, 1000, 3), np.uint8), 100, "max_side").shape == (1, 100, 3)


def test_resize_exact_cases():
    img = test_pattern()
    # Same size: every weight is exactly 1.
    np.testing.assert_array_equal(_core.resize(img, 317, "max_side"), img)
    # Weights sum to exactly 1, so flat stays flat at any scale.
    flat = np.full((203, 317, 3), (17, 128, 254), np.uint8)
    for mode in MODES:
        for size in (5, 64, 500):
            out = _core.resize(flat, size, mode)
            assert (out == (17, 128, 254)).all()


def test_resize_takes_any_strides_but_only_uint8():
    img = test_pattern(120, 200)
    base = _core.resize(img, 48, "center_crop")
    np.testing.assert_array_equal(_core.resize(img[:, ::-1][:, ::-1], 48, "center_crop"), base)
    padded = np.zeros((120, 210, 3), np.uint8)
    padded[:, :200] = img
    np.testing.assert_array_equal(_core.resize(padded[:, :200], 48, "center_crop"), base)
    np.testing.assert_array_equal(
        _core.resize(np.ascontiguousarray(img.transpose(2, 0, 1)).transpose(1, 2, 0), 48, "center_crop"), base
    )
    with pytest.raises(TypeError):
        _core.resize(img.astype(np.float32), 48, "center_crop")
    with pytest.raises(ValueError, match="H, W, 3"):
        _core.resize(img[..., :2], 48, "center_crop")
    with pytest.raises(ValueError, match="resize mode"):
        _core.resize(img, 48, "crop")
    with pytest.raises(ValueError, match="size"):
        _core.resize(img, 0, "squash")


# ------------------------------------------------------------------ decode + resize --------

# Where DCT-domain downscaling is not used (the scaled box would be under 2x the output),
# decode_resize equals Pillow decode + Pillow resize up to the resize rounding above.
# Where it is used, libjpeg's scaled IDCT replaces part of the low-pass: measured PSNR
# against Pillow 34-57 dB (worst: line art at 32 px), median about 50 dB.
DCT_MIN_PSNR = 33.0
DCT_MEDIAN_PSNR = 45.0
DCT_MEAN_ABS = 3.5


def dct_scaled(h: int, w: int, size: int, mode: str) -> bool:
    (ow, oh), (x0, y0, x1, y1) = geometry(h, w, size, mode)
    r = _core.DCT_SCALE_MIN_RATIO
    return (x1 - x0) / 2 >= r * ow and (y1 - y0) / 2 >= r * oh


@needs_data
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [32, 64, 160, 224])
def test_decode_resize_matches_pillow(mode, size):
    scaled_psnr = []
    for p in KODAK[::8] + CALTECH[::20]:
        data = read(p)
        ref_img = pil_decode(data)
        ref = pil_resize(ref_img, size, mode)
        ours = _core.decode_resize(data, size, mode)
        d = absdiff(ours, ref)
        if dct_scaled(*ref_img.shape[:2], size, mode):
            scaled_psnr.append(psnr(ours, ref))
            assert scaled_psnr[-1] >= DCT_MIN_PSNR and d.mean() <= DCT_MEAN_ABS, (p.name, scaled_psnr[-1])
        else:
            assert d.max() <= RESIZE_MAX_ABS and d.mean() <= RESIZE_MEAN_ABS, (p.name, d.max(), d.mean())
    if scaled_psnr:
        assert np.median(scaled_psnr) >= DCT_MEDIAN_PSNR
    if size <= 64:
        assert scaled_psnr, "small sizes should use DCT scaling"


@needs_data
def test_decode_resize_equals_resize_of_decode_without_dct_scaling():
    for p in KODAK[::30]:
        data = read(p)
        for mode in MODES:
            np.testing.assert_array_equal(
                _core.decode_resize(data, 160, mode), _core.resize(_core.decode_jpeg(data), 160, mode)
            )


# ------------------------------------------------------------------ errors -----------------


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    return _core.encode_jpeg(test_pattern(), quality=90)


def test_truncated_is_an_error(jpeg):
    half = jpeg[: len(jpeg) // 2]
    with pytest.raises(DecodeError, match="truncated"):
        _core.decode_jpeg(half)
    # Every cut fails, except one that drops only the final EOI marker of a single-scan
    # file (all pixel data present).
    full = _core.decode_jpeg(jpeg)
    for n in list(range(0, len(jpeg) - 2, max(1, len(jpeg) // 300))) + list(range(len(jpeg) - 40, len(jpeg) - 2)):
        with pytest.raises(DecodeError):
            _core.decode_jpeg(jpeg[:n])
    np.testing.assert_array_equal(_core.decode_jpeg(jpeg[:-2]), full)


def test_truncated_progressive_is_an_error():
    data = _core.encode_jpeg(test_pattern(), quality=90, progressive=True)
    # Cut exactly between two scans (before each SOS after the first), the file looks
    # complete to libjpeg, which would leave the missing scans' coefficients at zero.
    scans = [i for i in range(len(data) - 1) if data[i : i + 2] == b"\xff\xda"]
    assert len(scans) >= 5
    for n in scans[1:] + [len(data) - 2] + list(range(100, len(data), max(1, len(data) // 200))):
        with pytest.raises(DecodeError, match="truncated"):
            _core.decode_jpeg(data[:n])


@needs_data
def test_real_file_cut_in_half():
    data = read(KODAK[0])
    with pytest.raises(DecodeError, match="truncated"):
        _core.decode_jpeg(data[: len(data) // 2])
    out = np.full((1, 64, 64, 3), 7, np.uint8)
    (err,) = _core.decode_resize_into([data[: len(data) // 2]], out, "center_crop")
    assert "truncated" in err and (out == 0).all()


def test_corrupt_bytes_are_an_error(jpeg):
    sos = jpeg.index(b"\xff\xda")
    rng = np.random.default_rng(1)
    for start in (sos + 200, sos + 2000, len(jpeg) // 2):
        bad = bytearray(jpeg)
        bad[start : start + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        with pytest.raises(DecodeError, match="corrupt|truncated|cannot decode"):
            _core.decode_jpeg(bytes(bad))
    # A header that lies: zero height.
    sof = jpeg.index(b"\xff\xc0")
    bad = bytearray(jpeg)
    bad[sof + 5 : sof + 7] = b"\x00\x00"
    with pytest.raises(DecodeError, match="cannot decode JPEG"):
        _core.decode_jpeg(bytes(bad))


@pytest.mark.parametrize(
    "data,what",
    [
        (b"", "empty"),
        (bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)), "random"),
        (b"\xff\xd8", "short"),
        (b"GIF89a" + b"\0" * 40, "GIF"),
    ],
)
def test_not_a_jpeg(data, what):
    with pytest.raises(DecodeError, match="not a JPEG") as e:
        _core.decode_jpeg(data)
    assert str(e.value).startswith("not a JPEG")
    with pytest.raises(DecodeError, match="^not a JPEG"):
        _core.jpeg_info(data)
    if what == "GIF":
        assert "GIF" in str(e.value)


def test_png_says_not_a_jpeg():
    buf = io.BytesIO()
    Image.fromarray(test_pattern(20, 30)).save(buf, "PNG")
    out = np.zeros((1, 8, 8, 3), np.uint8)
    (err,) = _core.decode_resize_into([buf.getvalue()], out, "center_crop")
    assert err.startswith("not a JPEG") and "PNG" in err
    with pytest.raises(DecodeError, match="^not a JPEG"):
        _core.decode_resize(buf.getvalue(), 8, "squash")


def test_random_after_jpeg_magic_is_an_error():
    rng = np.random.default_rng(3)
    for _ in range(20):
        with pytest.raises(DecodeError):
            _core.decode_jpeg(b"\xff\xd8\xff" + rng.integers(0, 256, 3000, dtype=np.uint8).tobytes())


def test_mutations_never_crash(jpeg):
    # Fuzz: flipped bytes, cut, spliced. Each result is an image of the right shape or a
    # DecodeError; never a crash or another exception.
    rnd = random.Random(7)
    base = bytearray(jpeg)
    ok = 0
    for _i in range(300):
        b = bytearray(base)
        for _ in range(rnd.randint(1, 8)):
            op = rnd.random()
            pos = rnd.randrange(len(b))
            if op < 0.6:
                b[pos] = rnd.randrange(256)
            elif op < 0.8:
                del b[pos : pos + rnd.randint(1, 50)]
            else:
                b[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 20)))
        try:
            out = _core.decode_resize(bytes(b), 32, "center_crop")
            assert out.shape == (32, 32, 3)
            ok += 1
        except DecodeError as e:
            assert str(e)
    assert ok < 300  # most mutations must be caught


def test_too_large_is_refused():
    # A valid 1x1 JPEG whose SOF claims 65000 x 65000: refused before any allocation.
    data = bytearray(_core.encode_jpeg(np.zeros((1, 1, 3), np.uint8)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (65000).to_bytes(2, "big") * 2
    with pytest.raises(DecodeError, match="too large"):
        _core.decode_jpeg(bytes(data))


# ------------------------------------------------------------------ batch ------------------


@pytest.fixture(scope="module")
def payloads() -> list[bytes]:
    if KODAK:
        return [read(p) for p in KODAK[::13]] + [read(p) for p in CALTECH[::97]]
    return [_core.encode_jpeg(test_pattern(150 + 7 * i, 230 - 5 * i, seed=i)) for i in range(12)]


@pytest.mark.parametrize("mode", ["center_crop", "squash"])
@pytest.mark.parametrize("size", [48, 160])
def test_batch_equals_single(payloads, mode, size):
    out = np.full((len(payloads), size, size, 3), 7, np.uint8)
    errs = _core.decode_resize_into(payloads, out, mode)
    assert errs == [None] * len(payloads)
    for i, data in enumerate(payloads):
        np.testing.assert_array_equal(out[i], _core.decode_resize(data, size, mode))


def test_batch_threads_identical(payloads):
    outs = []
    for threads in (1, 0, 3):
        out = np.empty((len(payloads), 96, 96, 3), np.uint8)
        assert not any(_core.decode_resize_into(payloads, out, "center_crop", threads=threads))
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_batch_mixed_failures(payloads):
    good = payloads[0]
    items = [
        good,
        b"",
        good[: len(good) // 2],
        b"\x89PNG\r\n\x1a\n" + b"\0" * 30,
        bytearray(good),
        memoryview(good),
        np.frombuffer(good, np.uint8),
    ]
    out = np.full((len(items), 32, 32, 3), 7, np.uint8)
    errs = _core.decode_resize_into(items, out, "center_crop", threads=2)
    assert errs[0] is None and errs[4] is None and errs[5] is None and errs[6] is None
    assert errs[1].startswith("not a JPEG") and "truncated" in errs[2] and errs[3].startswith("not a JPEG")
    single = _core.decode_resize(good, 32, "center_crop")
    for i in (0, 4, 5, 6):
        np.testing.assert_array_equal(out[i], single)
    for i in (1, 2, 3):
        assert (out[i] == 0).all()  # a failed slot is zeroed, never stale


def test_batch_rejects_bad_arguments(payloads):
    n = len(payloads)
    with pytest.raises(TypeError):
        _core.decode_resize_into(payloads, np.empty((n, 32, 32, 3), np.float32), "center_crop")
    with pytest.raises(TypeError):  # not C-contiguous: would be copied and thrown away
        _core.decode_resize_into(payloads, np.empty((n, 32, 64, 3), np.uint8)[:, :, ::2], "center_crop")
    readonly = np.empty((n, 32, 32, 3), np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(TypeError):
        _core.decode_resize_into(payloads, readonly, "center_crop")
    with pytest.raises(ValueError, match="shape"):
        _core.decode_resize_into(payloads, np.empty((n + 1, 32, 32, 3), np.uint8), "center_crop")
    with pytest.raises(ValueError, match="shape"):
        _core.decode_resize_into(payloads, np.empty((n, 32, 30, 3), np.uint8), "center_crop")
    with pytest.raises(ValueError, match="max_side"):
        _core.decode_resize_into(payloads, np.empty((n, 32, 32, 3), np.uint8), "max_side")
    with pytest.raises(ValueError, match="resize mode"):
        _core.decode_resize_into(payloads, np.empty((n, 32, 32, 3), np.uint8), "bogus")
    with pytest.raises(TypeError, match="bytes-like"):
        _core.decode_resize_into(payloads[:-1] + ["a str"], np.empty((n, 32, 32, 3), np.uint8), "squash")
    with pytest.raises(ValueError, match="threads"):
        _core.decode_resize_into(payloads, np.empty((n, 32, 32, 3), np.uint8), "squash", threads=-1)
    assert _core.decode_resize_into([], np.empty((0, 32, 32, 3), np.uint8), "squash") == []


# ------------------------------------------------------------------ encode, info -----------


@pytest.mark.parametrize("subsampling,factors", [("444", (1, 1)), ("422", (2, 1)), ("420", (2, 2))])
@pytest.mark.parametrize("progressive", [False, True])
def test_encode_jpeg(subsampling, factors, progressive):
    img = test_pattern()
    data = _core.encode_jpeg(img, quality=95, subsampling=subsampling, progressive=progressive)
    im = Image.open(io.BytesIO(data))
    assert im.size == (317, 203) and im.mode == "RGB"
    assert bool(im.info.get("progressive", 0)) == progressive
    assert im.layer[0][1:3] == factors  # luma sampling factors
    assert psnr(np.asarray(im), img) > 27  # noise and sharp colour edges: subsampling costs dB
    np.testing.assert_array_equal(_core.decode_jpeg(data), np.asarray(im))


def test_encode_jpeg_rejects_bad_input():
    img = test_pattern(16, 16)
    with pytest.raises(ValueError, match="quality"):
        _core.encode_jpeg(img, quality=0)
    with pytest.raises(ValueError, match="subsampling"):
        _core.encode_jpeg(img, subsampling="411")
    with pytest.raises(ValueError):
        _core.encode_jpeg(np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(TypeError):
        _core.encode_jpeg(img.astype(np.int32))


def test_native_info_names_the_recipe():
    info = _core.native_info()
    assert info["jpeg_idct"] == "islow" and info["resize_filter"] == "bilinear"
    assert _core.JPEG_IDCT == "islow" and _core.RESIZE_FILTER == "bilinear"
    assert set(_core.RESIZE_MODES) == set(MODES)
    assert _core.DCT_SCALE_MIN_RATIO == 2.0


def test_deterministic(jpeg):
    a = _core.decode_resize(jpeg, 37, "center_crop")
    for _ in range(3):
        np.testing.assert_array_equal(_core.decode_resize(jpeg, 37, "center_crop"), a)


# ------------------------------------------------------------------ crop-aware decode ------
# decode_resize decodes only the pixels the filter reads: for a box that is a strict part of
# the image (center_crop) libjpeg crops the columns and skips the rows outside, with a margin
# for chroma upsampling at the window's edges. That must not change a single output byte, so
# these tests compare against the whole image decoded by decode_jpeg (which never crops) and
# resized by _core.resize or, where decode_resize uses DCT scaling, by a NumPy port of the
# fixed-point filter.


def _lround(v: float) -> int:
    """std::lround for v >= 0 (round half away from zero; floor(v + 0.5) can be off by one)."""
    f = math.floor(v)
    return f + (1 if v - f >= 0.5 else 0)


def _taps(in_len: int, box0: float, box_len: float, out_len: int) -> np.ndarray:
    """resize.cpp's ComputeTaps as a dense (out_len, in_len) matrix of 14-bit weights."""
    scale = box_len / out_len
    fscale = max(scale, 1.0)
    support = 1.0 * fscale
    w = np.zeros((out_len, in_len), np.float64)
    for i in range(out_len):
        center = box0 + (i + 0.5) * scale
        lo = max(0, math.floor(center - support + 0.5))
        hi = min(in_len, math.floor(center + support + 0.5))
        t = [max(0.0, 1.0 - abs((j + 0.5 - center) / fscale)) for j in range(lo, hi)]
        total = 0.0
        for v in t:
            total += v
        while len(t) > 1 and t[0] == 0.0:
            t.pop(0)
            lo += 1
        while len(t) > 1 and t[-1] == 0.0:
            t.pop()
        assert t and total > 0
        q = [_lround(v / total * (1 << 14)) for v in t]
        q[q.index(max(q))] += (1 << 14) - sum(q)
        w[i, lo : lo + len(q)] = q
    return w


def np_resize(img: np.ndarray, out_h: int, out_w: int, box: tuple[float, float, float, float]) -> np.ndarray:
    """The fixed-point resize of resize.h in NumPy: vertical pass to 7 fractional bits, then
    horizontal, rounded to nearest. Integers throughout (float64 holds them exactly)."""
    h, w = img.shape[:2]
    bx, by, bw, bh = box
    wy, wx = _taps(h, by, bh, out_h), _taps(w, bx, bw, out_w)
    # Only the rows and columns with a weight (faster, same sums).
    (r0, r1), (c0, c1) = [
        (int(nz[0]), int(nz[-1]) + 1) for nz in (np.flatnonzero(wy.any(0)), np.flatnonzero(wx.any(0)))
    ]
    src = img[r0:r1, c0:c1].reshape(r1 - r0, (c1 - c0) * 3).astype(np.float64)
    mid = np.clip((((_apply_taps(wy[:, r0:r1], src)).astype(np.int64)) + 64) >> 7, 0, 255 << 7)
    out = _apply_taps(wx[:, c0:c1], mid.reshape(out_h, c1 - c0, 3).transpose(1, 0, 2).astype(np.float64))
    return np.clip((out.transpose(1, 0, 2).astype(np.int64) + (1 << 20)) >> 21, 0, 255).astype(np.uint8)


def _apply_taps(taps: np.ndarray, src: np.ndarray) -> np.ndarray:
    """taps @ src (over src's first axis) for a tap matrix whose rows are non-zero on one run
    of columns: the same sums, from each row's run only (integers, exact in float64), instead
    of the dense product (17 x 1001 to shorter side 300 took 17 s dense)."""
    nz = taps != 0
    first = nz.argmax(1)
    last = taps.shape[1] - 1 - nz[:, ::-1].argmax(1)
    out = np.zeros((taps.shape[0], *src.shape[1:]), np.float64)
    rows = np.arange(taps.shape[0])
    for k in range(int((last - first).max()) + 1):
        col = np.minimum(first + k, last)  # past a row's run: its last tap again ...
        w = np.where(first + k <= last, taps[rows, col], 0.0)  # ... with weight 0
        out += w.reshape(-1, *[1] * (src.ndim - 1)) * src[col]
    return out


def plan(h: int, w: int, size: int, mode: str):
    """(out_h, out_w), box (x, y, w, h): PlanResize."""
    (ow, oh), (x0, y0, x1, y1) = geometry(h, w, size, mode)
    return (oh, ow), (x0, y0, x1 - x0, y1 - y0)


def whole_decode_resize(data: bytes, size: int, mode: str) -> np.ndarray:
    """decode_resize's recipe from a whole-image decode: same DCT scale, same box."""
    info = _core.jpeg_info(data)
    big_h, big_w, o = info["height"], info["width"], info["orientation"]
    (oh, ow), (bx, by, bw, bh) = plan(big_h, big_w, size, mode)
    r = _core.DCT_SCALE_MIN_RATIO
    k = next((k for k in (8, 4, 2) if bw / k >= r * ow and bh / k >= r * oh), 1)
    img = _core.decode_jpeg(data, scale_denom=k)
    if k == 1:
        return _core.resize(img, size, mode)
    # The scaled box: coordinates divide by k; on an axis that runs backwards through the
    # stored image the partial last block comes first (see DecodeResizeImpl).
    h, w = img.shape[:2]
    bx = bx / k + (w - big_w / k if o in (2, 3, 6, 7) else 0.0)
    by = by / k + (h - big_h / k if o in (3, 4, 7, 8) else 0.0)
    return np_resize(img, oh, ow, (bx, by, bw / k, bh / k))


def with_orientation(data: bytes, orientation: int) -> bytes:
    """The JPEG with an APP1 EXIF segment carrying `orientation` after its SOI."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    payload = exif.tobytes()
    return data[:2] + b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload + data[2:]


def noisy_pattern(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Strong colour noise: chroma upsampling at a window edge would show in many pixels."""
    img = test_pattern(h, w, seed).astype(np.float64)
    img += np.random.default_rng(seed).normal(0, 40, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def assert_same_as_whole(data: bytes, size: int, mode: str, what: str = "", batch: bool = True) -> None:
    ours = _core.decode_resize(data, size, mode)
    np.testing.assert_array_equal(ours, whole_decode_resize(data, size, mode), err_msg=f"{what} {mode} {size}")
    if batch and mode in ("center_crop", "squash"):  # the fixed-size modes
        out = np.full((1, size, size, 3), 7, np.uint8)
        assert _core.decode_resize_into([data], out, mode, 1) == [None]
        np.testing.assert_array_equal(out[0], ours)


@pytest.mark.parametrize("mode", MODES)
def test_numpy_resize_reference_is_the_library_resize(mode):
    # The reference itself, against _core.resize where both apply (any box the modes make).
    for (h, w), size in [((203, 317), 160), ((203, 317), 37), ((40, 333), 90), ((97, 33), 13)]:
        img = noisy_pattern(h, w)
        (oh, ow), box = plan(h, w, size, mode)
        np.testing.assert_array_equal(np_resize(img, oh, ow, box), _core.resize(img, size, mode))


@needs_data
def test_crop_aware_decode_kodak():
    # All of kodak at the benchmark's setting (4:4:4 and 4:2:0, landscape, portrait, square),
    # through the batch entry the converter uses; other modes and DCT-scaled sizes on a sample.
    data = [read(p) for p in KODAK]
    out = np.empty((len(data), 160, 160, 3), np.uint8)
    assert _core.decode_resize_into(data, out, "center_crop", 1) == [None] * len(data)
    for i, d in enumerate(data):
        np.testing.assert_array_equal(out[i], whole_decode_resize(d, 160, "center_crop"), err_msg=KODAK[i].name)
    for i, d in enumerate(data[::7]):
        for mode in MODES:
            for size in (16, 32, 64, 224):  # DCT scales 8, 4, 2, 1 on kodak's sizes
                assert_same_as_whole(d, size, mode, KODAK[7 * i].name)


@needs_data
def test_crop_aware_decode_caltech101():
    # Other cameras and encoders: grayscale, odd sizes, 4:2:2, restart markers.
    for p in CALTECH[::9]:
        d = read(p)
        for mode in MODES:
            for size in (24, 160):
                assert_same_as_whole(d, size, mode, p.name)


# Odd sizes, sizes that are not multiples of an iMCU, extreme aspect ratios both ways.
WINDOW_SHAPES = [(17, 1001), (1001, 17), (203, 317), (317, 203), (64, 96), (97, 33), (129, 640), (640, 129)]


def synthetic_jpegs(h: int, w: int) -> dict[str, bytes]:
    img = noisy_pattern(h, w, seed=h * 7 + w)
    return {
        "444": _core.encode_jpeg(img, quality=90, subsampling="444"),
        "422": _core.encode_jpeg(img, quality=90, subsampling="422"),
        "420": _core.encode_jpeg(img, quality=90, subsampling="420"),
        "progressive": _core.encode_jpeg(img, quality=90, subsampling="420", progressive=True),
        "gray": _core.encode_jpeg(np.ascontiguousarray(img[..., 1]), quality=90),
        "cmyk": pil_jpeg(Image.fromarray(img).convert("CMYK"), quality=90),
        "restarts": pil_jpeg(Image.fromarray(img), quality=90, subsampling=2, restart_marker_blocks=3),
    }


@pytest.mark.parametrize("shape", WINDOW_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_crop_aware_decode_synthetic(shape):
    # The small sizes decode at 1/2, 1/4 or 1/8 where the box allows it. decode_resize_into
    # shares decode_resize's code: checked for one orientation of each kind (axes kept, swapped).
    for kind, data in synthetic_jpegs(*shape).items():
        # Every orientation for each iMCU shape (8x8, 16x8, 16x16); two for the other kinds.
        for orientation in range(1, 9) if kind in ("444", "422", "420") else (1, 6):
            tagged = with_orientation(data, orientation)
            assert _core.jpeg_info(tagged)["orientation"] == orientation
            for mode in MODES:
                for size in (1, 3, 8, 20, 57, 160):
                    assert_same_as_whole(
                        tagged, size, mode, f"{kind} orientation {orientation}", batch=orientation in (1, 6)
                    )


def test_crop_aware_decode_still_fails_on_damage_outside_the_window():
    # A portrait image centre-cropped to a small size reads only its middle rows; its top and
    # bottom rows are still entropy-decoded, so a cut or damage there fails as before.
    for kind, data in synthetic_jpegs(640, 129).items():
        sos = data.index(b"\xff\xda")
        cuts = [sos + 30, len(data) // 2, len(data) - len(data) // 10, len(data) - 300, len(data) - 40, len(data) - 3]
        for n in cuts + list(range(sos, len(data) - 2, max(1, len(data) // 60))):
            with pytest.raises(DecodeError):
                _core.decode_jpeg(data[:n])
            for mode, size in (("center_crop", 24), ("center_crop", 100), ("squash", 24)):
                with pytest.raises(DecodeError, match="truncated"):
                    _core.decode_resize(data[:n], size, mode)
                out = np.full((1, size, size, 3), 7, np.uint8)
                (err,) = _core.decode_resize_into([data[:n]], out, mode, 1)
                assert "truncated" in err and (out == 0).all(), (kind, n)
        if kind == "progressive":
            continue  # scans, not rows: a later scan's damage is everywhere
        # Garbage in the entropy data of the bottom rows (the last tenth of the file), which
        # the crop never shows.
        for start in (len(data) - len(data) // 10, len(data) - 200):
            bad = bytearray(data)
            bad[start : start + 48] = np.random.default_rng(start).integers(0, 256, 48, dtype=np.uint8).tobytes()
            with pytest.raises(DecodeError):
                _core.decode_jpeg(bytes(bad))
            with pytest.raises(DecodeError):
                _core.decode_resize(bytes(bad), 24, "center_crop")
    # Only the final EOI marker missing: all pixel data is there, so both decode.
    data = synthetic_jpegs(640, 129)["420"]
    np.testing.assert_array_equal(
        _core.decode_resize(data[:-2], 24, "center_crop"), _core.decode_resize(data, 24, "center_crop")
    )


# ------------------------------------------------------------------ resize SIMD targets ----
# The resize passes run as portable C++ ("scalar") or with AVX2 / AVX-512 intrinsics, chosen
# at run time like the serve kernel's (TBLJAX_SIMD caps it). Every target must give the bytes
# of the NumPy reference.


@pytest.fixture
def simd_targets():
    yield _core.supported_kernel_targets()
    _core.set_kernel_target("auto")


def test_resize_every_simd_target_matches_the_reference(simd_targets):
    # Rows narrower and wider than a SIMD step (32 and 64 bytes), odd and even tap counts,
    # up- and downscaling, flat black/white (the clamps) and noise, every mode.
    rng = np.random.default_rng(5)
    for h, w in [(1, 1), (2, 3), (7, 40), (13, 9), (40, 7), (64, 64), (203, 317), (17, 1001)]:
        for img in (
            rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
            np.where(rng.random((h, w, 1)) < 0.5, 0, 255).astype(np.uint8).repeat(3, 2),
        ):
            for mode in MODES:
                for size in (1, 2, 5, 11, 16, 33, 64, 160, 300):
                    (oh, ow), box = plan(h, w, size, mode)
                    ref = np_resize(img, oh, ow, box)
                    for target in simd_targets:
                        _core.set_kernel_target(target)
                        np.testing.assert_array_equal(
                            _core.resize(img, size, mode), ref, err_msg=f"{target} {(h, w)} {mode} {size}"
                        )


def test_decode_resize_same_on_every_simd_target(simd_targets):
    data = [read(p) for p in KODAK[::25] + CALTECH[::100]]
    data += [with_orientation(d, o) for d, o in zip(synthetic_jpegs(203, 317).values(), range(2, 9))]
    for mode, size in (("center_crop", 160), ("center_crop", 224), ("squash", 32), ("squash", 97)):
        outs = []
        for target in simd_targets:
            _core.set_kernel_target(target)
            out = np.empty((len(data), size, size, 3), np.uint8)
            assert _core.decode_resize_into(data, out, mode, 1) == [None] * len(data)
            outs.append(out)
        for target, out in zip(simd_targets, outs):
            np.testing.assert_array_equal(out, outs[0], err_msg=f"{target} {mode} {size}")


# ------------------------------------------------------------------ where decoded rows start ----


def test_decoded_rows_start_16_bytes_past_a_64_byte_boundary():
    """libjpeg-turbo writes its output rows where tbljax puts them: 16 bytes past a 64-byte
    boundary (kRowsPhase, ffi/core/jpeg/decode.h), never 32-byte aligned like its own sample rows,
    which made its upsampler stall (benchmarks/README.md, "Where the decoded rows start"). Before
    the phase, most of these 120 decodes landed 64-byte aligned; the pixels are Pillow's."""
    data = synthetic_jpegs(203, 317)
    for i in range(40):
        for name, blob in data.items():
            img = _core.decode_jpeg(blob)
            assert img.ctypes.data % 64 == 16, (name, i)
            np.testing.assert_array_equal(img, np.asarray(Image.open(io.BytesIO(blob)).convert("RGB")))

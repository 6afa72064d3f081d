"""Resize quality: the kernel's crop-resize against Pillow's antialiased bilinear on real
photos, and antialiasing on a fine checkerboard, where the old 2-tap bilinear (the kernel
before commit daf44ef, computed here in NumPy) aliases."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_dir

from tbljax._src.engine import kernels

# Measured by benchmarks/probe_resize_quality.py on kodak + every 10th caltech101 photo at max
# side 256 (413 images): whole record -> 64..224 and RRC boxes -> 112, 224 are 55.9-58.3 dB
# mean, 54.7 dB worst against Pillow; the old 2-tap formula 29.6 dB mean at -> 64. Asserted
# with margin:
MEAN_PSNR_DB = 50.0
WORST_PSNR_DB = 45.0


def psnr(a, b) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return np.inf if mse == 0 else 10 * np.log10(255.0**2 / mse)


def resize(img: np.ndarray, box, oh: int, ow: int) -> np.ndarray:
    out = np.empty((1, oh, ow, 3), np.uint8)
    return kernels.gather(
        np.ascontiguousarray(img[None]), np.zeros(1, np.int64), out, crop=np.asarray([box], np.int32)
    )[0]


def old_bilinear(img: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """The whole (H, W, 3) image by the kernel's former 2-tap bilinear: per axis the two pixels
    around the half-pixel centre, weights of 2^11 rounded half up, one rounding at the end."""

    def taps(out_len, length):
        o = np.arange(out_len, dtype=np.int64)
        n = np.maximum(0, (2 * o + 1) * length - out_len)
        i, f = n // (2 * out_len), n % (2 * out_len)
        w1 = (f * 2048 + out_len) // (2 * out_len)
        return i, np.minimum(i + 1, length - 1), 2048 - w1, w1

    sy0, sy1, wy0, wy1 = taps(oh, img.shape[0])
    sx0, sx1, wx0, wx1 = taps(ow, img.shape[1])
    p = img.astype(np.int64)
    wx0, wx1 = wx0[None, :, None], wx1[None, :, None]
    top = wx0 * p[sy0][:, sx0] + wx1 * p[sy0][:, sx1]
    bottom = wx0 * p[sy1][:, sx0] + wx1 * p[sy1][:, sx1]
    return ((wy0[:, None, None] * top + wy1[:, None, None] * bottom + (1 << 21)) >> 22).astype(np.uint8)


def test_downscales_match_pillow_on_real_photos(tmp_path):
    Image = pytest.importorskip("PIL.Image", reason="Pillow is the reference here")
    import tbljax

    files = sorted((shared_dir("kodak") / "images").rglob("*.jpg"))[::8]
    files += sorted((shared_dir("caltech101") / "images").rglob("*.jpg"))[::40]
    tbljax.convert(
        files, tmp_path / "p.tbl", image_size=256, resize="max_side", labels=[0] * len(files), progress=False
    )
    ds = tbljax.open(tmp_path / "p.tbl")
    rng = np.random.default_rng(0)
    ours, old = {}, []
    for i in range(len(ds)):
        img = ds.read(i)
        h, w = img.shape[:2]
        assert max(h, w) == 256
        bh, bw = int(rng.integers(h // 3, h + 1)), int(rng.integers(w // 3, w + 1))
        crop = (int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw)
        for name, box, s in [
            ("whole -> 64", (0, 0, h, w), 64),
            ("whole -> 112", (0, 0, h, w), 112),
            ("whole -> 160", (0, 0, h, w), 160),
            ("box -> 112", crop, 112),
        ]:
            y0, x0, bh_, bw_ = box
            ref = np.asarray(Image.fromarray(img).crop((x0, y0, x0 + bw_, y0 + bh_)).resize((s, s), Image.BILINEAR))
            ours.setdefault(name, []).append(psnr(resize(img, box, s, s), ref))
        old.append(psnr(old_bilinear(img, 64, 64), np.asarray(Image.fromarray(img).resize((64, 64), Image.BILINEAR))))
    assert len(old) >= 50
    for name, scores in ours.items():
        assert np.mean(scores) >= MEAN_PSNR_DB, (name, np.mean(scores))
        assert np.min(scores) >= WORST_PSNR_DB, (name, np.min(scores))
    # The comparison can tell filters apart: the non-antialiased 2-tap formula is far off.
    assert np.mean(old) < 40, np.mean(old)


@pytest.mark.parametrize("cell, side, out", [(3, 256, 64), (1, 192, 64)])
def test_fine_checkerboard_shrinks_to_flat_grey(cell, side, out):
    """A checkerboard finer than the output's pixels (3-px cells at 4x, 1-px cells at 3x)
    carries no detail the output can show: an antialiased filter averages it to grey; the
    2-tap formula samples it and returns full-contrast aliases."""
    y, x = np.mgrid[:side, :side]
    board = np.repeat(((y // cell + x // cell) % 2 * 255).astype(np.uint8)[..., None], 3, axis=2)
    ours = resize(board, (0, 0, side, side), out, out).astype(np.float64)
    assert abs(ours.mean() - 127.5) < 2 and ours.std() < 5, (ours.mean(), ours.std())
    assert np.abs(ours - 127.5).max() <= 20
    old = old_bilinear(board, out, out).astype(np.float64)
    assert old.std() > 80 and old.min() == 0 and old.max() == 255

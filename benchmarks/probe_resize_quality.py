"""Resize quality on real photos: the kernel's crop-resize (tbljax.kernels.gather with a crop
box) against Pillow's antialiased bilinear, `img.crop(box).resize((w, h), Image.BILINEAR)`,
beside the old 2-tap non-antialiased formula (the kernel before commit daf44ef, written here
in NumPy) and OpenCV's INTER_LINEAR and INTER_AREA (when OpenCV is installed).

The photos (kodak, and every 10th caltech101 image) are converted at max side 256 with their
aspect kept, then each record is resized whole to 64, 112, 160 and 224 px squares, and random
torchvision-style RRC boxes (scale 0.08-1, ratio 3/4-4/3) to 224 and 112. PSNR of each method
against Pillow per image: mean and worst per configuration (identical images count as 99 dB).

    PYTHONPATH=src python benchmarks/probe_resize_quality.py [--caltech-step 10] [--boxes 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA  # noqa: E402

PSNR_CAP = 99.0  # identical images: an infinite PSNR would swamp the mean


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return PSNR_CAP if mse == 0 else min(PSNR_CAP, 10 * np.log10(255.0**2 / mse))


def old_taps(out_len: int, start: int, length: int):
    """The kernel's resize before the antialiased filter (git show daf44ef~1:ffi/core/serve/kernel.h):
    per axis two source pixels around the half-pixel centre, weights of 2^11, half up."""
    o = np.arange(out_len, dtype=np.int64)
    n = np.maximum(0, (2 * o + 1) * length - out_len)
    i, f = n // (2 * out_len), n % (2 * out_len)
    w1 = (f * 2048 + out_len) // (2 * out_len)
    return start + i, start + np.minimum(i + 1, length - 1), 2048 - w1, w1


def old_bilinear(img: np.ndarray, box, oh: int, ow: int) -> np.ndarray:
    """The box (y0, x0, h, w) of an (H, W, 3) uint8 image, 2-tap bilinear to (oh, ow)."""
    y0, x0, h, w = (int(v) for v in box)
    sy0, sy1, wy0, wy1 = old_taps(oh, y0, h)
    sx0, sx1, wx0, wx1 = old_taps(ow, x0, w)
    p = img.astype(np.int64)
    wx0, wx1 = wx0[None, :, None], wx1[None, :, None]
    top = wx0 * p[sy0][:, sx0] + wx1 * p[sy0][:, sx1]
    bottom = wx0 * p[sy1][:, sx0] + wx1 * p[sy1][:, sx1]
    acc = wy0[:, None, None] * top + wy1[:, None, None] * bottom
    return ((acc + (1 << 21)) >> 22).astype(np.uint8)


def pillow(img: np.ndarray, box, oh: int, ow: int) -> np.ndarray:
    from PIL import Image

    y0, x0, h, w = (int(v) for v in box)
    return np.asarray(Image.fromarray(img).crop((x0, y0, x0 + w, y0 + h)).resize((ow, oh), Image.BILINEAR))


def ours(img: np.ndarray, boxes: np.ndarray, oh: int, ow: int) -> np.ndarray:
    from tbljax._src.engine import kernels

    out = np.empty((len(boxes), oh, ow, 3), np.uint8)
    return kernels.gather(
        np.ascontiguousarray(img[None]), np.zeros(len(boxes), np.int64), out, crop=np.asarray(boxes, np.int32)
    )


def rrc_box(rng, height: int, width: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3)."""
    for _ in range(10):
        area = height * width * rng.uniform(0.08, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        w, h = int(round((area * ratio) ** 0.5)), int(round((area / ratio) ** 0.5))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    return 0, 0, height, width


def photos(caltech_step: int, side: int = 256) -> list[np.ndarray]:
    """kodak and every caltech_step-th caltech101 JPEG, converted at max side `side`."""
    import tbljax

    files = sorted((SHARED_DATA / "kodak" / "images").rglob("*.jpg"))
    files += sorted((SHARED_DATA / "caltech101" / "images").rglob("*.jpg"))[::caltech_step]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "photos.tbl"
        tbljax.convert(files, path, image_size=side, resize="max_side", labels=[0] * len(files), progress=False)
        ds = tbljax.open(path)
        return [ds.read(i) for i in range(len(ds))]


def configurations(images, rng, boxes_per_image: int):
    """(name, output side, [(image index, box)]) of each configuration."""
    whole = [(k, (0, 0, im.shape[0], im.shape[1])) for k, im in enumerate(images)]
    out = [(f"whole record -> {s}", s, whole) for s in (64, 112, 160, 224)]
    for s in (224, 112):
        boxes = [(k, rrc_box(rng, *im.shape[:2])) for k, im in enumerate(images) for _ in range(boxes_per_image)]
        out.append((f"RRC box -> {s}", s, boxes))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--caltech-step", type=int, default=10, help="every n-th caltech101 image")
    ap.add_argument("--boxes", type=int, default=4, help="RRC boxes per image")
    a = ap.parse_args()
    for name in ("kodak", "caltech101"):
        if not (SHARED_DATA / name).is_dir():
            sys.exit(f"needs {SHARED_DATA / name} (real photos beside the repo)")
    try:
        import cv2
    except ImportError:
        cv2 = None
    images = photos(a.caltech_step)
    rng = np.random.default_rng(0)
    methods = ["tbljax", "old 2-tap"] + (["cv2 LINEAR", "cv2 AREA"] if cv2 is not None else [])
    print(
        f"{len(images)} photos at max side 256 (kodak + every {a.caltech_step}th caltech101); "
        f"PSNR in dB against Pillow BILINEAR (antialiased), mean / worst over the images\n"
    )
    print("| configuration | " + " | ".join(methods) + " |")
    print("|---|" + "---:|" * len(methods))
    for name, s, jobs in configurations(images, rng, a.boxes):
        scores: dict[str, list[float]] = {m: [] for m in methods}
        for k, box in jobs:
            img = images[k]
            ref = pillow(img, box, s, s)
            scores["tbljax"].append(psnr(ours(img, [box], s, s)[0], ref))
            scores["old 2-tap"].append(psnr(old_bilinear(img, box, s, s), ref))
            if cv2 is not None:
                y0, x0, h, w = box
                crop = np.ascontiguousarray(img[y0 : y0 + h, x0 : x0 + w])
                scores["cv2 LINEAR"].append(psnr(cv2.resize(crop, (s, s), interpolation=cv2.INTER_LINEAR), ref))
                scores["cv2 AREA"].append(psnr(cv2.resize(crop, (s, s), interpolation=cv2.INTER_AREA), ref))
        cells = [f"{np.mean(v):.1f} / {np.min(v):.1f}" for v in scores.values()]
        print(f"| {name} ({len(jobs)}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

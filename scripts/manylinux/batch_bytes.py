"""Converts real photos with the installed tbljax (16 seeded synthetic images where PHOTO_DIR has
none: a clone without ../shared), serves one batch from RAW and one from compact JPEG records,
and runs the in-jit op; writes each result to WORKDIR/out/*.npy, so that the wheels of two
machines can be compared byte for byte (scripts/check-manylinux-aarch64.sh: the aarch64 wheel
under qemu against the x86-64 wheel).

Usage: python batch_bytes.py PHOTO_DIR WORKDIR
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import numpy as np

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def synthetic_images(n: int) -> list[np.ndarray]:
    """n uint8 RGB images of several sizes, the same on every machine (PCG64 is platform-free):
    smooth gradients with noise, so their JPEG records have detail in every block."""
    rng = np.random.default_rng(2026)
    images = []
    for k in range(n):
        h, w = 100 + 7 * k, 180 - 5 * k
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * 255) // w, (y * 255) // h, ((x + y) * 255) // (h + w)], -1)
        images.append(np.clip(base + rng.integers(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8))
    return images


def main() -> None:
    photo_dir, work = Path(sys.argv[1]), Path(sys.argv[2])
    photos = sorted(str(p) for p in photo_dir.rglob("*.jpg"))[:16]
    if len(photos) < 16:  # a clone without ../shared beside it: the same images on both machines
        print(f"batch_bytes: {len(photos)} JPEG photos under {photo_dir}, 16 needed: 16 seeded synthetic images")
        photos = synthetic_images(16)
    import jax
    import jax.numpy as jnp

    import tbljax

    info = tbljax.build_info()
    print(
        f"batch_bytes: {platform.machine()}: simd {info['simd']}, targets {info['simd_targets']}, "
        f"libjpeg-turbo {info['libjpeg_turbo']}, lz4 {info['lz4']}, jax {jax.__version__}"
    )
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    tbljax.convert(photos, str(work / "raw.tbl"), image_size=96, overwrite=True)
    tbljax.convert(photos, str(work / "jpeg.tbl"), image_size=96, format="jpeg", quality=90, overwrite=True)
    view = np.asarray(tbljax.open(str(work / "raw.tbl")).view())
    np.save(out / "raw_records.npy", view)
    for name in ("raw", "jpeg"):
        loader = tbljax.loader(str(work / f"{name}.tbl"), batch_size=8, seed=0, num_epochs=1, mean=MEAN, std=STD)
        batch = next(iter(loader))
        np.save(out / f"{name}_batch_image.npy", np.asarray(batch["image"]))
        np.save(out / f"{name}_batch_index.npy", np.asarray(batch["index"]))
    pick = np.array([5, 0, 11, 3, 15, 8], np.int32)
    f = jax.jit(lambda d, i: tbljax.ops.gather_normalize(d, i, mean=MEAN, std=STD, backend="ffi"))
    got = np.asarray(f(jnp.asarray(view), jnp.asarray(pick)))
    # The op against NumPy here too, so a wrong op on both machines is not taken for agreement.
    want = ((view[pick] / 255.0 - np.array(MEAN)) / np.array(STD)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    np.save(out / "jit_op.npy", got)
    print(f"batch_bytes: wrote {sorted(p.name for p in out.glob('*.npy'))}")


if __name__ == "__main__":
    main()

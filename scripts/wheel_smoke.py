"""The installed wheel, used as a user would (scripts/check-wheel.sh runs this in a fresh venv
outside the source tree): its native code carries libjpeg-turbo and lz4, conversion, the loader,
the in-jit op and the console script work, and each result is checked against NumPy.

Usage: python wheel_smoke.py WORKDIR [PHOTO_DIR]   (synthetic images when PHOTO_DIR has none)
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import numpy as np


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"wheel smoke: FAILED: {what}")
    print(f"wheel smoke: ok: {what}")


def sources(photo_dir: Path | None):
    photos = sorted(photo_dir.rglob("*.jpg"))[:12] if photo_dir and photo_dir.is_dir() else []
    if photos:
        return [str(p) for p in photos], f"{len(photos)} photos from {photo_dir}"
    # Smooth gradients with noise: JPEG-friendly, different per image.
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:96, 0:128]
    images = np.stack(
        [
            np.stack([(x * (i + 1)) % 256, (y * 2 + i * 17) % 256, (x + y) % 256], -1)
            + rng.integers(0, 8, (96, 128, 3))
            for i in range(12)
        ]
    ).clip(0, 255)
    return (images.astype(np.uint8), np.arange(12) % 3), "12 synthetic images"


def main() -> None:
    work = Path(sys.argv[1])
    photo_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    import tbljax

    # The native module is the wheel's, and libjpeg's code lives inside it.
    core = Path(tbljax._core.__file__).resolve()
    check(
        not (Path.cwd() / "src" / "tbljax").exists() and "site-packages" in core.parts,
        f"tbljax imported from the installed wheel ({core})",
    )
    info = tbljax.build_info()
    check(info["native_deps"] == "static", f"native_deps is {info['native_deps']!r}")
    check(
        Path(info["libjpeg_library"]).resolve() == core,
        f"libjpeg's code is in _core itself ({info['libjpeg_library']})",
    )
    check(
        re.fullmatch(r"\d+\.\d+\.\d+", info["libjpeg_turbo"]) is not None
        and info["libjpeg_turbo"] == info["libjpeg_turbo_headers"],
        f"libjpeg-turbo {info['libjpeg_turbo']} linked (headers {info['libjpeg_turbo_headers']})",
    )
    check(info["lz4"] == info["lz4_headers"], f"lz4 {info['lz4']} linked")

    src, what = sources(photo_dir)
    raw = tbljax.convert(src, str(work / "raw.tbl"), image_size=64, overwrite=True)
    ds = tbljax.open(str(work / "raw.tbl"))
    view = np.asarray(ds.view())
    check(
        len(ds) == raw.written == 12 and view.shape == (12, 64, 64, 3),
        f"convert: {what} -> {len(ds)} RAW records, view {view.shape}",
    )
    check(view.std() > 10, "the records hold pictures, not a constant")

    # The loader: a batch equals the records it names, normalized in NumPy.
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    loader = tbljax.loader(str(work / "raw.tbl"), batch_size=4, seed=0, num_epochs=1, mean=mean, std=std)
    batch = next(iter(loader))
    idx = np.asarray(batch["index"])
    want = ((view[idx] / 255.0 - np.array(mean)) / np.array(std)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(batch["image"]), want, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(np.asarray(batch["label"]), np.asarray(ds.labels)[idx])
    check(True, f"loader: batch of records {idx.tolist()} equals NumPy's normalization")

    # The fused op inside jax.jit, through the wheel's XLA FFI handler.
    import jax
    import jax.numpy as jnp

    pick = np.array([5, 0, 11, 3], np.int32)
    crop = np.array([[0, 0, 64, 64]] * 4, np.int32)
    f = jax.jit(lambda d, i: tbljax.ops.gather_normalize(d, i, mean=mean, std=std, backend="ffi"))
    got = np.asarray(f(jnp.asarray(view), jnp.asarray(pick)))
    want = ((view[pick] / 255.0 - np.array(mean)) / np.array(std)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    g = jax.jit(
        lambda d, i: tbljax.ops.gather_normalize(d, i, crop=crop, out_size=(64, 64), dtype=jnp.uint8, backend="ffi")
    )
    np.testing.assert_array_equal(np.asarray(g(jnp.asarray(view), jnp.asarray(pick))), view[pick])
    check(True, f"ops.gather_normalize in jax.jit (FFI, jax {jax.__version__}) equals NumPy")

    # Compact JPEG records: encoded and decoded by the linked libjpeg-turbo, close to RAW.
    tbljax.convert(src, str(work / "jpeg.tbl"), image_size=64, format="jpeg", quality=95, overwrite=True)
    jp = tbljax.open(str(work / "jpeg.tbl"))
    decoded = np.stack([np.asarray(jp.read(i)) for i in range(len(jp))]).astype(np.float64)
    mse = np.mean((decoded - view) ** 2)
    psnr = 10 * np.log10(255.0**2 / max(mse, 1e-12))
    check(decoded.shape == view.shape and psnr > 25, f"compact JPEG records decode to RAW at {psnr:.1f} dB")

    # One version: the wheel's metadata, tbljax.__version__ and the console script.
    script = Path(sys.executable).with_name("tbljax")
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True).stdout
    dist = importlib.metadata.version("tbljax")
    check(
        out.strip() == f"tbljax {dist}" and tbljax.__version__ == dist,
        f"`tbljax --version` says {out.strip()!r}; wheel {dist}, __version__ {tbljax.__version__}",
    )

    # Nothing in this process mapped a system libjpeg or liblz4.
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    foreign = sorted({line.split()[-1] for line in maps.splitlines() if re.search(r"/lib(jpeg|lz4)[^/]*\.so", line)})
    check(foreign == [], f"no libjpeg or liblz4 mapped into the process: {foreign or 'none'}")


if __name__ == "__main__":
    main()

"""Serving compact JPEG records (q90 4:2:0 at max side 256, the whole photo) with
random-resized-crop + flip + normalize to float32 at 160 px, batch 256, 2 threads: tbljax's
fused decode-in-the-kernel pass against NVIDIA DALI's CPU pipeline and albumentations + OpenCV
on the same JPEG bytes, and per core against on-the-fly decoding of the original photos
(format="jpeg", quality=None, which serves square records: compared with a compact file of the
same square geometry), on the whole mix and on the ImageNet-sized kodak photos alone. Also the
DCT-scaled option (`jpeg_dct_scale=True`): its speed-up and its PSNR against the exact path, on
records at max side 512 served at 64 px.

Each configuration runs in its own process, rounds interleaved, timed after WARMUP batches (the
steady state: see WARMUP); medians are printed.

    python benchmarks/bench_compact.py --rounds 5
    python benchmarks/bench_compact.py --rounds 1 --photos 256 --batches 2   # a quick check
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA, machine, median, rounds  # noqa: E402

B, SIZE, THREADS = 256, 160, 2
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Batches run before timing, in every worker. The loader's ring holds prefetch + 3 = 4 slots of
# 78 MB here, and the first write to each faults its memory in: 7-9 ms in huge pages, up to
# ~150 ms each when the VM has none to give (measured 2026-12-01), once per run. Timing from
# the second batch, as the first version of this script did, mixed that start-up cost into
# the figure and moved it between 4.1k and 7.0k img/s from run to run.
WARMUP = 6


def photos(n: int, sets=("kodak", "caltech101")) -> list[Path]:
    """Every k-th photo of `sets` (in that order), n at most. kodak: 312 ImageNet-sized photos
    (long side 500, median 95 KB); caltech101: 1010 small ones (~300x225, 14 KB)."""
    found = []
    for name in sets:
        found += sorted((SHARED_DATA / name).rglob("*.jpg"))
    if not found:
        sys.exit(f"needs real photos in {SHARED_DATA}/{' or '.join(sets)}")
    step = max(1, len(found) // n)
    return found[::step][:n]


def payloads(path: str) -> list[np.ndarray]:
    """Every record's JPEG bytes, as the file holds them."""
    import tbljax

    ds = tbljax.open(path)
    views, _counts, offsets, sizes, _h, _w = ds.jpeg_records()
    return [views[0][o:o + s] for o, s in zip(offsets.tolist(), sizes.tolist())]


# ---- workers: each returns images per second over `n` batches after one warm-up batch ----

def tbljax_worker(path: str, n: int, size: int, dct: bool) -> float:
    import tbljax

    opts = tbljax.LoaderOptions(batch_size=B, seed=0, augment=tbljax.Augment(size=(size, size)),
                                jpeg_dct_scale=dct, prefetch=1)
    it = iter(tbljax.HostLoader(tbljax.open(path), opts))
    for _ in range(WARMUP):
        next(it)
    t = time.perf_counter()
    for _ in range(n):
        next(it)
    return n * B / (time.perf_counter() - t)


def dali_worker(path: str, n: int) -> float:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    blobs = payloads(path)

    def source(info):
        start = info.iteration * B
        return [blobs[(start + k) % len(blobs)] for k in range(B)]

    @pipeline_def(batch_size=B, num_threads=THREADS, device_id=None, seed=0)
    def pipe():
        jpegs = fn.external_source(source=source, batch=True, batch_info=True, dtype=types.UINT8)
        img = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        img = fn.resize(img, resize_x=SIZE, resize_y=SIZE)
        return fn.crop_mirror_normalize(img, mirror=fn.random.coin_flip(), dtype=types.FLOAT,
                                        mean=[255 * m for m in MEAN], std=[255 * s for s in STD],
                                        output_layout="HWC")

    p = pipe()
    p.build()
    for _ in range(WARMUP):
        p.run()
    t = time.perf_counter()
    for _ in range(n):
        (out,) = p.run()
        out.as_tensor()  # the batch as one dense array, as a training step takes it
    return n * B / (time.perf_counter() - t)


def albumentations_worker(path: str, n: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    import albumentations as A
    import cv2

    cv2.setNumThreads(1)  # the parallelism is the 2 threads below
    blobs = payloads(path)
    aug = A.Compose([A.RandomResizedCrop(size=(SIZE, SIZE)), A.HorizontalFlip(),
                     A.Normalize(mean=MEAN, std=STD)])
    out = np.empty((B, SIZE, SIZE, 3), np.float32)

    def one(k_blob):
        k, blob = k_blob
        img = cv2.cvtColor(cv2.imdecode(blob, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        out[k] = aug(image=img)["image"]

    with ThreadPoolExecutor(THREADS) as pool:
        def batch(s):
            list(pool.map(one, [(k, blobs[(s * B + k) % len(blobs)]) for k in range(B)]))
        for s in range(WARMUP):
            batch(s)
        t = time.perf_counter()
        for s in range(WARMUP, WARMUP + n):
            batch(s)
        return n * B / (time.perf_counter() - t)


def worker(kind: str, path: str, n: int) -> dict:
    if kind == "tbljax":
        v = tbljax_worker(path, n, SIZE, False)
    elif kind == "tbljax-dct":
        v = tbljax_worker(path, n, 64, True)
    elif kind == "tbljax-exact64":
        v = tbljax_worker(path, n, 64, False)
    elif kind == "dali":
        v = dali_worker(path, n)
    elif kind == "albumentations":
        v = albumentations_worker(path, n)
    else:
        raise SystemExit(f"unknown worker {kind}")
    return {"img_s": v}


# ---- DCT-scaled vs exact: PSNR on the same boxes ----

def dct_psnr(path: str) -> dict:
    import tbljax

    res = {}
    for name, aug in [("rrc", tbljax.Augment(size=(64, 64))),
                      ("center", tbljax.Augment(crop="center", flip=False, size=(64, 64)))]:
        imgs = {}
        for dct in (False, True):
            opts = tbljax.LoaderOptions(batch_size=B, seed=0, num_epochs=1, drop_remainder=False,
                                        dtype="uint8", augment=aug, jpeg_dct_scale=dct)
            imgs[dct] = np.concatenate([np.array(b.image) for b in
                                        tbljax.HostLoader(tbljax.open(path), opts)])
        err = (imgs[True].astype(np.float64) - imgs[False].astype(np.float64)) ** 2
        mse = err.reshape(len(err), -1).mean(1)
        changed = mse > 0
        per = 10 * np.log10(255 ** 2 / mse[changed]) if changed.any() else np.array([np.inf])
        res[name] = dict(scaled=float(changed.mean()), median_db=float(np.median(per)),
                         worst_db=float(per.min()),
                         pooled_db=float(10 * np.log10(255 ** 2 / max(err[changed].mean(), 1e-12))))
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "PATH", "BATCHES"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--photos", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--only", default="", help="configurations whose name contains one of these "
                    "';'-separated words (default: all)")
    a = ap.parse_args()
    if a.worker:
        kind, path, nb = a.worker
        print(json.dumps(worker(kind, path, int(nb))))
        return
    import tbljax

    files = photos(a.photos)
    kodak = photos(a.photos, sets=("kodak",))
    with tempfile.TemporaryDirectory() as d:
        compact, square, original, big, k_square, k_original = (
            str(Path(d) / f) for f in ("c256.tbl", "c256sq.tbl", "orig.tbl", "c512.tbl",
                                       "kodak_c256sq.tbl", "kodak_orig.tbl"))
        t = time.perf_counter()
        tbljax.convert(files, compact, image_size=256, resize="max_side", format="jpeg", quality=90,
                       chroma="420", progress=False)
        # Original bytes are served square (decoded + resized on the fly): the per-core
        # comparison is against a compact file of the same square geometry, on the whole mix
        # and on the ImageNet-sized kodak photos alone (the originals the target is about).
        for subset, sq, orig in [(files, square, original), (kodak, k_square, k_original)]:
            tbljax.convert(subset, sq, image_size=256, format="jpeg", quality=90, chroma="420",
                           progress=False)
            tbljax.convert(subset, orig, image_size=256, format="jpeg", progress=False)
        tbljax.convert(files, big, image_size=512, resize="max_side", format="jpeg", quality=90,
                       chroma="420", progress=False)
        print(f"converted {len(files)} photos six ways in {time.perf_counter() - t:.0f} s",
              file=sys.stderr)
        one, two = {"TBLJAX_NUM_THREADS": "1"}, {"TBLJAX_NUM_THREADS": str(THREADS)}
        configs = {
            "tbljax compact, 2 threads": (["tbljax", compact], two),
            "DALI CPU, 2 threads": (["dali", compact], two),
            "albumentations + OpenCV, 2 threads": (["albumentations", compact], two),
            "tbljax compact square 256, 1 thread": (["tbljax", square], one),
            "tbljax original bytes square 256, 1 thread": (["tbljax", original], one),
            "kodak: tbljax compact square 256, 1 thread": (["tbljax", k_square], one),
            "kodak: tbljax original bytes square 256, 1 thread": (["tbljax", k_original], one),
            "max side 512 -> 64 px, exact": (["tbljax-exact64", big], two),
            "max side 512 -> 64 px, jpeg_dct_scale": (["tbljax-dct", big], two),
        }
        if a.only:
            words = [w for w in a.only.split(";") if w]
            configs = {k: v for k, v in configs.items() if any(w in k for w in words)}
        res = rounds(Path(__file__), {k: [*v[0], str(a.batches)] for k, v in configs.items()},
                     a.rounds, env={k: v[1] for k, v in configs.items()})
        psnr = dct_psnr(big)
    m = {k: median(v, "img_s") for k, v in res.items()}
    print(f"\nbench_compact: {len(files)} photos (kodak + caltech101; kodak alone: {len(kodak)}), "
          f"compact q90 4:2:0 max side 256 -> RRC + flip + normalize float32 {SIZE} px, batch "
          f"{B}, {WARMUP} warm-up + {a.batches} timed batches, median of {a.rounds} rounds\n"
          f"machine: {machine()}\n")
    print("| configuration | img/s |")
    print("|---|---:|")
    for k, v in m.items():
        print(f"| {k} | {v:.0f} |")

    def ratio(x, y):
        return m[x] / m[y] if x in m and y in m and m[y] else float("nan")
    print()
    for label, x, y, target in [
            ("tbljax / DALI CPU", "tbljax compact, 2 threads", "DALI CPU, 2 threads", ">= 3x"),
            ("tbljax / albumentations", "tbljax compact, 2 threads",
             "albumentations + OpenCV, 2 threads", ">= 3x"),
            ("per core: compact / original bytes (square 256)",
             "tbljax compact square 256, 1 thread", "tbljax original bytes square 256, 1 thread",
             ">= 4x"),
            ("per core, kodak (ImageNet-sized originals): compact / original bytes",
             "kodak: tbljax compact square 256, 1 thread",
             "kodak: tbljax original bytes square 256, 1 thread", ">= 4x"),
            ("jpeg_dct_scale speed-up (512 -> 64 px)", "max side 512 -> 64 px, jpeg_dct_scale",
             "max side 512 -> 64 px, exact", "")]:
        print(f"{label}: {ratio(x, y):.2f}x" + (f" (target {target})" if target else ""))
    for name, r in psnr.items():
        print(f"jpeg_dct_scale PSNR vs exact, {name} 64 px from max side 512: {100 * r['scaled']:.0f}% "
              f"of samples scaled; over those median {r['median_db']:.1f} dB, worst "
              f"{r['worst_db']:.1f} dB, pooled {r['pooled_db']:.1f} dB")


if __name__ == "__main__":
    main()

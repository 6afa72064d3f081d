"""Native resolution (issue 49) against the fixed-size path: the host loader over the kodak
photos at full aspect, RAW records at shorter side 256, 2 threads, float32: RRC + flip at
224 x 224 vs aspect-ratio buckets ("auto" at 224² pixels, random cover-crop + flip) vs NaFlex
(RRC + flip, then 256 patches of 16², so at most 256² pixels a row). The issue asks for
>= 0.9x the fixed path's served pixels per second from both. Pixels count the valid rows'
(buckets) or valid patches' (NaFlex) output pixels. Each configuration in its own process,
warm-up batches first, medians over interleaved rounds.

    python benchmarks/bench_native_res.py [--rounds 3] [--batches 80] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import kodak_photos, machine, median, rounds  # noqa: E402

WARMUP = 6  # past the ring slots' first writes (each bucket shape its own)
CONFIGS = ("rrc 224", "buckets", "naflex 256x16")


def _options(config: str, batch_size: int):
    import tbljax

    common = dict(batch_size=batch_size, seed=0, threads=2, dtype="float32")
    if config == "rrc 224":
        return tbljax.LoaderOptions(augment=tbljax.Augment(size=(224, 224)), **common)
    if config == "buckets":
        buckets = tbljax.Buckets(sizes="auto", pixels=224 * 224, crop="random")
        return tbljax.LoaderOptions(augment="flip", buckets=buckets, **common)
    patches = tbljax.Patches(size=16, max_tokens=256)
    return tbljax.LoaderOptions(augment=tbljax.Augment(size=None), patches=patches, **common)


def worker(path: str, config: str, batches: int, batch_size: int) -> dict:
    import numpy as np

    import tbljax

    it = iter(tbljax.HostLoader(tbljax.open(path), _options(config, batch_size)))
    for _ in range(WARMUP):
        np.asarray(next(it).image).sum()
    pixels = 0
    t = time.perf_counter()
    for _ in range(batches):
        b = next(it)
        image = b.image
        image.reshape(-1)[0].item()  # the batch is built; reading it all would time NumPy
        rows = image.shape[0] if b.valids is None else int(b.valids[0].sum())
        if config == "naflex 256x16":
            pixels += int(b.fields["patch_valid"][0].sum()) * 16 * 16
        else:
            pixels += rows * image.shape[1] * image.shape[2]
    dt = time.perf_counter() - t
    return {
        "ms_per_batch": 1e3 * dt / batches,
        "mpixels_per_s": pixels / dt / 1e6,
        "pixels_per_row": pixels / batches / batch_size,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=80)  # 12 batches read buckets at 0.62x, 80 at 0.98x
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.rest[0], a.rest[1], a.batches, a.batch_size)))
        return
    import tbljax

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "raw.tbl"
        tbljax.convert(kodak_photos(), path, image_size=256, resize="shorter_side", progress=False)
        common = ["--batches", str(a.batches), "--batch-size", str(a.batch_size)]
        res = rounds(Path(__file__), {c: [*common, str(path), c] for c in CONFIGS}, a.rounds)
    print(f"# {machine()}; tbljax kernel target {tbljax.kernels.kernel_target()}")
    print(f"# batch {a.batch_size}, {a.batches} timed batches after {WARMUP} warm-up, median of {a.rounds} rounds")
    base = median(res["rrc 224"], "mpixels_per_s")
    for c in CONFIGS:
        mp = median(res[c], "mpixels_per_s")
        print(
            f"{c:14s} {median(res[c], 'ms_per_batch'):7.1f} ms/batch  {median(res[c], 'pixels_per_row'):8.0f} px/row"
            f"  {mp:7.1f} Mpx/s  {mp / base:.2f}x rrc 224"
        )


if __name__ == "__main__":
    main()

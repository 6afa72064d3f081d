"""The mask gather `_core.serve_nearest` alone (issue 48): 32 random uint8 maps 512x768 through
`augment.sample`'s RandomResizedCrop crops and flips into a reused (32, 512, 512) out; the median
of `--calls` calls.

    python benchmarks/bench_nearest.py [--calls 30] [--threads 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tbljax import _core, augment

B, H, W, OUT = 32, 512, 768, 512


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0, help="0: the process-wide pool")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    maps = [rng.integers(0, 256, (H, W), np.uint8) for _ in range(B)]
    crops, flips = augment.sample(augment.Augment(size=(OUT, OUT)), np.arange(B), height=H, width=W, seed=0, epoch=0)
    hs, ws = np.full(B, H, np.int32), np.full(B, W, np.int32)
    crops, flips = np.ascontiguousarray(crops, np.int32), np.ascontiguousarray(flips, np.uint8)
    out = np.empty((B, OUT, OUT), np.uint8)
    times = []
    for _ in range(args.calls + 1):  # the first warms the pool and out's pages
        t = time.perf_counter()
        _core.serve_nearest(maps, hs, ws, crops, flips, out, args.threads)
        times.append(time.perf_counter() - t)
    print(f"serve_nearest {B}x{H}x{W} uint8 -> {B}x{OUT}x{OUT}: median {statistics.median(times[1:]) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

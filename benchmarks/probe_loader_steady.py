"""The loader's steady state on one file: img/s as the median time of the batches after the
ring's slots have all been written once (the first write to each faults its memory in).
Used for the step-by-step table of compact serving in benchmarks/README.md.

    TBLJAX_NUM_THREADS=2 PYTHONPATH=src python benchmarks/probe_loader_steady.py FILE.tbl [--batches 24]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tbljax

SKIP = 4  # batches before the median: the ring's 4 slots (prefetch 1 + 3) written once


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--size", type=int, default=160)
    a = ap.parse_args()
    opts = tbljax.LoaderOptions(batch_size=256, seed=0, prefetch=1, augment=tbljax.Augment(size=(a.size, a.size)))
    it = iter(tbljax.HostLoader(tbljax.open(a.path), opts))
    next(it)
    times = []
    for _ in range(a.batches):
        t = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t)
    print(f"steady: {256 / np.median(times[SKIP:]):.0f} img/s (median of {len(times) - SKIP} batches)")


if __name__ == "__main__":
    main()

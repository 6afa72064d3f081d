"""How busy the loader keeps its threads on compact records: two ratios that a host's drifting
speed cancels out of (both sides of each are timed together).

- kernel share: the share of the loader's wall time spent inside the native `serve_jpeg` call
  (the rest the pool's threads wait for Python: the step's draw, slot and labels);
- pool utilization: process CPU time / (threads x wall time) over `kernels.serve_jpeg` calls
  of 256 random-resized-crop boxes on an explicit pool (how evenly the batch is split);
- float32 / uint8: the time of those calls writing float32 (ImageNet normalize) over the time
  writing uint8, the two alternating (what the 4 bytes a value cost over 1).

Data: the kodak photos converted at shorter side 256, compact q90 4:2:0 (bench_compact.py's
file); RRC to --size px, --dtype, batch 256, prefetch 1.

    PYTHONPATH=src python benchmarks/probe_loader_threads.py [--threads 2] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_box_decode import convert_compact, kodak_photos, rrc_boxes  # noqa: E402
from bench_compact import MEAN, STD, touch  # noqa: E402

B, WARMUP = 256, 6


def kernel_share(path: str, size: int, dtype: str, batches: int) -> tuple[float, float]:
    """(share of the loader's time inside the native serve_jpeg call, img/s): over the calls
    from the first to the last that ran wholly within the timed batches, their total time over
    the time from the first's start to the last's end (so: kernel / (kernel + the gaps))."""
    import tbljax
    from tbljax._src.engine import kernels

    calls: list[tuple[float, float]] = []
    native = kernels._core

    class Timed:  # the engine's handle on the native module, with serve_jpeg timed
        def __getattr__(self, name):
            return getattr(native, name)

        def serve_jpeg(self, *args):
            t = time.perf_counter()
            try:
                return native.serve_jpeg(*args)
            finally:
                calls.append((t, time.perf_counter()))

    kernels._core = Timed()
    try:
        opts = tbljax.LoaderOptions(
            batch_size=B, seed=0, augment=tbljax.Augment(size=(size, size)), dtype=dtype, prefetch=1
        )
        it = iter(tbljax.HostLoader(tbljax.open(path), opts))
        for _ in range(WARMUP):
            touch(next(it).image)
        t0 = time.perf_counter()
        for _ in range(batches):
            touch(next(it).image)
        t1 = time.perf_counter()
        it.close()
    finally:
        kernels._core = native
    inside = [(a, b) for a, b in calls if a >= t0 and b <= t1]
    span = inside[-1][1] - inside[0][0]
    return sum(b - a for a, b in inside) / span, batches * B / (t1 - t0)


def pool_calls(path: str, size: int, threads: int, batches: int) -> tuple[float, float]:
    """(median over batches of process CPU / (threads x wall) inside kernels.serve_jpeg,
    median of float32 time / uint8 time over the same batches, served alternately)."""
    import tbljax
    from tbljax._src.engine.ring import aligned_empty

    r = tbljax.open(path).jpeg_records()
    src = tbljax.kernels.jpeg_source(*r)
    n = len(r.heights)
    boxes = np.array(rrc_boxes(r.heights, r.widths), np.int32).reshape(n, 4)
    out = {
        dt: aligned_empty(B * size * size * 3 * np.dtype(dt).itemsize).view(dt).reshape(B, size, size, 3)
        for dt in ("uint8", "float32")
    }
    norm = {"float32": dict(mean=MEAN, std=STD), "uint8": {}}
    rng = np.random.default_rng(1)
    used, f32_over_u8 = [], []
    for k in range(batches + 1):
        idx = rng.integers(0, n, B).astype(np.int64)
        wall = {}
        for dt in ("uint8", "float32"):
            c, t = time.process_time(), time.perf_counter()
            tbljax.kernels.serve_jpeg(src, idx, out[dt], crop=boxes[idx], threads=threads, **norm[dt])
            wall[dt] = time.perf_counter() - t
            if k and dt == "uint8":  # the first batch starts the pool and faults `out` in
                used.append((time.process_time() - c) / (threads * wall[dt]))
        if k:
            f32_over_u8.append(wall["float32"] / wall["uint8"])
    return float(np.median(used)), float(np.median(f32_over_u8))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batches", type=int, default=30)
    a = ap.parse_args()
    os.environ.setdefault("TBLJAX_NUM_THREADS", str(a.threads))  # the loader's pool, before import
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "c256.tbl")
        convert_compact(kodak_photos(), path)
        share, img_s = kernel_share(path, a.size, a.dtype, a.batches)
        used, f32_over_u8 = pool_calls(path, a.size, a.threads, a.batches)
    print(
        f"loader, {a.threads} threads, RRC {a.size} {a.dtype}: kernel share of wall time {share:.3f} "
        f"({img_s:,.0f} img/s); serve_jpeg, uint8: pool utilization {used:.3f}; float32 / uint8 "
        f"time {f32_over_u8:.3f}"
    )


if __name__ == "__main__":
    main()

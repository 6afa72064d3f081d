"""Multi-view serving of compact records (``views=``, issue 47): each record decoded once per
view (`kernels.serve_jpeg` per view group, each view decoding its own box: what the loader did
before) against once for all of its views (`kernels.prepare_serve_jpeg_views`, the union of the boxes
decoded once: what it does now), same boxes, same bytes.

Data: the first `--records` kodak photos converted to compact records at shorter side 256
(quality 90, 4:2:0). Views: DINO's, 2 global 224² crops of scale (0.4, 1) and 8 local 96² of
scale (0.05, 0.4), float32 normalized, `--batch` records a batch, 2 threads. Both paths run in
one process, rounds alternating; medians.

    PYTHONPATH=src python benchmarks/bench_views.py [--rounds 5] [--batch 32] [--records 96]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import kodak_photos, machine

import tbljax
from tbljax._src.engine import kernels

GROUPS = (
    ("global", 2, tbljax.Augment(size=(224, 224), scale=(0.4, 1.0))),
    ("local", 8, tbljax.Augment(size=(96, 96), scale=(0.05, 0.4))),
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--records", type=int, default=96)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tbl = str(Path(d) / "c.tbl")
        photos = kodak_photos()[: a.records]
        tbljax.convert(
            photos, tbl, image_size=256, resize="shorter_side", format="jpeg", quality=90, chroma="420", progress=False
        )
        ds = tbljax.open(tbl)
        src = kernels.jpeg_source(*ds.jpeg_records())
        geo = tbljax.augment.RecordGeometry(*np.array(ds.jpeg_records()[4:6]))
        n = len(ds) // a.batch * a.batch
        batches = []  # per batch: per group (count, indices, out, crop, flip, ops)
        for first in range(0, n, a.batch):
            recs = np.arange(first, first + a.batch, dtype=np.int64)
            groups, v = [], 0
            for _, count, aug in GROUPS:
                drawn = [
                    tbljax.augment.sample(aug, recs, geometry=geo, seed=0, epoch=0, view=v + k) for k in range(count)
                ]
                v += count
                crop = np.stack([b for b, _ in drawn], 1).reshape(-1, 4)
                flip = np.stack([f for _, f in drawn], 1).reshape(-1)
                out = np.empty((a.batch * count, *aug.size, 3), np.float32)
                groups.append((count, np.repeat(recs, count), out, crop, flip, None))
            batches.append(groups)
        mean, std = tbljax.IMAGENET_MEAN, tbljax.IMAGENET_STD

        def per_view():
            for groups in batches:
                for _, idx, out, crop, flip, _ in groups:
                    kernels.serve_jpeg(src, idx, out, crop=crop, flip=flip, mean=mean, std=std, threads=2)

        def once():
            for groups in batches:
                kernels.prepare_serve_jpeg_views(src, groups, mean=mean, std=std, threads=2)()

        runs = {"decoded once per view (before)": per_view, "decoded once per record (now)": once}
        for f in runs.values():
            f()  # warm up
        times = {k: [] for k in runs}
        for _ in range(a.rounds):
            for name, f in runs.items():
                t = time.perf_counter()
                f()
                times[name].append((time.perf_counter() - t) / len(batches))
    print(f"{machine()}; {len(batches)} batches of {a.batch} records x (2 x 224² + 8 x 96²) float32, 2 threads")
    for name, v in times.items():
        med = statistics.median(v)
        print(
            f"{name:32s} median {med * 1e3:7.1f} ms/batch  {a.batch / med:7.1f} records/s  "
            f"rounds {[round(x * 1e3, 1) for x in v]}"
        )


if __name__ == "__main__":
    main()

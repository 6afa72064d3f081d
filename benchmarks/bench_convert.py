"""Conversion throughput: ../shared/data/kodak packed as a TAR, converted at 160 px by tbljax,
by turboloader 2.39's preprocess_to_tbl, and by a plain Pillow loop; each configuration in its
own process, medians over rounds. Also peak RSS as N grows (the TAR repeated k times).

    python benchmarks/bench_convert.py [--rounds 3] [--size 160]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA, machine, median, peak_rss_mib, rounds  # noqa: E402


def make_tar(dst: Path, repeat: int) -> int:
    files = sorted((SHARED_DATA / "kodak" / "images").rglob("*.jpg"))
    with tarfile.open(dst, "w") as tf:
        n = 0
        for r in range(repeat):
            for i, f in enumerate(files):
                data = f.read_bytes()
                ti = tarfile.TarInfo(f"{r:03d}{i:05d}.jpg")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
                n += 1
    return n


def worker(kind: str, tar: str, size: int, threads: int) -> dict:
    out = tempfile.mktemp(suffix=".tbl", dir=os.path.dirname(tar))
    # Imports are not conversion time.
    if kind == "tbljax":
        import tbljax
    elif kind == "turboloader":
        import turboloader
    else:
        import numpy as np
        from PIL import Image
    t0 = time.perf_counter()
    if kind == "tbljax":
        n = tbljax.convert(tar, out, image_size=size, threads=threads, progress=False).written
    elif kind == "turboloader":
        n = turboloader.preprocess_to_tbl(tar, out, image_size=size, num_workers=threads)
    elif kind == "pil":
        # The plain loop a user writes: decode, centre-crop resize, append raw bytes.
        n = 0
        with tarfile.open(tar) as tf, open(out, "wb") as f:
            for m in tf:
                im = Image.open(tf.extractfile(m)).convert("RGB")
                w, h = im.size
                s = min(w, h)
                box = ((w - s) / 2, (h - s) / 2, (w + s) / 2, (h + s) / 2)
                f.write(np.asarray(im.resize((size, size), Image.BILINEAR, box=box)).tobytes())
                n += 1
    else:
        raise ValueError(kind)
    dt = time.perf_counter() - t0
    os.remove(out)
    return {"kind": kind, "threads": threads, "n": n, "seconds": dt, "img_s": n / dt, "peak_rss_mib": peak_rss_mib()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=4, metavar=("KIND", "TAR", "SIZE", "THREADS"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=160)
    a = ap.parse_args()
    if a.worker:
        kind, tar, size, threads = a.worker
        print(json.dumps(worker(kind, tar, int(size), int(threads))))
        return
    if not (SHARED_DATA / "kodak").is_dir():
        sys.exit(f"needs {SHARED_DATA / 'kodak'} (real photos beside the repo)")
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as d:
        tar1, tar4 = Path(d) / "kodak.tar", Path(d) / "kodak4.tar"
        n1, n4 = make_tar(tar1, 1), make_tar(tar4, 4)
        configs = {
            f"tbljax, {cores} threads": ["tbljax", str(tar1), str(a.size), str(cores)],
            "tbljax, 1 thread": ["tbljax", str(tar1), str(a.size), "1"],
            f"turboloader preprocess_to_tbl, {cores} workers": ["turboloader", str(tar1), str(a.size), str(cores)],
            "Pillow loop, 1 core": ["pil", str(tar1), str(a.size), "1"],
            f"tbljax, {cores} threads, 4x N": ["tbljax", str(tar4), str(a.size), str(cores)],
        }
        res = rounds(Path(__file__), configs, a.rounds)
    print(f"\nbench_convert: kodak ({n1} JPEGs, {n4} for 4x N) -> {a.size} px, median of {a.rounds} rounds")
    print(f"machine: {machine()}\n")
    print("| configuration | img/s | img/s per core | peak RSS MiB |")
    print("|---|---:|---:|---:|")
    for name, rs in res.items():
        t = rs[0]["threads"]
        rate = median(rs, "img_s")
        print(f"| {name} | {rate:.0f} | {rate / t:.0f} | {median(rs, 'peak_rss_mib'):.0f} |")
    tj = median(res[f"tbljax, {cores} threads"], "img_s")
    tl = median(res[f"turboloader preprocess_to_tbl, {cores} workers"], "img_s")
    pil = median(res["Pillow loop, 1 core"], "img_s")
    one = median(res["tbljax, 1 thread"], "img_s")
    print(f"\ntbljax / turboloader: {tj / tl:.2f}x   (target >= 3x)")
    print(
        f"tbljax per core / Pillow loop: {tj / cores / pil:.2f}x; 1 thread / Pillow: {one / pil:.2f}x"
        "   (target >= 1.5x)"
    )
    rss1 = median(res[f"tbljax, {cores} threads"], "peak_rss_mib")
    rss4 = median(res[f"tbljax, {cores} threads, 4x N"], "peak_rss_mib")
    print(f"peak RSS at N={n1}: {rss1:.0f} MiB, at N={n4}: {rss4:.0f} MiB (flat: ratio {rss4 / rss1:.2f})")


if __name__ == "__main__":
    main()

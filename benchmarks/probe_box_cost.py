"""What a compact record's box costs, per box and per restart segment (issue 24's way 1): the
kodak photos converted at the ImageNet geometry (shorter side 256, q90 4:2:0, a restart marker
every 2 MCUs), one centred square box per record of side 16, 32, 64 and 128 px served by
`tbljax.kernels.serve_jpeg` on one thread to 16 px uint8 (CPU time per record, the minimum of
REPS passes, each side in its own process, rounds interleaved, medians), against the restart
segments each box's part reads. A least-squares line through (segments, µs) splits the cost
into a fixed part per box and a part per segment. For the random-resized-crop boxes of
bench_box_decode.py it also reports how much of what is read the box uses: the share of the
part's pixels inside the box, and of the segments read the share the box itself touches (the
others are read for the one-pixel margin fancy upsampling needs).

`--intervals 2 1` compares restart intervals instead: the same photos converted with a marker
every 2 MCUs (what tbljax writes) and every MCU, the RRC boxes served from each file in turn in
one process (so the machine's drift between processes cancels), per-round ratios.

    python benchmarks/probe_box_cost.py --rounds 3
    python benchmarks/probe_box_cost.py --rounds 15 --intervals 2 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402
from bench_box_decode import convert_compact, kodak_photos, rrc_boxes  # noqa: E402

REPS = 15
SIDES = (16, 32, 64, 128)
MCU, R = 16, 2  # 4:2:0 records: 16 x 16 px MCUs, a restart marker every 2 of them


def centred(hs: np.ndarray, ws: np.ndarray, side: int) -> list[tuple[int, int, int, int]]:
    return [(min(h // 2, h - side), min(w // 2, w - side), side, side) for h, w in zip(hs.tolist(), ws.tolist())]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def part_of(box, h: int, w: int, margin: int) -> tuple[int, int, int, int]:
    """MCU rows [r0, r1) and columns [c0, c1) of the part a box reads: its pixels plus `margin`
    (ffi/core/jpeg/decode_box.cpp, DecodeRestartPart: 1 px where the edge is inside the image), rounded
    out to MCU rows and to whole restart intervals of columns."""
    y0, x0, bh, bw = box
    per_row = ceil_div(w, MCU)
    top, bottom = max(0, y0 - margin), min(h, y0 + bh + margin)
    left, right = max(0, x0 - margin), min(w, x0 + bw + margin)
    c1 = min(per_row, ceil_div(ceil_div(right, MCU), R) * R)
    return top // MCU, ceil_div(bottom, MCU), left // MCU // R * R, c1


def segments_read(box, h: int, w: int, margin: int = 1) -> int:
    r0, r1, c0, c1 = part_of(box, h, w, margin)
    return (r1 - r0) * ceil_div(c1 - c0, R)


def worker(path: str, side: int) -> dict:
    import tbljax

    ds = tbljax.open(path)
    views, counts, offsets, sizes, hs, ws, _raw = ds.jpeg_records()
    src = tbljax.kernels.jpeg_source(list(views), list(counts), offsets, sizes, hs, ws)
    boxes = centred(hs, ws, side)
    out = np.empty((len(sizes), 16, 16, 3), np.uint8)
    idx = np.arange(len(sizes), dtype=np.int64)
    best = float("inf")
    for _ in range(REPS):
        t = time.process_time()
        tbljax.kernels.serve_jpeg(src, idx, out, crop=boxes)
        best = min(best, time.process_time() - t)
    return {"us_per_box": best / len(sizes) * 1e6}


def compare_intervals(files, intervals: list[int], rounds: int, out_size: int = 224) -> None:
    """RRC boxes from files written with each restart interval, alternating in this process."""
    import tbljax
    from tbljax._src.conversion import image_records

    written = image_records.COMPACT_RESTART_MCUS
    with tempfile.TemporaryDirectory() as d:
        srcs, sizes = {}, {}
        for r in intervals:
            image_records.COMPACT_RESTART_MCUS = r  # what convert writes for compact records
            try:
                path = str(Path(d) / f"r{r}.tbl")
                convert_compact(files, path)
            finally:
                image_records.COMPACT_RESTART_MCUS = written
            views, counts, offsets, nbytes, hs, ws, _raw = tbljax.open(path).jpeg_records()
            srcs[r] = tbljax.kernels.jpeg_source(list(views), list(counts), offsets, nbytes, hs, ws)
            sizes[r] = int(np.sum(nbytes))
        boxes = rrc_boxes(hs, ws)
        out = np.empty((len(boxes), out_size, out_size, 3), np.uint8)
        idx = np.arange(len(boxes), dtype=np.int64)
        us: dict[int, list[float]] = {r: [] for r in intervals}
        for _ in range(rounds):
            for r in intervals:
                best = float("inf")
                for _ in range(5):
                    t = time.process_time()
                    tbljax.kernels.serve_jpeg(srcs[r], idx, out, crop=boxes, threads=1)
                    best = min(best, time.process_time() - t)
                us[r].append(best / len(boxes) * 1e6)
    base = intervals[0]
    print(
        f"\nprobe_box_cost --intervals: {len(boxes)} kodak photos, shorter side 256, q90 4:2:0, "
        f"RRC to {out_size} px uint8, 1 thread, min of 5 passes, {rounds} alternating rounds\n"
        f"machine: {machine()}\n"
    )
    print(f"| restart every | JPEG bytes | CPU µs / box (median) | time ÷ every {base} (median of rounds) |")
    print("|---|---:|---:|---:|")
    for r in intervals:
        ratio = np.median([a / b for a, b in zip(us[r], us[base])])
        print(f"| {r} MCUs | {sizes[r]:,} ({sizes[r] / sizes[base]:.3f}×) | {np.median(us[r]):.1f} | {ratio:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=2, metavar=("PATH", "SIDE"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--intervals",
        type=int,
        nargs="+",
        metavar="MCUS",
        help="compare these restart intervals instead (the first is the baseline)",
    )
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], int(a.worker[1]))))
        return
    files = kodak_photos()
    if a.intervals:
        compare_intervals(files, a.intervals, a.rounds)
        return
    import tbljax

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "k256.tbl")
        convert_compact(files, path)
        hs, ws = tbljax.open(path).jpeg_records()[4:6]
        times: dict[int, list[float]] = {s: [] for s in SIDES}
        for r in range(a.rounds):
            for side in SIDES:
                env = dict(os.environ, TBLJAX_NUM_THREADS="1")
                p = subprocess.run(
                    [sys.executable, __file__, "--worker", path, str(side)],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                v = json.loads(p.stdout.strip().splitlines()[-1])["us_per_box"]
                times[side].append(v)
                print(f"  round {r + 1} side {side}: {v:.1f} us", file=sys.stderr)
    hw = list(zip(hs.tolist(), ws.tolist()))
    segs = {s: float(np.mean([segments_read(b, h, w) for b, (h, w) in zip(centred(hs, ws, s), hw)])) for s in SIDES}
    us = {s: float(np.median(v)) for s, v in times.items()}
    per_segment, per_box = np.polyfit([segs[s] for s in SIDES], [us[s] for s in SIDES], 1)
    print(
        f"\nprobe_box_cost: {len(hw)} kodak photos, shorter side 256, q90 4:2:0, restart every "
        f"{R} MCUs, 1 thread, min of {REPS} passes, median of {a.rounds} rounds\n"
        f"machine: {machine()}\n"
    )
    print("| centred box | segments read | CPU µs / box |")
    print("|---|---:|---:|")
    for s in SIDES:
        print(f"| {s} x {s} px | {segs[s]:.1f} | {us[s]:.1f} |")
    print(f"\nleast squares: {per_box:.1f} µs per box + {per_segment:.2f} µs per segment")
    rrc = rrc_boxes(hs, ws)
    read = sum(segments_read(b, h, w) for b, (h, w) in zip(rrc, hw))
    touched = sum(segments_read(b, h, w, margin=0) for b, (h, w) in zip(rrc, hw))
    box_px = part_px = 0
    for b, (h, w) in zip(rrc, hw):
        r0, r1, c0, c1 = part_of(b, h, w, 1)
        box_px += b[2] * b[3]
        part_px += (min(h, r1 * MCU) - r0 * MCU) * (min(w, c1 * MCU) - c0 * MCU)
    print(
        f"RRC boxes (bench_box_decode.py's): {read / len(rrc):.1f} segments read per box, "
        f"{touched / read:.3f} of them touched by the box itself; the box is {box_px / part_px:.3f} "
        f"of the part's pixels, so a box costs about {per_box:.0f} + {per_segment:.2f} x "
        f"{read / len(rrc):.0f} = {per_box + per_segment * read / len(rrc):.0f} µs"
    )


if __name__ == "__main__":
    main()

"""Cold epochs: one epoch of a RAW (or compact JPEG) file that is not in the page cache, served
with read-ahead off and on (`tbljax.loader(..., read_ahead=)`; on, the file fits in memory, so
the loader also asks for it whole in the background: engine/file_sweep.py), and on without that
sweep ("cold-on-nosweep": the per-step requests alone), beside the disk's own
random-read rate measured in the same run (16 threads of `pread` of the same record sizes in a
random order). The file is ../shared/data/kodak converted at 160 px (`--format compact`: JPEG
q90 4:2:0 records at that size, decoded in the serve pass; with `--raw-budget F` converted with
`raw_budget=F`, the records costliest to decode stored RAW), its records repeated to --gb
gigabytes. Before every cold configuration the file is dropped from the page cache (fsync,
then posix_fadvise(DONTNEED): no root needed) and `mincore` checks that it was; the warm
configurations read it all first. Each configuration runs in its own process; medians over
rounds, and the median of each round's cold ÷ warm (the rounds interleave the configurations).
"sys s" is the epoch's system CPU time (getrusage): the kernel's share of the work. uint8,
batch 256, the consumer touches one element per batch ("produce").

    python benchmarks/bench_cold.py [--gb 4] [--rounds 3] [--dir /tmp] [--format raw|compact]
                                    [--raw-budget F]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA, machine, median, rounds  # noqa: E402

B = 256
THREADS = 16  # pread threads for the disk's rate


def resident_fraction(path: str) -> float:
    """Share of the file's pages in the page cache (mincore over a mapping of the file)."""
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    view = np.frombuffer(m, np.uint8)  # only for the mapping's address; mapping touches nothing
    vec = np.zeros(-(-size // mmap.PAGESIZE), np.uint8)
    ok = libc.mincore(view.__array_interface__["data"][0], size, vec.ctypes.data) == 0
    del view
    m.close()
    return float(np.mean(vec & 1)) if ok else float("nan")


def drop(path: str) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # DONTNEED drops only clean pages
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_fraction(path)


def warm(path: str) -> float:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass
    return resident_fraction(path)


def disk_rate(path: str) -> dict:
    """Records per second read by THREADS threads of pread, in a random order (one epoch)."""
    import tbljax

    index = tbljax.open(path).index
    offsets, sizes = index["offset"].astype(np.int64), index["size"].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(index))
    fd = os.open(path, os.O_RDONLY)

    def read(chunk):
        buf = bytearray(int(sizes.max()))
        for i in chunk.tolist():
            os.preadv(fd, [memoryview(buf)[: sizes[i]]], int(offsets[i]))

    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as ex:
            list(ex.map(read, np.array_split(order, THREADS * 64)))
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    return {"img_s": len(order) / dt, "MB_s": float(sizes.sum()) / dt / 1e6}


def epoch(path: str, read_ahead: int, sweep: bool = True) -> dict:
    import tbljax

    if not sweep:  # the per-step requests alone: no source fits the sweep's budget
        from tbljax._src.engine import file_sweep

        file_sweep.memory_for_sweeps = lambda: 0
    ld = tbljax.loader(path, B, seed=0, num_epochs=1, dtype="uint8", read_ahead=read_ahead)
    n = 0
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for b in ld:
        np.asarray(b["image"]).reshape(-1)[0].item()
        n += B
    dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return {"img_s": n / dt, "sys_s": r1.ru_stime - r0.ru_stime}


def worker(kind: str, path: str) -> dict:
    state, _, what = kind.partition("-")
    resident = drop(path) if state == "cold" else warm(path)
    res = disk_rate(path) if what == "disk" else epoch(path, 0 if what == "off" else 2, sweep=what != "on-nosweep")
    res["resident_before"] = resident
    return res


def make_file(dst: Path, gb: float, size: int, fmt: str = "raw", raw_budget: float | None = None) -> int:
    """kodak converted once at `size` (RAW, or compact JPEG q90, perhaps with a raw budget), its
    records repeated to about `gb` GB."""
    import tbljax
    from tbljax._src.file.format import Writer

    base = dst.with_suffix(".base.tbl")
    compact = dict(format="jpeg", quality=90, raw_budget=raw_budget) if fmt == "compact" else {}
    tbljax.convert(SHARED_DATA / "kodak" / "images", base, image_size=size, progress=False, **compact)
    ds = tbljax.open(base)
    if fmt == "compact":
        views, _, offsets, sizes, heights, widths, stored_raw = ds.jpeg_records()
        payloads = [bytes(views[0][o : o + n]) for o, n in zip(offsets.tolist(), sizes.tolist())]
        records = int(gb * 1e9 // np.mean([len(p) for p in payloads]))
    else:
        src = ds.view()
        records = int(gb * 1e9 // src[0].nbytes)
    with Writer(dst, records) as w:
        for i in range(records):
            k = i % len(ds)
            if fmt == "compact" and stored_raw[k]:
                w.add_raw(np.frombuffer(payloads[k], np.uint8).reshape(int(heights[k]), int(widths[k]), 3))
            elif fmt == "compact":
                w.add_encoded(payloads[k], "JPEG", int(widths[k]), int(heights[k]))
            else:
                w.add_raw(src[k])
        w.set_metadata(labels=np.arange(records) % 24, recipe=ds.recipe)
    del ds
    os.remove(base)
    return records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "PATH"))
    ap.add_argument("--gb", type=float, default=4.0, help="file size in GB (default 4)")
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the file (default: the temp dir)")
    ap.add_argument("--format", choices=("raw", "compact"), default="raw")
    ap.add_argument(
        "--raw-budget", type=float, default=None, metavar="F", help="with --format compact: convert with raw_budget=F"
    )
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(*a.worker)))
        return
    if not (SHARED_DATA / "kodak").is_dir():
        sys.exit(f"needs {SHARED_DATA / 'kodak'} (real photos beside the repo)")
    kinds = ["cold-disk", "cold-off", "cold-on-nosweep", "cold-on", "warm-off", "warm-on"]
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        path = Path(d) / "cold.tbl"
        records = make_file(path, a.gb, a.size, a.format, a.raw_budget)
        gb = path.stat().st_size / 1e9
        res = rounds(Path(__file__), {k: [k, str(path)] for k in kinds}, a.rounds)
    budget = f" raw_budget {a.raw_budget:g}" if a.raw_budget is not None else ""
    print(
        f"\nbench_cold: kodak -> {a.size} px {a.format}{budget}, {records} records ({gb:.2f} GB), uint8, "
        f"batch {B}, "
        f"one epoch per configuration, median of {a.rounds} rounds\nmachine: {machine()}\n"
    )
    print("| configuration | img/s | MB/s | sys s | resident before |")
    print("|---|---:|---:|---:|---:|")
    rec_mb = gb * 1e3 / records
    for k in kinds:
        ips = median(res[k], "img_s")
        sys_s = f"{median(res[k], 'sys_s'):.2f}" if "sys_s" in res[k][0] else ""
        print(f"| {k} | {ips:.0f} | {ips * rec_mb:.0f} | {sys_s} | {median(res[k], 'resident_before'):.0%} |")
    disk = median(res["cold-disk"], "img_s")
    for label, k in (("off", "cold-off"), ("on, per-step requests alone", "cold-on-nosweep"), ("on", "cold-on")):
        print(
            f"cold epoch / disk random-read rate, read-ahead {label}: "
            f"{median(res[k], 'img_s') / disk:.2f}" + (" (target >= 0.9)" if a.format == "raw" else "")
        )
    for label, k in (("off", "cold-off"), ("on, per-step requests alone", "cold-on-nosweep"), ("on", "cold-on")):
        warm_k = "warm-off" if k == "cold-off" else "warm-on"
        paired = [c["img_s"] / w["img_s"] for c, w in zip(res[k], res[warm_k])]
        print(
            f"cold epoch / warm epoch, read-ahead {label}: "
            f"{median(res[k], 'img_s') / median(res[warm_k], 'img_s'):.2f} of the medians, "
            f"{np.median(paired):.2f} paired by round"
            + (" (about 1: limited by decode, not by the disk)" if a.format == "compact" else "")
        )
    per_round = [on["img_s"] / off["img_s"] for on, off in zip(res["warm-on"], res["warm-off"])]
    print(f"warm epoch, read-ahead on / off: {np.median(per_round):.2f} (median of per-round ratios)")


if __name__ == "__main__":
    main()

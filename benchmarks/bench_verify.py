"""What `verify_records=True` costs: the loader with and without each served record's CRC-16
checked, on RAW and compact records at ImageNet training geometry.

Data: the 312 ImageNet-sized kodak photos converted with `tbljax.convert(..., image_size=256,
resize="shorter_side", format="jpeg", quality=90)` (compact records, ~256x384), and the RAW
file decoded from it (`format="raw"`: the same records as pixels, ~295 KB each).

Configurations: {raw, compact} x {off, on}; `HostLoader`, batch 256, random-resized-crop +
flip to 224 px, float32 (ImageNet normalize), TBLJAX_NUM_THREADS=2, prefetch 1. Each runs in
its own process, rounds interleaved, WARMUP batches before the timed ones; medians of the
rounds are printed, and the cost of the option per configuration (1 - on / off, from the
medians, and the median of the rounds' own ratios). On a shared machine those rates move by
tens of percent from round to round, so the check alone is timed too (`check_worker`: the
CRC-16s of 256 records, the work the option adds to each batch, serial with the kernel).

    PYTHONPATH=src python benchmarks/bench_verify.py --rounds 5 --batches 12
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import kodak_photos, machine, median, rounds  # noqa: E402

B, OUT, SIDE, WARMUP = 256, 224, 256, 6


def touch(a) -> float:
    """One element of every 4 KiB of a batch (as bench_compact): the batch is there."""
    flat = np.asarray(a).reshape(-1)
    return float(flat[:: max(1, 4096 // flat.itemsize)].sum())


def check_worker(spec: dict) -> dict:
    """The check alone, as `fill` makes it: 256 random records' CRC-16s, min of 10 batches
    (the shared machine's noise moves the loaders' rates by tens of percent between rounds;
    this is the work the option adds to each batch, on the producer thread, GIL held)."""
    import tbljax
    from tbljax._src.engine.record_source import RecordSource

    src = RecordSource(tbljax.open(spec["data"]), 0, verify_records=True)
    rng, best = np.random.default_rng(0), float("inf")
    for _ in range(10):
        idx = rng.integers(0, src.n, B)
        t0 = time.perf_counter()
        src._check_records(idx)
        best = min(best, time.perf_counter() - t0)
    return {"check_ms": 1e3 * best}


def worker(spec: dict) -> dict:
    import tbljax

    if spec.get("check"):
        return check_worker(spec)

    opts = tbljax.LoaderOptions(
        batch_size=B, seed=0, augment=tbljax.Augment(size=(OUT, OUT)), prefetch=1, verify_records=spec["verify"]
    )
    it = iter(tbljax.HostLoader(tbljax.open(spec["data"]), opts))
    for _ in range(WARMUP):
        touch(next(it).image)
    t0 = time.perf_counter()
    for _ in range(spec["batches"]):
        touch(next(it).image)
    return {"img_s": spec["batches"] * B / (time.perf_counter() - t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", metavar="SPEC", help="(internal) run one worker, spec as JSON")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--data", help="folder for the two files (default: a temporary one)")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(json.loads(a.worker))))
        return
    import tbljax

    tmp = Path(a.data or tempfile.mkdtemp(prefix="bench_verify_"))
    compact, raw = tmp / "compact.tbl", tmp / "raw.tbl"
    if not compact.exists():
        tbljax.convert(
            kodak_photos(), compact, image_size=SIDE, resize="shorter_side", format="jpeg", quality=90, progress=False
        )
    if not raw.exists():
        tbljax.convert(compact, raw, format="raw", progress=False)
    print(f"# {machine()}", flush=True)
    for p in (compact, raw):
        ds = tbljax.open(p)
        print(
            f"# {p.name}: {len(ds)} records, {ds.record_format}, "
            f"{int(ds.index['size'].sum()) / len(ds) / 1e3:.0f} KB a record",
            flush=True,
        )
    configs = {
        f"{kind}-{'on' if v else 'off'}": [json.dumps({"data": str(path), "verify": v, "batches": a.batches})]
        for kind, path in (("raw", raw), ("compact", compact))
        for v in (False, True)
    }
    configs.update(
        {
            f"{kind}-check": [json.dumps({"data": str(path), "check": True})]
            for kind, path in (("raw", raw), ("compact", compact))
        }
    )
    res = rounds(Path(__file__), configs, a.rounds, env={k: {"TBLJAX_NUM_THREADS": "2"} for k in configs})
    print(
        f"\nbatch {B}, RRC + flip to {OUT} px, float32, 2 threads; {a.rounds} rounds x "
        f"{a.batches} batches after {WARMUP} warm-up; img/s, median of rounds"
    )
    for kind in ("raw", "compact"):
        off, on = median(res[f"{kind}-off"], "img_s"), median(res[f"{kind}-on"], "img_s")
        paired = [b["img_s"] / a_["img_s"] for a_, b in zip(res[f"{kind}-off"], res[f"{kind}-on"])]
        print(
            f"{kind:8s} off {off:8.0f}  on {on:8.0f}  cost {100 * (1 - on / off):5.1f}% "
            f"(per round: {', '.join(f'{100 * (1 - r):.1f}%' for r in paired)}; "
            f"median {100 * (1 - statistics.median(paired)):.1f}%)"
        )
        check = median(res[f"{kind}-check"], "check_ms")
        print(
            f"{'':8s} the check alone: {check:.1f} ms a batch of {B} records, "
            f"{100 * check / (1e3 * B / off):.0f}% of a batch's time without it"
        )


if __name__ == "__main__":
    main()

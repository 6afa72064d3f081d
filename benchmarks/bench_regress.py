"""Two builds side by side on the figures a decoder change must not move: RAW and compact
serving, and conversion. Each `--trees` entry is a checkout with its native modules built in place
(`scripts/dev-build.sh`); its workers run with PYTHONPATH=<tree>/src, each configuration in its
own process, the trees interleaved round by round, which of the two runs first alternating (use an
even --rounds); medians over rounds.

- serve: ../shared/data/kodak converted RAW at shorter side 256, aspect kept (~256×341);
  `HostLoader`, batch 256, RRC to 224 px + flip, float32 (ImageNet normalize) and uint8,
  TBLJAX_NUM_THREADS=2, prefetch 1; 8 batches of warm-up (past the ring's first touch), then
  --batches timed, one element of each batch's image read (the kernel has written it; a read
  of every page, as bench_compact.py's `touch` does, would add the same cost to both trees).
- serve compact: the same, from the photos converted compact (JPEG q90 4:2:0, restart markers:
  each crop box decoded from its restart segments), float32.
- convert: `tbljax.convert` of the 312 kodak photos at shorter side 256, RAW and compact (JPEG
  q90 4:2:0), 2 threads, to a fresh file; img/s of the whole call.

    python benchmarks/bench_regress.py --trees /path/to/old-checkout . [--rounds 6] [--batches 60]
        [--simd scalar|avx2|avx512] [--jobs "serve float32" "serve compact float32" ...]

--simd runs every worker with TBLJAX_SIMD set (both trees on the same target); --jobs runs only
the configurations named (the first column of the table).
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
from _common import kodak_photos, machine, median, run_worker  # noqa: E402

B, WARMUP, SIDE = 256, 8, 256


def serve_worker(spec: dict) -> dict:
    import tbljax

    opts = tbljax.LoaderOptions(
        batch_size=B, seed=0, augment=tbljax.Augment(size=(224, 224)), dtype=spec["dtype"], prefetch=1
    )
    it = iter(tbljax.HostLoader(tbljax.open(spec["data"]), opts))
    for _ in range(WARMUP):
        np.asarray(next(it).image).reshape(-1)[0].item()
    t = time.perf_counter()
    for _ in range(spec["batches"]):
        np.asarray(next(it).image).reshape(-1)[0].item()
    return {"img_s": spec["batches"] * B / (time.perf_counter() - t), "tbljax": tbljax.__file__}


def convert_worker(spec: dict) -> dict:
    import tbljax

    files = kodak_photos()
    kw = dict(format="jpeg", quality=90, chroma="420") if spec["format"] == "compact" else {}
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        tbljax.convert(files, Path(d) / "out.tbl", image_size=SIDE, resize="shorter_side", progress=False, **kw)
        return {"img_s": len(files) / (time.perf_counter() - t), "tbljax": tbljax.__file__}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=1, metavar="SPEC")
    ap.add_argument("--trees", nargs=2, required=False, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--simd", default=None, help="TBLJAX_SIMD for every worker (default: unset)")
    ap.add_argument("--jobs", nargs="+", default=None, metavar="NAME")
    a = ap.parse_args()
    if a.worker:
        spec = json.loads(a.worker[0])
        print(json.dumps(serve_worker(spec) if spec["job"] == "serve" else convert_worker(spec)))
        return
    if not a.trees:
        ap.error("--trees BEFORE AFTER is required")
    files = kodak_photos()  # exits with the reason where they are absent
    trees = [Path(t).resolve() for t in a.trees]
    with tempfile.TemporaryDirectory() as d:
        data = str(Path(d) / "raw256.tbl")
        compact = str(Path(d) / "compact256.tbl")
        sys.path.insert(0, str(trees[-1] / "src"))
        import tbljax

        tbljax.convert(files, data, image_size=SIDE, resize="shorter_side", progress=False)
        jobs = [
            ("serve float32", dict(job="serve", dtype="float32", data=data)),
            ("serve uint8", dict(job="serve", dtype="uint8", data=data)),
            ("serve compact float32", dict(job="serve", dtype="float32", data=compact)),
            ("convert raw", dict(job="convert", format="raw")),
            ("convert compact", dict(job="convert", format="compact")),
        ]
        if a.jobs:
            unknown = set(a.jobs) - {name for name, _ in jobs}
            if unknown:
                ap.error(f"--jobs: unknown {sorted(unknown)}")
            jobs = [(name, spec) for name, spec in jobs if name in a.jobs]
        if any(spec.get("data") == compact for _, spec in jobs):
            tbljax.convert(
                files,
                compact,
                image_size=SIDE,
                resize="shorter_side",
                progress=False,
                format="jpeg",
                quality=90,
                chroma="420",
            )
        configs, env = {}, {}
        for name, spec in jobs:
            for k, tree in enumerate(trees):
                key = f"{name} | {'before' if k == 0 else 'after'}"
                configs[key] = [json.dumps(dict(spec, batches=a.batches))]
                env[key] = {"PYTHONPATH": str(tree / "src"), "TBLJAX_NUM_THREADS": "2"}
                if a.simd:
                    env[key]["TBLJAX_SIMD"] = a.simd
        res = {key: [] for key in configs}
        for r in range(a.rounds):
            for name, _ in jobs:
                # A configuration's two trees run back to back, and which runs first alternates
                # round by round, so running second cannot favour one tree: over an even number
                # of rounds each runs first as often.
                pair = [f"{name} | before", f"{name} | after"]
                for key in pair if r % 2 == 0 else pair[::-1]:
                    res[key].append(run_worker(Path(__file__), configs[key], env[key]))
                    print(f"  round {r + 1}/{a.rounds} {key}: {json.dumps(res[key][-1])}", file=sys.stderr, flush=True)
    for key, runs in res.items():  # each worker imported its own tree's tbljax
        tree = trees[0] if key.endswith("before") else trees[1]
        assert all(Path(r["tbljax"]).is_relative_to(tree) for r in runs), (key, runs[0]["tbljax"])
    print(
        f"\nbench_regress: kodak at shorter side {SIDE}, {a.rounds} interleaved rounds (first tree alternating), "
        f"medians; TBLJAX_SIMD={a.simd or '(unset)'}\nbefore: {trees[0]}\nafter:  {trees[1]}\n"
        f"machine: {machine()}\n"
    )
    print("| configuration | before img/s | after img/s | after ÷ before | after ÷ before, median of the rounds |")
    print("|---|---:|---:|---:|---:|")
    for name, _ in jobs:
        before, after = res[f"{name} | before"], res[f"{name} | after"]
        paired = np.median([x["img_s"] / y["img_s"] for x, y in zip(after, before)])
        mb, ma = median(before, "img_s"), median(after, "img_s")
        print(f"| {name} | {mb:.0f} | {ma:.0f} | {ma / mb:.3f} | {paired:.3f} |")


if __name__ == "__main__":
    main()

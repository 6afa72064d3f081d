"""The compact-record decode alone, per core: `tbljax.kernels.serve_jpeg` on one thread over the
kodak photos converted at the ImageNet geometry (shorter side 256, q90 4:2:0, restart markers),
one random-resized-crop box per record (scale 0.08-1, ratio 3/4-4/3, fixed seed) resized to
OUT px uint8 (--dtype float32: normalized with the ImageNet mean and std, as the loader's
default float32 batch is) -- no loader, no page faults, no Python per image. CPU time per image, the minimum
of REPS passes in a process, median over the rounds. With --trees, each tree's `src` (a
checkout with its extension built by scripts/dev-build.sh) runs in its own process, rounds
interleaved: the A/B of a decoder change.

Each round runs every (tree, size) in LAYOUTS memory layouts: the worker's environment padded
with 0, 1000, 2000, ... bytes, which moves where the process's stack and heap buffers fall.
On the AMD Zen 4 host one layout in three ran 10-12% slower (libjpeg-turbo's AVX2 fancy
upsampler stalling on its own buffers, or the zero-fill of the part's pixels: benchmarks/
README.md, "Per-record costs"), so one layout per tree (and trees' paths of different lengths
are different layouts) could decide an A/B by itself. The median is over rounds x layouts.

With --raw-budget F, each tree also serves a second file converted with `raw_budget=F` (the
records costliest to decode stored RAW), in the same rounds: the A/B of the two files.

    python benchmarks/bench_box_decode.py --rounds 5
    python benchmarks/bench_box_decode.py --rounds 5 --trees /path/to/old-checkout .
    python benchmarks/bench_box_decode.py --rounds 8 --layouts 1 --raw-budget 0.2
    python benchmarks/bench_box_decode.py --rounds 8 --layouts 1 --versus-ceiling --trees A B
    python benchmarks/bench_box_decode.py --rounds 6 --dtype float32 --versus-ceiling --trees A B

--versus-ceiling: where the host's speed drifts (on the shared Zen 4 host, the same pass took
178-260 us per image within one process), times from different processes cannot be compared
closely; each worker then also decodes every record whole after each pass and reports the
median of (whole decode time / box decode time) over its passes: the speed cancels out.
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
from _common import REPO, SHARED_DATA, machine  # noqa: E402

REPS = 7
REPS_VERSUS = 12  # --versus-ceiling: pairs of passes (box decodes, whole decodes)
LAYOUTS = 4  # environment paddings per round (see above)


def rrc_boxes(hs: np.ndarray, ws: np.ndarray, seed: int = 0) -> list[tuple[int, int, int, int]]:
    """torchvision's RandomResizedCrop draw (10 tries, then the whole image), one per record."""
    rng = np.random.default_rng(seed)
    boxes = []
    for h, w in zip(hs.tolist(), ws.tolist()):
        for _ in range(10):
            area = rng.uniform(0.08, 1.0) * h * w
            ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
            bw, bh = int(round(np.sqrt(area * ratio))), int(round(np.sqrt(area / ratio)))
            if 0 < bw <= w and 0 < bh <= h:
                break
        else:
            bh, bw = h, w
        boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
    return boxes


def kodak_photos() -> list[Path]:
    files = sorted((SHARED_DATA / "kodak").rglob("*.jpg"))
    if not files:
        sys.exit(f"needs the kodak photos in {SHARED_DATA}/kodak")
    return files


def convert_compact(files: list[Path], path: str, raw_budget: float | None = None) -> None:
    """The photos as compact records at the ImageNet geometry (shorter side 256, q90 4:2:0)."""
    import tbljax

    tbljax.convert(
        files,
        path,
        image_size=256,
        resize="shorter_side",
        format="jpeg",
        quality=90,
        chroma="420",
        raw_budget=raw_budget,
        progress=False,
    )


def worker(path: str, out_size: int, versus_ceiling: bool = False, dtype: str = "uint8") -> dict:
    import tbljax

    ds = tbljax.open(path)
    views, counts, offsets, sizes, hs, ws, stored_raw = ds.jpeg_records()
    src = tbljax.kernels.jpeg_source(list(views), list(counts), offsets, sizes, hs, ws, stored_raw)
    n = len(sizes)
    boxes = rrc_boxes(hs, ws)
    # In the loader's kind of memory (its ring's 4 KiB-aligned buffers): a plain np.empty of this
    # size starts 16 bytes past a page, where the float32 rows cannot take non-temporal stores.
    from tbljax._src.engine.ring import aligned_empty

    shape = (n, out_size, out_size, 3)
    out = aligned_empty(int(np.prod(shape)) * np.dtype(dtype).itemsize).view(dtype).reshape(shape)
    norm = {} if dtype == "uint8" else {"mean": tbljax.IMAGENET_MEAN, "std": tbljax.IMAGENET_STD}
    idx = np.arange(n, dtype=np.int64)
    best, ratios = float("inf"), []
    blobs = [bytes(views[0][o : o + s]) for o, s in zip(offsets.tolist(), sizes.tolist())] if versus_ceiling else []
    for _ in range(REPS_VERSUS if versus_ceiling else REPS):
        t = time.process_time()
        tbljax.kernels.serve_jpeg(src, idx, out, crop=boxes, **norm)
        box = time.process_time() - t
        best = min(best, box)
        if versus_ceiling:  # the whole decode of every record, right after: the same host speed
            t = time.process_time()
            for b in blobs:
                tbljax._core.decode_jpeg(b)
            ratios.append((time.process_time() - t) / box)
    res = {"us_per_img": best / n * 1e6}
    if versus_ceiling:
        res["versus_ceiling"] = float(np.median(ratios))
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=2, metavar=("PATH", "OUT"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=int, nargs="+", default=[160, 224])
    ap.add_argument("--trees", nargs="+", default=[str(REPO)], help="checkouts whose src/ to time (default: this one)")
    ap.add_argument(
        "--layouts", type=int, default=LAYOUTS, help="memory layouts (environment paddings) per round and tree"
    )
    ap.add_argument(
        "--raw-budget", type=float, default=None, metavar="F", help="also time a file converted with raw_budget=F"
    )
    ap.add_argument(
        "--dtype",
        choices=["uint8", "float32"],
        default="uint8",
        help="the output: uint8 pixels, or float32 normalized with the ImageNet mean and std",
    )
    ap.add_argument(
        "--versus-ceiling",
        action="store_true",
        help="also the whole-image decode of every record (_core.decode_jpeg) after "
        "each pass, in the same process: box decodes per whole decode, a ratio "
        "that a host's drifting speed moves far less than either time",
    )
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], int(a.worker[1]), a.versus_ceiling, a.dtype)))
        return
    files = kodak_photos()
    with tempfile.TemporaryDirectory() as d:
        paths = {"compact": str(Path(d) / "k256.tbl")}
        convert_compact(files, paths["compact"])
        if a.raw_budget is not None:
            paths[f"raw_budget {a.raw_budget:g}"] = str(Path(d) / "k256-rb.tbl")
            convert_compact(files, paths[f"raw_budget {a.raw_budget:g}"], a.raw_budget)
        res: dict[tuple[str, str, int], list[float]] = {}
        versus: dict[tuple[str, str, int], list[float]] = {}
        flag = (["--versus-ceiling"] if a.versus_ceiling else []) + ["--dtype", a.dtype]
        for r in range(a.rounds):
            for out in a.out:
                for layout in range(a.layouts):
                    for tree in a.trees:
                        for name, path in paths.items():
                            env = dict(
                                os.environ,
                                TBLJAX_NUM_THREADS="1",
                                PYTHONPATH=str(Path(tree).resolve() / "src"),
                                TBLJAX_BENCH_LAYOUT="x" * (1000 * layout),
                            )
                            p = subprocess.run(
                                [sys.executable, __file__, "--worker", path, str(out), *flag],
                                capture_output=True,
                                text=True,
                                env=env,
                                check=True,
                            )
                            got = json.loads(p.stdout.strip().splitlines()[-1])
                            v = got["us_per_img"]
                            res.setdefault((tree, name, out), []).append(v)
                            if a.versus_ceiling:
                                versus.setdefault((tree, name, out), []).append(got["versus_ceiling"])
                            print(
                                f"  round {r + 1} layout {layout} {tree} {name} {out}px: {v:.1f} us"
                                + (f", {got['versus_ceiling']:.3f}x the whole decode" if a.versus_ceiling else ""),
                                file=sys.stderr,
                            )
    print(
        f"\nbench_box_decode: {len(files)} kodak photos, shorter side 256, q90 4:2:0, one RRC "
        f"box each, {a.dtype}, 1 thread, min of {REPS} passes, median of {a.rounds} rounds x "
        f"{a.layouts} memory layouts\n"
        f"machine: {machine()}\n"
    )
    print("| tree | file | out px | CPU us/img | img per CPU-second |")
    print("|---|---|---:|---:|---:|")
    for (tree, name, out), v in res.items():
        m = float(np.median(v))
        print(f"| {tree} | {name} | {out} | {m:.1f} | {1e6 / m:,.0f} |")
    for (tree, name, out), v in versus.items():
        print(
            f"{tree} {name} {out}px: box decodes per whole decode of the records "
            f"(_core.decode_jpeg), median of the runs' medians: {np.median(v):.3f} "
            f"({' '.join(f'{x:.2f}' for x in v)})"
        )
    for (tree, name, out), v in res.items():
        if name != "compact":  # paired with the plain file's run just before it
            base = res[tree, "compact", out]
            ratios = [x / y for x, y in zip(v, base)]
            print(
                f"{tree} {out}px: {name} / compact, CPU time, paired runs: median "
                f"{np.median(ratios):.3f} ({' '.join(f'{x:.2f}' for x in ratios)})"
            )


if __name__ == "__main__":
    main()

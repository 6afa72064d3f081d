"""The ViT/DeiT recipe's per-image ops in the fused pass (issue 47): the host loader over the
kodak photos at full aspect, shorter side 256, RAW and compact (JPEG q90) records, 2 threads,
output 224 float32: RRC + flip vs RRC + flip + RandAugment ``rand-m9-mstd0.5-inc1`` + random
erasing 0.25 (the issue asks for at most 1.5x the time); and the same two inside `jax.jit`
(`ResidentDataset.batch` of the RAW records, drawn in the graph, run by the CPU FFI handler on
the core's default thread pool). Each configuration in its own process, warm-up batches first
(the jit compile among them), medians over interleaved rounds; wall clock and the worker
process's CPU time (all threads; on a shared host the steadier of the two). The peers on the
same pixels: bench_vit_peers.py.

    python benchmarks/bench_ops_recipe.py [--rounds 3] [--batches 12] [--batch-size 64]
        [--builds BEFORE_SRC,AFTER_SRC]

``--builds``: the host-loader rows once per build (each a ``src`` folder with its built
``_core``, put first on the workers' PYTHONPATH), interleaved in every round, and the ratio per
round as well as of the medians: before/after of a change on a host whose speed drifts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import kodak_photos, machine, median, rounds  # noqa: E402

WARMUP = 6  # past the ring slots' first writes and the first epoch (see bench_vit_peers.py)


def worker(path: str, recipe: bool, batches: int, batch_size: int, jit: bool = False) -> dict:
    import numpy as np

    import tbljax

    extra = {}
    if recipe:
        extra = dict(ops=[tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1")], erasing=tbljax.RandomErasing(p=0.25))
    aug = tbljax.Augment(size=(224, 224), **extra)
    if jit:
        return _jit_worker(path, aug, batches, batch_size)
    opts = tbljax.LoaderOptions(batch_size=batch_size, seed=0, threads=2, dtype="float32", augment=aug)
    it = iter(tbljax.HostLoader(tbljax.open(path), opts))
    for _ in range(WARMUP):
        np.asarray(next(it).image).sum()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it).image[0, 0, 0, 0].item()
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    return {
        "images_per_s": batches * batch_size / dt,
        "ms_per_batch": 1e3 * dt / batches,
        "cpu_ms_per_batch": 1e3 * cpu / batches,  # all threads: what a shared host moves least
    }


def _jit_worker(path: str, aug, batches: int, batch_size: int) -> dict:
    """`ResidentDataset.batch` in a jitted step: the steps after the warm-up ones, each waited for."""
    import jax

    import tbljax

    ds = tbljax.ResidentDataset(path)
    step = jax.jit(lambda d, s: d.batch(s, batch_size=batch_size, seed=0, augment=aug, dtype="float32")["image"])
    spe = ds.steps_per_epoch(batch_size)
    for s in range(WARMUP):
        step(ds, s % spe).block_until_ready()
    t, c = time.perf_counter(), time.process_time()
    for s in range(WARMUP, WARMUP + batches):
        step(ds, s).block_until_ready()
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    return {
        "images_per_s": batches * batch_size / dt,
        "ms_per_batch": 1e3 * dt / batches,
        "cpu_ms_per_batch": 1e3 * cpu / batches,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--builds", default="", help="comma-separated src folders to compare (host loader only)")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.worker:
        path, recipe, jit = a.rest[0], a.rest[1] == "1", a.rest[2:] == ["jit"]
        print(json.dumps(worker(path, recipe, a.batches, a.batch_size, jit)))
        return
    import tbljax

    with tempfile.TemporaryDirectory() as d:
        files = {"raw": Path(d) / "raw.tbl", "compact": Path(d) / "compact.tbl"}
        photos = kodak_photos()
        tbljax.convert(photos, files["raw"], image_size=256, resize="shorter_side", progress=False)
        tbljax.convert(
            photos, files["compact"], image_size=256, resize="shorter_side", format="jpeg", quality=90, progress=False
        )
        common = ["--batches", str(a.batches), "--batch-size", str(a.batch_size)]
        if a.builds:
            return _compare_builds(a, files, common)
        configs = {
            f"{kind} {what}": [*common, str(files[kind]), flag]
            for kind in files
            for what, flag in (("rrc+flip", "0"), ("+randaug+erasing", "1"))
        }
        for what, flag in (("rrc+flip", "0"), ("+randaug+erasing", "1")):
            configs[f"jit {what}"] = [*common, str(files["raw"]), flag, "jit"]
        res = rounds(Path(__file__), configs, a.rounds)
    print(f"# {machine()}; tbljax kernel target {tbljax.kernels.kernel_target()}")
    print(f"# batch {a.batch_size}, {a.batches} timed batches after {WARMUP} warm-up, median of {a.rounds} rounds")
    for kind in ("raw", "compact", "jit"):
        for key, what in (("ms_per_batch", "wall"), ("cpu_ms_per_batch", "CPU ")):
            plain = median(res[f"{kind} rrc+flip"], key)
            ops = median(res[f"{kind} +randaug+erasing"], key)
            print(
                f"{kind:8s} {what} rrc+flip {plain:8.1f} ms/batch  +randaug+erasing {ops:8.1f} ms/batch"
                f"  ratio {ops / plain:.2f}x"
            )


def _compare_builds(a, files, common) -> None:
    """The host-loader rows of each build in `a.builds`, interleaved round by round."""
    builds = [str(Path(b).resolve()) for b in a.builds.split(",")]
    configs, env = {}, {}
    for i, src in enumerate(builds):
        for kind in files:
            for what, flag in (("rrc+flip", "0"), ("+randaug+erasing", "1")):
                name = f"build{i} {kind} {what}"
                configs[name] = [*common, str(files[kind]), flag]
                env[name] = {"PYTHONPATH": src}
    res = rounds(Path(__file__), configs, a.rounds, env=env)
    print(f"# {machine()}; builds: " + ", ".join(f"build{i} = {b}" for i, b in enumerate(builds)))
    print(f"# batch {a.batch_size}, {a.batches} timed batches after {WARMUP} warm-up, {a.rounds} rounds; CPU ms/batch")
    for i in range(len(builds)):
        for kind in files:
            plain = [r["cpu_ms_per_batch"] for r in res[f"build{i} {kind} rrc+flip"]]
            ops = [r["cpu_ms_per_batch"] for r in res[f"build{i} {kind} +randaug+erasing"]]
            per_round = sorted(o / p for o, p in zip(ops, plain))
            p_ms, o_ms = statistics.median(plain), statistics.median(ops)
            print(
                f"build{i} {kind:8s} rrc+flip {p_ms:7.1f}  +randaug+erasing {o_ms:7.1f}  ratio {o_ms / p_ms:.2f}x;"
                " per round " + " ".join(f"{r:.2f}" for r in per_round)
            )


if __name__ == "__main__":
    main()

"""`ResidentDataset.batch` inside a jitted step on CPU devices, with glibc's default malloc and
with the three settings the reference recommends there (`MALLOC_MMAP_THRESHOLD_`,
`MALLOC_TRIM_THRESHOLD_`, `MALLOC_ARENA_MAX`): XLA's CPU runtime mallocs each step's output and
temporaries, and glibc maps every large block afresh, so the batch is page-faulted each step.
The kodak photos at full aspect, shorter side 256 (RAW), RRC + flip to 224 float32, the batch
summed in the step (as a training step consumes it); each configuration in its own process,
warm-up steps first (the compile among them), medians over interleaved rounds.

    python benchmarks/bench_resident_cpu.py [--rounds 3] [--steps 20] [--batch-sizes 64 256]
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

WARMUP = 6
KEEP_BUFFERS = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_ARENA_MAX": "1",
}


def worker(path: str, batch_size: int, steps: int) -> dict:
    import jax

    import tbljax

    ds = tbljax.ResidentDataset(path)
    aug = tbljax.Augment(size=(224, 224))
    step = jax.jit(lambda d, s: d.batch(s, batch_size=batch_size, seed=0, augment=aug, dtype="float32")["image"].sum())
    for s in range(WARMUP):
        step(ds, s).block_until_ready()
    times = []
    for s in range(WARMUP, WARMUP + steps):
        t = time.perf_counter()
        step(ds, s).block_until_ready()
        times.append(time.perf_counter() - t)
    return {"ms_per_step": 1e3 * statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.rest[0], int(a.rest[1]), a.steps)))
        return
    import tbljax

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "raw.tbl"
        tbljax.convert(kodak_photos(), path, image_size=256, resize="shorter_side", progress=False)
        configs, env = {}, {}
        for b in a.batch_sizes:
            for how in ("default", "keep buffers"):
                name = f"batch {b}, {how}"
                configs[name] = ["--steps", str(a.steps), str(path), str(b)]
                env[name] = KEEP_BUFFERS if how == "keep buffers" else {}
        res = rounds(Path(__file__), configs, a.rounds, env=env)
    print(f"# {machine()}; {a.steps} timed steps after {WARMUP} warm-up, median of {a.rounds} rounds")
    for b in a.batch_sizes:
        plain = median(res[f"batch {b}, default"], "ms_per_step")
        kept = median(res[f"batch {b}, keep buffers"], "ms_per_step")
        print(
            f"batch {b:4d}: default malloc {plain:7.1f} ms/step, keep buffers {kept:7.1f} ms/step, {plain / kept:.2f}x"
        )


if __name__ == "__main__":
    main()

"""End to end: a small CNN training step in JAX fed by `tbljax.loader` against the same step on
one resident batch (the floor). Each configuration in its own process; medians over rounds.
Target: the loader adds <= 10% to the step.

    python benchmarks/bench_e2e.py [--rounds 3] [--steps 30] [--batch 64] [--size 160]
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
from _common import SHARED_DATA, machine, median, rounds  # noqa: E402


def make_file(dst: Path, size: int, records: int) -> None:
    """kodak at `size` px when present, else synthetic noise images (same bytes per record)."""
    import tbljax
    from tbljax._src.file.format import Writer

    if (SHARED_DATA / "kodak").is_dir():
        base = dst.with_suffix(".base.tbl")
        tbljax.convert(SHARED_DATA / "kodak" / "images", base, image_size=size, progress=False)
        src = tbljax.open(base).view()
    else:
        src = np.random.default_rng(0).integers(0, 256, (64, size, size, 3), dtype=np.uint8)
    with Writer(dst, records) as w:
        for i in range(records):
            w.add_raw(src[i % len(src)])
        w.set_metadata(labels=np.arange(records) % 10)


def worker(mode: str, path: str, steps: int, batch: int) -> dict:
    import jax
    import jax.numpy as jnp

    import tbljax

    def conv(x, w, stride):
        return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def forward(p, x):
        # A small CNN sized so a CPU step is tens of milliseconds: patchify, one conv, a head.
        x = jax.nn.relu(conv(x, p["c1"], 4))
        x = jax.nn.relu(conv(x, p["c2"], 2))
        return x.mean(axis=(1, 2)) @ p["w"]

    def init_params(key, classes):
        k1, k2, k3 = jax.random.split(key, 3)
        return {
            "c1": jax.random.normal(k1, (4, 4, 3, 32)) * 0.1,
            "c2": jax.random.normal(k2, (3, 3, 32, 64)) * 0.05,
            "w": jax.random.normal(k3, (64, classes)) * 0.05,
        }

    @jax.jit
    def step(params, images, labels):
        def loss_fn(p):
            logits = forward(p, images)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

        loss, g = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda p, g_: p - 1e-3 * g_, params, g), loss

    params = init_params(jax.random.key(0), 10)
    ld = tbljax.loader(path, batch, seed=0, augment="rrc_flip" if mode.endswith("aug") else None)
    it = iter(ld)
    first = next(it)
    params, loss = step(params, first["image"], first["label"])  # compile
    jax.block_until_ready(loss)
    if mode == "floor":
        images, labels = first["image"], first["label"]
        t0 = time.perf_counter()
        for _ in range(steps):
            params, loss = step(params, images, labels)
        jax.block_until_ready(loss)
    else:
        t0 = time.perf_counter()
        for _ in range(steps):
            b = next(it)
            params, loss = step(params, b["image"], b["label"])
        jax.block_until_ready(loss)
    dt = (time.perf_counter() - t0) / steps
    m = ld.metrics()
    ld.close()
    return {"mode": mode, "step_ms": dt * 1e3, "img_s": batch / dt, "wait_s": m["wait_seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=4, metavar=("MODE", "PATH", "STEPS", "BATCH"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=160)
    a = ap.parse_args()
    if a.worker:
        mode, path, steps, batch = a.worker
        print(json.dumps(worker(mode, path, int(steps), int(batch))))
        return
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "e2e.tbl"
        make_file(path, a.size, 2000)
        configs = {m: [m, str(path), str(a.steps), str(a.batch)] for m in ("floor", "loader", "loader-aug")}
        res = rounds(Path(__file__), configs, a.rounds)
    print(
        f"\nbench_e2e: small CNN (4x4/4 patchify conv, 3x3/2 conv, linear head), batch {a.batch} "
        f"at {a.size} px, float32 NHWC, "
        f"{a.steps} steps, median of {a.rounds} rounds\nmachine: {machine()}\n"
    )
    print("| configuration | step ms | img/s | overhead vs floor |")
    print("|---|---:|---:|---:|")
    floor = median(res["floor"], "step_ms")
    for name, rs in res.items():
        ms = median(rs, "step_ms")
        print(f"| {name} | {ms:.1f} | {median(rs, 'img_s'):.0f} | {100 * (ms / floor - 1):+.1f}% |")
    # The CPU step itself drifts by +-20% between processes on a shared 2-core VM; rounds run
    # the configurations back to back, so the ratio within a round cancels most of that drift.
    print("\noverhead, median over rounds of (step / floor step of the same round) - 1:")
    for name in ("loader", "loader-aug"):
        paired = [r["step_ms"] / f["step_ms"] - 1 for r, f in zip(res[name], res["floor"])]
        print(
            f"  {name}: {100 * statistics.median(paired):+.1f}% "
            f"(rounds: {', '.join(f'{100 * p:+.0f}%' for p in paired)}; target <= +10%)"
        )


if __name__ == "__main__":
    main()

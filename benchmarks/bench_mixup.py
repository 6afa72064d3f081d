"""What `tbljax.ops.mixup_cutmix` adds to a jitted training step: a small ViT-ish model (16 px
patches, width 192, `--depth` blocks) trained by SGD on one fixed float32 NHWC batch of
`--batch` x 224², with soft targets, once as it is and once with Mixup/CutMix (timm's defaults,
mode "batch", a new step each call) inside the same jit. Rounds alternate the two; medians.

    python benchmarks/bench_mixup.py [--rounds 5] [--steps 3] [--batch 128] [--depth 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from tbljax import ops

CLASSES, WIDTH, PATCH = 1000, 192, 16


def init(key, depth):
    ks = iter(jax.random.split(key, 4 + 4 * depth))

    def dense(i, o):
        return jax.random.normal(next(ks), (i, o), jnp.float32) * (1 / np.sqrt(i))

    p = {"embed": dense(PATCH * PATCH * 3, WIDTH), "head": dense(WIDTH, CLASSES), "blocks": []}
    for _ in range(depth):
        p["blocks"].append(
            {
                "qkv": dense(WIDTH, 3 * WIDTH),
                "proj": dense(WIDTH, WIDTH),
                "up": dense(WIDTH, 4 * WIDTH),
                "down": dense(4 * WIDTH, WIDTH),
            }
        )
    return p


def forward(p, x):
    b, h, w, _ = x.shape
    t = x.reshape(b, h // PATCH, PATCH, w // PATCH, PATCH, 3).transpose(0, 1, 3, 2, 4, 5)
    t = t.reshape(b, -1, PATCH * PATCH * 3) @ p["embed"]
    for blk in p["blocks"]:
        q, k, v = jnp.split(jax.nn.standardize(t) @ blk["qkv"], 3, axis=-1)
        a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(WIDTH), axis=-1)
        t = t + (a @ v) @ blk["proj"]
        t = t + jax.nn.gelu(jax.nn.standardize(t) @ blk["up"]) @ blk["down"]
    return jax.nn.standardize(t.mean(1)) @ p["head"]


def make_step(mix: bool):
    def loss(p, x, y):
        return -(y * jax.nn.log_softmax(forward(p, x))).sum(-1).mean()

    @jax.jit
    def step(p, x, labels, i):
        if mix:
            x, y = ops.mixup_cutmix(x, labels, seed=0, step=i, num_classes=CLASSES)
        else:
            y = jax.nn.one_hot(labels, CLASSES) * 0.9 + 0.1 / CLASSES
        g = jax.grad(loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g)

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((a.batch, 224, 224, 3)).astype(np.float32))
    labels = jnp.asarray(rng.integers(0, CLASSES, a.batch).astype(np.int32))
    p0 = init(jax.random.key(0), a.depth)
    steps = {"plain": make_step(False), "mixup": make_step(True)}
    mix_only = jax.jit(lambda x, y, i: ops.mixup_cutmix(x, y, seed=0, step=i, num_classes=CLASSES))
    for f in steps.values():  # compile
        jax.block_until_ready(f(p0, x, labels, 0))
    jax.block_until_ready(mix_only(x, labels, 0))
    times = {k: [] for k in (*steps, "mixup alone")}
    for r in range(a.rounds):
        for name, f in steps.items():
            p = p0
            t = time.perf_counter()
            for i in range(a.steps):
                p = f(p, x, labels, r * a.steps + i)
            jax.block_until_ready(p)
            times[name].append((time.perf_counter() - t) / a.steps)
        t = time.perf_counter()
        for i in range(a.steps):
            jax.block_until_ready(mix_only(x, labels, i))
        times["mixup alone"].append((time.perf_counter() - t) / a.steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"jax {jax.__version__}, {jax.devices()[0].platform}, batch {a.batch} x 224^2 float32, depth {a.depth}, "
        f"{a.rounds} rounds x {a.steps} steps"
    )
    for k, v in times.items():
        print(f"{k:12s} median {med[k] * 1e3:8.1f} ms/step  rounds {[round(t * 1e3, 1) for t in v]}")
    print(
        f"mixup adds {100 * (med['mixup'] / med['plain'] - 1):+.1f}% to the step "
        f"(alone: {100 * med['mixup alone'] / med['plain']:.1f}% of it)"
    )


if __name__ == "__main__":
    main()

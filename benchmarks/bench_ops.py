"""Batches for a jitted training step, four ways: the host loader (C++ kernel on the host, then
device_put), the FFI kernel inside jit (indices, crops and flips from the host; donated output),
the pure-JAX twin inside jit, and a ResidentDataset drawing the whole batch in the graph. Each
configuration runs in its own process, rounds interleaved, medians reported: the batch rate
alone, and the time each adds to a small conv-net training step over the same step on one
fixed resident batch (the "floor").

Data: ../shared/data/kodak (312 real photos) decoded with Pillow and centre-cropped to
176 px, repeated to 1024 records (a synthetic smooth-image file when kodak is absent); the
step trains on 160 px random-resized crops + flips ("rrc_flip"), or 160 px crops at random
places ("crop"), float32 NHWC, in batches of 64.

    python benchmarks/bench_ops.py [--rounds 3] [--steps 12] [--batch 64] [--augment both]

On a GPU machine the same script measures the GPU (jax's default backend).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA, machine, median, rounds  # noqa: E402

# The photos sit beside the main checkout; a worktree elsewhere can point at them.
DATA = Path(os.environ.get("TBLJAX_SHARED_DATA", SHARED_DATA))

STORED, OUT = 176, 160
PASSES = 5  # alternations of (batches alone, training step, floor) inside one process
N_RECORDS = 1024
CONFIGS = ("host loader", "in-jit FFI", "in-jit twin", "resident ds.batch")


# ---------------------------------------------------------------------------------------------
# The dataset
# ---------------------------------------------------------------------------------------------


def make_dataset(path: Path) -> str:
    """A RAW TBL file of N_RECORDS STORED x STORED records; returns what it was made from."""
    import tbljax

    files = sorted((DATA / "kodak" / "images").glob("*.jpg"))
    if files:
        from PIL import Image

        imgs = []
        for f in files:
            im = Image.open(f).convert("RGB")
            w, h = im.size
            s = min(w, h)
            box = ((w - s) / 2, (h - s) / 2, (w + s) / 2, (h + s) / 2)
            imgs.append(np.asarray(im.resize((STORED, STORED), Image.BILINEAR, box=box)))
        source = f"kodak ({len(files)} photos, repeated)"
    else:
        y, x = np.mgrid[0:STORED, 0:STORED]
        imgs = [
            np.stack([(x * (k + 1) + y) % 256, (y * 3 + k) % 256, (x + y + 7 * k) % 256], -1).astype(np.uint8)
            for k in range(64)
        ]
        source = "synthetic gradients (kodak absent)"
    with tbljax.Writer(path, N_RECORDS) as w:
        for i in range(N_RECORDS):
            w.add_raw(imgs[i % len(imgs)])
        w.set_metadata(labels=np.arange(N_RECORDS) % 10)
    return source


# ---------------------------------------------------------------------------------------------
# The training step: a small conv net in plain jax.lax
# ---------------------------------------------------------------------------------------------


def init_params(key):
    import jax

    k1, k2, k3 = jax.random.split(key, 3)
    he = lambda k, shape, fan: jax.random.normal(k, shape) * np.sqrt(2.0 / fan)  # noqa: E731
    # Small on purpose (2 CPU cores): a 4x4 stride-4 stem, one 3x3 stride-2 conv, a linear head.
    return {"c1": he(k1, (4, 4, 3, 16), 48), "c2": he(k2, (3, 3, 16, 32), 144), "w": he(k3, (32, 10), 32)}


def loss_fn(params, images, labels):
    import jax
    import jax.numpy as jnp

    dn = ("NHWC", "HWIO", "NHWC")
    x = images.astype(jnp.float32)
    x = jax.nn.relu(jax.lax.conv_general_dilated(x, params["c1"], (4, 4), "VALID", dimension_numbers=dn))
    x = jax.nn.relu(jax.lax.conv_general_dilated(x, params["c2"], (2, 2), "SAME", dimension_numbers=dn))
    logits = x.mean(axis=(1, 2)) @ params["w"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(labels.shape[0]), labels])


def sgd(params, images, labels):
    import jax

    loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads), loss


# ---------------------------------------------------------------------------------------------
# One configuration, in its own process
# ---------------------------------------------------------------------------------------------


def augment_spec(name: str):
    """rrc_flip: random-resized-crop to 160 px + flip. crop: a fixed-size 160 px crop at a
    random place, no flip (the same box path, the least work per pixel)."""
    import tbljax

    if name == "rrc_flip":
        return tbljax.Augment(size=(OUT, OUT))
    return tbljax.Augment(size=(OUT, OUT), flip=False, scale=(OUT * OUT / STORED**2,) * 2, ratio=(1.0, 1.0))


def worker(config: str, path: str, batch: int, steps: int, augment: str) -> dict:
    import functools

    import jax
    import jax.numpy as jnp

    import tbljax
    from tbljax import ops
    from tbljax._src.rules import augment as aug_mod
    from tbljax._src.rules import order

    aug = augment_spec(augment)
    mean, std, seed, n = tbljax.IMAGENET_MEAN, tbljax.IMAGENET_STD, 0, N_RECORDS
    jit_donating = functools.partial(jax.jit, donate_argnums=0)
    state = {"p": init_params(jax.random.key(0))}

    def host_plan(step):
        """What the host decides for a step: indices, crop boxes, flips (numpy)."""
        epoch, s = divmod(step, n // batch)
        idx = order.permute(np.arange(s * batch, (s + 1) * batch), n, seed, epoch)
        boxes, flips = aug_mod.sample(aug, idx, height=STORED, width=STORED, seed=seed, epoch=epoch)
        return idx, boxes, flips

    def timed(fn, k):
        out = None
        t0 = time.perf_counter()
        for i in range(k):
            out = fn(i)
        jax.block_until_ready(out)
        return time.perf_counter() - t0

    it = None
    if config == "host loader":
        it = iter(tbljax.loader(path, batch, seed=seed, augment=aug, mean=mean, std=std))
        train = jit_donating(sgd)

        def gather(i):
            return next(it)["image"]

        def step_fn(i):
            b = next(it)
            state["p"], loss = train(state["p"], b["image"], b["label"])
            return loss
    elif config == "resident ds.batch":
        ds = tbljax.ResidentDataset(path)
        kw = dict(batch_size=batch, seed=seed, augment=aug, mean=mean, std=std)
        draw = jax.jit(lambda ds, s: ds.batch(s, **kw)["image"])

        @jit_donating
        def train(p, ds, s):
            b = ds.batch(s, **kw)
            return sgd(p, b["image"], b["label"])

        def gather(i):
            return draw(ds, i)

        def step_fn(i):
            state["p"], loss = train(state["p"], ds, i)
            return loss
    else:
        ds = tbljax.ResidentDataset(path)
        backend = "ffi" if config == "in-jit FFI" else "twin"
        plans = [host_plan(i) for i in range(steps)]
        kw = dict(out_size=(OUT, OUT), mean=mean, std=std, backend=backend)
        if backend == "ffi":  # write each batch into the previous one's (donated) buffer
            draw = jax.jit(
                lambda d, i, c, f, o: ops.gather_normalize(d, i, crop=c, flip=f, out=o, **kw), donate_argnums=4
            )
        else:
            draw = jax.jit(lambda d, i, c, f, o: ops.gather_normalize(d, i, crop=c, flip=f, **kw))
        buf = {"o": jnp.zeros((batch, OUT, OUT, 3), jnp.float32)}

        def gather(i):
            out = draw(ds.data, *plans[i % steps], buf["o"])
            if backend == "ffi":
                buf["o"] = out
            return out

        @jit_donating
        def train(p, d, lab, idx, c, f):
            return sgd(p, ops.gather_normalize(d, idx, crop=c, flip=f, **kw), lab[idx])

        def step_fn(i):
            # The host's share (order + augmentation in numpy) is timed with the step.
            state["p"], loss = train(state["p"], ds.data, ds.labels, *host_plan(i))
            return loss

    # The floor: the same training step on one fixed batch already on the device.
    floor_x = jnp.asarray(np.random.default_rng(0).standard_normal((batch, OUT, OUT, 3)), jnp.float32)
    floor_y = jnp.arange(batch, dtype=jnp.int32) % 10
    floor_train = jit_donating(sgd)
    fstate = {"p": init_params(jax.random.key(0))}

    def floor_fn(i):
        fstate["p"], loss = floor_train(fstate["p"], floor_x, floor_y)
        return loss

    for fn in (gather, step_fn, floor_fn):  # compile and warm up
        timed(fn, 2)
    # Alternate the three a few times so drift (other load on the machine) hits all alike;
    # the added time is the median of the per-pass differences.
    passes = [(timed(gather, steps), timed(step_fn, steps), timed(floor_fn, steps)) for _ in range(PASSES)]
    if it is not None:
        it.close()
    g, st, fl = (statistics.median(p[k] for p in passes) for k in range(3))
    added = statistics.median(p[1] - p[2] for p in passes)
    return {
        "img_s": batch * steps / g,
        "step_ms": 1e3 * st / steps,
        "floor_ms": 1e3 * fl / steps,
        "added_ms": 1e3 * added / steps,
        "platform": jax.default_backend(),
    }


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--augment", choices=["rrc_flip", "crop", "both"], default="both")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        aug = args.augment
        print(json.dumps(worker(args.config, args.path, args.batch, args.steps, aug)))
        return
    augs = ["rrc_flip", "crop"] if args.augment == "both" else [args.augment]
    configs = [c for c in CONFIGS if c in args.configs.split(",")]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.tbl"
        source = make_dataset(path)
        rows = []
        for aug in augs:
            runs = rounds(
                Path(__file__),
                {
                    c: [
                        "--config",
                        c,
                        "--path",
                        str(path),
                        "--batch",
                        str(args.batch),
                        "--steps",
                        str(args.steps),
                        "--augment",
                        aug,
                    ]
                    for c in configs
                },
                args.rounds,
            )
            for c in configs:
                rs = runs[c]
                rows.append(
                    (
                        aug,
                        c,
                        median(rs, "img_s"),
                        median(rs, "step_ms"),
                        median(rs, "floor_ms"),
                        median(rs, "added_ms"),
                        rs[0]["platform"],
                    )
                )
    print(
        f"\nMachine: {machine()}. Data: {source}, {N_RECORDS} records of {STORED} px, "
        f"float32 NHWC {OUT} px batches of {args.batch}; each configuration in its own process, "
        f"{args.rounds} rounds interleaved, each round the median of {PASSES} alternating "
        f"passes of {args.steps} steps (batches alone, training step, floor); medians of "
        f"the rounds.\n"
    )
    print(
        "| augment | path | batches alone, img/s | train step, ms | floor step, ms "
        "| added by the input, ms | platform |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    for aug, c, img_s, step, floor, added, plat in rows:
        print(f"| {aug} | {c} | {img_s:,.0f} | {step:.1f} | {floor:.1f} | {added:+.1f} | {plat} |")


if __name__ == "__main__":
    main()

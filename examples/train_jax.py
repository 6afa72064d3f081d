"""Train a small CNN in JAX on a TBL file, data-parallel over every device, with checkpoints
that hold the loader's state so a restarted run continues the exact same stream.

    python examples/train_jax.py --train train.tbl --val val.tbl --steps 2000 \
        --batch-size 256 --checkpoint run.ckpt --ckpt-every 500
    python examples/train_jax.py ... --resume          # after a crash or preemption

Without --train it makes a small labelled dataset from code first (the demo's patterns).
To try it on several CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=4.

    python examples/train_jax.py --recipe standard --size-schedule 0:160,30:192 --train ...

`--recipe standard` is the usual ImageNet recipe on full-aspect records (converted with
resize="max_side" or "shorter_side", each record at its own size): random-resized-crop + flip
drawn from the whole record, a size schedule (progressive resizing: small crops first), and
evaluation on the center crop (87.5% of the shorter side) at the last training size. Without
--train it makes records of several aspect ratios.

What it shows:
- `tbljax.loader(..., sharding=...)` yields global jax.Arrays whose batch axis is split over a
  mesh of all devices; parameters are replicated; one jitted step.
- The checkpoint is a pickle of plain NumPy arrays and `loader.state_dict()` (a small dict of
  ints and a string). Restoring it puts the loader at the same position of the same epoch, so
  the steps after a resume see exactly the batches (same samples, same crops and flips) the
  uninterrupted run would have: the per-step lines it prints are identical.
- Evaluation: a padded last batch with a `valid` mask, so every image counts exactly once.
- `--recipe standard`: `tbljax.Augment(size={epoch: (side, side), ...})` for training and
  `tbljax.Augment(crop="center", flip=False, size=...)` for evaluation.
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np


def make_dataset(workdir: Path, n: int, size: int) -> tuple[Path, Path]:
    """A small labelled dataset (4 classes of patterns) as train.tbl and val.tbl."""
    import tbljax
    from tbljax import demo

    rng = np.random.default_rng(0)
    out = []
    for name, count in (("train", n), ("val", max(n // 4, 8))):
        labels = rng.integers(len(demo.CLASSES), size=count)
        images = np.stack([demo.make_image(rng, int(k)) for k in labels])
        path = workdir / f"{name}.tbl"
        tbljax.convert(images, path, image_size=size, labels=labels, overwrite=True, progress=False)
        out.append(path)
    return out[0], out[1]


# Aspect ratios (height, width) of the made full-aspect images: portrait, landscape, square.
FULL_ASPECT_SHAPES = ((72, 48), (48, 72), (72, 72), (54, 72), (72, 60))


def make_fullaspect_dataset(workdir: Path, n: int, size: int) -> tuple[Path, Path]:
    """The same patterns cut to several aspect ratios, converted with the longer side `size`
    and the aspect kept (resize="max_side"): records of different sizes."""
    import tbljax
    from tbljax import demo

    rng = np.random.default_rng(0)
    out = []
    for name, count in (("train", n), ("val", max(n // 4, 8))):
        labels = rng.integers(len(demo.CLASSES), size=count)
        images = []
        for k, label in enumerate(labels):
            h, w = FULL_ASPECT_SHAPES[k % len(FULL_ASPECT_SHAPES)]
            images.append(demo.make_image(rng, int(label))[:h, :w])
        path = workdir / f"{name}.tbl"
        tbljax.convert(images, path, image_size=size, resize="max_side", labels=labels, overwrite=True, progress=False)
        out.append(path)
    return out[0], out[1]


def parse_schedule(text: str) -> dict[int, tuple[int, int]]:
    """ "0:24,1:32" → {0: (24, 24), 1: (32, 32)}: from each epoch on, square crops of that side."""
    try:
        pairs = [item.split(":") for item in text.split(",")]
        return {int(e): (int(s), int(s)) for e, s in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--size-schedule wants EPOCH:SIDE,... (e.g. 0:160,30:192), got {text!r}"
        ) from None


def init_params(key, num_classes: int, width: int = 16):
    import jax

    k1, k2 = jax.random.split(key)
    return {
        "conv": jax.random.normal(k1, (3, 3, 3, width)) * np.sqrt(2 / 27),
        "conv_b": np.zeros(width, np.float32),
        "w": jax.random.normal(k2, (width, num_classes)) * 0.1,
        "b": np.zeros(num_classes, np.float32),
    }


def forward(params, x):
    import jax

    x = jax.lax.conv_general_dilated(x, params["conv"], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    x = jax.nn.relu(x + params["conv_b"]).mean(axis=(1, 2))
    return x @ params["w"] + params["b"]


def save_checkpoint(path: Path, step: int, params, momentum, loader) -> None:
    """Params, optimizer state and the loader's position, written atomically (a crash while
    writing leaves the previous checkpoint). In a multi-host run, process 0 writes it."""
    import jax

    ckpt = {
        "step": step,
        "params": jax.device_get(params),
        "momentum": jax.device_get(momentum),
        "loader": loader.state_dict(),
    }
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
        pickle.dump(ckpt, f)
    os.replace(f.name, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=Path, help="training TBL file (default: make a small one)")
    p.add_argument("--val", type=Path, help="evaluation TBL file")
    p.add_argument("--workdir", type=Path, default=None, help="where to make data (default: tmp)")
    p.add_argument("--synthetic", type=int, default=512, help="images to make without --train")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64, help="global batch, all devices")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--augment", default="flip", choices=["none", "flip", "rrc_flip"], help="with --recipe basic: the augmentation"
    )
    p.add_argument(
        "--recipe",
        default="basic",
        choices=["basic", "standard"],
        help="basic: --augment on fixed-size records; standard: random-resized-crop "
        "+ flip with --size-schedule on full-aspect records, center-crop eval",
    )
    p.add_argument(
        "--size-schedule",
        type=parse_schedule,
        default=parse_schedule("0:24,1:32"),
        metavar="EPOCH:SIDE,...",
        help="with --recipe standard: the crop side from each epoch on (default 0:24,1:32)",
    )
    p.add_argument("--checkpoint", type=Path, help="checkpoint file")
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument(
        "--stop-at", type=int, default=None, help="stop after this step, as a preemption would (to try --resume)"
    )
    p.add_argument("--log-every", type=int, default=10)
    a = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import tbljax

    if a.train is None:
        work = a.workdir or Path(tempfile.mkdtemp(prefix="tbljax-train-jax-"))
        work.mkdir(parents=True, exist_ok=True)
        make = make_fullaspect_dataset if a.recipe == "standard" else make_dataset
        a.train, a.val = make(work, a.synthetic, 40 if a.recipe == "standard" else 32)
        print(f"made {a.synthetic} training images in {work}")

    if a.recipe == "standard":
        train_augment = tbljax.Augment(size=a.size_schedule)
        # Evaluate at the last training size, on the central 87.5% of the shorter side.
        eval_size = train_augment.schedule[-1][1]
        eval_augment = tbljax.Augment(crop="center", flip=False, size=eval_size, center_fraction=0.875)
    else:
        train_augment = None if a.augment == "none" else a.augment
        eval_augment = None

    mesh = Mesh(np.array(jax.devices()), ("batch",))
    batch_sharding = NamedSharding(mesh, P("batch"))
    replicated = NamedSharding(mesh, P())
    loader = tbljax.loader(a.train, a.batch_size, seed=a.seed, sharding=batch_sharding, augment=train_augment)
    ds = tbljax.open(a.train)
    num_classes = len(ds.classes) if ds.classes else int(ds.labels.max()) + 1
    print(
        f"{loader.num_samples} images, {len(loader)} steps per epoch of {a.batch_size} over "
        f"{jax.device_count()} device(s), {num_classes} classes"
    )

    params = init_params(jax.random.key(a.seed), num_classes)
    momentum = jax.tree.map(np.zeros_like, params)
    step = 0
    if a.resume:
        with open(a.checkpoint, "rb") as f:
            ckpt = pickle.load(f)
        params, momentum, step = ckpt["params"], ckpt["momentum"], ckpt["step"]
        loader.load_state_dict(ckpt["loader"])
        print(
            f"resumed at step {step}: loader at epoch {ckpt['loader']['epoch']}, position {ckpt['loader']['position']}"
        )
    params, momentum = jax.device_put((params, momentum), replicated)

    @jax.jit
    def train_step(params, momentum, images, labels):
        def loss_fn(p):
            logp = jax.nn.log_softmax(forward(p, images))
            return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], 1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
        params = jax.tree.map(lambda w, m: w - a.lr * m, params, momentum)
        return params, momentum, loss

    t0, first_step = time.perf_counter(), step
    shape = None
    for batch in loader:
        if step >= a.steps:
            break
        if batch["image"].shape[1:3] != shape:  # a size schedule's change (jit compiles anew)
            shape = batch["image"].shape[1:3]
            print(f"training on {shape[0]}x{shape[1]} crops from step {step + 1}", flush=True)
        params, momentum, loss = train_step(params, momentum, batch["image"], batch["label"])
        step += 1
        if step % a.log_every == 0 or step == a.steps:
            # The batch's sample indices as a checksum: identical lines before and after a
            # resume show that the stream continued exactly.
            idx = np.asarray(batch["index"])
            print(f"step {step} loss {float(loss):.6f} indices-crc {zlib.crc32(idx.tobytes()):08x}", flush=True)
        if a.checkpoint and step % a.ckpt_every == 0:
            save_checkpoint(a.checkpoint, step, params, momentum, loader)
            print(f"checkpoint at step {step} -> {a.checkpoint}")
        if a.stop_at is not None and step >= a.stop_at:
            print(f"stopping at step {step} (--stop-at)")
            return 0
    jax.block_until_ready(params)
    took = time.perf_counter() - t0
    if step > first_step:
        print(
            f"trained {step - first_step} steps in {took:.1f} s "
            f"({(step - first_step) * a.batch_size / took:.0f} img/s incl. compile)"
        )

    if a.val is not None:

        @jax.jit
        def eval_step(params, images, labels, valid):
            correct = (jnp.argmax(forward(params, images), -1) == labels) & valid
            return correct.sum(), valid.sum()

        ndev = jax.device_count()
        eval_batch = max(ndev, a.batch_size // ndev * ndev)
        correct = total = 0
        for batch in tbljax.loader(
            a.val,
            eval_batch,
            shuffle=False,
            num_epochs=1,
            drop_remainder=False,
            sharding=batch_sharding,
            augment=eval_augment,
        ):
            c, n = eval_step(params, batch["image"], batch["label"], batch["valid"])
            correct, total = correct + int(c), total + int(n)
        print(f"eval accuracy {correct / total:.3f} on {total} images")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

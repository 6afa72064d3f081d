"""Train a small CNN in MLX on a TBL file with `tbljax.mlx.loader`; checkpoints hold the loader's
state for exact resume. On a Mac it runs on the GPU (Metal, unified memory); on Linux on
``mlx[cpu]``.

    python examples/train_mlx.py --train train.tbl --val val.tbl --epochs 10 --batch-size 128
    python examples/train_mlx.py ... --checkpoint run.pkl --resume          # after a stop

Without --train it makes a small labelled dataset from code first (the demo's patterns).

What it shows:
- Batches are NHWC float32 ``mx.array``s (what ``mlx.nn.Conv2d`` takes), built in the
  loader's background thread while the step runs.
- The checkpoint is a pickle of NumPy copies of the model and optimizer state plus
  `loader.state_dict()`; after --resume the steps print the same lines as the uninterrupted run.
- Evaluation with drop_remainder=False: the batch's `valid` mask counts each image once.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_jax import make_dataset  # noqa: E402  (the same small dataset)


def build_model(num_classes: int):
    import mlx.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 16, 3, stride=2, padding=1)
            self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.fc = nn.Linear(32, num_classes)

        def __call__(self, x):
            x = nn.relu(self.c2(nn.relu(self.c1(x))))
            return self.fc(x.mean(axis=(1, 2)))

    return Net()


def to_numpy(tree):
    from mlx.utils import tree_flatten

    return {k: np.array(v) for k, v in tree_flatten(tree)}


def from_numpy(flat):
    import mlx.core as mx
    from mlx.utils import tree_unflatten

    return tree_unflatten([(k, mx.array(v)) for k, v in flat.items()])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=Path, help="training TBL file (default: make a small one)")
    p.add_argument("--val", type=Path, help="evaluation TBL file")
    p.add_argument("--workdir", type=Path, default=None, help="where to make data (default: tmp)")
    p.add_argument("--synthetic", type=int, default=512, help="images to make without --train")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--augment", default="flip", choices=["none", "flip", "rrc_flip"])
    p.add_argument("--checkpoint", type=Path, help="checkpoint file (saved every epoch and at --stop-at)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument(
        "--stop-at", type=int, default=None, help="stop after this step, as a preemption would (to try --resume)"
    )
    p.add_argument("--log-every", type=int, default=10)
    a = p.parse_args(argv)

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    import tbljax
    import tbljax.mlx

    if a.train is None:
        work = a.workdir or Path(tempfile.mkdtemp(prefix="tbljax-train-mlx-"))
        work.mkdir(parents=True, exist_ok=True)
        a.train, a.val = make_dataset(work, a.synthetic, 32)
        print(f"made {a.synthetic} training images in {work}")

    loader = tbljax.mlx.loader(a.train, a.batch_size, seed=a.seed, augment=None if a.augment == "none" else a.augment)
    ds = tbljax.open(a.train)
    num_classes = len(ds.classes) if ds.classes else int(ds.labels.max()) + 1
    print(
        f"{loader.num_samples} images, {len(loader)} steps per epoch of {a.batch_size}, "
        f"{num_classes} classes, MLX on {mx.default_device()}"
    )

    mx.random.seed(a.seed)
    model = build_model(num_classes)
    opt = optim.SGD(learning_rate=a.lr, momentum=0.9)
    step = 0
    if a.resume:
        with open(a.checkpoint, "rb") as f:
            ckpt = pickle.load(f)
        model.update(from_numpy(ckpt["model"]))
        opt.state = from_numpy(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        step = ckpt["step"]
        print(
            f"resumed at step {step}: loader at epoch {ckpt['loader']['epoch']}, position {ckpt['loader']['position']}"
        )
    mx.eval(model.parameters())

    def loss_fn(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)

    def save():
        ckpt = {
            "model": to_numpy(model.parameters()),
            "optimizer": to_numpy(opt.state),
            "loader": loader.state_dict(),
            "step": step,
        }
        with tempfile.NamedTemporaryFile(dir=a.checkpoint.parent, delete=False) as f:
            pickle.dump(ckpt, f)
        os.replace(f.name, a.checkpoint)  # atomic: a crash while saving keeps the last one
        print(f"checkpoint at step {step} -> {a.checkpoint}")

    t0, first_step = time.perf_counter(), step
    for epoch in range(loader.state_dict()["epoch"], a.epochs):
        loader.set_epoch(epoch)  # keeps the position when resuming inside this epoch
        for batch in loader:
            x, y = batch
            loss, grads = loss_and_grad(model, x, y)
            opt.update(model, grads)
            mx.eval(model.parameters(), opt.state, loss)
            step += 1
            if step % a.log_every == 0:
                crc = zlib.crc32(np.array(batch.index).tobytes())
                print(f"epoch {epoch} step {step} loss {loss.item():.6f} indices-crc {crc:08x}", flush=True)
            if a.stop_at is not None and step >= a.stop_at:
                if a.checkpoint:
                    save()
                print(f"stopping at step {step} (--stop-at)")
                return 0
        if a.checkpoint:
            save()
    took = time.perf_counter() - t0
    if step > first_step:
        print(
            f"trained {step - first_step} steps in {took:.1f} s ({(step - first_step) * a.batch_size / took:.0f} img/s)"
        )

    if a.val is not None:
        correct = total = 0
        for batch in tbljax.mlx.loader(a.val, a.batch_size, shuffle=False, drop_remainder=False):
            x, y = batch
            hit = (mx.argmax(model(x), axis=1) == y) & batch.valid
            correct += int(hit.sum().item())
            total += int(batch.valid.sum().item())
        print(f"eval accuracy {correct / total:.3f} on {total} images")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Train a small CNN in PyTorch on a TBL file with `tbljax.torch.loader` where a DataLoader
would be; data-parallel under torchrun; checkpoints hold the loader's state for exact resume.

    python examples/train_torch.py --train train.tbl --val val.tbl --epochs 10 --batch-size 128
    torchrun --nproc-per-node 4 examples/train_torch.py --train train.tbl ...    # DDP
    python examples/train_torch.py ... --checkpoint run.pt --resume              # after a stop

Without --train it makes a small labelled dataset from code first (the demo's patterns).

What it shows:
- The loop is the usual one: ``for epoch ...: loader.set_epoch(epoch); for x, y in loader``.
  Batches are NCHW float32 tensors that share memory with the loader's ring (pinned when CUDA
  is present, so ``.to(device, non_blocking=True)`` is a direct copy).
- Under torchrun, rank and world size come from torch.distributed: each rank gets its rows of
  every global batch, and the global batch is batch-size x world size.
- The checkpoint (torch.save) holds `loader.state_dict()`; after --resume the steps print the
  same lines as the uninterrupted run (the same samples, crops and flips).
- Evaluation with drop_remainder=False: the batch's `valid` mask counts each image once.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_jax import make_dataset  # noqa: E402  (the same small dataset)


def build_model(num_classes: int):
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=Path, help="training TBL file (default: make a small one)")
    p.add_argument("--val", type=Path, help="evaluation TBL file")
    p.add_argument("--workdir", type=Path, default=None, help="where to make data (default: tmp)")
    p.add_argument("--synthetic", type=int, default=512, help="images to make without --train")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--augment", default="flip", choices=["none", "flip", "rrc_flip"])
    p.add_argument("--checkpoint", type=Path, help="checkpoint file (saved every epoch and at --stop-at)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument(
        "--stop-at", type=int, default=None, help="stop after this global step, as a preemption would (to try --resume)"
    )
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    a = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import tbljax
    import tbljax.torch

    if a.threads:
        torch.set_num_threads(a.threads)
    cuda = torch.cuda.is_available()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # started by torchrun
        if cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    say = print if rank == 0 else (lambda *args, **kw: None)

    if a.train is None:
        work = a.workdir or Path(tempfile.mkdtemp(prefix="tbljax-train-torch-"))
        work.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            make_dataset(work, a.synthetic, 32)
        if dist.is_initialized():
            dist.barrier()
        a.train, a.val = work / "train.tbl", work / "val.tbl"

    # Rank and world size come from torch.distributed when it is initialized.
    loader = tbljax.torch.loader(a.train, a.batch_size, seed=a.seed, augment=None if a.augment == "none" else a.augment)
    ds = tbljax.open(a.train)
    num_classes = len(ds.classes) if ds.classes else int(ds.labels.max()) + 1
    say(
        f"{loader.num_samples} images, {len(loader)} steps per epoch of {loader.batch_size} "
        f"x {loader.world_size} rank(s), pinned={loader.pin_memory}, {num_classes} classes"
    )

    torch.manual_seed(a.seed)
    model = build_model(num_classes).to(device)
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    step = 0
    if a.resume:
        ckpt = torch.load(a.checkpoint, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        step = ckpt["step"]
        say(f"resumed at step {step}: loader at epoch {ckpt['loader']['epoch']}, position {ckpt['loader']['position']}")

    def save():
        if rank != 0:
            return
        ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "loader": loader.state_dict(), "step": step}
        tmp = a.checkpoint.with_name(a.checkpoint.name + ".tmp")
        torch.save(ckpt, tmp)
        os.replace(tmp, a.checkpoint)  # atomic: a crash while saving keeps the last one
        print(f"checkpoint at step {step} -> {a.checkpoint}")

    t0, first_step = time.perf_counter(), step
    # After a resume the loader's epoch is where the run stopped; set_epoch keeps the
    # position inside that epoch, so nothing is repeated or skipped.
    for epoch in range(loader.state_dict()["epoch"], a.epochs):
        loader.set_epoch(epoch)
        model.train()
        for batch in loader:
            x, y = batch
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % a.log_every == 0:
                # int32, as the JAX and MLX examples: the same seed prints the same checksums.
                crc = zlib.crc32(batch.index.to(torch.int32).numpy().tobytes())
                say(f"epoch {epoch} step {step} loss {loss.item():.6f} indices-crc {crc:08x}", flush=True)
            if a.stop_at is not None and step >= a.stop_at:
                if a.checkpoint:
                    save()
                say(f"stopping at step {step} (--stop-at)")
                return 0
        if a.checkpoint:
            save()
    took = time.perf_counter() - t0
    if step > first_step:
        say(
            f"trained {step - first_step} steps in {took:.1f} s "
            f"({(step - first_step) * a.batch_size * loader.world_size / took:.0f} img/s)"
        )

    if a.val is not None:
        model.eval()
        correct = total = 0
        val = tbljax.torch.loader(a.val, a.batch_size, shuffle=False, drop_remainder=False)
        with torch.no_grad():
            for batch in val:
                x, y = batch
                pred = model(x.to(device)).argmax(1).cpu()
                correct += int(((pred == y) & batch.valid).sum())
                total += int(batch.valid.sum())
        if dist.is_initialized():
            counts = torch.tensor([correct, total], device=device)
            dist.all_reduce(counts)
            correct, total = (int(v) for v in counts)
        say(f"eval accuracy {correct / total:.3f} on {total} images")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

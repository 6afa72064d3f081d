"""The DeiT recipe against its peers (issue 47): RRC + flip + RandAugment `rand-m9-mstd0.5-inc1`
+ random erasing 0.25 + normalize, output 224 float32, over the kodak photos at full aspect,
shorter side 256. tbljax's host loader (2 threads) on RAW and compact (JPEG q90) records; timm's
own pipeline (`create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
re_prob=0.25)`, PIL) and torchvision v2 on uint8 tensors, each in a torch DataLoader with 2
workers, over the same decoded records (the RAW file's pixels, decoded once, held in memory).
Erasing is timm's default mode for that call, "const", on every side. Each configuration in its
own process, warm-up batches first, medians over interleaved rounds.

    python benchmarks/bench_vit_peers.py [--rounds 3] [--batches 8] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import kodak_photos, machine, median, rounds, torchvision_schemas  # noqa: E402

WARMUP = 2
CONFIGS = ("tbljax raw", "tbljax compact", "timm", "torchvision v2")


def tbljax_worker(path: str, batches: int, batch_size: int) -> dict:
    import numpy as np

    import tbljax

    aug = tbljax.Augment(
        size=(224, 224),
        ops=[tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1")],
        erasing=tbljax.RandomErasing(p=0.25, mode="const"),
    )
    opts = tbljax.LoaderOptions(batch_size=batch_size, seed=0, threads=2, dtype="float32", augment=aug)
    it = iter(tbljax.HostLoader(tbljax.open(path), opts))
    for _ in range(WARMUP):
        np.asarray(next(it).image).sum()
    t = time.perf_counter()
    for _ in range(batches):
        next(it).image[0, 0, 0, 0].item()
    return {"ms_per_batch": 1e3 * (time.perf_counter() - t) / batches}


class _Records:
    """The RAW file's decoded records, as PIL images (timm) or uint8 CHW tensors (torchvision)."""

    def __init__(self, path: str, transform, as_tensor: bool):
        import tbljax

        ds = tbljax.open(path)
        self.images = [ds.read(i) for i in range(len(ds))]
        self.transform, self.as_tensor = transform, as_tensor

    def __len__(self):
        return 1 << 20  # cycled: the timed batches never run out

    def __getitem__(self, i):
        import torch
        from PIL import Image

        a = self.images[i % len(self.images)]
        x = torch.from_numpy(a).permute(2, 0, 1) if self.as_tensor else Image.fromarray(a)
        return self.transform(x)


def torch_worker(path: str, which: str, batches: int, batch_size: int) -> dict:
    import torch

    torchvision_schemas()
    if which == "timm":
        from PIL import Image, ImageOps
        from timm.data import create_transform

        # timm's PosterizeIncreasing reaches 0 bits at the top magnitudes (mstd draws there);
        # Pillow >= 11 refuses bits=0, which older Pillow (and timm's authors) served as an
        # all-zero image. Give timm that result, so its pipeline runs: what tbljax serves too.
        posterize = ImageOps.posterize
        ImageOps.posterize = lambda img, bits: Image.new(img.mode, img.size) if bits == 0 else posterize(img, bits)

        transform = create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)
    else:
        from torchvision.transforms import v2

        transform = v2.Compose(
            [
                v2.RandomResizedCrop(224, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.RandAugment(num_ops=2, magnitude=9),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
                v2.RandomErasing(p=0.25),
            ]
        )
    data = _Records(path, transform, as_tensor=which != "timm")
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=2, prefetch_factor=2)
    it = iter(loader)
    for _ in range(WARMUP):
        next(it).sum()
    t = time.perf_counter()
    for _ in range(batches):
        next(it)[0, 0, 0, 0].item()
    return {"ms_per_batch": 1e3 * (time.perf_counter() - t) / batches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.worker:
        which, path = a.rest
        if which.startswith("tbljax"):
            print(json.dumps(tbljax_worker(path, a.batches, a.batch_size)))
        else:
            print(json.dumps(torch_worker(path, which, a.batches, a.batch_size)))
        return
    import tbljax

    with tempfile.TemporaryDirectory() as d:
        raw, compact = Path(d) / "raw.tbl", Path(d) / "compact.tbl"
        photos = kodak_photos()
        tbljax.convert(photos, raw, image_size=256, resize="shorter_side", progress=False)
        tbljax.convert(
            photos, compact, image_size=256, resize="shorter_side", format="jpeg", quality=90, progress=False
        )
        common = ["--batches", str(a.batches), "--batch-size", str(a.batch_size)]
        files = {"tbljax raw": raw, "tbljax compact": compact, "timm": raw, "torchvision v2": raw}
        res = rounds(Path(__file__), {k: [*common, k, str(files[k])] for k in CONFIGS}, a.rounds)
    print(f"# {machine()}; tbljax kernel target {tbljax.kernels.kernel_target()}")
    print(f"# batch {a.batch_size}, {a.batches} timed batches after {WARMUP} warm-up, median of {a.rounds} rounds")
    ms = {k: median(res[k], "ms_per_batch") for k in CONFIGS}
    best_peer = min(ms["timm"], ms["torchvision v2"])
    for k in CONFIGS:
        print(
            f"{k:16s} {ms[k]:8.1f} ms/batch  {a.batch_size * 1e3 / ms[k]:7.0f} images/s  "
            f"{best_peer / ms[k]:.2f}x the faster peer"
        )


if __name__ == "__main__":
    main()

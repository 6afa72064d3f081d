"""The DeiT recipe against its peers (issue 47): RRC + flip + RandAugment `rand-m9-mstd0.5-inc1`
+ random erasing 0.25 + normalize, output 224 float32, over the kodak photos at full aspect,
shorter side 256. tbljax's host loader (2 threads) on RAW and compact (JPEG q90) records; timm's
own pipeline (`create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
re_prob=0.25)`, PIL) and torchvision v2 on uint8 tensors, each in a torch DataLoader with 2
workers, over the same decoded records (the RAW file's pixels, decoded once, held in memory);
and NVIDIA DALI's CPU pipeline (2 threads) over the same pixels with the ops DALI offers on CPU:
`fn.random_resized_crop`, `fn.flip`, its own RandAugment (`nvidia.dali.auto_aug.rand_augment`,
n=2, m=9: no `mstd`/`inc` variant, its own op list), `fn.crop_mirror_normalize` and `fn.erase`
with p 0.25 (a box of 0.14-0.58 of each side, uniform: near timm's area range, not its draw).
Erasing is timm's default mode for that call, "const", on every side. Each configuration in its
own process, warm-up batches first, medians over interleaved rounds. DALI runs in its own venv
(benchmarks' peer setup; `--peers` / $TBLJAX_PEERS, as bench_compact.py) and is reported as
skipped, with the reason, where it does not import.

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

# Batches before timing: past the loader ring's first write to each of its 5 slots (a fresh
# 38.5 MB batch each, faulted in when first written) and past the first epoch (312 records,
# 4.9 batches), whose RAW rows first-touch the file's mapping. With 2, the timed window took
# 145 minor faults a batch on RAW and 84 on compact (~0 from 6 on; getrusage, 2026-12-06):
# the cost bench_compact.py measured at 7-150 ms a slot, which timed RAW slower than compact.
WARMUP = 6
CONFIGS = ("tbljax raw", "tbljax compact", "timm", "torchvision v2", "DALI CPU")
PEERS = ("timm", "torchvision v2", "DALI CPU")


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


def dump_pixels(raw: Path, path: Path) -> None:
    """The RAW file's records as one flat uint8 array and their shapes (for DALI's venv, which has
    no tbljax)."""
    import numpy as np

    import tbljax

    ds = tbljax.open(str(raw))
    images = [ds.read(i) for i in range(len(ds))]
    np.savez(path, data=np.concatenate([a.ravel() for a in images]), shapes=np.array([a.shape for a in images]))


def dali_worker(path: str, batches: int, batch_size: int) -> dict:
    import numpy as np
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
    from nvidia.dali.auto_aug import rand_augment

    z = np.load(path)
    data, shapes = z["data"], z["shapes"]  # each z[...] reads the array again: once each
    ends = np.cumsum([int(np.prod(s)) for s in shapes])
    images = [data[e - int(np.prod(s)) : e].reshape(s) for e, s in zip(ends, shapes)]
    order = np.random.default_rng(0).permutation(1 << 20) % len(images)  # shuffled, cycled

    def source(info):
        start = info.iteration * batch_size
        return [images[i] for i in order[start : start + batch_size]]

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None, seed=0, enable_conditionals=True)
    def pipe():
        x = fn.external_source(source=source, batch=True, batch_info=True, dtype=types.UINT8, layout="HWC")
        x = fn.random_resized_crop(x, size=(224, 224))
        x = fn.flip(x, horizontal=fn.random.coin_flip())
        x = rand_augment.rand_augment(x, n=2, m=9, fill_value=128)
        x = fn.crop_mirror_normalize(
            x,
            dtype=types.FLOAT,
            mean=[255 * m for m in (0.485, 0.456, 0.406)],
            std=[255 * s for s in (0.229, 0.224, 0.225)],
            output_layout="HWC",
        )
        if fn.random.coin_flip(probability=0.25):
            shape = fn.random.uniform(range=(0.14, 0.58), shape=2)
            anchor = fn.random.uniform(range=(0.0, 1.0), shape=2) * (1.0 - shape)
            x = fn.erase(x, anchor=anchor, shape=shape, axis_names="HW", normalized_anchor=True, normalized_shape=True)
        return x

    p = pipe()
    p.build()
    for _ in range(WARMUP):
        (o,) = p.run()
        np.asarray(o.as_tensor()).sum()
    t = time.perf_counter()
    for _ in range(batches):
        (o,) = p.run()
        np.asarray(o.as_tensor())[0, 0, 0, 0].item()
    return {"ms_per_batch": 1e3 * (time.perf_counter() - t) / batches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument(
        "--peers", default=None, help="the peers' folder (default $TBLJAX_PEERS, else peers in the temp folder)"
    )
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.worker:
        which, path = a.rest
        if which.startswith("tbljax"):
            print(json.dumps(tbljax_worker(path, a.batches, a.batch_size)))
        elif which == "DALI CPU":
            print(json.dumps(dali_worker(path, a.batches, a.batch_size)))
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
        from bench_compact import peers_root, probe_peer

        dali, why = probe_peer(peers_root(a.peers), "dali")
        if dali is not None:
            files["DALI CPU"] = Path(d) / "pixels.npz"
            dump_pixels(raw, files["DALI CPU"])
        configs = {k: [*common, k, str(files[k])] for k in CONFIGS if k in files}
        res = rounds(Path(__file__), configs, a.rounds, python={"DALI CPU": dali} if dali else None)
    print(f"# {machine()}; tbljax kernel target {tbljax.kernels.kernel_target()}")
    print(f"# batch {a.batch_size}, {a.batches} timed batches after {WARMUP} warm-up, median of {a.rounds} rounds")
    ms = {k: median(res[k], "ms_per_batch") for k in configs}
    best_peer = min(ms[k] for k in PEERS if k in ms)
    for k in configs:
        print(
            f"{k:16s} {ms[k]:8.1f} ms/batch  {a.batch_size * 1e3 / ms[k]:7.0f} images/s  "
            f"{best_peer / ms[k]:.2f}x the fastest peer"
            + (f"  ({ms['DALI CPU'] / ms[k]:.2f}x DALI CPU)" if "DALI CPU" in ms and k.startswith("tbljax") else "")
        )
    if dali is None:
        print(f"DALI CPU: skipped ({why})")


if __name__ == "__main__":
    main()

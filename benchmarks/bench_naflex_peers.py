"""NaFlex serving per core against timm's NaFlex loader (issue 49 asks >= 3x): the 312 kodak
photos, RAW records at shorter side 256; a random-resized crop and flip, each resized to its
sequence size at 256 patches of 16² and patchified, float32 normalized. tbljax's host loader
with one kernel thread; timm 1.0's ``create_naflex_loader`` (one length, 256; color jitter off,
as tbljax serves none here) with one worker process over the same decoded records as PIL
images. Each configuration in its own process, warm-up batches first, medians over
interleaved rounds; images per second of the loader's output.

    python benchmarks/bench_naflex_peers.py [--rounds 3] [--batches 10] [--batch-size 64]
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

WARMUP = 3
CONFIGS = ("tbljax", "timm")
PATCH, TOKENS = 16, 256


def tbljax_worker(path: str, batches: int, batch_size: int) -> dict:
    import tbljax

    opts = tbljax.LoaderOptions(
        batch_size=batch_size,
        seed=0,
        threads=1,
        dtype="float32",
        augment=tbljax.Augment(size=None),
        patches=tbljax.Patches(size=PATCH, max_tokens=TOKENS),
    )
    it = iter(tbljax.HostLoader(tbljax.open(path), opts))
    for _ in range(WARMUP):
        next(it).image.sum()
    t = time.perf_counter()
    for _ in range(batches):
        next(it).image[0, 0, 0].item()
    return {"img_per_s": batches * batch_size / (time.perf_counter() - t)}


class _Records:
    """The RAW file's decoded records as (PIL image, 0), cycled 8 times (timm's wrapper plans
    an epoch's batches over the dataset's length)."""

    def __init__(self, path: str):
        import tbljax

        ds = tbljax.open(path)
        self.images = [ds.read(i) for i in range(len(ds))]

    def __len__(self):
        return 8 * len(self.images)

    def __getitem__(self, i):
        from PIL import Image

        return Image.fromarray(self.images[i % len(self.images)]), 0


def timm_worker(path: str, batches: int, batch_size: int) -> dict:
    import torch

    torchvision_schemas()
    from timm.data.naflex_loader import create_naflex_loader

    loader = create_naflex_loader(
        _Records(path),
        patch_size=PATCH,
        train_seq_lens=(TOKENS,),
        max_seq_len=TOKENS,
        batch_size=batch_size,  # its token budget: batch_size x the longest length, 256
        is_training=True,
        color_jitter=0.0,
        num_workers=1,
        use_prefetcher=False,
        pin_memory=False,
        device=torch.device("cpu"),
    )
    it = iter(loader)
    for _ in range(WARMUP):
        next(it)
    t, n = time.perf_counter(), 0
    for _ in range(batches):
        x, _ = next(it)
        n += x["patches"].shape[0]
    return {"img_per_s": n / (time.perf_counter() - t)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.worker:
        fn = tbljax_worker if a.rest[1] == "tbljax" else timm_worker
        print(json.dumps(fn(a.rest[0], a.batches, a.batch_size)))
        return
    import tbljax

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "raw.tbl"
        tbljax.convert(kodak_photos(), path, image_size=256, resize="shorter_side", progress=False)
        common = ["--batches", str(a.batches), "--batch-size", str(a.batch_size)]
        res = rounds(Path(__file__), {c: [*common, str(path), c] for c in CONFIGS}, a.rounds)
    print(f"# {machine()}; tbljax kernel target {tbljax.kernels.kernel_target()}")
    print(f"# batch {a.batch_size}, {a.batches} timed batches after {WARMUP} warm-up, median of {a.rounds} rounds")
    base = median(res["timm"], "img_per_s")
    for c in CONFIGS:
        v = median(res[c], "img_per_s")
        print(f"{c:8s} {v:8.1f} img/s on one core  {v / base:5.2f}x timm")


if __name__ == "__main__":
    main()

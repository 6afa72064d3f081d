"""Convert ImageNet (or any dataset laid out like it) to TBL once, with the settings we recommend,
and check what was skipped.

    # ImageNet-style folder: train/n01440764/*.JPEG, ... (sorted class folders give labels)
    python examples/convert_imagenet.py /data/imagenet/train train-160.tbl --image-size 160
    # WebDataset shards (.jpg/.cls members), converted by 4 jobs (machines, Slurm tasks), I=0..3:
    python examples/convert_imagenet.py 'imagenet-train-{000000..001281}.tar' \
        'train-160-{shard}.tbl' --image-size 160 --shard $I/4
    # ... then read the parts as one dataset, exactly the single-job one:
    #     tbljax.loader(sorted(glob.glob("train-160-*-of-00004.tbl")), ...)

Recommended settings (why):
- --image-size: store the largest side you will train at. 160 is the fast choice (FFCV's
  ResNet recipes train at 160-192 px); 176 leaves room for random-resized-crop to 160; 224 for
  the classic recipe. The loader's random-resized-crop (`augment=Augment(size=...)`) crops
  from the stored image and resizes to the output size at serve time.
- --resize center_crop (default): shorter side to S, then the central S x S. That is a crop
  ratio of 1.0; the classic evaluation (resize 256, crop 224) keeps the central 87.5 %.
- --format raw (default) stores decoded uint8 pixels, N*S*S*3 bytes: for ImageNet-1k train
  (1,281,167 images) 98 GB at 160 px, 119 GB at 176, 193 GB at 224. It is served at memory
  speed from the page cache (or NVMe). --format jpeg keeps the original bytes (about the
  size of the source) and decodes with the same recipe at serve time, giving the same pixels
  but at decode speed (roughly 0.5-1k images/s per core): pick it when the raw file would not
  fit your RAM or disk. lz4 compresses raw records; photos shrink little.
- --threads: decoding is CPU-bound and runs in tbljax's C++ pool; default all CPUs.
- strict off (default): a corrupt, truncated or non-image file is skipped, never written as
  a black image. The list (key, source file, reason) is stored in the file, written next to
  it as OUT.skipped.json, and the run fails when more than --max-skipped-fraction of the
  items were bad (a sign of a broken copy rather than a few bad files).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="an ImageNet-style folder (one subfolder per class) or a "
                   "WebDataset shard pattern such as 'train-{000000..001281}.tar'")
    p.add_argument("output", help="the .tbl file to write ('{shard}' becomes "
                   "'iiiii-of-nnnnn' with --shard)")
    p.add_argument("--image-size", type=int, default=160, help="stored side S (default 160)")
    p.add_argument("--resize", default="center_crop", choices=["center_crop", "squash"])
    p.add_argument("--format", default="raw", choices=["raw", "jpeg", "lz4"])
    p.add_argument("--threads", type=int, default=None, help="decode threads (default: all)")
    p.add_argument("--shard", default=None, metavar="I/N", help="convert only the I-th of N "
                   "contiguous shares of the sources (whole TAR files; items of a folder)")
    p.add_argument("--max-skipped-fraction", type=float, default=0.001)
    p.add_argument("--verify", action="store_true", help="check every checksum afterwards")
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args(argv)

    import tbljax

    t0 = time.perf_counter()
    summary = tbljax.convert(a.source, a.output, image_size=a.image_size, resize=a.resize,
                             format=a.format, threads=a.threads, strict=False,
                             overwrite=a.overwrite, shard=a.shard)
    print(summary)
    a.output = Path(summary.dst)  # with '{shard}' filled in

    ds = tbljax.open(a.output)
    gb = ds.index["size"].sum() / 1e9
    print(f"{a.output}: {len(ds)} records, {ds.record_format}, image_shape {ds.image_shape}, "
          f"{len(ds.classes or [])} classes, {gb:.3f} GB of payload, "
          f"{time.perf_counter() - t0:.1f} s")

    skipped = ds.skipped
    skipped_path = a.output.with_name(a.output.name + ".skipped.json")
    skipped_path.write_text(json.dumps(skipped, indent=1))
    total = len(ds) + len(skipped)
    fraction = len(skipped) / total if total else 0.0
    print(f"skipped {len(skipped)} of {total} items ({100 * fraction:.3f} %), "
          f"listed in {skipped_path}")
    status = 0
    if fraction > a.max_skipped_fraction:
        print(f"error: more than {100 * a.max_skipped_fraction:.3f} % of the items were bad; "
              "check the source (the first reasons are listed above)", file=sys.stderr)
        status = 1
    if a.verify:
        problems = ds.verify(threads=a.threads or 0)
        print("verify: all checksums match" if not problems else
              f"verify: {len(problems)} bad records, first {problems[0]}")
        status = status or int(bool(problems))
    return status


if __name__ == "__main__":
    raise SystemExit(main())

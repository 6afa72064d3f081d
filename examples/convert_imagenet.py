"""Convert ImageNet (or any dataset laid out like it) to TBL once, with the settings we recommend,
and check what was skipped.

    # ImageNet-style folder: train/n01440764/*.JPEG, ... (sorted class folders give labels)
    python examples/convert_imagenet.py /data/imagenet/train train-160.tbl --image-size 160
    # WebDataset shards (.jpg/.cls members), e.g. converted on 4 machines, one part each:
    python examples/convert_imagenet.py 'imagenet-train-{000000..001281}.tar' train-160-0.tbl \
        --image-size 160 --part 0 --parts 4
    # ... then read the parts as one dataset: tbljax.loader(["train-160-0.tbl", ...], ...)

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
    p.add_argument("output", type=Path, help="the .tbl file to write")
    p.add_argument("--image-size", type=int, default=160, help="stored side S (default 160)")
    p.add_argument("--resize", default="center_crop", choices=["center_crop", "squash"])
    p.add_argument("--format", default="raw", choices=["raw", "jpeg", "lz4"])
    p.add_argument("--threads", type=int, default=None, help="decode threads (default: all)")
    p.add_argument("--part", type=int, default=0, help="this machine's part (TAR shards only)")
    p.add_argument("--parts", type=int, default=1, help="how many parts the shards are split in")
    p.add_argument("--max-skipped-fraction", type=float, default=0.001)
    p.add_argument("--verify", action="store_true", help="check every checksum afterwards")
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args(argv)

    import tbljax
    from tbljax import sources

    src = a.source
    if not Path(src).is_dir():
        shards = [s for pat in [src] for s in sources.expand_braces(pat)]
        if not 0 <= a.part < a.parts:
            p.error(f"--part must be in [0, {a.parts}), got {a.part}")
        src = shards[a.part::a.parts]  # every parts-th shard: parts of similar size
        print(f"part {a.part} of {a.parts}: {len(src)} of {len(shards)} TAR shards")
    elif a.parts != 1:
        p.error("--part/--parts split TAR shards; split a folder into several folders instead")

    t0 = time.perf_counter()
    summary = tbljax.convert(src, a.output, image_size=a.image_size, resize=a.resize,
                             format=a.format, threads=a.threads, strict=False,
                             overwrite=a.overwrite)
    print(summary)

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

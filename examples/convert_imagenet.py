"""Convert ImageNet (or any dataset laid out like it) to TBL once with the standard recipe, check
what was skipped, and print the disk it took.

    # ImageNet-style folder: train/n01440764/*.JPEG, ... (sorted class folders give labels)
    python examples/convert_imagenet.py /data/imagenet/train train-256.tbl
    # compact JPEG records (q90 4:2:0): about a tenth of the disk
    python examples/convert_imagenet.py /data/imagenet/train train-256-q90.tbl --format compact
    # WebDataset shards (.jpg/.cls members), converted by 4 jobs (machines, Slurm tasks), I=0..3:
    python examples/convert_imagenet.py 'imagenet-train-{000000..001281}.tar' \
        'train-256-{shard}.tbl' --shard $I/4
    # ... then read the parts as one dataset, exactly the single-job one:
    #     tbljax.open(sorted(glob.glob("train-256-*-of-00004.tbl")))

The standard recipe (docs/reference.md, "The standard ImageNet recipe"):
- Store each image with its longer side at 256 (or 320) pixels, aspect kept (--resize max_side,
  the default here): the whole photo stays, so training can draw random-resized-crop boxes from
  all of it (`tbljax.Augment(size=(224, 224))`) and evaluation can take the classic centre crop
  (`tbljax.Augment(crop="center", flip=False, size=(224, 224), center_fraction=0.875)`).
- --format raw stores decoded pixels (served at memory speed; ImageNet-1k train takes about
  190 GB at 256, 300 GB at 320). --format compact re-encodes each stored image as a JPEG of
  quality 90 (about 20 GB at 256, 28 GB at 320) and decodes it when served (no resize).
- strict off: a corrupt, truncated or non-image file is skipped, never written as a black
  image. The list (key, source file, reason) is stored in the file and, when it is not empty,
  written next to it as OUT.skipped.json; the run fails when more than --max-skipped-fraction of the items were bad
  (a sign of a broken copy rather than a few bad files).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

IMAGENET_TRAIN = 1_281_167  # images in ImageNet-1k train, for the extrapolated size


def main(argv=None) -> int:
    summary_line, _, details = __doc__.partition("\n\n")  # the first paragraph, whole: one sentence
    p = argparse.ArgumentParser(
        description=" ".join(summary_line.split()), epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "source",
        help="an ImageNet-style folder (one subfolder per class) or a "
        "WebDataset shard pattern such as 'train-{000000..001281}.tar'",
    )
    p.add_argument("output", help="the .tbl file to write ('{shard}' becomes 'iiiii-of-nnnnn' with --shard)")
    p.add_argument(
        "--image-size",
        type=int,
        default=256,
        help="stored longer side S (default 256; 320 for higher-resolution training)",
    )
    p.add_argument(
        "--resize",
        default="max_side",
        choices=["max_side", "shorter_side", "center_crop", "squash"],
        help="max_side keeps the whole photo (default); the square modes store S x S",
    )
    p.add_argument(
        "--format",
        default="raw",
        choices=["raw", "compact"],
        help="raw: decoded pixels (default); compact: JPEG records re-encoded at the stored size",
    )
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of --format compact (default 90)")
    p.add_argument(
        "--chroma", default="420", choices=["420", "444"], help="chroma subsampling of --format compact (default 420)"
    )
    p.add_argument("--threads", type=int, default=None, help="decode threads (default: all)")
    p.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="convert only the I-th of N contiguous shares of the sources (whole TAR files; items of a folder)",
    )
    p.add_argument(
        "--max-skipped-fraction",
        type=float,
        default=0.001,
        help="fail (exit 1) when more than this fraction of the items were bad",
    )
    p.add_argument("--verify", action="store_true", help="check every checksum afterwards")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    a = p.parse_args(argv)

    import tbljax

    compact = dict(format="jpeg", quality=a.quality, chroma=a.chroma) if a.format == "compact" else {}
    t0 = time.perf_counter()
    summary = tbljax.convert(
        a.source,
        a.output,
        image_size=a.image_size,
        resize=a.resize,
        threads=a.threads,
        strict=False,
        overwrite=a.overwrite,
        shard=a.shard,
        **compact,
    )
    print(summary)
    a.output = Path(summary.dst)  # with '{shard}' filled in

    ds = tbljax.open(a.output)
    print(
        f"{a.output}: {len(ds)} records, {ds.record_format}, image_shape {ds.image_shape}, "
        f"{f'{summary.num_classes} classes' if summary.num_classes else 'unlabelled'}, "
        f"{time.perf_counter() - t0:.1f} s"
    )
    idx = ds.index
    stored = int(idx["size"].sum())
    raw = int((idx["height"].astype("int64") * idx["width"] * 3).sum())
    per_image = a.output.stat().st_size / len(ds)
    print(
        f"disk: {a.output.stat().st_size / 1e9:.3f} GB, {per_image:.0f} bytes/image "
        f"({stored / raw:.3f} of RAW); for {IMAGENET_TRAIN:,} images about "
        f"{per_image * IMAGENET_TRAIN / 1e9:.1f} GB"
    )

    skipped = ds.skipped
    skipped_path = a.output.with_name(a.output.name + ".skipped.json")
    total = len(ds) + len(skipped)
    fraction = len(skipped) / total if total else 0.0
    if skipped:
        skipped_path.write_text(json.dumps(skipped, indent=1))
        print(f"skipped {len(skipped)} of {total} items ({100 * fraction:.3f} %), listed in {skipped_path}")
    else:
        skipped_path.unlink(missing_ok=True)  # a list from an earlier run of this output is no longer true
        print(f"skipped 0 of {total} items: no list written")
    status = 0
    if fraction > a.max_skipped_fraction:
        print(
            f"error: more than {100 * a.max_skipped_fraction:.3f} % of the items were bad; "
            "check the source (the first reasons are listed above)",
            file=sys.stderr,
        )
        status = 1
    if a.verify:
        problems = ds.verify(threads=a.threads or 0)
        print(
            "verify: all checksums match"
            if not problems
            else f"verify: {len(problems)} bad records, first {problems[0]}"
        )
        status = status or int(bool(problems))
    return status


if __name__ == "__main__":
    raise SystemExit(main())

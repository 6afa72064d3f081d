"""Conversion on Apache Beam: `ConvertShards`, a PTransform whose elements are the shard
numbers 0..N-1, each converted by a worker with the one converter (`convert(...,
shard=(i, N))`) into one part; and `main`, the `python -m tbljax.beam` command. A part at a URL
is written to local disk, then uploaded through fsspec (a TBL writer seeks back to finish its
index, which Beam's append-only file sinks cannot give). The parts opened together are the
single-job conversion record for record: `--shard`'s contiguous shares, in order."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

try:
    import apache_beam as beam
except ImportError:
    raise ImportError("tbljax.beam runs conversions on Apache Beam: pip install 'tbljax[beam]'") from None

from tbljax._src.conversion.convert import convert
from tbljax._src.conversion.convert_options import RECORD_FORMATS
from tbljax._src.remote import remote

__all__ = ["ConvertShards", "convert_part", "main"]


def convert_part(shard: int, sources: Any, dst: str, num_shards: int, options: dict[str, Any]) -> dict[str, Any]:
    """Converts share `shard` of `num_shards` of `sources` into `dst` ('{shard}' filled in);
    returns what the part holds ({"shard", "path", "written", "skipped"})."""
    name = dst.replace("{shard}", f"{shard:05d}-of-{num_shards:05d}")
    if not remote.is_url(name):
        s = convert(sources, name, shard=(shard, num_shards), progress=False, **options)
    else:
        fs, path = remote.filesystem(name)
        if fs.exists(path) and not options.get("overwrite"):
            raise FileExistsError(f"{name} already exists (pass overwrite=True to replace it)")
        with tempfile.TemporaryDirectory(prefix="tbljax-beam-") as tmp:
            local = os.path.join(tmp, remote.name_of(name))
            s = convert(sources, local, shard=(shard, num_shards), progress=False, **options)
            fs.put_file(local, path)
    return {"shard": shard, "path": name, "written": s.written, "skipped": len(s.skipped)}


class ConvertShards(beam.PTransform):
    """Converts `sources` into `num_shards` TBL parts named by `dst` (its '{shard}' becomes
    'iiiii-of-nnnnn'), one part per element, on whatever runner the pipeline has. `options`
    are `tbljax.convert`'s keyword arguments (image_size=, format=, classes=, ...). The output
    PCollection holds one dict per part: shard, path, written, skipped.

    >>> with beam.Pipeline(options=opts) as p:
    ...     p | ConvertShards("gs://b/train-{0000..1023}.tar", "gs://b/tbl/train-{shard}.tbl",
    ...                       num_shards=64, image_size=160)
    """

    def __init__(self, sources: Any, dst: str, num_shards: int, **options: Any):
        super().__init__()
        if "{shard}" not in dst:
            raise ValueError(f"dst must hold '{{shard}}' so that each part has its own name, got {dst!r}")
        if not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
        if "shard" in options:
            raise ValueError("shard= is chosen per worker: give num_shards=")
        self.sources, self.dst, self.num_shards, self.options = sources, dst, num_shards, options

    def expand(self, pbegin: Any) -> Any:
        return (
            pbegin
            | "Shards" >> beam.Create(range(self.num_shards))
            | "Spread" >> beam.Reshuffle()  # one part per worker, not all on the first
            | "Convert" >> beam.Map(convert_part, self.sources, self.dst, self.num_shards, self.options)
        )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tbljax.beam SOURCES -o 'out-{shard}.tbl' --num-shards N -s SIZE [...]`;
    arguments it does not know are Beam's pipeline options (--runner, --project, ...)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    ap = argparse.ArgumentParser(prog="python -m tbljax.beam", description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="+", help="what tbljax convert takes: TAR shards, Parquet, TFRecord, ...")
    ap.add_argument("-o", "--output", required=True, help="the parts: a path or URL holding '{shard}'")
    ap.add_argument("--num-shards", type=int, required=True, metavar="N", help="parts (and work items)")
    ap.add_argument("-s", "--image-size", type=int, default=None, metavar="SIZE")
    ap.add_argument("--resize", default="center_crop")
    ap.add_argument("--max-long-side", type=int, default=None)
    ap.add_argument("--format", default="raw", choices=list(RECORD_FORMATS))
    ap.add_argument("--quality", type=int, default=None)
    ap.add_argument("--chroma", default=None)
    ap.add_argument("--raw-budget", type=float, default=None)
    ap.add_argument("--classes", default=None, metavar="FILE")
    ap.add_argument("--label-ext", default=None)
    for flag in ("--image-column", "--label-column", "--image-key", "--label-key"):
        ap.add_argument(flag, default=None, metavar="NAME")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    a, beam_args = ap.parse_known_args(argv)
    options = {
        k: getattr(a, k)
        for k in (
            "image_size",
            "resize",
            "max_long_side",
            "format",
            "quality",
            "chroma",
            "raw_budget",
            "classes",
            "label_ext",
            "image_column",
            "label_column",
            "image_key",
            "label_key",
            "strict",
            "overwrite",
        )
    }
    sources = a.sources[0] if len(a.sources) == 1 else a.sources
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        (
            p
            | ConvertShards(sources, a.output, a.num_shards, **options)
            | "Report"
            >> beam.Map(
                lambda r: print(
                    f"part {r['shard']}: {r['written']} records, {r['skipped']} skipped -> {r['path']}", flush=True
                )
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tbljax.beam: conversion on Apache Beam (the `beam` extra). `ConvertShards` is a PTransform
that converts N shares of the sources into N TBL parts in parallel; `python -m tbljax.beam
SOURCES -o 'out-{shard}.tbl' --num-shards N -s SIZE [Beam pipeline options]` runs it.

>>> with beam.Pipeline(options=opts) as p:
...     p | tbljax.beam.ConvertShards("train-{000..099}.tar", "out/train-{shard}.tbl",
...                                   num_shards=16, image_size=160)
"""

import sys

from tbljax._src.tools.beam import ConvertShards, convert_part, main

__all__ = ["ConvertShards", "convert_part", "main"]

if __name__ == "__main__":
    sys.exit(main())

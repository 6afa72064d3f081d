"""A TBL file (or shard files) as convert's source: every record decoded record for record
into a RAW or LZ4 file, labels, keys, classes, skipped list, geometry and fields carried over."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tbljax._src.conversion.convert_options import CHUNK, ConversionError, ConvertOptions, ConvertSummary, num_classes
from tbljax._src.conversion.progress import Progress, progress_mode
from tbljax._src.datasets import reader as _reader
from tbljax._src.file import fields as _fields
from tbljax._src.file.format import Writer, run_entries
from tbljax._src.sources.items import paths_of

__all__ = ["convert_tbl", "tbl_paths"]


def tbl_paths(sources: Any) -> list[str] | None:
    """The files of a TBL source (paths and patterns ending in .tbl, expanded), else None."""
    return paths_of(sources, lambda words: all(w.lower().endswith(".tbl") for w in words))


def convert_tbl(paths: list[str], dst: str, opts: ConvertOptions) -> ConvertSummary:
    """Decodes every record of a TBL dataset (`Dataset.read`: a plain decode for compact
    records) into a RAW (or lz4) file, record for record: labels, keys, classes, skipped list
    and geometry carry over. A record that fails its checksum or its decode stops the run with
    CorruptFileError/DecodeError naming the file and record, and nothing is written."""
    ds = _reader.open(paths)
    n = len(ds)
    if n == 0:
        raise ConversionError(f"no record to write: {', '.join(paths)} holds no record; {dst} was not written")
    recipe = ds.recipe  # parsed before the threads read records
    bar = Progress(n, progress_mode(opts.progress), opts.progress_interval)
    bar.start(n)
    t0 = time.perf_counter()
    out_dir = os.path.dirname(os.path.abspath(dst))
    kinds = {name: info.kind for name, info in ds.fields.items()}
    with (
        _fields.Columns(kinds, {}, out_dir) as columns,
        Writer(dst, n, overwrite=opts.overwrite) as w,
        ThreadPoolExecutor(opts.pool_threads) as pool,
    ):
        for start in range(0, n, CHUNK):
            rows = np.arange(start, min(n, start + CHUNK))
            for img in pool.map(ds.read, rows.tolist()):
                w.add_raw(img, lz4=(opts.format == "lz4"))
            for name in kinds:  # the fields carry over record for record
                col = columns.writers[name]
                for v in ds.field_rows(name, rows):
                    col.expect(v)
                    col.append(v)
            bar.update(min(n, start + CHUNK), 0)
        columns.write(w)
        w.set_metadata(
            labels=ds.labels,
            keys=ds.keys,
            classes=ds.classes,
            skipped=ds.skipped,
            recipe={
                **{k: v for k, v in recipe.items() if k not in ("quality", "chroma", "raw_budget", "stored")},
                "format": opts.format,
                "decoded_from": {
                    "fingerprint": ds.fingerprint,
                    "format": ds.record_format,
                    **{k: recipe.get(k) for k in ("quality", "chroma")},
                    **{k: recipe[k] for k in ("raw_budget",) if k in recipe},
                },
                **run_entries(ds.paths),
            },
        )
    bar.update(n, 0, final=True)
    return ConvertSummary(
        dst=dst,
        written=n,
        skipped=[],
        seconds=time.perf_counter() - t0,
        bytes=os.path.getsize(dst),
        classes=ds.classes,
        num_classes=num_classes(ds.labels, ds.classes),
        labels_from="the TBL source has none",
    )

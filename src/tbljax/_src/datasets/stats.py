"""Statistics of an opened dataset, as `tbljax info` prints them (`Dataset.describe`): computed
from what the dataset offers publicly (its index, served geometry, labels, recipe, fields)."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from tbljax._src.file.format import FORMAT_NAMES

__all__ = ["describe"]


def describe(ds: Any) -> dict[str, Any]:
    """The record count, format and shape, bytes on disk and stored per image (and their ratio
    to RAW records of the served size), the five commonest served sizes, labels and classes,
    the recipe, the skipped sources, the fields and the fingerprint of dataset `ds`."""
    idx, n = ds.index, len(ds)
    # The served sizes: for original JPEG bytes the index holds the source photos' sizes.
    g = ds.geometry if n else None
    if g is None:
        sizes = Counter()
    elif g.shape is not None:
        sizes = Counter({g.shape: n})
    else:
        sizes = Counter(zip(g.heights.tolist(), g.widths.tolist()))
    stored = int(idx["size"].sum())
    raw = ds.served_bytes() if n else 0  # what RAW records would take
    known = ds.labels[ds.labels >= 0]
    return {
        "records": n,
        "record_format": ds.record_format,
        # How many records of each format (a compact file with a raw budget holds both).
        "record_formats": {
            FORMAT_NAMES.get(int(f), str(int(f))): int(c) for f, c in zip(*np.unique(idx["format"], return_counts=True))
        },
        "image_shape": ds.image_shape,
        "zero_copy_view": ds.image_shape is not None and ds.record_format == "raw",
        "bytes": sum(os.path.getsize(p) for p in ds.paths),
        "stored_payload_bytes": stored,
        "bytes_per_image": round(stored / n) if n else 0,
        "ratio_to_raw": round(stored / raw, 4) if raw else None,
        "record_sizes_hxw": {f"{h}x{w}": c for (h, w), c in sizes.most_common(5)},
        "labelled": int(known.size),
        "num_classes": (len(ds.classes) if ds.classes else int(np.unique(known).size) if known.size else 0),
        "classes": (ds.classes or [])[:10],
        "recipe": ds.recipe,
        "skipped": len(ds.skipped),
        "fields": {
            name: {
                "kind": f.kind,
                "dtype": None if f.dtype is None else str(f.dtype),
                "shape": list(f.shape),
                "bytes": ds.field_bytes(name),
            }
            for name, f in ds.fields.items()
        },
        "fingerprint": ds.fingerprint,
    }

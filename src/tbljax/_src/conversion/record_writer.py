"""What a conversion from images writes: a chunk's good records in source order (pixels, the
original JPEG bytes, or compact records, some kept as pixels within `raw_budget`), their fields
at the record's geometry, the skipped items and unreadable labels set aside, and at the end
the metadata (labels, keys, classes, skipped list, recipe) and the field blocks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tbljax import _core
from tbljax._src.conversion.convert_options import ConversionError, ConvertOptions
from tbljax._src.conversion.geometric_fields import GeometricFields
from tbljax._src.conversion.image_records import Encoded, choose_raw, is_jpeg, size_histogram, source_size
from tbljax._src.conversion.label_table import LabelTable
from tbljax._src.file import fields as _fields
from tbljax._src.file.format import Writer, run_entries
from tbljax._src.sources.items import Item

__all__ = ["RecordWriter"]


class RecordWriter:
    """What a conversion from images has written so far (keys, source sizes) and set aside
    (skipped items, unreadable labels); `add` writes a chunk's good records in source order,
    `finish` the metadata."""

    def __init__(
        self, dst: str, opts: ConvertOptions, labels: LabelTable, columns: _fields.Columns, geometric: GeometricFields
    ):
        self.dst, self.opts, self.labels, self.columns, self.geometric = dst, opts, labels, columns, geometric
        self.keys: list[str] = []
        self.skipped: list[dict[str, str]] = []
        self.label_errors: list[dict[str, str]] = []
        self.widths: list[int] = []
        self.heights: list[int] = []
        self.seen = 0
        # raw_budget=: the bytes of the records written so far, and of their RAW pixels.
        self.stored_bytes = 0
        self.raw_bytes = 0

    def add(self, chunk: list[Item], results: list, w: Writer) -> None:
        # A record whose fields fail is skipped like a bad image; its reason names the field.
        values = [
            None if isinstance(r, str) else self.columns.parse(it, self._at_geometry(it, r))
            for it, r in zip(chunk, results)
        ]
        results = [v if isinstance(v, str) else r for r, v in zip(results, values)]
        bad = [{"key": it.key, "source": it.source, "reason": r} for it, r in zip(chunk, results) if isinstance(r, str)]
        bad_labels = []
        for it, r in zip(chunk, results):
            if not isinstance(r, str):
                problem = self.labels.add(it.key, -1 if it.label_error else it.label)
                if it.label_error or problem:
                    bad_labels.append({"key": it.key, "source": it.source, "reason": it.label_error or problem})
        if self.opts.strict and (bad or bad_labels):
            self.skipped.extend(bad + [dict(b, reason=f"label unreadable: {b['reason']}") for b in bad_labels])
            first = self.skipped[0]
            raise ConversionError(
                f"strict conversion stopped: {len(bad) + len(bad_labels)} bad item(s), first "
                f"{first['key']} ({first['source']}): {first['reason']}; {self.dst} was not "
                "written",
                self.skipped,
            )
        self.skipped.extend(bad)
        self.label_errors.extend(bad_labels)
        if self.opts.raw_budget is not None:
            results = self._spend_raw_budget(results)
        for it, r, v in zip(chunk, results, values):
            if not isinstance(r, str):
                self._write(w, it, r)
                self.columns.append(v)
        self.seen += len(chunk)

    def _at_geometry(self, it: Item, r: np.ndarray | Encoded) -> Any:
        """The transform that takes `it`'s geometric fields to its record's geometry."""
        if not self.geometric.specs:
            return None
        width, height = source_size(it.data)
        out_hw = (r.height, r.width) if isinstance(r, Encoded) else r.shape[:2]
        # Fields are read in the displayed frame (the decoder applies EXIF orientation): the
        # orientation only words the reason when a field fits the stored frame instead.
        turned = is_jpeg(it.data) and _core.jpeg_info(it.data)["orientation"]
        return lambda values: self.geometric.apply(values, (height, width), out_hw, turned or 1)

    def _spend_raw_budget(self, results: list) -> list:
        """The chunk's compact records with those `choose_raw` picks replaced by their pixels,
        keeping the file so far within raw_budget of its RAW size (a running total, so a chunk
        may spend what earlier ones left)."""
        rows = [k for k, r in enumerate(results) if isinstance(r, Encoded)]
        jpeg = [len(results[k].data) for k in rows]
        raw = [results[k].height * results[k].width * 3 for k in rows]
        self.raw_bytes += sum(raw)
        self.stored_bytes += sum(jpeg)
        results = list(results)
        for k in choose_raw(jpeg, raw, self.opts.raw_budget * self.raw_bytes - self.stored_bytes):
            results[rows[k]] = results[rows[k]].pixels
            self.stored_bytes += raw[k] - jpeg[k]
        return results

    def _write(self, w: Writer, it: Item, r: np.ndarray | Encoded) -> None:
        width, height = source_size(it.data)
        self.widths.append(width)
        self.heights.append(height)
        if isinstance(r, Encoded):
            w.add_encoded(r.data, "JPEG", r.width, r.height)  # the stored geometry
        elif self.opts.quality is not None:  # a compact record kept as pixels: raw_budget=
            w.add_raw(r, lz4=False)
        elif self.opts.format == "jpeg" and is_jpeg(it.data):
            w.add_encoded(bytes(it.data), "JPEG", width, height)
        else:
            w.add_raw(r, lz4=(self.opts.format == "lz4"))
        self.keys.append(it.key)

    def finish(self, w: Writer, src: Any) -> tuple[np.ndarray, list[str] | None]:
        """Writes the labels, keys, classes, skipped list, recipe and fields; returns the labels
        and the classes."""
        try:
            self.columns.check_found(self.dst)
        except _fields.FieldsNotFound as e:
            raise ConversionError(str(e), self.skipped) from None
        if not self.keys:
            s = self.skipped
            first = f"; first: {s[0]['key']} ({s[0]['source']}): {s[0]['reason']}" if s else ""
            raise ConversionError(
                f"no record written: all {self.seen} items were skipped{first}; {self.dst} was not written", s
            )
        out_labels, out_classes = self.labels.finish()
        shard = self.opts.shard
        recipe = {**self.opts.recipe(), "image_size": int(self.opts.image_size)}
        w.set_metadata(
            labels=out_labels,
            keys=self.keys,
            classes=out_classes,
            skipped=self.skipped,
            recipe={
                **recipe,
                "idct": _core.JPEG_IDCT,
                "resize_filter": _core.native_info().get("resize_filter", ""),
                **run_entries(
                    src.describe(),
                    shard=list(shard) if shard else None,
                    label_errors=len(self.label_errors),
                    source_sizes=size_histogram(self.widths, self.heights),
                ),
            },
        )
        self.columns.write(w)
        return out_labels, out_classes

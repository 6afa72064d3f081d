"""Rows on a padded canvas (issue 48: large-scale jitter, evaluation's resize-longer-and-pad):
each row's source box resized to its own extent (rh, rw) (`rules/scale_jitter.py` decides) at
the top-left of the H x W output row, the rest 0 (after normalization: detectron2 normalizes,
then its ImageList pads with 0; 0 in uint8 output too). The kernel runs once per distinct
extent into a scratch image (`native_res.fill_by_size`); each row is then copied into place.

Batch key: ``image_valid`` (rows, H, W) bool, True on the real pixels (False on padding rows).
"""

from __future__ import annotations

import numpy as np

from tbljax._src.engine import native_res

__all__ = ["CANVAS_KEYS", "CanvasServing"]

CANVAS_KEYS = ("image_valid",)


def _hwc(row: np.ndarray, layout: str) -> np.ndarray:
    """An output row as an (H, W, C) view."""
    return row if layout == "NHWC" else row.transpose(1, 2, 0)


class CanvasServing:
    """Fills canvas rows; one per loader (its scratch buffer is reused across steps)."""

    def __init__(self):
        self._scratch = native_res.Scratch()

    def fill(self, src, records, out, *, extents, boxes, flip, layout, **kw) -> None:
        """Writes records `records` into `out` (rows, H, W, 3 or rows, 3, H, W): row r's box
        `boxes[r]` resized to `extents[r]` at its top-left, flipped if `flip[r]`, 0 elsewhere.
        `kw`: the rest of `src.fill`'s arguments."""
        rows = native_res.fill_by_size(
            src, records, extents, self._scratch, boxes=boxes, flip=flip, dtype=out.dtype, **kw
        )
        for m, img in rows:
            h, w = img.shape[1:3]
            for k, r in enumerate(m.tolist()):
                row = _hwc(out[r], layout)
                row[:h, :w] = img[k]
                row[h:] = 0
                row[:h, w:] = 0

    @staticmethod
    def arrays(drawn, rows, out_hw) -> dict[str, list]:
        """``image_valid`` per row range: True within each valid row's extent."""
        valid = []
        for d, nrows in zip(drawn, rows):
            v = np.zeros((nrows, *out_hw), bool)
            for r, (h, w) in enumerate(d.extents.tolist()):
                v[r, :h, :w] = True
            valid.append(v)
        return {"image_valid": valid}

"""Records of one size or many (`RecordGeometry`): every record's stored (height, width), and the
per-record tables a box needs that are computed in float64 once on the host (``float32(sqrt(H*W))``,
torchvision's fallback crop clamped to a ratio, the center crop), gathered by sample index, so
jax.numpy never recomputes them in float32 and both paths give the same boxes (`augment.py`).

Example:
    >>> import numpy as np
    >>> RecordGeometry(np.array([300, 40]), np.array([200, 90])).shape is None
    True
"""

from __future__ import annotations

import copy

import numpy as np

from tbljax._src.rules import contract

__all__ = ["RecordGeometry"]

# TBL stores sides as u16, which keeps the placement product in uint32.
_MAX_SIDE = contract.MAX_SIDE


class RecordGeometry:
    """The stored (height, width) of every record, and the per-record float64 tables that
    boxes need, built once on the host and gathered by sample index.

    ``RecordGeometry(h, w)`` with two ints: every record is h×w (``shape == (h, w)``).
    ``RecordGeometry(heights, widths)`` with two 1-D integer arrays: record i is
    heights[i]×widths[i] (``shape`` is None unless they are all equal).

    >>> g = RecordGeometry(np.array([300, 40]), np.array([200, 90]))
    >>> g.shape, len(g), g.center_table(0.5).tolist()
    (None, 2, [[100, 50, 100, 100], [10, 35, 20, 20]])
    """

    def __init__(self, heights, widths):
        if np.ndim(heights) == 0 and np.ndim(widths) == 0:
            hw = [_check_side(name, v) for name, v in (("height", heights), ("width", widths))]
            self.heights, self.widths = (np.array([v], np.int32) for v in hw)
            self._uniform = True
        else:
            h, w = np.asarray(heights), np.asarray(widths)
            if h.ndim != 1 or h.shape != w.shape or not len(h) or h.dtype.kind not in "iu" or w.dtype.kind not in "iu":
                raise ValueError(
                    f"heights and widths must be two ints or two 1-D integer arrays "
                    f"of one length >= 1, got {h.dtype} {h.shape} and "
                    f"{w.dtype} {w.shape}"
                )
            for name, a in (("height", h), ("width", w)):
                if a.min() < 1 or a.max() > _MAX_SIDE:
                    k = int(np.argmax((a < 1) | (a > _MAX_SIDE)))
                    raise ValueError(f"record {k}: {name} must be an integer in [1, {_MAX_SIDE}], got {int(a[k])}")
            self.heights, self.widths = h.astype(np.int32), w.astype(np.int32)
            self._uniform = bool((h == h[0]).all() and (w == w[0]).all())
            if self._uniform:  # one size after all: the scalar path (one table row)
                self.heights, self.widths = self.heights[:1], self.widths[:1]
        for a in (self.heights, self.widths):
            a.setflags(write=False)
        self._tables: dict = {}
        self._first = 0  # the global index of record 0 (`shifted`)

    @classmethod
    def of(cls, hw) -> "RecordGeometry":
        """`hw` itself if it is a RecordGeometry, else RecordGeometry(*hw)."""
        return hw if isinstance(hw, cls) else cls(*hw)

    @property
    def shape(self) -> tuple[int, int] | None:
        """(H, W) when every record has that size, else None."""
        return (int(self.heights[0]), int(self.widths[0])) if self._uniform else None

    def __len__(self) -> int:
        """Records described (1 for a uniform geometry: it holds one size for all)."""
        return len(self.heights)

    def __repr__(self) -> str:
        if self._uniform:
            return f"RecordGeometry({self.shape[0]}, {self.shape[1]})"
        return f"RecordGeometry({len(self)} records of different sizes)"

    def shifted(self, first: int) -> "RecordGeometry":
        """This geometry for records numbered from global index `first` (a host's part of a
        dataset): `gather` then takes global sample indices. Shares the tables."""
        if not first or self._uniform:
            return self
        other = copy.copy(self)
        other._first = int(first)
        return other

    def gather(self, table, indices, xp=np):
        """Rows of a per-record `table` for sample `indices` (uniform: its one row, shaped to
        broadcast against the batch)."""
        t = xp.asarray(table)
        return t[:1] if self._uniform else t[xp.asarray(indices) - self._first]

    def _cached(self, key, make):
        if key not in self._tables:
            table = make()
            table.setflags(write=False)
            self._tables[key] = table
        return self._tables[key]

    def sqrt_area_table(self) -> np.ndarray:
        """float32 (N,): float32(sqrt(H*W)) per record, computed in float64."""
        return self._cached(
            "sqrt_area", lambda: np.sqrt(self.heights.astype(np.float64) * self.widths).astype(np.float32)
        )

    def fallback_table(self, ratio) -> np.ndarray:
        """int32 (N, 4): torchvision's central crop clamped to `ratio`, per record (float64
        and round-half-to-even, as Python's round)."""
        lo, hi = (float(r) for r in ratio)

        def make():
            h, w = self.heights.astype(np.float64), self.widths.astype(np.float64)
            in_ratio = w / h
            # At least 1 pixel: an extreme ratio range may round a side to 0.
            ch = np.where(in_ratio < lo, np.maximum(np.rint(w / lo), 1), h)
            cw = np.where(in_ratio > hi, np.maximum(np.rint(h * hi), 1), w)
            return _boxes(h, w, ch, cw)

        return self._cached(("fallback", lo, hi), make)

    def center_table(self, fraction: float) -> np.ndarray:
        """int32 (N, 4): the central square of side max(1, int(fraction * min(H, W)))."""
        fraction = float(fraction)

        def make():
            h, w = self.heights.astype(np.float64), self.widths.astype(np.float64)
            c = np.maximum(np.floor(fraction * np.minimum(h, w)), 1)
            return _boxes(h, w, c, c)

        return self._cached(("center", fraction), make)


def _boxes(h, w, ch, cw):
    """int32 (N, 4) boxes (y0, x0, ch, cw) centred in h×w records (float64 whole numbers)."""
    return np.stack([(h - ch) // 2, (w - cw) // 2, ch, cw], axis=-1).astype(np.int32)


def _check_side(name, v):
    if not contract.is_integer(v) or not 1 <= v <= _MAX_SIDE:
        raise ValueError(f"{name} must be an integer in [1, {_MAX_SIDE}], got {v!r}")
    return int(v)

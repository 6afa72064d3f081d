"""The host tables that turn a random word into a value: 4096 quantiles, computed once in
float64, gathered by the word's top 12 bits. One home for the rule that the crops
(`augment`), random erasing (`erasing`) and the per-image ops' factors share, so a batch only
gathers and NumPy and jax.numpy agree to the bit.

>>> grid()[:2] * 4096
array([0.5, 1.5])
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["BITS", "area_aspect_tables", "grid", "uniform_table"]

BITS = 12  # a word's top BITS bits index a table (shift by 32 - BITS)


def grid() -> np.ndarray:
    """float64 (4096,): the quantile levels (k + 0.5) / 4096."""
    return (np.arange(1 << BITS, dtype=np.float64) + 0.5) / (1 << BITS)


def uniform_table(lo: float, hi: float) -> np.ndarray:
    """float32 (4096,): U(lo, hi) at the quantile levels (float64, then rounded to float32)."""
    return (float(lo) + (float(hi) - float(lo)) * grid()).astype(np.float32)


@functools.lru_cache(maxsize=32)
def area_aspect_tables(area: tuple, aspect: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 (4096,) x 3, read-only: sqrt(s) for an area fraction s ~ U(area), and sqrt(r),
    1 / sqrt(r) for an aspect r ~ logU(aspect) (torchvision's crop and timm's erasing draw)."""
    k = grid()
    s = np.sqrt(area[0] + (area[1] - area[0]) * k)
    log_lo, log_hi = math.log(aspect[0]), math.log(aspect[1])
    r = np.sqrt(np.exp(log_lo + (log_hi - log_lo) * k))
    tables = (s.astype(np.float32), r.astype(np.float32), (1.0 / r).astype(np.float32))
    for t in tables:
        t.setflags(write=False)
    return tables

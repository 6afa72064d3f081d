"""Weighted mixtures of datasets as pure functions of (seed, epoch, step, row), so a mixed
stream is deterministic, its state is O(1) and a resume is exact.

The algorithm. Sources k = 0..K-1 hold n_k records and have weights w_k (summing to 1). Let
S = epoch * steps_per_epoch + step be the global step and G the global batch.

1. *How many rows of each source a step holds.* With cumulative weights W_k = w_0 + ... + w_k
   held as integers over 2^20 (W_{K-1} = 2^20 exactly), the rows of sources <= k among the
   first S steps are T_k(S) = floor(S * G * W_k / 2^20), so source k has drawn
   D_k(S) = T_k(S) - T_{k-1}(S) rows before step S and step S holds D_k(S+1) - D_k(S) of its
   rows: every step holds exactly G rows, and after any number of steps each source's share
   is within one row per source of its weight (deterministic quotas, not a coin per row).
2. *Which rows.* The step's G rows are shuffled by a keyed bijection of (seed, S)
   (`order.permute`): row r takes slot j = pi_S(r), and slots [C_{k-1}, C_k) of the step
   (C the step's cumulative quotas) belong to source k: row r is source k's draw number
   d = D_k(S) + j - C_{k-1}.
3. *Which record.* Draw d of source k is position d mod n_k of pass q = d // n_k over that
   source, and the record is ``order.permute(d mod n_k, n_k, seed_k, q)``: records are taken
   without replacement and reshuffled at every pass over the source, so a small source
   repeats and a large one is not exhausted. seed_k is derived from (seed, k).
4. *Augmentation* of a row is keyed by (seed, q, the record's index in the mixture), so a
   record drawn again in a later pass gets another crop.
5. *Host parts* (``partition="host"``, P processes). Process p draws its L = G / P rows of
   each step by steps 1-3 from its own part of every source (n_k is then the part's record
   count), with G replaced by L and the seed replaced by a seed keyed by (seed, p) for p > 0,
   so the processes draw different rows (process 0 keeps the seed: one process is the
   unpartitioned stream). Every process runs the same steps; each process's shares follow
   the weights exactly as a whole batch's do.

Everything is integer arithmetic on NumPy arrays.

>>> spec = MixSpec((0.7, 0.3), (100, 8))
>>> src, rec, passes = draw_rows(spec, seed=0, global_step=0, rows=np.arange(4), batch=4)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tbljax._src.rules import order

__all__ = ["MixSpec", "WEIGHT_BITS", "draw_rows", "process_seed", "rows_before", "step_quotas"]

WEIGHT_BITS = 20  # weights are held as integers over 2^20 (about 1e-6 resolution)
_ROW_TAG = 0x6D69_7852  # keys the shuffle of a step's rows
_SOURCE_TAG = 0x6D69_7853  # keys each source's record order
_PROCESS_TAG = 0x6D69_7850  # keys a host part's stream by its process index


@dataclasses.dataclass(frozen=True)
class MixSpec:
    """Weights (any positive numbers, normalized here) and the record count of each source."""

    weights: tuple[float, ...]
    counts: tuple[int, ...]

    def __post_init__(self):
        w = np.asarray(self.weights, np.float64)
        if w.ndim != 1 or not len(w) or len(w) != len(self.counts):
            raise ValueError(
                f"a mixture needs one weight per source, got {len(w)} weights for {len(self.counts)} sources"
            )
        if not np.all(np.isfinite(w)) or (w <= 0).any():
            raise ValueError(f"mixture weights must be finite and > 0, got {list(self.weights)}")
        if any(int(c) < 1 for c in self.counts):
            raise ValueError(f"every source of a mixture needs records, got counts {list(self.counts)}")

    @property
    def shares(self) -> np.ndarray:
        """w_k: the weights normalized to sum to 1 (scaled by the largest first, so weights
        near the float64 limit do not overflow their sum)."""
        w = np.asarray(self.weights, np.float64)
        w = w / w.max()
        return w / w.sum()

    @property
    def cumulative(self) -> np.ndarray:
        """W_k as integers over 2^WEIGHT_BITS, the last exactly 2^WEIGHT_BITS."""
        cum = np.rint(np.cumsum(self.shares) * (1 << WEIGHT_BITS)).astype(np.int64)
        cum[-1] = 1 << WEIGHT_BITS
        return cum


def rows_before(spec: MixSpec, global_step: int, batch: int) -> np.ndarray:
    """D_k(S): rows each source drew in the steps before global step S."""
    total = int(global_step) * int(batch)
    t = np.array([(total * int(c)) >> WEIGHT_BITS for c in spec.cumulative], np.int64)
    return np.diff(np.concatenate([[0], t]))


def step_quotas(spec: MixSpec, global_step: int, batch: int) -> np.ndarray:
    """Rows of each source in global step S (they sum to `batch`)."""
    return rows_before(spec, global_step + 1, batch) - rows_before(spec, global_step, batch)


def _source_seed(seed: int, k: int) -> int:
    words = [np.array([_SOURCE_TAG], np.uint32), np.array([seed & 0xFFFFFFFF], np.uint32), np.array([k], np.uint32)]
    return int(order.hash32(words)[0]) & 0x7FFFFFFF


def process_seed(seed: int, process: int) -> int:
    """The seed process `process` of a host-partitioned mixture draws with (step 5)."""
    if process == 0:
        return int(seed)
    words = [
        np.array([_PROCESS_TAG], np.uint32),
        np.array([seed & 0xFFFFFFFF], np.uint32),
        np.array([process], np.uint32),
    ]
    return int(order.hash32(words)[0]) & 0x7FFFFFFF


def draw_rows(spec: MixSpec, *, seed: int, global_step: int, rows, batch: int, process: int = 0):
    """(source, record in that source, pass over that source) of `rows` of global step S.
    With host parts, `spec` holds process `process`'s part sizes and `batch` is its L rows."""
    rows = np.asarray(rows, np.int64)
    seed = process_seed(seed, process)
    s = int(global_step)
    row_seed = (int(seed) ^ _ROW_TAG) & 0x7FFFFFFF
    # The shuffle of a step's rows: a bijection keyed by (seed, S); S is its "epoch" key.
    slots = order.permute(rows, batch, row_seed, s % (1 << 31))
    quotas = step_quotas(spec, s, batch)
    bounds = np.cumsum(quotas)
    source = np.searchsorted(bounds, slots, side="right").astype(np.int64)
    first_slot = (bounds - quotas)[source]
    draw = rows_before(spec, s, batch)[source] + (slots - first_slot)
    counts = np.asarray(spec.counts, np.int64)[source]
    passes, pos = np.divmod(draw, counts)
    record = np.empty_like(pos)
    for k in np.unique(source).tolist():
        for q in np.unique(passes[source == k]).tolist():
            m = (source == k) & (passes == q)
            record[m] = order.permute(pos[m], int(spec.counts[k]), _source_seed(seed, k), int(q) % (1 << 31))
    return source, record, passes

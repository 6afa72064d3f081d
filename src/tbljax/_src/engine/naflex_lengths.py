"""A NaFlex sequence-length schedule as the host loaders serve it (``Patches(max_tokens=[...])``,
issue 49): each step's length and batch size from `naflex.length_schedule` (timm's rule, keyed
by (seed, epoch, step)), this process's rows of it, and the step's patch rows through a
`native_res.PatchServing` at that length. Positions count records of the epoch's order, so a
step starts at the schedule's ``first`` and a saved position is a step start.

>>> ls = LengthServing(ds.geometry, len(ds), opts, RowLayout.for_rank(64, 0, 1))
>>> ls.step(0, 0)   # (length, batch size, first position, real rows) of epoch 0's first step
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from tbljax._src.engine import native_res
from tbljax._src.engine.rows import RowLayout
from tbljax._src.rules import naflex
from tbljax._src.rules.options import LoaderOptions

__all__ = ["LengthServing"]


class LengthServing:
    """The length schedule of a loader over n records with rows `rows` (a rank's range,
    `RowLayout.for_rank`, or a JAX sharding's: each step's rows are its placement at that step's
    batch size, `RowLayout.resized`)."""

    def __init__(self, geometry, n: int, opts: LoaderOptions, rows: RowLayout):
        p = opts.patches
        self.opts, self.n = opts, int(n)
        self.lengths = p.max_tokens
        self.sizes = naflex.length_batch_size(p.tokens_per_batch, np.array(self.lengths), p.batch_divisor)
        if rows.sharding is None and len(rows.ranges) != 1:
            raise ValueError(
                f"patches with a list of max_tokens (a length schedule): the rows {rows.ranges} are several ranges "
                "without a sharding; pass RowLayout.for_rank(...) or a JAX sharding"
            )
        self.biggest = int(self.sizes.max())  # the batch of the shortest length
        self.world = rows.shards  # ranks, or the sharding's batch shards
        where = f"{self.world} ranks" if rows.sharding is None else f"the {self.world} batch shards of the sharding"
        if rows.global_batch != self.biggest:
            raise ValueError(
                f"patches={p}: batch_size must be the schedule's largest step, {self.biggest} rows "
                f"(tokens_per_batch // {self.lengths[0]}, the shortest length; "
                f"{self.biggest // self.world} each of {where}), got {rows.global_batch}"
            )
        odd = [(int(t), int(b)) for t, b in zip(self.lengths, self.sizes) if b % self.world]
        if odd:
            raise ValueError(
                f"patches={p}: the batch sizes (length, rows) {odd} do not split over {where}; "
                f"set batch_divisor to a multiple of {self.world}"
            )
        # Each step's rows on this process: the same placement at the step's batch size.
        self.layouts = {int(b): rows.resized(int(b)) for b in self.sizes}
        # One PatchServing a length: what a fixed max_tokens serves, at the step's length.
        self.serving = {
            t: native_res.PatchServing(geometry, n, dataclasses.replace(opts, patches=naflex.Patches(p.size, t)))
            for t in self.lengths
        }
        self.row_shape = self.serving[self.lengths[-1]].row_shape  # the longest length's row
        # The ring's row: (rows × this) holds every step's rows × length × p·p·3 values.
        most = int(max(b * t for b, t in zip(self.sizes, self.lengths)))
        self.ring_row = (-(-most // self.biggest), p.size * p.size * 3)
        self._schedule = functools.lru_cache(maxsize=2)(self._epoch)

    def _epoch(self, epoch: int) -> naflex.LengthSchedule:
        o = self.opts
        return naflex.length_schedule(
            self.n, o.patches, seed=o.seed, epoch=epoch, drop_remainder=o.drop_remainder, shuffle=o.shuffle
        )

    def steps(self, epoch: int = 0) -> int:
        """Steps of epoch `epoch` (the same count every epoch: its batches are permuted)."""
        return len(self._schedule(int(epoch)).seq_len)

    def _index(self, epoch: int, first: int) -> int:
        s = self._schedule(int(epoch))
        k = int(np.searchsorted(s.first, first))
        if k >= len(s.first) or s.first[k] != first:
            raise ValueError(
                f"position {first} of epoch {epoch} is not the start of a step of the length schedule "
                f"{self.opts.patches} (a state saved under another schedule resumes at an epoch boundary)"
            )
        return k

    def starts(self, epoch: int, position: int = 0):
        """The first positions of the steps of `epoch` from the one starting at `position`."""
        s = self._schedule(int(epoch))
        if position >= self.n or (len(s.first) and position > s.first[-1]):
            return []
        return s.first[self._index(epoch, position) :].tolist()

    def step(self, epoch: int, first: int) -> tuple[int, int, int, int]:
        """(length, batch size, first position, real rows) of the step at `first`."""
        s, k = self._schedule(int(epoch)), self._index(epoch, first)
        return int(s.seq_len[k]), int(s.batch_size[k]), int(s.first[k]), int(s.count[k])

    def next_cursor(self, epoch: int, first: int) -> tuple[int, int]:
        """The cursor after the step at `first`: the next step's start, or the next epoch."""
        s, k = self._schedule(int(epoch)), self._index(epoch, first)
        return (epoch, int(s.first[k + 1])) if k + 1 < len(s.first) else (epoch + 1, 0)

    def layout(self, epoch: int, first: int) -> RowLayout:
        """This process's rows of the step at `first` (its batch split evenly over the ranks or
        the sharding's batch shards, as the loader's batch_size is)."""
        return self.layouts[self.step(epoch, first)[1]]

    def ranges(self, epoch: int, first: int) -> tuple[tuple[int, int], ...]:
        """This process's row ranges of the step at `first`."""
        return self.layout(epoch, first).ranges

    def patches(self, epoch: int, first: int) -> native_res.PatchServing:
        """The serving of the step's length."""
        return self.serving[self.step(epoch, first)[0]]

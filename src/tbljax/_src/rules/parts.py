"""The steps of an epoch and host parts: how many steps an epoch of N samples has at a global
batch G, where the cursor goes after a step, and `Parts`, the record counts of every
process's part (one part, the whole dataset, is the global order). Pure integer arithmetic.

**Steps.** With G the global batch, step s of an epoch that starts at position p0 (0, or the
position a resumed run starts from) covers positions [p0 + s*G, p0 + (s+1)*G). With
``drop_remainder`` the last partial step is dropped; without it the last step is padded past
N and a ``valid`` mask marks real rows.

**Host parts** (``tbljax.loader(..., partition="host")``). Process p of P serves only the
records of its part: global indices [start_p, start_p + n_p), the parts in process order
(`tbljax.host_part` of the shard files, or of the records of a single file). Its
local position x of epoch e holds sample ``start_p + permute(x, n_p, seed, e)``: each part is
reshuffled every epoch by the same (seed, epoch) key. Step s of an epoch covers local positions
[s*b, (s+1)*b) of every part, b = G / P, and every process runs the same steps: with
``drop_remainder`` as many as the smallest part fills, min(n_p // b); without, as many as the
largest part needs, max(ceil(n_p / b)), the parts that run out first padding their rows.
`Parts` holds the counts; with one part (the whole dataset, start 0) it is the global order.
"""

from __future__ import annotations

import dataclasses

from tbljax._src.rules.contract import is_integer

__all__ = ["MAX_SAMPLES", "Parts", "advance", "steps_in_epoch"]

MAX_SAMPLES = 1 << 62  # the shuffle's halves stay within 32 bits


def _check_batch(n, global_batch):
    if not is_integer(n) or not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"n (the number of samples) must be an integer in [1, 2**62], got {n!r}")
    if not is_integer(global_batch) or global_batch < 1:
        raise ValueError(f"global batch must be an integer >= 1, got {global_batch!r}")


def steps_in_epoch(n: int, global_batch: int, *, drop_remainder: bool, start: int = 0) -> int:
    """Steps left in an epoch of n samples from position `start` (0: a whole epoch).

    >>> steps_in_epoch(10, 4, drop_remainder=True), steps_in_epoch(10, 4, drop_remainder=False)
    (2, 3)
    """
    _check_batch(n, global_batch)
    if not 0 <= start <= n:
        raise ValueError(f"start position must be in [0, {n}], got {start!r}")
    left = n - start
    return left // global_batch if drop_remainder else -(-left // global_batch)


def advance(epoch: int, position: int, n: int, global_batch: int, *, drop_remainder: bool):
    """The cursor (epoch, position) after a step that ended at `position`: the start of the
    next epoch once this one has no step left (so a saved state never points at a spent tail).

    >>> advance(0, 8, 10, 4, drop_remainder=True), advance(0, 8, 10, 4, drop_remainder=False)
    ((1, 0), (0, 8))
    """
    position = min(position, n)
    if steps_in_epoch(n, global_batch, drop_remainder=drop_remainder, start=position) == 0:
        return epoch + 1, 0
    return epoch, position


@dataclasses.dataclass(frozen=True)
class Parts:
    """The record counts of every process's part and which part is this process's (see
    "Host parts" in the module docstring). ``Parts.whole(n)``: one part, the whole dataset (the global order).

    >>> p = Parts((5, 3), index=1)
    >>> p.start, p.n, p.steps(2, drop_remainder=True), p.steps(2, drop_remainder=False)
    (5, 3, 1, 3)
    """

    counts: tuple[int, ...]
    index: int = 0

    def __post_init__(self):
        counts = tuple(int(c) for c in self.counts)
        object.__setattr__(self, "counts", counts)
        if not counts or not 0 <= self.index < len(counts):
            raise ValueError(f"part {self.index} is not one of the {len(counts)} parts")
        empty = [p for p, c in enumerate(counts) if c < 1]
        if empty:
            raise ValueError(
                f"the parts of processes {empty} hold no records (part sizes "
                f"{list(counts)}): every process needs at least one record"
            )

    @classmethod
    def whole(cls, n: int) -> "Parts":
        return cls((n,), 0)

    @property
    def start(self) -> int:
        """Global index of this part's first record."""
        return sum(self.counts[: self.index])

    @property
    def n(self) -> int:
        return self.counts[self.index]

    def times(self, k: int) -> "Parts":
        """These parts with every count times k: the positions of an epoch with repeats=k."""
        return self if k == 1 else Parts(tuple(c * k for c in self.counts), self.index)

    def steps(self, batch: int, *, drop_remainder: bool, start: int = 0) -> int:
        """Steps left from local position `start` with `batch` rows of each part a step: the
        same on every process."""
        left = [steps_in_epoch(c, batch, drop_remainder=drop_remainder, start=min(start, c)) for c in self.counts]
        return min(left) if drop_remainder else max(left)

    def advance(self, epoch: int, position: int, batch: int, *, drop_remainder: bool):
        """`advance` for parts: the cursor after a step that ended at local `position`."""
        position = min(position, max(self.counts))
        if self.steps(batch, drop_remainder=drop_remainder, start=position) == 0:
            return epoch + 1, 0
        return epoch, position

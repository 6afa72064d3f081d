"""Row placement: which rows of each global batch this process builds (`RowLayout`), from a JAX
sharding (`jax/sharding.py` reads it) or, framework-free, from a rank. The ring (`ring.py`) lays its slots out by it and
the JAX room (`jax/arrays.py`) assembles global arrays by it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RowLayout", "register_from_sharding"]

# How a JAX sharding becomes a RowLayout (`jax/sharding.row_layout`): the engine imports no
# framework, so the JAX room registers it when it is imported (as it registers its while loop
# with `rules/order.py`).
_FROM_SHARDING = None


def register_from_sharding(fn) -> None:
    """`fn(sharding, global_batch) -> RowLayout` is what `RowLayout.create` runs."""
    global _FROM_SHARDING
    _FROM_SHARDING = fn


@dataclass(frozen=True)
class RowLayout:
    """Where the rows of a global batch of `global_batch` rows live for this process (the
    placement of rows, not the pixel layout "NHWC" / "NCHW" of `LoaderOptions.layout`).

    Made from a JAX sharding (`tbljax.row_layout`, `jax/sharding.py`) or, framework-free,
    from a rank (`for_rank`). ``ranges``: the distinct (start, stop) row
    ranges on this process's devices, sorted; each is built once even when several devices
    hold it (replication). ``devices``: per addressable device, (device, index into ranges).
    """

    sharding: object
    global_batch: int
    ranges: tuple[tuple[int, int], ...]
    devices: tuple[tuple[object, int], ...]

    @classmethod
    def create(cls, sharding, global_batch: int) -> "RowLayout":
        """The rows a JAX `sharding` gives this process's devices: `tbljax.row_layout`."""
        if _FROM_SHARDING is None:
            raise RuntimeError("RowLayout.create needs the JAX room: import tbljax first")
        return _FROM_SHARDING(sharding, global_batch)

    @classmethod
    def from_spans(cls, sharding, global_batch: int, spans: dict) -> "RowLayout":
        """From each addressable device's (start, stop) rows of the batch (what a JAX sharding
        gives: `tbljax.row_layout`, in the JAX room)."""
        ranges = tuple(sorted(set(spans.values())))
        where = {r: i for i, r in enumerate(ranges)}
        devices = tuple((d, where[spans[d]]) for d in spans)
        return cls(sharding, global_batch, ranges, devices)

    @classmethod
    def for_rank(cls, global_batch: int, rank: int, world_size: int) -> "RowLayout":
        """Rank `rank` of `world_size` holds rows [rank*b, (rank+1)*b) of each global batch,
        b = global_batch / world_size: the rows the JAX loader's default sharding gives
        process `rank` (jax.devices() lists processes in order). No devices, no jax.

        >>> RowLayout.for_rank(8, 1, 4).ranges
        ((2, 4),)
        """
        if global_batch % world_size:
            raise ValueError(f"global batch {global_batch} does not split evenly over world_size {world_size}")
        b = global_batch // world_size
        return cls(None, global_batch, ((rank * b, (rank + 1) * b),), ())

    def resized(self, global_batch: int) -> "RowLayout":
        """The same placement for a batch of `global_batch` rows (a length schedule's steps
        change size): the same sharding's rows, or the same rank of the same world size."""
        if self.sharding is not None:
            return RowLayout.create(self.sharding, global_batch)
        if len(self.ranges) != 1:
            raise ValueError(f"a layout of several row ranges without a sharding cannot be resized: {self.ranges}")
        local = self.local_rows
        return RowLayout.for_rank(global_batch, self.ranges[0][0] // local, self.global_batch // local)

    @property
    def shards(self) -> int:
        """How many pieces the batch axis is cut into (ranks, or a sharding's batch shards)."""
        a, b = self.ranges[0]
        return self.global_batch // (b - a)

    @property
    def local_rows(self) -> int:
        return sum(b - a for a, b in self.ranges)

    def process_local(self, processes: int) -> "RowLayout":
        """This process's rows as a batch of their own, for host-local reading: each of
        `processes` processes fills G / P contiguous rows of every global batch from its own
        part of the data, so its rows are local positions [0, G/P). The ranges keep their
        sizes and order (a slot made for it holds the pieces `tbljax._src.jax.arrays.to_global` of `self` takes).

        >>> RowLayout.for_rank(8, 1, 2).process_local(2).ranges
        ((0, 4),)
        """
        g, p = self.global_batch, int(processes)
        if g % p:
            raise ValueError(
                f"global batch {g} does not split evenly over {p} processes: "
                f"with partition='host' use a multiple of {p}"
            )
        lo, hi = self.ranges[0][0], self.ranges[-1][1]
        contiguous = all(a == b for (_, a), (b, _) in zip(self.ranges, self.ranges[1:]))
        if not contiguous or hi - lo != g // p:
            raise ValueError(
                f"with partition='host' each process must hold G/P = {g // p} "
                f"contiguous rows of the batch, but the sharding gives this "
                f"process rows {list(self.ranges)}: shard the batch axis over "
                "all processes' devices, with no replication across processes"
            )
        return RowLayout(None, g // p, tuple((a - lo, b - lo) for a, b in self.ranges), ())

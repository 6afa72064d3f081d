"""What a loader was given, opened for ``partition="host"``: a `tbljax.mix` mixture of paths
opens each process's part of every source, paths open their own part. The one place that
tells the two apart, so the engine and the framework layers ask no dataset for its type."""

from __future__ import annotations

from tbljax._src.datasets import host_part
from tbljax._src.datasets.mixture import Mixture

__all__ = ["open_host_part"]


def open_host_part(path_or_paths, global_batch: int, rank: int, world_size: int, allgather):
    """(this process's dataset, the `Parts` its steps and state count over at global batch
    `global_batch`). `allgather(row)` exchanges a row among the `world_size` processes (every
    rank's row in rank order): the framework layer passes its own collective."""
    if isinstance(path_or_paths, Mixture):
        part = path_or_paths.open_part(rank, world_size, allgather)
        return part, part.step_parts(global_batch)
    local = host_part.open_part(path_or_paths, rank, world_size, allgather)
    return local.dataset, local.parts

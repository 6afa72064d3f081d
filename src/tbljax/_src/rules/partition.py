"""tbljax.partition: which part of a list of items (shard files, or records of one file) each
process of a multi-process JAX job owns. One rule, used by staging (`tbljax.stage`) and by
host-local reading (`tbljax.loader(..., partition="host")`), so a host stages exactly the files
it will read.

The rule: process p of P owns the contiguous block ``[p * n // P, (p + 1) * n // P)``. Blocks
differ in size by at most one item, and the parts of all processes are the items, each once.

>>> [list(host_part(5, p, 2)) for p in range(2)]
[[0, 1], [2, 3, 4]]
"""
from __future__ import annotations

__all__ = ["host_part"]


def host_part(count: int, index: int | None = None, processes: int | None = None) -> range:
    """The items of process `index` of `processes` (default: this process of the running JAX
    job, ``jax.process_index()`` of ``jax.process_count()``) among `count` items."""
    if index is None or processes is None:
        import jax  # only when asked about the running job

        index = jax.process_index() if index is None else index
        processes = jax.process_count() if processes is None else processes
    count, index, processes = int(count), int(index), int(processes)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if processes < 1 or not 0 <= index < processes:
        raise ValueError(f"process index {index} is not in [0, {processes})")
    return range(index * count // processes, (index + 1) * count // processes)

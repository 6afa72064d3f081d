"""What JAX knows of the running job, handed to the framework-free rooms: this process's index
and count (`host_part`'s default), the exchange of a row among the processes that
``partition="host"`` passes to `datasets/host_part.py`, and jax.numpy's while loop for the
array code of `rules/order.py`. jax is imported when these are called, so `import tbljax`
stays quick; the loop is registered with `rules/order.py` when this module is imported."""

from __future__ import annotations

import numpy as np

from tbljax._src.rules import order, partition

__all__ = ["host_part", "process_allgather", "while_loop"]


def process() -> tuple[int, int]:
    """(jax.process_index(), jax.process_count())."""
    import jax

    return jax.process_index(), jax.process_count()


def host_part(count: int, index: int | None = None, processes: int | None = None) -> range:
    """The items of process `index` of `processes` among `count` items (`rules/partition.py`'s
    rule); by default this process of the running JAX job, ``jax.process_index()`` of
    ``jax.process_count()``.

    >>> [list(tbljax.host_part(5, p, 2)) for p in range(2)]
    [[0, 1], [2, 3, 4]]
    """
    if index is None or processes is None:
        here, count_here = process()
        index = here if index is None else index
        processes = count_here if processes is None else processes
    return partition.host_part(count, index, processes)


def process_allgather(row: np.ndarray) -> np.ndarray:
    """Every JAX process's `row`, in process order: (process_count, len(row))."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(row))


def while_loop(cond, body, init):
    """jax.lax.while_loop: the loop `rules/order.py` runs under jax.numpy (also inside jit)."""
    import jax

    return jax.lax.while_loop(cond, body, init)


order.register_while_loop("jax.numpy", while_loop)

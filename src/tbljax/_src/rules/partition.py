"""Which part of a list of items (shard files, or records of one file) each
process of a multi-process JAX job owns. One rule, used by staging (`tbljax.stage`), by
host-local reading (`tbljax.loader(..., partition="host")`), so a host stages exactly the files
it will read, and by `convert(..., shard=(i, n))`; and the one parser of a part written
(i, n) or 'i/n'.

The rule: process p of P owns the contiguous block ``[p * n // P, (p + 1) * n // P)``. Blocks
differ in size by at most one item, and the parts of all processes are the items, each once.

>>> [list(host_part(5, p, 2)) for p in range(2)]
[[0, 1], [2, 3, 4]]
"""

from __future__ import annotations

import re
from typing import Any

from tbljax._src.rules.contract import Arg, ArgumentError, is_integer

__all__ = ["host_part", "parse_part"]


def host_part(count: int, index: int, processes: int) -> range:
    """The items of process `index` of `processes` among `count` items (`tbljax.host_part`, in
    the JAX room, defaults them to this process of the running JAX job)."""
    count, index, processes = int(count), int(index), int(processes)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if processes < 1 or not 0 <= index < processes:
        raise ValueError(f"process index {index} is not in [0, {processes})")
    return range(index * count // processes, (index + 1) * count // processes)


def parse_part(spec: Any, what: str, forms: str = "(i, n) or 'i/n'") -> tuple[int, int]:
    """Part i of n as (i, n) from (i, n) (a tuple or list of two ints, not bools) or 'i/n'
    (decimal digits, spaces allowed around them), checked: 0 <= i < n. ValueError otherwise,
    naming the argument `what` and the `forms` it takes."""
    if isinstance(spec, str):
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
        if not m:
            raise ArgumentError(Arg(what), f" must be {forms}, got {spec!r}")
        spec = (int(m[1]), int(m[2]))
    if not (isinstance(spec, (tuple, list)) and len(spec) == 2 and all(is_integer(x) for x in spec)):
        raise ArgumentError(Arg(what), f" must be {forms}, got {spec!r}")
    i, n = spec
    if not (n >= 1 and 0 <= i < n):  # named as an Arg: the CLI reads `--shard 3/2 needs ...`
        raise ArgumentError(Arg(what), f" {i}/{n} needs part i of n with 0 <= i < n")
    return i, n

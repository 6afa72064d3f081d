"""The memory this process may still fill: what the kernel says is available (MemAvailable), less
where this process's cgroup (v2) allows less (a container's limit). One home for the rule the
whole-source sweep (`engine/file_sweep.py`) and the resident dataset's check on CPU
(`jax/resident_host.py`) both follow.

The files are read at the paths in `SYSTEM` (a test points them at files of its own).
"""

from __future__ import annotations

import dataclasses
import os

__all__ = ["SYSTEM", "Paths", "available_bytes"]


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where the kernel says it: /proc/meminfo, this process's cgroup line (``0::/path``), and
    the cgroup v2 hierarchy's root."""

    meminfo: str = "/proc/meminfo"
    cgroup: str = "/proc/self/cgroup"
    cgroup_root: str = "/sys/fs/cgroup"


SYSTEM = Paths()


def available_bytes(paths: Paths | None = None) -> int | None:
    """Bytes this process may fill: MemAvailable (sysconf's available pages without
    /proc/meminfo), or the cgroup's memory.max less its memory.current when that is less;
    None where neither is known (macOS, Windows)."""
    paths = paths or SYSTEM
    try:
        with open(paths.meminfo) as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        avail = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:  # "0::/path" names the cgroup (v2); its memory.max is "max" or a byte count
        with open(paths.cgroup) as f:
            path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
        with open(f"{paths.cgroup_root}{path}/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open(f"{paths.cgroup_root}{path}/memory.current") as f:
                avail = min(avail, int(limit) - int(f.read()))
    except (OSError, StopIteration, ValueError):
        pass  # no cgroup v2 limit to read: MemAvailable alone
    return max(avail, 0)

"""Two real processes on localhost for the combination matrix: the parent's launcher and the
workers' joining of one 2-process JAX runtime and one 2-rank torch.distributed (gloo) group."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(worker: Path, spec: Path, tmp_path: Path, timeout: float = 300) -> list[dict]:
    """Runs `worker PROCESS_ID JAX_PORT TORCH_PORT SPEC OUT_NPZ` as processes 0 and 1; returns
    what each saved (a dict of arrays), or fails with the end of their output."""
    ports = [str(_free_port()), str(_free_port())]
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(worker.parent), os.environ.get("PYTHONPATH", "")]),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(p), *ports, str(spec), str(tmp_path / f"out{p}.npz")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for p in range(2)
    ]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)[-4000:]
    return [dict(np.load(tmp_path / f"out{p}.npz")) for p in range(2)]


def join(argv: list[str]):
    """In a worker: (process id, the spec's path, the output path) after joining the JAX
    runtime and the gloo group of the two processes."""
    import jax
    import torch.distributed as dist

    pid, jax_port, torch_port = int(argv[1]), int(argv[2]), int(argv[3])
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{jax_port}", num_processes=2, process_id=pid)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=pid, world_size=2)
    return pid, argv[4], argv[5]


def leave() -> None:
    import jax
    import torch.distributed as dist

    dist.destroy_process_group()
    jax.distributed.shutdown()

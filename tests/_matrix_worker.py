"""One process of the combination matrix's host-local row (tests/test_matrix.py).

Usage: python _matrix_worker.py PROCESS_ID JAX_PORT TORCH_PORT SPEC_JSON OUT_NPZ
Joins a 2-process JAX runtime and a 2-rank torch.distributed (gloo) group on localhost, then
serves every dataset of the spec with ``partition="host"`` through `tbljax.loader` and
`tbljax.torch.loader` (uint8, random-resized crop), and saves what this process served —
each row's global index and pixels, or the error a loader raised — for the parent to check
against the NumPy oracle.
"""
from __future__ import annotations

import json
import sys

import jax
import numpy as np


def main():
    pid, jax_port, torch_port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    spec = json.loads(open(sys.argv[4]).read())
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{jax_port}", num_processes=2,
                               process_id=pid)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=pid,
                            world_size=2)
    import tbljax
    import tbljax.torch

    aug = tbljax.Augment(size=tuple(spec["out"]))
    out = {}
    for name, paths in spec["datasets"].items():
        for framework in ("jax", "torch"):
            key = f"{name}|{framework}"
            try:
                if framework == "jax":
                    ld = tbljax.loader(paths, 2 * spec["batch"], seed=spec["seed"], dtype="uint8",
                                       augment=aug, num_epochs=1, partition="host")
                    rows = [(np.asarray(b["index"].addressable_data(0)),
                             np.asarray(b["image"].addressable_data(0))) for b in ld]
                else:
                    ld = tbljax.torch.loader(paths, spec["batch"], seed=spec["seed"],
                                             dtype="uint8", layout="NHWC", augment=aug,
                                             partition="host")
                    rows = [(b.index.numpy(), b.images.numpy()) for b in ld]
            except Exception as e:  # noqa: BLE001 - the parent says which cell raised what
                out[key + "|error"] = np.array(f"{type(e).__name__}: {e}")
                continue
            out[key + "|index"] = np.concatenate([i for i, _ in rows])
            out[key + "|image"] = np.concatenate([im for _, im in rows])
    np.savez(sys.argv[5], **out)
    dist.destroy_process_group()
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()

"""One process of the mixture row's host-local test (tests/test_matrix.py).

Usage: python _mixture_worker.py PROCESS_ID JAX_PORT TORCH_PORT SPEC_JSON OUT_NPZ
Joins a 2-process JAX runtime and a 2-rank torch.distributed (gloo) group on localhost, serves
``tbljax.mix`` of the spec's sources (paths) with ``partition="host"`` through `tbljax.loader`
(two epochs, a state saved mid-epoch and resumed by a new loader) and `tbljax.torch.loader`,
and saves what this process served — each row's index, source and pixels, the global batch's
indices gathered over the processes, the states — for the parent to check.
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
    from jax.experimental import multihost_utils

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=pid,
                            world_size=2)
    import tbljax
    import tbljax.torch

    def mixture():
        return tbljax.mix(spec["sources"], weights=spec["weights"], steps_per_epoch=spec["steps"])

    kw = dict(seed=spec["seed"], dtype="uint8", augment=tbljax.Augment(size=tuple(spec["out"])))
    out = {}

    def serve(ld, prefix, save_after=None):
        rows = {"index": [], "source": [], "image": [], "global": []}
        for k, b in enumerate(ld):
            for name in ("index", "source", "image"):
                rows[name].append(np.asarray(b[name].addressable_data(0)))
            rows["global"].append(np.asarray(
                multihost_utils.process_allgather(b["index"], tiled=True)))
            if k == save_after:
                out[prefix + "state"] = np.array(json.dumps(ld.state_dict()))
        for name, v in rows.items():
            out[prefix + name] = np.stack(v)
        out[prefix + "end_state"] = np.array(json.dumps(ld.state_dict()))

    ld = tbljax.loader(mixture(), 2 * spec["batch"], num_epochs=2, partition="host", **kw)
    out["len"] = np.array(len(ld))
    serve(ld, "jax|", save_after=spec["save_after"])
    again = tbljax.loader(mixture(), 2 * spec["batch"], num_epochs=2, partition="host", **kw)
    again.load_state_dict(json.loads(str(out["jax|state"])))
    serve(again, "resumed|")
    rows = [(b.index.numpy(), b.source.numpy(), b.images.numpy()) for b in
            tbljax.torch.loader(mixture(), spec["batch"], layout="NHWC", partition="host", **kw)]
    for i, name in enumerate(("index", "source", "image")):
        out["torch|" + name] = np.stack([r[i] for r in rows])
    np.savez(sys.argv[5], **out)
    dist.destroy_process_group()
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()

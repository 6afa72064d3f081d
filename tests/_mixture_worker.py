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

import jax  # noqa: F401 - imported before tbljax, as a user's program does
import numpy as np

import _two_jobs


def main():
    pid, spec_path, out_path = _two_jobs.join(sys.argv)
    spec = json.loads(open(spec_path).read())
    from jax.experimental import multihost_utils

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
            rows["global"].append(np.asarray(multihost_utils.process_allgather(b["index"], tiled=True)))
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
    rows = [
        (b.index.numpy(), b.source.numpy(), b.images.numpy())
        for b in tbljax.torch.loader(mixture(), spec["batch"], layout="NHWC", partition="host", **kw)
    ]
    for i, name in enumerate(("index", "source", "image")):
        out["torch|" + name] = np.stack([r[i] for r in rows])
    np.savez(out_path, **out)
    _two_jobs.leave()


if __name__ == "__main__":
    main()

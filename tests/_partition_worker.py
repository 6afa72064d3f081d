"""One process of the host-local reading tests (tests/test_partition.py).

Usage: python _partition_worker.py PROCESS_ID PROCESSES PORT SPEC_JSON OUT_JSON
Joins a P-process JAX runtime on localhost and runs the loaders the spec asks for with
partition="host". Its paths are the full list of shard paths, of which only this process's
part exists here (a staged host). Each step it checks its own rows against the NumPy reference
(pixels, flips, labels, padding), gathers the global arrays over all processes, and writes what
it saw to OUT_JSON for the parent test to check across processes.
"""

from __future__ import annotations

import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]

import jax  # noqa: E402
import numpy as np  # noqa: E402

import _loader_testing as T  # noqa: E402


def serve(ld, pid, ref, labels, *, save_after=()):
    """Runs the loader; returns per step what this process held and the gathered arrays."""
    from jax.experimental import multihost_utils

    local_rows = ld.options.batch_size // jax.process_count()
    steps, states = [], {}
    for k, b in enumerate(ld):
        held = T.rows(b["index"])
        assert sorted(held) == list(range(pid * local_rows, (pid + 1) * local_rows)), sorted(held)
        img, lab = T.rows(b["image"]), T.rows(b["label"])
        val = T.rows(b["valid"]) if "valid" in b else {r: True for r in held}
        idx, flips = [], []
        for r in sorted(held):
            i = int(held[r])
            idx.append(i)
            if not val[r]:
                assert i == -1 and lab[r] == -1 and not img[r].any()
                flips.append(None)
                continue
            assert lab[r] == labels[i], (lab[r], labels[i])
            if np.array_equal(img[r], ref[i]):
                flips.append(False)
            else:
                assert np.array_equal(img[r], ref[i][:, ::-1]), f"row {r}: not sample {i}"
                flips.append(True)
        gathered = np.asarray(multihost_utils.process_allgather(b["index"], tiled=True))
        steps.append(
            {
                "local": idx,
                "valid": [bool(val[r]) for r in sorted(held)],
                "flips": flips,
                "global": gathered.tolist(),
                "cursor": list(ld.cursor),
            }
        )
        if k in save_after:
            states[k] = ld.state_dict()
    return {
        "steps": steps,
        "states": {str(k): v for k, v in states.items()},
        "len": len(ld),
        "end_state": ld.state_dict(),
    }


def main():
    pid, processes, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    spec = json.loads(open(sys.argv[4]).read())
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=processes, process_id=pid)
    import tbljax

    ref, labels = np.load(spec["images"]), np.load(spec["labels"])
    assert jax.process_count() == processes
    out = {}
    for name, run in spec["runs"].items():
        paths = (
            run["paths"][pid] if isinstance(run["paths"], list) and isinstance(run["paths"][0], list) else run["paths"]
        )
        kw = dict(
            seed=run["seed"],
            num_epochs=run["epochs"],
            dtype="uint8",
            augment="flip",
            drop_remainder=run["drop"],
            partition="host",
        )
        try:
            ld = tbljax.loader(paths, run["batch"], **kw)
        except Exception as e:  # a run that must fail on every process: say how
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        out[name] = serve(ld, pid, ref, labels, save_after=run.get("save_after", ()))
        out[name]["num_samples"] = ld.num_samples
        for k, batch in run.get("resume", ()):  # from the state saved after step k
            again = tbljax.loader(paths, batch, **kw)
            again.load_state_dict(out[name]["states"][str(k)])
            out[name][f"resumed_{k}_{batch}"] = serve(again, pid, ref, labels)
    with open(sys.argv[5], "w") as f:
        json.dump(out, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()

"""One host of the pod workflow test (tests/test_pod.py): stage, then read the host's part.

Usage: python _pod_worker.py PROCESS_ID PROCESSES PORT SPEC_JSON OUT_JSON
Joins a P-process JAX runtime on localhost, runs ``tbljax.stage(url, its own cache,
partition="host")`` against the test's HTTP server, then ``tbljax.loader(<the list stage
returned>, ..., partition="host")``. Each step it checks its own rows against the NumPy
pixels and labels, gathers the global index over all processes, and writes what it saw (and
what its cache holds) to OUT_JSON for the parent test to check across processes.
"""

from __future__ import annotations

import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]

import jax  # noqa: E402
import numpy as np  # noqa: E402

import _loader_testing as T  # noqa: E402


def check_assembly_aliases_the_ring(batch_size):
    """This process's rows become its part of the global array without a copy, and the ring
    slot counts as in use while the array lives (the ring's lifetime contract, engine/ring.py)."""
    import gc

    from tbljax._src.engine import ring
    from tbljax._src.jax import sharding
    from tbljax._src.jax.arrays import to_global

    whole = sharding.row_layout(sharding.batch_sharding(None), batch_size)
    slot = ring.Slot(whole.process_local(jax.process_count()), (4, 3, 3), np.uint8)
    views = slot.views()
    arr = to_global(whole, views, (4, 3, 3))
    assert [s.data.unsafe_buffer_pointer() for s in arr.addressable_shards] == [v.ctypes.data for v in views]
    del views
    assert slot.in_use()
    del arr
    gc.collect()
    assert not slot.in_use()


def main():
    pid, processes, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    spec = json.loads(open(sys.argv[4]).read())
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=processes, process_id=pid)
    from jax.experimental import multihost_utils

    import tbljax

    check_assembly_aliases_the_ring(spec["batch"])
    ref, labels = np.load(spec["images"]), np.load(spec["labels"])
    cache = os.path.join(spec["caches"], f"host{pid}")
    paths = tbljax.stage(spec["url"], cache, partition="host", retry_backoff=0.01)
    ld = tbljax.loader(
        paths,
        spec["batch"],
        seed=spec["seed"],
        num_epochs=spec["epochs"],
        dtype="uint8",
        drop_remainder=False,
        partition="host",
    )
    steps = []
    for b in ld:
        img, lab, idx, val = (T.rows(b[k]) for k in ("image", "label", "index", "valid"))
        local = []
        for r in sorted(idx):
            i = int(idx[r])
            if val[r]:
                assert lab[r] == labels[i] and np.array_equal(img[r], ref[i]), f"row {r}: not {i}"
                local.append(i)
            else:
                assert i == -1 and lab[r] == -1 and not img[r].any(), f"row {r}: bad padding"
        gathered = np.asarray(multihost_utils.process_allgather(b["index"], tiled=True))
        epoch, position = ld.cursor
        steps.append(
            {
                "epoch": epoch if position else epoch - 1,
                "rows": sorted(idx),
                "valid": local,
                "global": gathered.tolist(),
            }
        )
    out = {
        "paths": paths,
        "cache": sorted(os.listdir(cache)),
        "len": len(ld),
        "steps": steps,
        "num_samples": ld.num_samples,
    }
    with open(sys.argv[5], "w") as f:
        json.dump(out, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()

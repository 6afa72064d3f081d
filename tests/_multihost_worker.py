"""One process of the two-process loader test (tests/test_loader.py::test_two_processes).

Usage: python _multihost_worker.py PROCESS_ID PORT TBL_PATH OUT_JSON
Run with XLA_FLAGS=--xla_force_host_platform_device_count=2. Joins a 2-process JAX runtime on
localhost, serves one padded epoch, checks its own rows and the gathered global arrays
against NumPy, counts the indices its kernel calls received, and writes what it saw to OUT_JSON.
"""

from __future__ import annotations

import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]

import jax  # noqa: E402
import numpy as np  # noqa: E402

import _loader_testing as T  # noqa: E402

G = 8
SEED = 3


def main():
    pid, port, path, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from jax.experimental import multihost_utils

    import tbljax
    from tbljax import order
    from tbljax._src.engine import kernels

    seen = []
    real_prepare = kernels.prepare_gather  # what the loader calls for each batch of RAW rows

    def counting_prepare(source, indices, out, **kw):
        seen.extend(int(i) for i in indices)
        return real_prepare(source, indices, out, **kw)

    kernels.prepare_gather = counting_prepare

    ds = tbljax.open(path)
    data, labels = ds.view(), ds.labels
    n = len(ds)
    assert jax.process_count() == 2 and len(jax.local_devices()) == 2 and len(jax.devices()) == 4
    ld = tbljax.loader(ds, G, seed=SEED, num_epochs=1, drop_remainder=False)
    local_indices, stream, state_after_2 = [], [], None
    for step, b in enumerate(ld):
        assert b["image"].shape == (G, *data.shape[1:]) and not b["image"].is_fully_addressable
        mine = T.rows(b["index"])
        assert sorted(mine) == list(range(4 * pid, 4 * pid + 4)), sorted(mine)
        img, lab, val = T.rows(b["image"]), T.rows(b["label"]), T.rows(b["valid"])
        for r, i in mine.items():
            i = int(i)
            if val[r]:
                local_indices.append(i)
                ref = T.normalize(data[i : i + 1], tbljax.IMAGENET_MEAN, tbljax.IMAGENET_STD)[0]
                assert np.array_equal(img[r], ref) and lab[r] == labels[i]
            else:
                assert i == -1 and lab[r] == -1 and not img[r].any()
        # The global arrays, gathered across both processes, match the order and the labels.
        idx = np.asarray(multihost_utils.process_allgather(b["index"], tiled=True))
        valid = np.asarray(multihost_utils.process_allgather(b["valid"], tiled=True))
        pos = step * G + np.arange(G)
        assert np.array_equal(valid, pos < n)
        assert np.array_equal(idx[valid], order.permute(pos[pos < n], n, SEED, 0))
        total = int(jax.jit(lambda x: x.sum())(b["label"]))
        assert total == int(labels[idx[valid]].sum()) - int((~valid).sum()), total
        stream.extend(idx[valid].tolist())
        if step == 1:
            state_after_2 = ld.state_dict()
    assert ld.state_dict()["epoch"] == 1 and ld.state_dict()["position"] == 0
    with open(out_path, "w") as f:
        json.dump(
            {
                "kernel_indices": seen,
                "local_indices": local_indices,
                "stream": stream,
                "state_after_2": state_after_2,
                "steps": len(ld),
            },
            f,
        )
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()

"""One process of the combination matrix's host-local row (tests/test_matrix.py).

Usage: python _matrix_worker.py PROCESS_ID JAX_PORT TORCH_PORT SPEC_JSON OUT_NPZ
Joins a 2-process JAX runtime and a 2-rank torch.distributed (gloo) group on localhost, then
serves every dataset of the spec with ``partition="host"`` through `tbljax.loader` and
`tbljax.torch.loader` (uint8, random-resized crop), and saves what this process served —
each row's global index, pixels and record fields (str/json ones as JSON text), or the error a
loader raised — for the parent to check against the NumPy oracle and the source values.
"""

from __future__ import annotations

import json
import sys

import jax  # noqa: F401 - imported before tbljax, as a user's program does
import numpy as np

import _two_jobs

IMAGE_KEYS = ("image", "label", "index", "valid")


def _fields_of(named: dict, host) -> dict:
    """This process's rows of each field: arrays (via `host`) as they are, lists as JSON text."""
    return {k: (json.dumps(v) if isinstance(v, list) else host(v)) for k, v in named.items() if k not in IMAGE_KEYS}


def main():
    pid, spec_path, out_path = _two_jobs.join(sys.argv)
    spec = json.loads(open(spec_path).read())

    import tbljax
    import tbljax.torch

    aug = tbljax.Augment(size=tuple(spec["out"]))
    out = {}
    for name, paths in spec["datasets"].items():
        for framework in ("jax", "torch"):
            key = f"{name}|{framework}"
            kw = spec["serve"][name]
            try:
                if framework == "jax":
                    ld = tbljax.loader(
                        paths,
                        2 * spec["batch"],
                        seed=spec["seed"],
                        dtype="uint8",
                        augment=aug,
                        num_epochs=1,
                        partition="host",
                        **kw,
                    )
                    rows = [
                        (
                            np.asarray(b["index"].addressable_data(0)),
                            np.asarray(b["image"].addressable_data(0)),
                            _fields_of(b, lambda a: np.asarray(a.addressable_data(0))),
                        )
                        for b in ld
                    ]
                else:
                    ld = tbljax.torch.loader(
                        paths,
                        spec["batch"],
                        seed=spec["seed"],
                        dtype="uint8",
                        layout="NHWC",
                        augment=aug,
                        partition="host",
                        **kw,
                    )
                    rows = [(b.index.numpy(), b.images.numpy(), _fields_of(b.fields, lambda t: t.numpy())) for b in ld]
            except Exception as e:  # noqa: BLE001 - the parent says which cell raised what
                out[key + "|error"] = np.array(f"{type(e).__name__}: {e}")
                continue
            out[key + "|index"] = np.concatenate([i for i, _, _ in rows])
            out[key + "|image"] = np.concatenate([im for _, im, _ in rows])
            for f in rows[0][2]:
                got = [fs[f] for _, _, fs in rows]
                out[f"{key}|field|{f}"] = (
                    np.array(json.dumps([x for g in got for x in json.loads(g)]))
                    if isinstance(got[0], str)
                    else np.concatenate(got)
                )
    np.savez(out_path, **out)
    _two_jobs.leave()


if __name__ == "__main__":
    main()

"""One process of the two-process NaFlex length schedule test (tests/test_native_res.py).

Usage: python _lengths_worker.py PROCESS_ID JAX_PORT TORCH_PORT PATH OUT_NPZ
Joins a 2-process JAX runtime on localhost, serves PATH through `tbljax.loader` with a length
schedule (each step's global batch split over the two processes) and saves this process's rows
of every step, and each step's global shape, for the parent to check against `HostLoader`.
"""

from __future__ import annotations

import sys

import jax  # noqa: F401 - imported before tbljax, as a user's program does
import numpy as np

import _two_jobs

KEYS = ("image", "index", "label", "valid", "patch_yx", "patch_valid")


def main():
    _, path, out_path = _two_jobs.join(sys.argv)
    import tbljax

    sched = tbljax.Patches(size=4, max_tokens=[36, 64, 16], tokens_per_batch=256, batch_divisor=2)
    ld = tbljax.loader(
        path, 16, patches=sched, seed=5, dtype="uint8", augment="flip", drop_remainder=False, num_epochs=1
    )
    out = {}
    for s, b in enumerate(ld):
        out[f"{s}|shape"] = np.array(b["image"].shape)
        out.update({f"{s}|{k}": np.asarray(b[k].addressable_data(0)) for k in KEYS})
    np.savez(out_path, **out)
    _two_jobs.leave()


if __name__ == "__main__":
    main()

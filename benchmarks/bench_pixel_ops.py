"""The pixel program's cost per op (issue 47's Fast): each RandAugment op code alone (magnitude 9,
bilinear, and the affine ops also at nearest) on 64 rows of 224 x 224 through `kernels.gather`
(uint8 out, no crop: the resize is a copy), the median of runs minus the median of the same
gather with no op, as wall-clock µs per image on the default pool, and as CPU µs per image (all
threads: on a shared host the steadier figure). The active SIMD target is
TBLJAX_SIMD's (default: the best the CPU has).

    python benchmarks/bench_pixel_ops.py [--runs 15] [--ops Rotate,ShearX]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import kodak_photos, machine  # noqa: E402

ROWS, SIZE = 64, 224


def photos() -> np.ndarray:
    from PIL import Image

    paths = kodak_photos()[:: max(1, len(kodak_photos()) // ROWS)][:ROWS]
    return np.stack([np.asarray(Image.open(p).convert("RGB").resize((SIZE, SIZE))) for p in paths])


def timed(src, out, ops, runs: int) -> tuple[float, float]:
    """Median wall-clock and CPU (all threads) seconds of a gather."""
    from tbljax._src.engine import kernels

    idx = np.arange(len(src), dtype=np.int64)
    kernels.gather(src, idx, out, ops=ops)  # warm-up
    wall, cpu = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        kernels.gather(src, idx, out, ops=ops)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--ops", default="", help="comma-separated op names (default: every RandAugment op)")
    a = ap.parse_args()
    import tbljax
    from tbljax._src.engine import kernels
    from tbljax._src.rules import pixel_ops, randaug

    src = photos()
    out = np.empty_like(src)
    names = a.ops.split(",") if a.ops else [n for n, c in pixel_ops.CODES.items() if 0 < c < pixel_ops.CODES["Cutout"]]
    base = timed(src, out, None, a.runs)
    print(f"# {machine()}; tbljax kernel target {tbljax.kernels.kernel_target()}")
    print(
        f"# {len(src)} rows of {SIZE}x{SIZE}, median of {a.runs} runs;"
        f" no-op gather {1e6 * base[0] / len(src):.1f} µs/image"
    )
    print(f"{'op':<16}{'interp':<10}{'µs/image':>10}{'CPU µs/image':>14}")
    for name in names:
        affine = pixel_ops.CODES[name] in pixel_ops.AFFINE
        for interp in ("bilinear", "nearest") if affine else ("bilinear",):
            ra = randaug.RandAugment(num_ops=1, fill=(128, 128, 128), interpolation=interp)
            code, arg = randaug.op_arg(ra, name, 9.0)
            codes = np.full((len(src), 1), code, np.uint8)
            args = np.full((len(src), 1), arg, np.int32)
            ops = kernels.pixel_program(codes, args, (SIZE, SIZE), policies=(ra,))
            wall, cpu = (1e6 * (v - b) / len(src) for v, b in zip(timed(src, out, ops, a.runs), base))
            print(f"{name:<16}{interp:<10}{wall:>10.1f}{cpu:>14.1f}")


if __name__ == "__main__":
    main()

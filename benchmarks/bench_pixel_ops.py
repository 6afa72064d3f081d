"""The pixel program's cost per op (issue 47's Fast): each RandAugment op code alone (magnitude 9,
bilinear, and the affine ops also at nearest) on 64 rows through `kernels.gather`, the median of
runs minus the median of the same gather with no op, as wall-clock µs per image on the default
pool, and as CPU µs per image (all threads: on a shared host the steadier figure). The active
SIMD target is TBLJAX_SIMD's (default: the best the CPU has).

Default: 224 x 224 rows, uint8 out, no crop (the resize is a copy): the op's own work.

``--pipeline``: the loader's shape instead -- 256 x 384 rows (shorter side 256), one box of
230 x 300 resized to 224 x 224, every row an op, against the same gather with no op run just
before it (medians of the pairs); CPU µs per image for uint8 out and for float32 out
(ImageNet mean and std, into a page-aligned batch as the loader's ring slots are, so the
stores are non-temporal). The float32 column less the uint8 one is what the op costs the
normalize: a row with ops is resized to uint8 first and normalized after its program -- in one
pass over the whole image after it, unless the last op is a bilinear affine op or Sharpness,
which hand their rows on as they finish them. Also a row for random erasing alone
(RandomErasing(p=1)'s boxes, float32 only).

    python benchmarks/bench_pixel_ops.py [--runs 15] [--ops Rotate,ShearX] [--pipeline]
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
SOURCE_HW, BOX = (256, 384), (8, 20, 230, 300)  # --pipeline: the rows and the crop box
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def photos(hw=(SIZE, SIZE)) -> np.ndarray:
    from PIL import Image

    paths = kodak_photos()[:: max(1, len(kodak_photos()) // ROWS)][:ROWS]
    return np.stack([np.asarray(Image.open(p).convert("RGB").resize(hw[::-1])) for p in paths])


def timed(src, out, ops, runs: int, **kw) -> tuple[float, float]:
    """Median wall-clock and CPU (all threads) seconds of a gather."""
    from tbljax._src.engine import kernels

    idx = np.arange(len(src), dtype=np.int64)
    kernels.gather(src, idx, out, ops=ops, **kw)  # warm-up
    wall, cpu = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        kernels.gather(src, idx, out, ops=ops, **kw)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def programs(names):
    """(name, interpolation, pixel program) of each op alone on every row, magnitude 9."""
    from tbljax._src.engine import kernels
    from tbljax._src.rules import pixel_ops, randaug

    for name in names:
        affine = pixel_ops.CODES[name] in pixel_ops.AFFINE
        for interp in ("bilinear", "nearest") if affine else ("bilinear",):
            ra = randaug.RandAugment(num_ops=1, fill=(128, 128, 128), interpolation=interp)
            code, arg = randaug.op_arg(ra, name, 9.0)
            codes = np.full((ROWS, 1), code, np.uint8)
            args = np.full((ROWS, 1), arg, np.int32)
            yield name, interp, kernels.pixel_program(codes, args, (SIZE, SIZE), policies=(ra,))


def per_op(names, runs: int) -> None:
    src = photos()
    out = np.empty_like(src)
    base = timed(src, out, None, runs)
    no_op = 1e6 * base[0] / len(src)
    print(f"# {len(src)} rows of {SIZE}x{SIZE}, median of {runs} runs; no-op gather {no_op:.1f} µs/image")
    print(f"{'op':<16}{'interp':<10}{'µs/image':>10}{'CPU µs/image':>14}")
    for name, interp, ops in programs(names):
        wall, cpu = (1e6 * (v - b) / len(src) for v, b in zip(timed(src, out, ops, runs), base))
        print(f"{name:<16}{interp:<10}{wall:>10.1f}{cpu:>14.1f}")


def pipeline(names, runs: int) -> None:
    import tbljax
    from tbljax._src.engine import kernels
    from tbljax._src.engine.ring import aligned_empty
    from tbljax._src.rules import erasing

    def aligned(shape, dtype):  # as the loader's ring slots are
        return aligned_empty(int(np.prod(shape)) * np.dtype(dtype).itemsize).view(dtype).reshape(shape)

    src = photos(SOURCE_HW)
    idx = np.arange(ROWS, dtype=np.int64)
    crop = np.tile(np.array(BOX, np.int64), (ROWS, 1))
    u8, f32 = aligned((ROWS, SIZE, SIZE, 3), np.uint8), aligned((ROWS, SIZE, SIZE, 3), np.float32)
    norm = dict(mean=MEAN, std=STD)

    def cpu_us(out, ops, **kw) -> float:
        c = time.process_time()
        kernels.gather(src, idx, out, crop=crop, ops=ops, **kw)
        return 1e6 * (time.process_time() - c) / ROWS

    def over_no_op(ops, outs) -> list[float]:
        """Per output: the median over runs of (with ops - without), each pair run back to back
        (the host's speed drifts over a whole sweep)."""
        for out, kw in outs:  # warm-up
            cpu_us(out, ops, **kw)
        diffs = [[cpu_us(out, ops, **kw) - cpu_us(out, None, **kw) for out, kw in outs] for _ in range(runs)]
        return [statistics.median(d[i] for d in diffs) for i in range(len(outs))]

    base = [statistics.median(cpu_us(out, None, **kw) for _ in range(runs)) for out, kw in ((u8, {}), (f32, norm))]
    print(
        f"# {ROWS} rows of {SOURCE_HW[0]}x{SOURCE_HW[1]}, box {BOX[2]}x{BOX[3]} -> {SIZE}x{SIZE}, medians of {runs}"
        f" paired runs; the gather with no op: uint8 {base[0]:.1f}, float32 {base[1]:.1f} CPU µs/image"
    )
    print(f"{'op':<16}{'interp':<10}{'uint8 out':>10}{'float32 out':>13}{'difference':>12}   (CPU µs/image over no op)")
    for name, interp, ops in programs(names):
        a, b = over_no_op(ops, ((u8, {}), (f32, norm)))
        print(f"{name:<16}{interp:<10}{a:>10.1f}{b:>13.1f}{b - a:>12.1f}")
    boxes, keys = erasing.decide_erasing(tbljax.RandomErasing(p=1.0), idx, height=SIZE, width=SIZE, seed=0, epoch=0)
    none = np.zeros((ROWS, 1), np.uint8), np.zeros((ROWS, 1), np.int32)
    ops = kernels.pixel_program(*none, (SIZE, SIZE), erase_boxes=boxes, erase_keys=keys)
    area = float((boxes[..., 2] * boxes[..., 3]).sum(1).mean()) / SIZE**2
    (b,) = over_no_op(ops, ((f32, norm),))
    print(f"{'erasing':<16}{'pixel':<10}{'':>10}{b:>13.1f}   (boxes {area:.0%} of the image)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--ops", default="", help="comma-separated op names (default: every RandAugment op)")
    ap.add_argument(
        "--pipeline", action="store_true", help="the loader's shape: crop and resize, uint8 and float32 out"
    )
    a = ap.parse_args()
    import tbljax
    from tbljax._src.rules import pixel_ops

    names = a.ops.split(",") if a.ops else [n for n, c in pixel_ops.CODES.items() if 0 < c < pixel_ops.CODES["Cutout"]]
    print(f"# {machine()}; tbljax kernel target {tbljax.kernels.kernel_target()}")
    (pipeline if a.pipeline else per_op)(names, a.runs)


if __name__ == "__main__":
    main()

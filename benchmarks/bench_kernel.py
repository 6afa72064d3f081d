"""Throughput of the serve kernel (tbljax.kernels.gather) beside the fill-bandwidth roofline.

Each configuration runs in its own process, rounds are interleaved, and the median is
reported. Records are random uint8 (the kernel's cost does not depend on pixel values).

    PYTHONPATH=src python benchmarks/bench_kernel.py               # 5,000 x 160 px, batch 256
    PYTHONPATH=src python benchmarks/bench_kernel.py --rounds 5 --only f32_nhwc,rrc_flip_f32_nhwc
    PYTHONPATH=src python benchmarks/bench_kernel.py --only whole192x256_to224_f32,whole192x256_to112_f32

"produce" = batches written per second x batch size, into one reused output buffer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# name -> (kind, dtype, layout, simd cap). Every run also times numpy filling the same
# output buffer (1 and 2 threads), so each kernel figure has its roofline from the same moment.
CONFIGS = {
    "f32_nhwc": ("plain", "float32", "NHWC", None),
    "f32_nchw": ("plain", "float32", "NCHW", None),
    "bf16_nhwc": ("plain", "bfloat16", "NHWC", None),
    "bf16_nchw": ("plain", "bfloat16", "NCHW", None),
    "u8_nhwc": ("plain", "uint8", "NHWC", None),
    "u8_nchw": ("plain", "uint8", "NCHW", None),
    "rrc_flip_f32_nhwc": ("rrc", "float32", "NHWC", None),
    "rrc_flip_f32_nchw": ("rrc", "float32", "NCHW", None),
    "rrc_flip_bf16_nhwc": ("rrc", "bfloat16", "NHWC", None),
    "rrc_flip_u8_nhwc": ("rrc", "uint8", "NHWC", None),
    "f32_nhwc_avx2": ("plain", "float32", "NHWC", "avx2"),
    "rrc_flip_f32_nhwc_avx2": ("rrc", "float32", "NHWC", "avx2"),
    "f32_nhwc_scalar": ("plain", "float32", "NHWC", "scalar"),
    "rrc_flip_f32_nhwc_scalar": ("rrc", "float32", "NHWC", "scalar"),
    # The general (shrinking) resize path: whole 192x256 records (a full-aspect record of max
    # side 256) to 224 px (rows stretched, columns shrunk) and to 112 px (both shrunk).
    "whole192x256_to224_f32": ("whole:224", "float32", "NHWC", None),
    "whole192x256_to112_f32": ("whole:112", "float32", "NHWC", None),
    "whole192x256_to112_f32_avx2": ("whole:112", "float32", "NHWC", "avx2"),
    "whole192x256_to112_f32_scalar": ("whole:112", "float32", "NHWC", "scalar"),
}
WHOLE_HW = (192, 256)  # the source records of the "whole:" configurations
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def rrc_boxes(rng, n, size):
    """torchvision RandomResizedCrop boxes (scale 0.08-1, ratio 3/4-4/3, 10 tries, then the
    centre crop) as (y0, x0, h, w)."""
    import numpy as np

    out = np.empty((n, 4), np.int32)
    for k in range(n):
        for _ in range(10):
            area = size * size * rng.uniform(0.08, 1.0)
            ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
            w, h = int(round((area * ratio) ** 0.5)), int(round((area / ratio) ** 0.5))
            if 0 < w <= size and 0 < h <= size:
                out[k] = (rng.integers(0, size - h + 1), rng.integers(0, size - w + 1), h, w)
                break
        else:
            out[k] = (0, 0, size, size)
    return out


def aligned_empty(shape, dtype, align=4096):
    """A C-contiguous array whose data starts on a 4 KiB boundary, like the loader's ring."""
    import numpy as np

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + nbytes].view(dtype).reshape(shape)


def interleaved(steps: dict, seconds: float, min_rounds: int = 10) -> tuple[dict, dict]:
    """Calls each step once per round, in turn, until the first has run `seconds`; returns
    calls per wall second and per CPU second (all threads of this process) of each.
    Interleaving puts the kernel and its roofline under the same background load (this
    machine is shared); CPU seconds show what the kernel costs when other processes take
    cores away from it."""
    for step in steps.values():
        for i in range(2):
            step(i)
    wall = dict.fromkeys(steps, 0.0)
    cpu = dict.fromkeys(steps, 0.0)
    first = next(iter(steps))
    n = 0
    while wall[first] < seconds or n < min_rounds:
        for name, step in steps.items():
            t0, c0 = time.perf_counter(), time.process_time()
            step(n)
            wall[name] += time.perf_counter() - t0
            cpu[name] += time.process_time() - c0
        n += 1
    return ({k: n / t for k, t in wall.items()}, {k: n / t for k, t in cpu.items()})


def child(name: str, args) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    import ml_dtypes
    import numpy as np

    from tbljax import _core
    from tbljax._src.engine import kernels

    kind, dtype_name, layout, _ = CONFIGS[name]
    dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "uint8": np.uint8}[dtype_name]
    s, b = args.size, args.batch
    if kind.startswith("whole:"):
        kind, s = "whole", int(kind.split(":")[1])
    shape = (b, s, s, 3) if layout == "NHWC" else (b, 3, s, s)
    out = aligned_empty(shape, dtype)
    out.view(np.uint8).fill(0)  # fault the pages in: the loader reuses its buffers
    rng = np.random.default_rng(0)

    src_hw = {"rrc": (args.rrc_source,) * 2, "whole": WHOLE_HW}.get(kind, (s, s))
    records = np.frombuffer(rng.bytes(args.records * src_hw[0] * src_hw[1] * 3), np.uint8)
    records = records.reshape(args.records, *src_hw, 3)
    source = kernels.raw_source(records)
    nb = 64
    idx = [rng.integers(0, args.records, b) for _ in range(nb)]
    crops = [
        rrc_boxes(rng, b, src_hw[0])
        if kind == "rrc"
        else np.tile(np.array([0, 0, *src_hw], np.int32), (b, 1))
        if kind == "whole"
        else None
        for _ in range(nb)
    ]
    flips = [rng.random(b) < 0.5 if kind != "plain" else None for _ in range(nb)]
    norm = {} if dtype_name == "uint8" else IMAGENET

    def kernel_step(i):
        k = i % nb
        kernels.gather(source, idx[k], out, layout=layout, crop=crops[k], flip=flips[k], **norm)

    # The roofline: writing a float32 buffer of the batch's float32 size (78.6 MB at 160 px).
    fill_buf = aligned_empty((b, s, s, 3), np.float32).reshape(-1)
    fill_buf.fill(0)
    halves = np.array_split(fill_buf, 2)
    pool = ThreadPoolExecutor(2)

    def fill_1t(i):
        fill_buf.fill(i)

    def fill_2t(i):  # numpy's fill releases the GIL: two threads, like the kernel's pool
        list(pool.map(lambda h: h.fill(i), halves))

    rates, cpu_rates = interleaved({"kernel": kernel_step, "fill_1t": fill_1t, "fill_2t": fill_2t}, args.seconds)
    kernel_rate, f1, f2 = rates["kernel"], rates["fill_1t"], rates["fill_2t"]
    return {
        "img_s": kernel_rate * b,
        "ms_per_batch": 1e3 / kernel_rate,
        "img_per_cpu_s": cpu_rates["kernel"] * b,
        "gb_s_written": kernel_rate * out.nbytes / 1e9,
        "fill_img_s": max(f1, f2) * b,
        "fill_1t_img_s": f1 * b,
        "fill_2t_img_s": f2 * b,
        "simd": _core.kernel_target(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--rrc-source", type=int, default=176, help="source side for the RRC runs")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5, help="timed seconds per run")
    ap.add_argument("--only", default="", help="comma-separated config names")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return

    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    load0 = os.getloadavg()
    results: dict[str, list[dict]] = {n: [] for n in names}
    passthrough = [
        f"--records={args.records}",
        f"--size={args.size}",
        f"--batch={args.batch}",
        f"--rrc-source={args.rrc_source}",
        f"--seconds={args.seconds}",
    ]
    for r in range(args.rounds):
        for n in names:
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # no idle BLAS threads spinning
            if CONFIGS[n][3]:
                env["TBLJAX_SIMD"] = CONFIGS[n][3]
            p = subprocess.run(
                [sys.executable, __file__, f"--child={n}", *passthrough], env=env, capture_output=True, text=True
            )
            if p.returncode != 0:
                sys.exit(f"{n} failed:\n{p.stderr}")
            results[n].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {n}: {results[n][-1]['img_s']:,.0f} img/s", file=sys.stderr)

    def med(n, key):
        return statistics.median(x[key] for x in results[n])

    def med_ratio(n):
        return statistics.median(x["img_s"] / x["fill_img_s"] for x in results[n])

    print(
        f"\n{args.records} records, {args.size} px out (RRC from {args.rrc_source} px), "
        f"batch {args.batch}, median of {args.rounds} rounds, {os.cpu_count()} CPUs"
    )
    print(f"load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f}")
    print(
        f"{'config':26s} {'img/s':>9s} {'ms/batch':>9s} {'GB/s out':>9s} {'fill img/s':>11s} "
        f"{'vs fill':>8s} {'img/CPU-s':>10s}  simd"
    )
    for n in names:
        print(
            f"{n:26s} {med(n, 'img_s'):9,.0f} {med(n, 'ms_per_batch'):9.2f} "
            f"{med(n, 'gb_s_written'):9.1f} {med(n, 'fill_img_s'):11,.0f} "
            f"{med_ratio(n):8.0%} {med(n, 'img_per_cpu_s'):10,.0f}  {results[n][0]['simd']}"
        )
    all_fill = [x for n in names for x in results[n]]
    print(
        f"fill roofline over all runs (float32 batch, numpy fill of a reused buffer): "
        f"1 thread {statistics.median(x['fill_1t_img_s'] for x in all_fill):,.0f} img/s, "
        f"2 threads {statistics.median(x['fill_2t_img_s'] for x in all_fill):,.0f} img/s; "
        f"'vs fill' = kernel / the better fill measured in the same process; "
        f"img/CPU-s = images per CPU-second of all the process's threads"
    )


if __name__ == "__main__":
    main()

"""Small probes behind the explanations in benchmarks/README.md (not targets: single runs,
best or median of a few repetitions, on whatever the machine is doing at the time).

    PYTHONPATH=src python benchmarks/probe.py first-touch   # fresh 78 MB batch buffer: 4 KiB vs huge pages
    PYTHONPATH=src python benchmarks/probe.py map-passes    # kernel on a freshly opened file: pass 1 vs pass 2
    PYTHONPATH=src python benchmarks/probe.py permute       # the shuffle of one batch: C++ vs array code
    PYTHONPATH=src python benchmarks/probe.py decode        # decode_resize_into per image, 1 thread
    PYTHONPATH=src python benchmarks/probe.py convert-gaps  # idle time of the decode pool inside convert
"""

from __future__ import annotations

import importlib
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA  # noqa: E402

BATCH_BYTES = 256 * 160 * 160 * 3 * 4  # one float32 NHWC batch of 256 at 160 px


def first_touch() -> None:
    from tbljax._src.engine.ring import aligned_empty

    for name, make in (
        ("np.empty (4 KiB pages)", lambda: np.empty(BATCH_BYTES, np.uint8)),
        ("aligned_empty (huge pages)", lambda: aligned_empty(BATCH_BYTES)),
    ):
        times = []
        for _ in range(3):
            a = make()
            t0 = time.perf_counter()
            a[::4096] = 1  # one write per 4 KiB page
            times.append(time.perf_counter() - t0)
            del a
        print(
            f"{name}: first touch of a fresh {BATCH_BYTES / 1e6:.1f} MB buffer, 3 buffers in turn: "
            + ", ".join(f"{t * 1e3:.1f}" for t in times)
            + " ms"
        )


def _kodak_file(d: Path, records: int) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_serve import make_file

    path = d / "kodak160.tbl"
    make_file(path, records, 160)
    return path


def map_passes() -> None:
    import tbljax
    from tbljax._src.engine import kernels

    with tempfile.TemporaryDirectory() as d:
        path = _kodak_file(Path(d), 5000)  # written just now: in the page cache, never mapped here
        ds = tbljax.open(path)
        src = kernels.raw_source(ds.shard_views())
        out = np.zeros((256, 160, 160, 3), np.float32)  # touched: only the file's pages are new
        perm = np.random.default_rng(0).permutation(len(ds))
        warm = np.array(ds.view()[:1])  # a copy: starts the pool, touches nothing of the map
        kernels.gather(warm, np.zeros(256, np.int64), out, mean=(0.5,) * 3, std=(0.25,) * 3)
        for p in (1, 2):
            t0 = time.perf_counter()
            for s in range(len(ds) // 256):
                kernels.gather(src, perm[s * 256 : (s + 1) * 256], out, mean=(0.5,) * 3, std=(0.25,) * 3)
            n = len(ds) // 256 * 256
            print(f"pass {p} over the mapping: {n / (time.perf_counter() - t0):,.0f} img/s")


def permute() -> None:
    from tbljax._src.rules import order

    n, pos = 1_281_167, np.arange(256, dtype=np.int64) + 100_000

    def per_call(f, reps=300):
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        return (time.perf_counter() - t0) / reps * 1e6

    print(f"order.permute (C++), 256 positions: {per_call(lambda: order.permute(pos, n, 0, 3)):.0f} us")
    print(
        f"array code (permute_reference, NumPy), 256 positions: "
        f"{per_call(lambda: order.permute_reference(pos, n, 0, 3)):.0f} us"
    )


def _kodak_jpegs() -> list[bytes]:
    files = sorted((SHARED_DATA / "kodak" / "images").rglob("*.jpg"))
    if not files:
        sys.exit(f"needs {SHARED_DATA / 'kodak'}")
    return [f.read_bytes() for f in files]


def decode() -> None:
    from tbljax import _core

    jpegs = _kodak_jpegs()
    out = np.empty((len(jpegs), 160, 160, 3), np.uint8)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        _core.decode_resize_into(jpegs, out, "center_crop", 1)
        times.append(time.perf_counter() - t0)
    print(
        f"decode_resize_into, 1 thread, {len(jpegs)} kodak JPEGs -> 160 px: "
        f"best {min(times) / len(jpegs) * 1e3:.2f} ms per image"
    )


def convert_gaps() -> None:
    import tarfile

    import tbljax

    convert_module = importlib.import_module("tbljax._src.conversion.image_records")  # where convert decodes
    real = convert_module._core.decode_resize_into
    spans = []

    def timed(payloads, *args):
        t0 = time.perf_counter()
        r = real(payloads, *args)
        spans.append((t0, time.perf_counter(), len(payloads)))
        return r

    jpegs = _kodak_jpegs()
    with tempfile.TemporaryDirectory() as d:
        tar = Path(d) / "kodak.tar"
        with tarfile.open(tar, "w") as tf:
            for i, data in enumerate(jpegs * 4):
                info = tarfile.TarInfo(f"{i:06d}.jpg")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        convert_module._core.decode_resize_into = timed
        try:
            t0 = time.perf_counter()
            s = tbljax.convert(tar, Path(d) / "out.tbl", image_size=160, progress=False)
            total = time.perf_counter() - t0
        finally:
            convert_module._core.decode_resize_into = real
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    busy = sum(b - a for a, b, _ in spans)
    print(
        f"convert of {s.written} images: {s.written / total:,.0f} img/s; decode calls busy {busy:.3f} s "
        f"of {total:.3f} s; gaps between calls: total {sum(gaps) * 1e3:.1f} ms, "
        f"largest {max(gaps) * 1e3:.2f} ms; wall time per image while decoding "
        f"{busy / sum(n for _, _, n in spans) * 1e3:.2f} ms"
    )


PROBES = {
    "first-touch": first_touch,
    "map-passes": map_passes,
    "permute": permute,
    "decode": decode,
    "convert-gaps": convert_gaps,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PROBES:
        sys.exit(f"usage: probe.py {{{','.join(PROBES)}}}")
    PROBES[sys.argv[1]]()

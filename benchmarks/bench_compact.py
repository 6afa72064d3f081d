"""Compact JPEG records at the standard ImageNet training geometry, tbljax beside its peers on
the same JPEG bytes, in one run.

Data: the 312 ImageNet-sized kodak photos converted with `tbljax.convert(..., image_size=S,
resize="shorter_side", format="jpeg", quality=90, chroma="420")` (S = 256 by default, `--side
256 320`). Every peer decodes exactly those records' bytes: tbljax serves the file; FFCV 1.0.2
a .beton whose `RGBImageField(write_mode='jpg')` payloads are these bytes (its JPEG encoder is
swapped for the writer run, and the .beton is read back and compared byte for byte); NVIDIA
DALI's CPU pipeline and albumentations + OpenCV get them from memory.

Configurations, for outputs 224 and 160 px, float32 (ImageNet normalize) and uint8, batch 256,
random-resized-crop + horizontal flip, 2 threads each:
  * tbljax `HostLoader` (TBLJAX_NUM_THREADS=2); also 1 thread and `jpeg_dct_scale=True` (float32);
    with `--raw-budget F`, also a second file converted with `raw_budget=F` (the records costliest
    to decode stored RAW, the records within F of RAW), 2 threads and 1 thread;
  * FFCV `Loader` (RandomResizedCropRGBImageDecoder, RandomHorizontalFlip, NormalizeImage
    float32 or none, num_workers=2, order RANDOM, os_cache=True, drop_last=True);
  * DALI CPU (`decoders.image_random_crop` -> `resize` -> `crop_mirror_normalize`, num_threads=2);
  * albumentations + OpenCV (two Python threads, `cv2.setNumThreads(1)`);
and the decode ceiling: one thread decoding every record whole with libjpeg-turbo, through
OpenCV's `cv2.imdecode` and through tbljax's own `_core.decode_jpeg`. Each tbljax worker also
pairs its loader with the ceiling in its own process (`paired_ceiling`): per core against the
1-thread ceiling, and for 2 threads also against the ceiling on 2 threads (both cores busy).

Each configuration runs in its own process (peers in their own venvs under $TBLJAX_PEERS,
default `peers` in the system temp folder, as benchmarks' peer setup script installs them; a
peer that is missing or fails is reported as skipped, with the reason), rounds interleaved,
WARMUP batches before the timed ones; medians are printed, with the CPU time of the worker
process (user + sys, all its threads) per image over the timed window. `--dct` adds the older
probe: records at max side 512 served at 64 px, exact vs `jpeg_dct_scale`, speed and PSNR.

    TBLJAX_PEERS=/work/peers PYTHONPATH=src python benchmarks/bench_compact.py --rounds 3 --batches 13
    PYTHONPATH=src python benchmarks/bench_compact.py --rounds 1 --batches 3   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import kodak_photos, machine, median, rounds  # noqa: E402

B, THREADS = 256, 2
OUTS, DTYPES = (224, 160), ("float32", "uint8")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Batches run before timing, in every worker. The loader's ring holds prefetch + 3 = 4 slots of
# up to 154 MB here, and the first write to each faults its memory in: 7-9 ms in huge pages, up
# to ~150 ms each when the VM has none to give (measured 2026-12-01), once per run. Timing from
# the second batch, as the first version of this script did, mixed that start-up cost into the
# figure and moved it between 4.1k and 7.0k img/s from run to run.
WARMUP = 6
# The peers' interpreters: venv under $TBLJAX_PEERS/venvs, and the import that proves it works.
PEERS = {
    "ffcv": ("ffcv", "import ffcv, numba, torch, cv2"),
    "dali": ("dali", "import nvidia.dali"),
    "albu": ("albu", "import albumentations, cv2"),
}


def payloads(path: str) -> list[np.ndarray]:
    """Every record's JPEG bytes, as the file holds them."""
    import tbljax

    ds = tbljax.open(path)
    views, _counts, offsets, sizes, _h, _w, _raw = ds.jpeg_records()
    return [views[0][o : o + s] for o, s in zip(offsets.tolist(), sizes.tolist())]


def load_blobs(path: str) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The records' bytes as written by `dump_blobs` (for peers, which have no tbljax)."""
    z = np.load(path)
    data, offsets, sizes = z["data"], z["offsets"], z["sizes"]
    return [data[o : o + s] for o, s in zip(offsets.tolist(), sizes.tolist())], z["heights"], z["widths"]


def dump_blobs(tbl: str, path: str) -> None:
    import tbljax

    _views, _counts, _offsets, sizes, h, w, _raw = tbljax.open(tbl).jpeg_records()
    blobs = payloads(tbl)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    np.savez(
        path,
        data=np.concatenate(blobs),
        offsets=offsets,
        sizes=sizes.astype(np.int64),
        heights=h.astype(np.int64),
        widths=w.astype(np.int64),
    )


def touch(a) -> float:
    """Reads one element of every 4 KiB of a batch: proves it is there, in memory, without
    charging a full pass over it (154 MB at 224 px float32) to whichever loader is measured."""
    flat = np.asarray(a).reshape(-1)
    return float(flat[:: max(1, 4096 // flat.itemsize)].sum())


class Timer:
    """Wall and process CPU time (user + sys of every thread) over the timed window."""

    def __enter__(self):
        import resource

        self._r = resource
        self.t0 = time.perf_counter()
        self.c0 = self._cpu()
        return self

    def _cpu(self) -> float:
        u = self._r.getrusage(self._r.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.cpu = self._cpu() - self.c0

    def result(self, images: int) -> dict:
        return {"img_s": images / self.wall, "cpu_us": 1e6 * self.cpu / images}


# ---- workers: each returns {"img_s", "cpu_us"} over `batches` batches after WARMUP ----


def tbljax_worker(spec: dict) -> dict:
    import tbljax

    out, n = spec["out"], spec["batches"]
    opts = tbljax.LoaderOptions(
        batch_size=B,
        seed=0,
        augment=tbljax.Augment(size=(out, out)),
        dtype=spec["dtype"],
        jpeg_dct_scale=spec.get("dct", False),
        prefetch=1,
    )
    it = iter(tbljax.HostLoader(tbljax.open(spec["data"]), opts))
    for _ in range(WARMUP):
        touch(next(it).image)
    with Timer() as t:
        for _ in range(n):
            touch(next(it).image)
    result = t.result(n * B)
    if spec.get("paired"):
        result["paired"], busy = paired_ceiling(it, spec)
        if busy:
            result["paired_busy"] = busy
    return result


# The paired measure: PAIRS times, the decode ceiling (every record decoded whole, 1 thread, the
# loader idle) then the loader again (PAIR_SKIP batches it had built ahead dropped, PAIR_BATCHES
# timed). The host's speed drifts by tens of percent within minutes (the Zen 4 host: the same
# pass took 178-260 us per image in one process), and each pair sees one speed.
# A loader on 2 threads is also paired with the ceiling on 2 threads (each decoding every record
# whole, both cores busy, as the loader's are): on this host a core runs 3-17% slower while the
# other is busy, which the 1-thread ceiling does not pay and a 2-thread loader does.
PAIRS, PAIR_SKIP, PAIR_BATCHES = 5, 3, 4


def paired_ceiling(it, spec: dict) -> tuple[list[float], list[float]]:
    """Per pair: (loader img/s / its threads) / ceiling img/s, the loader measured right after;
    and with 2 threads, (loader img/s) / (the ceiling on 2 threads, img/s), measured between."""
    from concurrent.futures import ThreadPoolExecutor

    blobs, decode = ceiling_decoder(spec["data"], spec.get("raw_budget", False))
    threads = int(os.environ.get("TBLJAX_NUM_THREADS", "1"))
    ratios, busy = [], []

    def decode_all(_=None) -> None:
        for b in blobs:
            decode(b)

    with ThreadPoolExecutor(2) as pool:
        for _ in range(PAIRS):
            time.sleep(0.5)  # the producer fills the ring and stops: the decodes below run alone
            t = time.perf_counter()
            decode_all()
            ceiling = len(blobs) / (time.perf_counter() - t)
            if threads == 2:
                t = time.perf_counter()
                list(pool.map(decode_all, range(2)))
                ceiling2 = 2 * len(blobs) / (time.perf_counter() - t)
            for _ in range(PAIR_SKIP):
                touch(next(it).image)
            t = time.perf_counter()
            for _ in range(PAIR_BATCHES):
                touch(next(it).image)
            img_s = PAIR_BATCHES * B / (time.perf_counter() - t)
            ratios.append(img_s / threads / ceiling)
            if threads == 2:
                busy.append(img_s / ceiling2)
    return ratios, busy


def ffcv_write_worker(spec: dict) -> dict:
    """Writes the records' bytes as a .beton and reads it back: every payload must be the
    record's bytes, unchanged. RGBImageField.encode JPEG-encodes the array it is given through
    the module's `encode_jpeg`; the writer run replaces that function with one that returns the
    record's bytes (the record number rides in the first 8 bytes of a blank image of the
    record's shape, so the metadata's height and width are the record's)."""
    import ffcv.fields.rgb_image as rgb
    from ffcv.fields import RGBImageField
    from ffcv.reader import Reader
    from ffcv.writer import DatasetWriter

    blobs, heights, widths = load_blobs(spec["blobs"])

    class Records:
        def __len__(self):
            return len(blobs)

        def __getitem__(self, i):
            img = np.zeros((int(heights[i]), int(widths[i]), 3), np.uint8)
            img.reshape(-1)[:8] = np.frombuffer(np.int64(i).tobytes(), np.uint8)
            return (img,)

    def record_bytes(image, _quality):
        return np.array(blobs[int(np.frombuffer(image.reshape(-1)[:8].tobytes(), np.int64)[0])])

    rgb.encode_jpeg = record_bytes
    DatasetWriter(spec["beton"], {"image": RGBImageField(write_mode="jpg")}, num_workers=1).from_indexed_dataset(
        Records()
    )
    # Read back: each sample's allocation (pointer, size) in the file vs the record's bytes.
    r = Reader(spec["beton"])
    md = r.metadata[r.metadata.dtype.names[r.field_names.index("image")]]  # fields are f0, f1, ...
    size_at = dict(zip(r.alloc_table["ptr"].tolist(), r.alloc_table["size"].tolist()))
    mm = np.memmap(spec["beton"], np.uint8, mode="r")
    same = 0
    for i, blob in enumerate(blobs):
        ptr = int(md["data_ptr"][i])
        stored = mm[ptr : ptr + size_at[ptr]]
        same += int(
            md["mode"][i] == rgb.IMAGE_MODES["jpg"]
            and int(md["height"][i]) == heights[i]
            and int(md["width"][i]) == widths[i]
            and np.array_equal(stored, blob)
        )
    return {
        "records": len(blobs),
        "identical": same,
        "payload_bytes": int(sum(b.size for b in blobs)),
        "stored_payload_bytes": int(r.alloc_table["size"].sum()),
        "beton_bytes": os.path.getsize(spec["beton"]),
    }


def ffcv_worker(spec: dict) -> dict:
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor

    out, n = spec["out"], spec["batches"]
    pipeline = [RandomResizedCropRGBImageDecoder((out, out)), RandomHorizontalFlip()]
    if spec["dtype"] == "float32":
        pipeline.append(NormalizeImage(255 * np.array(MEAN), 255 * np.array(STD), np.float32))
    pipeline.append(ToTensor())
    # The .beton holds the 312 records once; the loader's indices list each several times so
    # that one epoch (one RANDOM permutation) covers the whole run, as the other workers cycle.
    records = spec["records"]
    indices = np.arange((WARMUP + n + 2) * B, dtype=np.uint64) % np.uint64(records)
    loader = Loader(
        spec["beton"],
        batch_size=B,
        num_workers=THREADS,
        order=OrderOption.RANDOM,
        os_cache=True,
        drop_last=True,
        seed=0,
        indices=indices,
        pipelines={"image": pipeline},
    )
    it = iter(loader)
    for _ in range(WARMUP):
        touch(next(it)[0].numpy())
    with Timer() as t:
        for _ in range(n):
            touch(next(it)[0].numpy())
    it.close()
    return t.result(n * B)


def dali_worker(spec: dict) -> dict:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    out, n = spec["out"], spec["batches"]
    blobs, _h, _w = load_blobs(spec["blobs"])

    def source(info):
        start = info.iteration * B
        return [blobs[(start + k) % len(blobs)] for k in range(B)]

    @pipeline_def(batch_size=B, num_threads=THREADS, device_id=None, seed=0)
    def pipe():
        jpegs = fn.external_source(source=source, batch=True, batch_info=True, dtype=types.UINT8)
        img = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        img = fn.resize(img, resize_x=out, resize_y=out)
        if spec["dtype"] == "float32":
            return fn.crop_mirror_normalize(
                img,
                mirror=fn.random.coin_flip(),
                dtype=types.FLOAT,
                mean=[255 * m for m in MEAN],
                std=[255 * s for s in STD],
                output_layout="HWC",
            )
        return fn.crop_mirror_normalize(img, mirror=fn.random.coin_flip(), dtype=types.UINT8, output_layout="HWC")

    p = pipe()
    p.build()
    for _ in range(WARMUP):
        (o,) = p.run()
        touch(o.as_tensor())  # the batch as one dense array, as a training step takes it
    with Timer() as t:
        for _ in range(n):
            (o,) = p.run()
            touch(o.as_tensor())
    return t.result(n * B)


def albumentations_worker(spec: dict) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    import albumentations as A
    import cv2

    cv2.setNumThreads(1)  # the parallelism is the 2 threads below
    out_px, n = spec["out"], spec["batches"]
    blobs, _h, _w = load_blobs(spec["blobs"])
    steps = [A.RandomResizedCrop(size=(out_px, out_px)), A.HorizontalFlip()]
    if spec["dtype"] == "float32":
        steps.append(A.Normalize(mean=MEAN, std=STD))
    aug = A.Compose(steps)
    out = np.empty((B, out_px, out_px, 3), spec["dtype"])

    def one(k_blob):
        k, blob = k_blob
        img = cv2.cvtColor(cv2.imdecode(blob, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        out[k] = aug(image=img)["image"]

    with ThreadPoolExecutor(THREADS) as pool:

        def batch(s):
            list(pool.map(one, [(k, blobs[(s * B + k) % len(blobs)]) for k in range(B)]))
            touch(out)

        for s in range(WARMUP):
            batch(s)
        with Timer() as t:
            for s in range(WARMUP, WARMUP + n):
                batch(s)
    return t.result(n * B)


def ceiling_decoder(data: str, raw_budget: bool):
    """(every record of file `data`, a function decoding one whole with tbljax's libjpeg-turbo);
    raw_budget: records stored RAW need no decode, a copy stands for them."""
    from tbljax import _core

    blobs, decode = payloads(data), _core.decode_jpeg
    if raw_budget:
        import tbljax

        raw = tbljax.open(data).jpeg_records().stored_raw.astype(bool).tolist()
        blobs = [(b, r) for b, r in zip(blobs, raw)]

        def decode(br, _d=_core.decode_jpeg):
            return br[0].copy() if br[1] else _d(br[0])

    return blobs, decode


def ceiling_worker(spec: dict) -> dict:
    """One thread decoding whole records, one after another: one pass to warm up, then
    batches * 256 decodes. With spec["threads"] = 2, two threads at once, each doing that
    (both decoders release the GIL): the ceiling per core while both cores are busy, as they
    are for every 2-thread loader."""
    if spec["kind"] == "ceiling-cv2":
        import cv2

        cv2.setNumThreads(1)
        blobs, _h, _w = load_blobs(spec["blobs"])

        def decode(b):
            return cv2.imdecode(b, cv2.IMREAD_COLOR)
    else:
        blobs, decode = ceiling_decoder(spec["data"], spec.get("raw_budget", False))
    for b in blobs:
        decode(b)
    n, threads = spec["batches"] * B, spec.get("threads", 1)

    def run(first: int) -> None:
        for k in range(first, n * threads, threads):
            decode(blobs[k % len(blobs)])

    with Timer() as t:
        if threads == 1:
            run(0)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(run, range(threads)))
    return t.result(n * threads)


def worker(spec: dict) -> dict:
    kind = spec["kind"]
    if kind == "tbljax":
        return tbljax_worker(spec)
    if kind == "ffcv-write":
        return ffcv_write_worker(spec)
    if kind == "ffcv":
        return ffcv_worker(spec)
    if kind == "dali":
        return dali_worker(spec)
    if kind == "albumentations":
        return albumentations_worker(spec)
    if kind in ("ceiling-cv2", "ceiling-tbljax"):
        return ceiling_worker(spec)
    raise SystemExit(f"unknown worker {kind}")


# ---- peers: where they are, whether they run ----


def peers_root(arg: str | None) -> Path:
    return Path(arg or os.environ.get("TBLJAX_PEERS") or Path(tempfile.gettempdir()) / "peers")


def peer_env(root: Path, name: str) -> dict[str, str]:
    if name != "ffcv":
        return {}
    lib = root / "sysroot_ffcv" / "usr" / "lib" / "x86_64-linux-gnu"
    dirs = [lib, lib / "blas", lib / "lapack", lib / "hdf5" / "serial"]
    rest = [os.environ["LD_LIBRARY_PATH"]] if os.environ.get("LD_LIBRARY_PATH") else []
    return {"LD_LIBRARY_PATH": ":".join([*map(str, dirs), *rest])}


def probe_peer(root: Path, name: str) -> tuple[str | None, str]:
    """(its interpreter, "") when the peer imports, else (None, why not)."""
    venv, imports = PEERS[name]
    py = root / "venvs" / venv / "bin" / "python"
    if not py.exists():
        return None, f"no interpreter at {py} (install with the peers' setup.sh, PEERS={root})"
    env = {**os.environ, **peer_env(root, name)}
    try:
        r = subprocess.run([str(py), "-c", imports], capture_output=True, text=True, env=env, timeout=300)
    except subprocess.TimeoutExpired:
        return None, f"{py} -c {imports!r} took over 300 s"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        return None, f"{py} -c {imports!r} failed: {last[:200]}"
    return str(py), ""


# ---- DCT-scaled vs exact: PSNR on the same boxes (--dct) ----


def dct_psnr(path: str) -> dict:
    import tbljax

    res = {}
    for name, aug in [
        ("rrc", tbljax.Augment(size=(64, 64))),
        ("center", tbljax.Augment(crop="center", flip=False, size=(64, 64))),
    ]:
        imgs = {}
        for dct in (False, True):
            opts = tbljax.LoaderOptions(
                batch_size=B, seed=0, num_epochs=1, drop_remainder=False, dtype="uint8", augment=aug, jpeg_dct_scale=dct
            )
            imgs[dct] = np.concatenate([np.array(b.image) for b in tbljax.HostLoader(tbljax.open(path), opts)])
        err = (imgs[True].astype(np.float64) - imgs[False].astype(np.float64)) ** 2
        mse = err.reshape(len(err), -1).mean(1)
        changed = mse > 0
        per = 10 * np.log10(255**2 / mse[changed]) if changed.any() else np.array([np.inf])
        res[name] = dict(
            scaled=float(changed.mean()),
            median_db=float(np.median(per)),
            worst_db=float(per.min()),
            pooled_db=float(10 * np.log10(255**2 / max(err[changed].mean(), 1e-12))),
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", metavar="SPEC", help="(internal) run one worker, spec as JSON")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=13, help="timed batches per worker")
    ap.add_argument("--side", type=int, nargs="+", default=[256], help="records' shorter side(s)")
    ap.add_argument(
        "--peers", default=None, help="the peers' folder (default $TBLJAX_PEERS, else peers in the system temp folder)"
    )
    ap.add_argument(
        "--raw-budget",
        type=float,
        default=None,
        metavar="F",
        help="also serve a file converted with raw_budget=F (e.g. 0.2)",
    )
    ap.add_argument(
        "--dct", action="store_true", help="also max side 512 -> 64 px, exact vs jpeg_dct_scale, and its PSNR"
    )
    ap.add_argument(
        "--only", default="", help="configurations whose name contains one of these ';'-separated words (default: all)"
    )
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(json.loads(a.worker))), flush=True)
        return
    import tbljax

    files = kodak_photos()
    root = peers_root(a.peers)
    load_start = os.getloadavg()
    t_start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    one, two = {"TBLJAX_NUM_THREADS": "1"}, {"TBLJAX_NUM_THREADS": str(THREADS)}
    words = [w for w in a.only.split(";") if w]

    def wanted(name: str) -> bool:
        return not words or any(w in name for w in words)

    with tempfile.TemporaryDirectory() as d:
        # name -> (spec, env, peer or None); every spec gets "batches" below.
        configs: dict[str, tuple[dict, dict, str | None]] = {}
        sizes: dict[int, dict] = {}
        for side in a.side:
            tbl, blobs = str(Path(d) / f"c{side}.tbl"), str(Path(d) / f"c{side}.npz")
            t = time.perf_counter()
            tbljax.convert(
                files,
                tbl,
                image_size=side,
                resize="shorter_side",
                format="jpeg",
                quality=90,
                chroma="420",
                progress=False,
            )
            _v, _c, _o, rec_sizes, h, w, _r = tbljax.open(tbl).jpeg_records()
            raw = int((h.astype(np.int64) * w * 3).sum())
            sizes[side] = dict(
                file=os.path.getsize(tbl),
                records=int(rec_sizes.sum()),
                raw=raw,
                n=len(h),
                seconds=time.perf_counter() - t,
                geometry=f"{int(min(h.min(), w.min()))}-{int(max(h.max(), w.max()))} px",
            )
            dump_blobs(tbl, blobs)
            rb_tbl = str(Path(d) / f"c{side}-rb.tbl")
            if a.raw_budget is not None:
                tbljax.convert(
                    files,
                    rb_tbl,
                    image_size=side,
                    resize="shorter_side",
                    format="jpeg",
                    quality=90,
                    chroma="420",
                    raw_budget=a.raw_budget,
                    progress=False,
                )
                r = tbljax.open(rb_tbl).jpeg_records()
                sizes[side].update(
                    rb_file=os.path.getsize(rb_tbl), rb_records=int(r.sizes.sum()), rb_raw=int(r.stored_raw.sum())
                )
            beton = str(Path(d) / f"c{side}.beton")
            for out in OUTS:
                for dt in DTYPES:
                    g = f"S{side} {out}px {'f32' if dt == 'float32' else 'u8'}"
                    base = {"side": side, "out": out, "dtype": dt}
                    configs[f"{g}: tbljax, 2 threads"] = (
                        {"kind": "tbljax", "data": tbl, "paired": True, **base},
                        two,
                        None,
                    )
                    configs[f"{g}: FFCV, 2 workers"] = (
                        {"kind": "ffcv", "beton": beton, "records": len(h), **base},
                        {},
                        "ffcv",
                    )
                    configs[f"{g}: DALI CPU, 2 threads"] = ({"kind": "dali", "blobs": blobs, **base}, {}, "dali")
                    configs[f"{g}: albumentations + OpenCV, 2 threads"] = (
                        {"kind": "albumentations", "blobs": blobs, **base},
                        {},
                        "albu",
                    )
                    if a.raw_budget is not None:
                        rb = f"{g}: tbljax raw_budget {a.raw_budget:g}"
                        rb_spec = {"kind": "tbljax", "data": rb_tbl, "paired": True, "raw_budget": True, **base}
                        configs[f"{rb}, 2 threads"] = (rb_spec, two, None)
                        configs[f"{rb}, 1 thread"] = (dict(rb_spec), one, None)
                    if dt == "float32":
                        configs[f"{g}: tbljax jpeg_dct_scale, 2 threads"] = (
                            {"kind": "tbljax", "data": tbl, "dct": True, **base},
                            two,
                            None,
                        )
                        configs[f"{g}: tbljax, 1 thread"] = (
                            {"kind": "tbljax", "data": tbl, "paired": True, **base},
                            one,
                            None,
                        )
            configs[f"S{side} ceiling: cv2.imdecode whole, 1 thread"] = (
                {"kind": "ceiling-cv2", "side": side, "blobs": blobs},
                {},
                "albu",
            )
            configs[f"S{side} ceiling: tbljax _core.decode_jpeg whole, 1 thread"] = (
                {"kind": "ceiling-tbljax", "side": side, "data": tbl},
                one,
                None,
            )
            configs[f"S{side} ceiling, both cores busy: tbljax _core.decode_jpeg whole, 2 threads"] = (
                {"kind": "ceiling-tbljax", "side": side, "data": tbl, "threads": THREADS},
                one,
                None,
            )
            if a.raw_budget is not None:
                configs[f"S{side} raw_budget ceiling: tbljax _core.decode_jpeg whole, RAW records copied, 1 thread"] = (
                    {"kind": "ceiling-tbljax", "side": side, "data": rb_tbl, "raw_budget": True},
                    one,
                    None,
                )
        if a.dct:
            big = str(Path(d) / "c512.tbl")
            tbljax.convert(
                files, big, image_size=512, resize="max_side", format="jpeg", quality=90, chroma="420", progress=False
            )
            for dct in (False, True):
                configs[f"max side 512 -> 64px f32: tbljax{' jpeg_dct_scale' if dct else ''}, 2 threads"] = (
                    {"kind": "tbljax", "data": big, "out": 64, "dtype": "float32", "dct": dct},
                    two,
                    None,
                )
        configs = {k: v for k, v in configs.items() if wanted(k)}

        # Peers: probe the ones a selected configuration needs; build FFCV's .beton files.
        skipped: dict[str, str] = {}
        pythons: dict[str, str] = {}
        for name in sorted({p for _s, _e, p in configs.values() if p}):
            py, why = probe_peer(root, name)
            if py:
                pythons[name] = py
            else:
                skipped[name] = why
        ffcv_checks: dict[int, dict] = {}
        if "ffcv" in pythons:
            for side in a.side:
                if not any(s["kind"] == "ffcv" and s["side"] == side for s, _e, _p in configs.values()):
                    continue
                spec = {
                    "kind": "ffcv-write",
                    "blobs": str(Path(d) / f"c{side}.npz"),
                    "beton": str(Path(d) / f"c{side}.beton"),
                }
                try:
                    chk = json.loads(
                        subprocess.run(
                            [pythons["ffcv"], __file__, "--worker", json.dumps(spec)],
                            capture_output=True,
                            text=True,
                            check=True,
                            timeout=900,
                            env={**os.environ, **peer_env(root, "ffcv")},
                        )
                        .stdout.strip()
                        .splitlines()[-1]
                    )
                except (subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
                    tail = (getattr(e, "stderr", "") or "").strip().splitlines()
                    rc = getattr(e, "returncode", None)
                    skipped[f"ffcv S{side}"] = (
                        "writing the .beton failed"
                        + (f" (status {rc})" if rc else "")
                        + (f": {tail[-1][:200]}" if tail else f": {type(e).__name__}")
                    )
                    continue
                ffcv_checks[side] = chk
                if chk["identical"] != chk["records"]:
                    skipped[f"ffcv S{side}"] = (
                        f"the .beton's payloads are not the records' bytes "
                        f"({chk['identical']} of {chk['records']} identical)"
                    )
        for k in list(configs):
            spec, _e, peer = configs[k]
            if peer and (peer in skipped or f"{peer} S{spec.get('side')}" in skipped):
                del configs[k]
        for spec, _e, _p in configs.values():
            spec["batches"] = a.batches
        print(
            f"{len(configs)} configurations, {a.rounds} round(s); peers skipped: {skipped or 'none'}",
            file=sys.stderr,
            flush=True,
        )

        res = rounds(
            Path(__file__),
            {k: [json.dumps(v[0])] for k, v in configs.items()},
            a.rounds,
            env={k: {**v[1], **(peer_env(root, v[2]) if v[2] else {})} for k, v in configs.items()},
            python={k: pythons[v[2]] for k, v in configs.items() if v[2]},
            keep_going=True,
        )
        psnr = dct_psnr(big) if a.dct else {}
    load_end = os.getloadavg()

    # ---- report ----
    ok = {k: [r for r in v if "error" not in r] for k, v in res.items()}
    partial = {}
    for k, v in res.items():
        errors = [r["error"] for r in v if "error" in r]
        if not ok[k]:
            skipped[k] = errors[0] if errors else "no result"
        elif errors:
            partial[k] = f"{len(errors)} of {len(v)} rounds failed ({errors[0]}); median of the others"
    m = {k: median(v, "img_s") for k, v in ok.items() if v}
    cpu = {k: median(v, "cpu_us") for k, v in ok.items() if v}
    print(
        f"\nbench_compact: {len(files)} kodak photos -> compact q90 4:2:0, resize shorter_side "
        f"{'/'.join(map(str, a.side))}; RRC + flip, batch {B}, {WARMUP} warm-up + {a.batches} timed "
        f"batches per worker, median of {a.rounds} round(s)\nmachine: {machine()}\n"
        f"started {t_start}; load average at start {load_start[0]:.2f} {load_start[1]:.2f} "
        f"{load_start[2]:.2f}, at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}\n"
    )
    for side, s in sizes.items():
        frac = s["file"] / s["raw"]
        print(
            f"S{side}: {s['n']} records, {s['geometry']}, file {s['file'] / 2**20:.2f} MiB = "
            f"{frac:.3f} of RAW ({s['raw'] / 2**20:.1f} MiB){'' if frac <= 0.2 else '  ABOVE 0.2'}; "
            f"JPEG payloads {s['records'] / 2**20:.2f} MiB; converted in {s['seconds']:.1f} s"
        )
        if "rb_file" in s:
            frac = s["rb_file"] / s["raw"]
            print(
                f"S{side} raw_budget {a.raw_budget:g}: file {s['rb_file'] / 2**20:.2f} MiB = {frac:.3f} of "
                f"RAW{'' if frac <= 0.2 else '  ABOVE 0.2'}; records {s['rb_records'] / s['raw']:.3f} of "
                f"their pixels; {s['rb_raw']} of {s['n']} records stored RAW"
            )
    for side, c in ffcv_checks.items():
        print(
            f"S{side} FFCV .beton: {c['identical']} of {c['records']} payloads byte-identical to the "
            f"records; payloads {c['payload_bytes']} B, stored {c['stored_payload_bytes']} B, "
            f".beton {c['beton_bytes']} B"
        )
    for k, why in skipped.items():
        print(f"skipped {k}: {why}")
    for k, why in partial.items():
        print(f"{k}: {why}")
    print("\n| configuration | img/s | CPU µs / img | img / CPU-s | rounds (img/s) |")
    print("|---|---:|---:|---:|---|")
    for k in m:
        print(
            f"| {k} | {m[k]:,.0f} | {cpu[k]:.0f} | {1e6 / cpu[k]:,.0f} | "
            f"{' / '.join(format(r['img_s'], ',.0f') for r in ok[k])} |"
        )

    def print_pairs(key: str, title: str) -> None:
        """The paired ratios `key` of every worker that has them: the median of all its pairs,
        each round's median in brackets."""
        pairs = {k: [r[key] for r in v if key in r] for k, v in ok.items()}
        if not any(pairs.values()):
            return
        print(f"\n{title} Median of all pairs; each round's median in brackets.")
        for k, rs in pairs.items():
            if rs:
                flat = [x for r in rs for x in r]
                print(
                    f"{k}: {statistics.median(flat):.2f}x "
                    f"({' / '.join(f'{statistics.median(r):.2f}' for r in rs)}) (target >= 1.8x)"
                )

    print_pairs(
        "paired",
        f"Per core / the decode ceiling, paired in one process: each tbljax worker, "
        f"after its timed batches, {PAIRS} times decodes every record of its file whole on 1 "
        f"thread (tbljax _core.decode_jpeg; RAW-stored records copied) with the loader idle, "
        f"then times {PAIR_BATCHES} batches; ratio (img/s / threads) / ceiling.",
    )
    print_pairs(
        "paired_busy",
        f"Per core while both cores are busy, paired in one process: each "
        f"2-thread tbljax worker, {PAIRS} times, also decodes every record whole on 2 threads "
        f"at once (right after the 1-thread ceiling above), then times its {PAIR_BATCHES} "
        f"batches; ratio loader img/s / that ceiling's img/s.",
    )

    def ratio(x: str, y: str, of=m) -> float:
        return of[x] / of[y] if x in of and y in of and of[y] else float("nan")

    def paired(x: str, ys: list[str], scale: float = 1.0) -> str:
        """x ÷ the fastest of ys round by round (rounds where all of them ran), and the median:
        a neighbour's load that comes and goes between rounds moves both sides of a round's
        ratio alike, where it moves a ratio of medians taken from different rounds."""
        rs = []
        for r, rx in enumerate(res.get(x, [])):
            ry = [res[y][r] for y in ys if y in res and r < len(res[y])]
            if "error" in rx or len(ry) != len(ys) or any("error" in v for v in ry):
                continue
            rs.append(scale * rx["img_s"] / max(v["img_s"] for v in ry))
        if not rs:
            return "no round with all of them"
        return f"{' / '.join(f'{v:.2f}' for v in rs)}, median {statistics.median(rs):.2f}x"

    per_cpu = {k: 1e6 / v for k, v in cpu.items()}
    print()
    for side in a.side:
        ceil = {k: m[k] for k in m if k.startswith(f"S{side} ceiling:")}
        busy = f"S{side} ceiling, both cores busy: tbljax _core.decode_jpeg whole, 2 threads"
        best_ceil = max(ceil, key=ceil.get) if ceil else None
        best_ceil_cpu = max(ceil, key=lambda k: per_cpu[k]) if ceil else None
        for out in OUTS:
            for dt in ("f32", "u8"):
                g = f"S{side} {out}px {dt}"
                peers = {k: m[k] for k in m if k.startswith(g + ":") and "tbljax" not in k}
                for variant in ("tbljax", f"tbljax raw_budget {a.raw_budget or 0:g}"):
                    tb, one_t = f"{g}: {variant}, 2 threads", f"{g}: {variant}, 1 thread"
                    if tb in m and peers:
                        best = max(peers, key=peers.get)
                        best_cpu = max(peers, key=lambda k: per_cpu[k])
                        print(
                            f"{g}: {variant} / fastest peer ({best.split(': ')[1]}): {ratio(tb, best):.2f}x "
                            f"(target >= 3x); per CPU-second / best peer ({best_cpu.split(': ')[1]}): "
                            f"{ratio(tb, best_cpu, per_cpu):.2f}x; round by round / that round's "
                            f"fastest peer: {paired(tb, list(peers))}"
                        )
                    if best_ceil and tb in m:
                        txt = (
                            f"{g}: {variant} per core / decode ceiling per core ({best_ceil.split(': ')[1]}, "
                            f"{m[best_ceil]:,.0f} img/s): 2 threads / 2: {m[tb] / THREADS / m[best_ceil]:.2f}x"
                        )
                        if one_t in m:
                            txt += f", 1 thread: {ratio(one_t, best_ceil):.2f}x"
                        # Per CPU-second: the same comparison in the process's CPU time, which a
                        # neighbour's load moves far less than wall time on this 2-core machine.
                        print(
                            txt + f", per CPU-second: {ratio(tb, best_ceil_cpu, per_cpu):.2f}x (target >= 1.8x); "
                            f"2 threads / 2, round by round: {paired(tb, [best_ceil], 1 / THREADS)}"
                        )
                    own = [k for k in m if k.startswith(f"S{side} raw_budget ceiling:")]
                    if variant != "tbljax" and tb in m and own:
                        print(
                            f"{g}: {variant} per core / the decode ceiling on its own records "
                            f"({m[own[0]]:,.0f} img/s): 2 threads / 2: {m[tb] / THREADS / m[own[0]]:.2f}x; "
                            f"round by round: {paired(tb, own, 1 / THREADS)}"
                        )
                tb = f"{g}: tbljax, 2 threads"
                if busy in m and tb in m:
                    print(
                        f"{g}: tbljax 2 threads / the ceiling on 2 threads (both cores busy, "
                        f"{m[busy]:,.0f} img/s): {ratio(tb, busy):.2f}x"
                    )
                dct = f"{g}: tbljax jpeg_dct_scale, 2 threads"
                if dct in m and tb in m:
                    print(f"{g}: jpeg_dct_scale speed-up: {ratio(dct, tb):.2f}x")
    if a.dct:
        x, y = (
            "max side 512 -> 64px f32: tbljax jpeg_dct_scale, 2 threads",
            "max side 512 -> 64px f32: tbljax, 2 threads",
        )
        print(f"jpeg_dct_scale speed-up (max side 512 -> 64 px): {ratio(x, y):.2f}x")
        for name, r in psnr.items():
            print(
                f"jpeg_dct_scale PSNR vs exact, {name} 64 px from max side 512: {100 * r['scaled']:.0f}% "
                f"of samples scaled; over those median {r['median_db']:.1f} dB, worst "
                f"{r['worst_db']:.1f} dB, pooled {r['pooled_db']:.1f} dB"
            )


if __name__ == "__main__":
    main()

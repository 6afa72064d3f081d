"""Serving throughput from one RAW file (../shared/data/kodak converted at 160 px, repeated to
N records): tbljax's loader in several output modes vs turboloader 2.39's TblRawImageLoader,
Grain over the same file doing the same work, a tuned numpy gather, and the memory-bandwidth
roofline measured in the same run. Each configuration runs in its own process; medians over
rounds; every configuration gets the same 8 warm-up batches before the timed ones. "produce":
the consumer touches one element per batch; "consumed": it reads every byte (np.sum).

`--suite fullaspect` (issue 13): the real photos (kodak + caltech101) converted at max side 256
with their aspect kept vs the same photos as 256 px squares, RRC + flip + normalize to 224 px
float32, the eval center crop, and peers on the same pixels (albumentations + OpenCV over the
decoded records, turboloader's train_aug, which serves only records of one size).

    python benchmarks/bench_serve.py [--rounds 3] [--records 5000] [--batches 40]
    python benchmarks/bench_serve.py --suite fullaspect [--rounds 3] [--records 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA, machine, median, rounds  # noqa: E402

B = 256
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def rss_anon_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def make_file(dst: Path, records: int, size: int) -> None:
    """kodak converted once at `size`, its records repeated to `records`."""
    import tbljax
    from tbljax._src.file.format import Writer

    base = dst.with_suffix(".base.tbl")
    tbljax.convert(SHARED_DATA / "kodak" / "images", base, image_size=size, progress=False)
    src = tbljax.open(base).view()
    with Writer(dst, records) as w:
        for i in range(records):
            w.add_raw(src[i % len(src)])
        w.set_metadata(labels=np.arange(records) % 24)
    os.remove(base)


def photo_files() -> list[Path]:
    return sorted((SHARED_DATA / "kodak" / "images").rglob("*.jpg")) + sorted(
        (SHARED_DATA / "caltech101" / "images").rglob("*.jpg")
    )


def make_photo_file(dst: Path, records: int, **recipe) -> None:
    """The real photos converted once with `recipe`, their records repeated to `records`."""
    import tbljax
    from tbljax._src.file.format import Writer

    base = dst.with_suffix(".base.tbl")
    files = photo_files()
    tbljax.convert(files, base, labels=[0] * len(files), progress=False, **recipe)
    ds = tbljax.open(base)
    images = [ds.read(i) for i in range(len(ds))]
    with Writer(dst, records) as w:
        for i in range(records):
            w.add_raw(images[i % len(images)])
        w.set_metadata(labels=np.zeros(records, np.int64))
    os.remove(base)


def albumentations_batches(path: str, threads: int):
    """albumentations + OpenCV over the decoded records (read once into memory): RRC to 224,
    flip, normalize, each batch's samples spread over `threads` threads, stacked (B, 224, 224, 3)
    float32."""
    from concurrent.futures import ThreadPoolExecutor

    import albumentations as A
    import cv2

    import tbljax

    cv2.setNumThreads(1)  # the `threads` workers are all the parallelism, as for tbljax
    ds = tbljax.open(path)
    images = [ds.read(i) for i in range(len(ds))]
    aug = A.Compose([A.RandomResizedCrop(size=(224, 224)), A.HorizontalFlip(), A.Normalize(mean=MEAN, std=STD)])
    pool = ThreadPoolExecutor(threads)
    rng = np.random.default_rng(0)
    while True:
        perm = rng.permutation(len(images))
        for s in range(len(images) // B):
            yield np.stack(list(pool.map(lambda i: aug(image=images[i])["image"], perm[s * B : (s + 1) * B])))


FULLASPECT_KINDS = {  # kind -> (file, what it is)
    "fa-rrc": ("fa", "tbljax RRC+flip, full-aspect records"),
    "sq-rrc": ("sq256", "tbljax RRC+flip, square 256 records"),
    "fa-center": ("fa", "tbljax eval center crop, full-aspect records"),
    "sq224-plain": ("sq224", "tbljax, square 224 records, no resize"),
    "albumentations": ("fa", "albumentations+OpenCV RRC+flip+normalize, full-aspect"),
    "turboloader-train-aug": ("sq256", "turboloader train_aug, square 256 records"),
}


def fullaspect_worker(kind: str, path: str, n_batches: int) -> dict:
    """Every byte consumed (np.sum); 2 threads for every configuration."""
    threads = 2
    if kind in ("fa-rrc", "sq-rrc", "fa-center", "sq224-plain"):
        import tbljax

        augment = {
            "fa-rrc": tbljax.Augment(size=(224, 224)),
            "sq-rrc": tbljax.Augment(size=(224, 224)),
            "fa-center": tbljax.Augment(crop="center", flip=False, size=(224, 224)),
            "sq224-plain": None,
        }[kind]
        it = tbljax.loader(
            path, B, seed=0, num_epochs=None, dtype="float32", layout="NHWC", augment=augment, threads=threads
        )
        ips = timed((b["image"] for b in it), n_batches, "consumed")
        it.close()
    elif kind == "albumentations":
        ips = timed(albumentations_batches(path, threads), n_batches, "consumed")
    elif kind == "turboloader-train-aug":
        import turboloader as tl

        def batches():
            epoch = 0
            while True:
                ld = tl.TblRawImageLoader(
                    path,
                    batch_size=B,
                    seed=0,
                    shuffle=True,
                    drop_last=True,
                    image_size=224,
                    train_aug=True,
                    hflip_prob=0.5,
                )
                ld.set_epoch(epoch)
                for x, _ in ld:
                    yield x
                epoch += 1

        ips = timed(batches(), n_batches, "consumed")
    else:
        raise ValueError(kind)
    return {"kind": kind, "img_s": ips, "rss_anon_mib": rss_anon_mib()}


def fullaspect_suite(a) -> None:
    for name in ("kodak", "caltech101"):
        if not (SHARED_DATA / name).is_dir():
            sys.exit(f"needs {SHARED_DATA / name} (real photos beside the repo)")
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        paths = {"fa": Path(d) / "fa256.tbl", "sq256": Path(d) / "sq256.tbl", "sq224": Path(d) / "sq224.tbl"}
        make_photo_file(paths["fa"], a.records, image_size=256, resize="max_side")
        make_photo_file(paths["sq256"], a.records, image_size=256, resize="center_crop")
        make_photo_file(paths["sq224"], a.records, image_size=224, resize="center_crop")
        kinds = [k for k in FULLASPECT_KINDS if not a.only or k in a.only.split(",")]
        configs = {k: ["fa:" + k, str(paths[FULLASPECT_KINDS[k][0]]), "consumed", str(a.batches)] for k in kinds}
        res = rounds(Path(__file__), configs, a.rounds)
    m = {k: median(v, "img_s") for k, v in res.items()}
    print(
        f"\nbench_serve --suite fullaspect: {len(photo_files())} photos (kodak + caltech101) repeated to "
        f"{a.records} records, 224 px float32 NHWC out (turboloader: NCHW, its layout), batch {B}, 2 threads, "
        f"every byte consumed, {a.batches} timed batches, median of {a.rounds} rounds\nmachine: {machine()}\n"
        f"load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f}\n"
    )
    print("| configuration | records | consumed img/s |")
    print("|---|---|---:|")
    for k in kinds:
        print(f"| {FULLASPECT_KINDS[k][1]} | {FULLASPECT_KINDS[k][0]} | {m[k]:.0f} |")
    print()
    for label, num, den, target in [
        ("(a) full-aspect RRC / square RRC", "fa-rrc", "sq-rrc", ">= 0.7x"),
        ("(b) full-aspect center crop / square 224 no resize", "fa-center", "sq224-plain", ">= 1x"),
        ("(b) full-aspect center crop / square RRC", "fa-center", "sq-rrc", ">= 1x"),
        ("(c) full-aspect RRC / albumentations+OpenCV", "fa-rrc", "albumentations", ">= 5x"),
        ("(c) full-aspect RRC / turboloader train_aug (square)", "fa-rrc", "turboloader-train-aug", ">= 3x"),
    ]:
        if num in m and den in m:
            print(f"{label}: {m[num] / m[den]:.2f}x (target {target})")


WARMUP = 8  # batches before timing: threads started, every ring slot / buffer touched once


def consume(x, mode: str) -> None:
    a = np.asarray(x)
    if mode == "consumed":
        # np.sum with NumPy's own accumulator reads every byte (uint8 -> uint64, float32 ->
        # float32). bfloat16 sums in float32: NumPy has no fast bfloat16 loop (~2k img/s).
        a.sum(dtype=np.float32 if a.dtype.name == "bfloat16" else None)
    else:
        a.reshape(-1)[0].item()


def timed(batches, n_batches: int, mode: str) -> float:
    it = iter(batches)
    for _ in range(WARMUP):
        consume(next(it), mode)
    t0 = time.perf_counter()
    for _ in range(n_batches):
        consume(next(it), mode)
    return n_batches * B / (time.perf_counter() - t0)


def worker(kind: str, path: str, mode: str, n_batches: int) -> dict:
    extra: dict = {}
    if kind.startswith("tbljax"):
        import tbljax

        opts = {
            "tbljax-f32-nhwc": dict(dtype="float32", layout="NHWC"),
            "tbljax-f32-nchw": dict(dtype="float32", layout="NCHW"),
            "tbljax-bf16": dict(dtype="bfloat16", layout="NHWC"),
            "tbljax-u8": dict(dtype="uint8", layout="NHWC"),
            "tbljax-rrc-flip": dict(dtype="float32", layout="NCHW", augment="rrc_flip"),
        }[kind]
        it = tbljax.loader(path, B, seed=0, num_epochs=None, **opts)
        ips = timed((b["image"] for b in it), n_batches, mode)
        extra = it.metrics() if hasattr(it, "metrics") else {}
        extra = {k: v for k, v in extra.items() if isinstance(v, (int, float))}
        it.close() if hasattr(it, "close") else None
    elif kind.startswith("turboloader"):
        import turboloader as tl

        prefetch = 2 if kind == "turboloader-prefetch" else 0
        aug = kind == "turboloader-train-aug"

        def batches():
            epoch = 0
            while True:
                ld = tl.TblRawImageLoader(
                    path,
                    batch_size=B,
                    seed=0,
                    shuffle=True,
                    drop_last=True,
                    prefetch_batches=prefetch,
                    train_aug=aug,
                    hflip_prob=0.5 if aug else 0.0,
                )
                ld.set_epoch(epoch)
                for x, _ in ld:
                    yield x
                epoch += 1

        ips = timed(batches(), n_batches, mode)
    elif kind == "grain":
        import grain

        import tbljax

        view = tbljax.open(path).view()
        mean = np.asarray(MEAN, np.float32) * 255
        inv = 1 / (np.asarray(STD, np.float32) * 255)

        class Source:
            def __len__(self):
                return len(view)

            def __getitem__(self, i):
                return view[i]

        ds = (
            grain.MapDataset.source(Source())
            .shuffle(seed=0)
            .repeat()
            .map(lambda x: ((x.astype(np.float32) - mean) * inv).transpose(2, 0, 1))
            .batch(B)
        )
        it = ds.to_iter_dataset(grain.ReadOptions(num_threads=os.cpu_count(), prefetch_buffer_size=4 * B))
        ips = timed(it, n_batches, mode)
    elif kind == "numpy":
        # Tuned numpy: gather into a reused uint8 buffer, one fused multiply-add per channel.
        import tbljax

        view = tbljax.open(path).view()
        n = len(view)
        u8 = np.empty((B,) + view.shape[1:], np.uint8)
        out = np.empty((B, 3) + view.shape[1:3], np.float32)
        scale = (1 / (255 * np.asarray(STD))).astype(np.float32)
        shift = (-np.asarray(MEAN) / np.asarray(STD)).astype(np.float32)
        rng = np.random.default_rng(0)

        def batches():
            while True:
                perm = rng.permutation(n)
                for s in range(n // B):
                    np.take(view, perm[s * B : (s + 1) * B], axis=0, out=u8)
                    for c in range(3):
                        np.multiply(u8[..., c], scale[c], out=out[:, c])
                        out[:, c] += shift[c]
                    yield out

        ips = timed(batches(), n_batches, mode)
    elif kind == "roofline":
        big = np.empty((B, 160, 160, 3), np.float32)  # one float32 batch: 78.6 MB
        src = np.ones_like(big)
        big.fill(0)
        t0 = time.perf_counter()
        reps = 20
        for _ in range(reps):
            big.fill(1.0)
        fill = reps * big.nbytes / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(reps):
            np.copyto(big, src)
        copy = 2 * reps * big.nbytes / (time.perf_counter() - t0)
        per_img_bytes = 160 * 160 * 3 * (1 + 4)  # read u8 + write f32
        return {
            "kind": kind,
            "fill_GBs": fill / 1e9,
            "copy_GBs": copy / 1e9,
            "img_s": fill / (160 * 160 * 3 * 4),
            "copy_roofline_img_s": copy / per_img_bytes,
            "rss_anon_mib": rss_anon_mib(),
        }
    else:
        raise ValueError(kind)
    return {"kind": kind, "mode": mode, "img_s": ips, "rss_anon_mib": rss_anon_mib(), **extra}


def open_first_batch(path: str) -> dict:
    # A training program has imported jax (and tbljax) already: imports are not open time.
    import jax

    import tbljax

    jax.devices()
    t0 = time.perf_counter()
    it = iter(tbljax.loader(path, B, seed=0))
    b = next(it)
    np.asarray(b["image"]).reshape(-1)[0].item()
    dt = time.perf_counter() - t0
    return {"kind": "open+first", "ms": dt * 1e3, "img_s": 0.0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=4, metavar=("KIND", "PATH", "MODE", "BATCHES"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--only", default="", help="comma-separated kinds to run (default: all)")
    ap.add_argument("--suite", choices=("serve", "fullaspect"), default="serve")
    a = ap.parse_args()
    if a.worker:
        kind, path, mode, nb = a.worker
        if kind.startswith("fa:"):
            print(json.dumps(fullaspect_worker(kind[3:], path, int(nb))))
            return
        res = open_first_batch(path) if kind == "open+first" else worker(kind, path, mode, int(nb))
        print(json.dumps(res))
        return
    if a.suite == "fullaspect":
        fullaspect_suite(a)
        return
    if not (SHARED_DATA / "kodak").is_dir():
        sys.exit(f"needs {SHARED_DATA / 'kodak'} (real photos beside the repo)")
    kinds = [
        "tbljax-f32-nhwc",
        "tbljax-f32-nchw",
        "tbljax-bf16",
        "tbljax-u8",
        "tbljax-rrc-flip",
        "turboloader-sync",
        "turboloader-prefetch",
        "turboloader-train-aug",
        "grain",
        "numpy",
    ]
    if a.only:
        kinds = [k for k in kinds if k in a.only.split(",")]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kodak160.tbl"
        big = Path(d) / "kodak160x4.tbl"
        tiny = Path(d) / "tiny100k.tbl"
        make_file(path, a.records, a.size)
        make_file(big, 4 * a.records, a.size)
        make_file(tiny, 100_000, 32)
        configs = {f"{k} {m}": [k, str(path), m, str(a.batches)] for k in kinds for m in ("produce", "consumed")}
        configs["roofline"] = ["roofline", str(path), "produce", "0"]
        configs["tbljax-f32-nhwc consumed 4xN"] = ["tbljax-f32-nhwc", str(big), "consumed", str(a.batches)]
        configs["open+first batch, 100k records"] = ["open+first", str(tiny), "produce", "1"]
        res = rounds(Path(__file__), configs, a.rounds)
    print(
        f"\nbench_serve: kodak -> {a.size} px, {a.records} records, batch {B}, {a.batches} timed batches, "
        f"median of {a.rounds} rounds\nmachine: {machine()}\n"
    )
    print("| configuration | produce img/s | consumed img/s | RssAnon MiB |")
    print("|---|---:|---:|---:|")
    for k in kinds:
        p, c = res[f"{k} produce"], res[f"{k} consumed"]
        print(f"| {k} | {median(p, 'img_s'):.0f} | {median(c, 'img_s'):.0f} | {median(c, 'rss_anon_mib'):.0f} |")
    r = res["roofline"]
    print(
        f"\nroofline: fill {median(r, 'fill_GBs'):.1f} GB/s -> {median(r, 'img_s'):.0f} img/s float32; "
        f"copy {median(r, 'copy_GBs'):.1f} GB/s (read+write)"
    )
    m = {k: median(v, "img_s") for k, v in res.items() if "img_s" in v[0]}

    def ratio(a_, b_):
        return m[a_] / m[b_] if a_ in m and b_ in m and m[b_] else float("nan")

    for label, num, den, target in [
        (
            "float32 consumed / turboloader sync consumed",
            "tbljax-f32-nchw consumed",
            "turboloader-sync consumed",
            ">= 1.5x",
        ),
        ("float32 NHWC produce / fill roofline", "tbljax-f32-nhwc produce", "roofline", ">= 0.70"),
        ("uint8 produce / turboloader sync produce", "tbljax-u8 produce", "turboloader-sync produce", ">= 3x"),
        (
            "RRC+flip produce / turboloader train_aug produce",
            "tbljax-rrc-flip produce",
            "turboloader-train-aug produce",
            ">= 3x",
        ),
        ("float32 NCHW consumed / Grain consumed", "tbljax-f32-nchw consumed", "grain consumed", ">= 5x"),
    ]:
        print(f"{label}: {ratio(num, den):.2f}x (target {target})")
    a1 = median(res["tbljax-f32-nhwc consumed"], "rss_anon_mib")
    a4 = median(res["tbljax-f32-nhwc consumed 4xN"], "rss_anon_mib")
    print(f"anonymous memory: {a1:.0f} MiB at N={a.records}, {a4:.0f} MiB at N={4 * a.records}")
    first = median(res["open+first batch, 100k records"], "ms")
    print(f"open + first batch on a 100k-record file: {first:.0f} ms (target <= 100 ms)")


if __name__ == "__main__":
    main()

"""What a mask costs to store beside its image (issue 48: "compactly and losslessly"): the kodak
photos at full aspect, shorter side 512 (as `bench_dense.py` serves them), each with masks
made from its own pixels, converted with `tbljax.convert` as a RAW file and as compact JPEG
records (quality 90). Per record it reports the image's bytes (RAW and JPEG, from the files'
index) and the mask field's bytes as the file stores it today (its values block over the
records), beside what each mask would take losslessly compressed per record: LZ4 (the
library the core links for LZ4 image records, `LZ4_compress_default`, through ctypes) and PNG
(Pillow, compress_level 6), with each one's decode time per record (single thread) and a
bit-exact round-trip check; and the JPEG file again with its masks declared
`Mask(compress="lz4")` (the field's stored bytes, and the serve CPU of image + mask from each
JPEG file). The masks:

  brightness  4 classes of brightness (`bench_dense.py`'s mask)
  kmeans      8 colour classes by k-means over the photo's RGB (a semantic segmentation map)
  instances   the 12 largest connected regions of the k-means map as instance ids 1..12, the
              rest background 0 (COCO-style instance masks)

    python benchmarks/bench_mask_storage.py [--photos 64]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import kodak_photos, machine  # noqa: E402

SIDE, CLASSES, INSTANCES, ROUNDS = 512, 8, 12, 3
MASKS = ("brightness", "kmeans", "instances")


def _lz4():
    lib = ctypes.CDLL(ctypes.util.find_library("lz4") or "liblz4.so.1")
    lib.LZ4_compressBound.argtypes = [ctypes.c_int]
    lib.LZ4_compress_default.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    lib.LZ4_decompress_safe.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    return lib


def lz4_compress(lib, data: bytes) -> bytes:
    dst = ctypes.create_string_buffer(lib.LZ4_compressBound(len(data)))
    n = lib.LZ4_compress_default(data, dst, len(data), len(dst))
    return dst.raw[:n]


def lz4_decompress(lib, data: bytes, dst: np.ndarray) -> float:
    """Decodes into `dst` (preallocated, as a serve path would); returns the call's seconds."""
    ptr = ctypes.cast(dst.ctypes.data, ctypes.c_char_p)
    t = time.perf_counter()
    got = lib.LZ4_decompress_safe(data, ptr, len(data), dst.nbytes)
    t = time.perf_counter() - t
    if got != dst.nbytes:
        raise RuntimeError("LZ4 round trip failed")
    return t


def kmeans_labels(im: np.ndarray, k: int, rng: np.random.Generator, iters: int = 8) -> np.ndarray:
    """(H, W) uint8 labels: k-means over the pixels' RGB, centres fitted on a sample."""
    px = im.reshape(-1, 3).astype(np.float32)
    sample = px[rng.choice(len(px), 4096, replace=False)]
    centres = sample[rng.choice(len(sample), k, replace=False)]
    for _ in range(iters):
        near = ((sample[:, None] - centres[None]) ** 2).sum(-1).argmin(1)
        centres = np.stack([sample[near == c].mean(0) if (near == c).any() else centres[c] for c in range(k)])
    d = (px**2).sum(1)[:, None] - 2 * px @ centres.T + (centres**2).sum(1)[None]
    return d.argmin(1).astype(np.uint8).reshape(im.shape[:2])


def instance_labels(classes: np.ndarray) -> np.ndarray:
    """The largest connected regions of a class map as instance ids 1..INSTANCES, else 0."""
    from scipy import ndimage

    out = np.zeros(classes.shape, np.uint8)
    regions, sizes = [], []
    for c in np.unique(classes):
        lab, n = ndimage.label(classes == c)
        counts = np.bincount(lab.ravel())[1:]
        regions += [(lab, j + 1) for j in range(n)]
        sizes += counts.tolist()
    for inst, r in enumerate(np.argsort(sizes)[::-1][:INSTANCES]):
        lab, j = regions[r]
        out[lab == j] = inst + 1
    return out


def make_files(dst: Path, count: int) -> dict[str, Path]:
    from PIL import Image

    import tbljax

    rng = np.random.default_rng(0)
    images, masks = [], {m: [] for m in MASKS}
    for p in kodak_photos()[:count]:
        im = np.asarray(Image.open(p).convert("RGB"))
        images.append(im)
        km = kmeans_labels(im, CLASSES, rng)
        masks["brightness"].append(np.digitize(im.mean(-1), [64, 128, 192]).astype(np.uint8))
        masks["kmeans"].append(km)
        masks["instances"].append(instance_labels(km))
    files = {}
    for name, fmt, compress, extra in (
        ("raw", "raw", None, {}),
        ("jpeg", "jpeg", None, {"quality": 90}),
        ("jpeg_lz4", "jpeg", "lz4", {"quality": 90}),
    ):
        files[name] = dst / f"{name}.tbl"
        tbljax.convert(
            {"image": images, **masks},
            files[name],
            image_size=SIDE,
            resize="shorter_side",
            format=fmt,
            progress=False,
            fields={m: tbljax.Mask(ignore=255, compress=compress) for m in MASKS},
            **extra,
        )
    return files


def serve_cpu_us(path: Path, fields: list[str] | None, batches: int = 12, batch_size: int = 16) -> float:
    """CPU microseconds per record (all threads) the host loader spends serving `path`: RRC +
    flip to 512 x 512, float32 normalized, 1 thread (bench_dense.py's recipe).
    Medians of interleaved rounds: see `measure`."""
    import resource

    import tbljax

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    opts = tbljax.LoaderOptions(
        batch_size=batch_size,
        seed=0,
        threads=1,
        dtype="float32",
        augment=tbljax.Augment(size=(SIDE, SIDE)),
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        fields=fields,
    )
    it = iter(tbljax.HostLoader(tbljax.open(str(path)), opts))
    for _ in range(4):  # the ring's first touch
        next(it).image[0, 0, 0, 0].item()
    c = cpu()
    for _ in range(batches):
        hb = next(it)
        hb.image[0, 0, 0, 0].item()
        for v in hb.fields.values():
            v[0].flat[0].item()
    return 1e6 * (cpu() - c) / (batches * batch_size)


def measure(files: dict[str, Path]) -> dict:
    from PIL import Image

    import tbljax

    lib = _lz4()
    raw, jpeg = tbljax.open(str(files["raw"])), tbljax.open(str(files["jpeg"]))
    n = len(raw)
    hw = np.stack([raw.index["height"], raw.index["width"]], 1).astype(np.int64)
    out = {
        "records": n,
        "pixels_per_record": float((hw[:, 0] * hw[:, 1]).mean()),
        "image_raw_bytes": float(raw.index["size"].mean()),
        "image_jpeg_q90_bytes": float(jpeg.index["size"].mean()),
    }
    runs = {"serve_raw_us": (files["raw"], None), "serve_raw_mask_us": (files["raw"], ["kmeans"])}
    runs["serve_jpeg_us"] = (files["jpeg"], None)
    runs["serve_jpeg_mask_us"] = (files["jpeg"], ["kmeans"])
    runs["serve_jpeg_lz4_mask_us"] = (files["jpeg_lz4"], ["kmeans"])
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(ROUNDS):  # interleaved rounds, medians: the neighbours' load swings
        for k, (path, fields) in runs.items():
            times[k].append(serve_cpu_us(path, fields))
    out.update({k: statistics.median(v) for k, v in times.items()})
    for m in MASKS:
        col = raw.field(m)
        # What the file holds: the records' values, and an int64 offset a record for a ragged
        # field (full-aspect masks are flat rows of their record's pixels).
        stored = sum(np.asarray(col[i]).nbytes for i in range(n)) + (0 if raw.fields[m].fixed else 8 * (n + 1))
        lz4_b = png_b = 0
        lz4_t = png_t = 0.0
        for i in range(n):
            mask = np.asarray(col[i]).reshape(hw[i])
            data = mask.tobytes()
            c = lz4_compress(lib, data)
            back = np.empty_like(mask)
            lz4_t += min(lz4_decompress(lib, c, back) for _ in range(3))  # best of 3: the load's noise out
            buf = io.BytesIO()
            Image.fromarray(mask).save(buf, "PNG", compress_level=6)
            t = time.perf_counter()
            png = np.asarray(Image.open(io.BytesIO(buf.getvalue())))
            png_t += time.perf_counter() - t  # once: 10-30x LZ4's anyway
            if not np.array_equal(back, mask) or not np.array_equal(png, mask):
                raise RuntimeError(f"{m}: record {i} does not round-trip")
            lz4_b += len(c)
            png_b += buf.tell()
        out[m] = {
            "stored_bytes": stored / n,
            "lz4_bytes": lz4_b / n,
            "lz4_field_bytes": tbljax.open(str(files["jpeg_lz4"])).field_bytes(m) / n,  # compress="lz4"
            "png_bytes": png_b / n,
            "lz4_decode_us": 1e6 * lz4_t / n,
            "png_decode_us": 1e6 * png_t / n,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photos", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        r = measure(make_files(Path(d), args.photos))
    print(f"# {machine()}")
    print(
        f"{r['records']} records, {r['pixels_per_record']:.0f} pixels each on average; image per record: "
        f"RAW {r['image_raw_bytes'] / 1024:.0f} KiB, JPEG q90 {r['image_jpeg_q90_bytes'] / 1024:.1f} KiB"
    )
    print(
        f"{'mask':<11} {'stored KiB':>10} {'LZ4 KiB':>8} {'ratio':>6} {'PNG KiB':>8} {'ratio':>6} "
        f"{'LZ4 dec us':>10} {'PNG dec us':>10} {'raw/JPEG':>8} {'LZ4/JPEG':>8}"
    )
    for m in MASKS:
        s = r[m]
        print(
            f"{m:<11} {s['stored_bytes'] / 1024:>10.1f} {s['lz4_bytes'] / 1024:>8.1f} "
            f"{s['stored_bytes'] / s['lz4_bytes']:>5.1f}x {s['png_bytes'] / 1024:>8.1f} "
            f"{s['stored_bytes'] / s['png_bytes']:>5.1f}x {s['lz4_decode_us']:>10.0f} {s['png_decode_us']:>10.0f} "
            f"{s['stored_bytes'] / r['image_jpeg_q90_bytes']:>8.2f} {s['lz4_bytes'] / r['image_jpeg_q90_bytes']:>8.2f}"
        )
    print(
        f"serve CPU per record (RRC + flip to {SIDE}, 1 thread): RAW image {r['serve_raw_us']:.0f} us, RAW image + "
        f"kmeans mask {r['serve_raw_mask_us']:.0f} us, JPEG q90 image {r['serve_jpeg_us']:.0f} us, + kmeans mask "
        f"{r['serve_jpeg_mask_us']:.0f} us, + kmeans mask stored compress='lz4' {r['serve_jpeg_lz4_mask_us']:.0f} us"
    )
    print(
        "stored compress='lz4' (KiB a record, blocks and offsets included): "
        + ", ".join(f"{m} {r[m]['lz4_field_bytes'] / 1024:.1f}" for m in MASKS)
    )
    print(json.dumps(r))


if __name__ == "__main__":
    main()

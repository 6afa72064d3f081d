"""What record fields cost (issue 22), side by side in one run: serving random-resized-crop +
flip float32 224 px images from the real photos (../shared/data/kodak, center-cropped to 256 px,
repeated to N records) alone, with a 768-float16 embedding field and a ragged int32 token field
padded to 64, and with a str caption through a byte-level `field_fn` tokenizer; and converting
the photos from a WebDataset TAR with and without those fields. Each configuration runs in its
own process, rounds interleaved; serving warms up past the ring's first touch (every slot
filled once) before the timed batches; medians of the rounds. Each reports wall-clock img/s and
the CPU time its process (all threads, and child processes) spent per 1000 images: on a shared,
loaded machine the wall clock swings with the neighbours' load, the CPU time far less, so the
cost of a field is judged on CPU time.

    python benchmarks/bench_fields.py [--rounds 3] [--records 1000] [--batches 30]
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA, kodak_photos, machine, median, rounds  # noqa: E402

B, OUT, SIDE, PAD, EMB = 128, 224, 256, 64, 768
WARMUP = 8  # > the ring's slots: every slot has been written once before the clock starts


def cpu_seconds() -> float:
    """User + system CPU time of this process's threads and of its finished children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def values(i: int, name: str) -> dict:
    """Record i's fields: a caption, a (768,) float16 embedding, 20..100 int32 tokens."""
    rng = np.random.default_rng(i)
    return {
        "caption": f"a photo of {name}, number {i}",
        "emb": rng.standard_normal(EMB).astype(np.float16),
        "tok": rng.integers(0, 32000, int(rng.integers(20, 101))).astype(np.int32),
    }


def _npy(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def write_tar(dst: Path, repeat: int) -> None:
    """The photos as a WebDataset shard, `repeat` times: key.jpg, key.txt, key.emb.npy, key.tok.npy."""
    files = kodak_photos()
    with tarfile.open(dst, "w") as tf:
        for i in range(repeat * len(files)):
            p = files[i % len(files)]
            v = values(i, p.stem)
            for ext, data in (
                ("jpg", p.read_bytes()),
                ("txt", v["caption"].encode()),
                ("emb.npy", _npy(v["emb"])),
                ("tok.npy", _npy(v["tok"])),
            ):
                ti = tarfile.TarInfo(f"r{i:06d}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))


FIELDS = {"caption": "txt", "emb": "emb.npy", "tok": "tok.npy"}


def make_served_file(dst: Path, records: int) -> None:
    """The photos at 256 px (center crop), repeated to `records`, with the three fields."""
    import tbljax

    base = dst.with_suffix(".base.tbl")
    tbljax.convert(SHARED_DATA / "kodak" / "images", base, image_size=SIDE, progress=False)
    view = tbljax.open(base).view()
    vals = [values(i, f"photo {i % len(view)}") for i in range(records)]
    tbljax.convert(
        {
            "image": view[np.arange(records) % len(view)],
            "label": np.zeros(records, np.int64),
            "caption": [v["caption"] for v in vals],
            "emb": np.stack([v["emb"] for v in vals]),
            "tok": [v["tok"] for v in vals],
        },
        dst,
        image_size=SIDE,
        progress=False,
    )
    base.unlink()


def byte_tokenizer(texts: list[str]) -> np.ndarray:
    """A byte-level tokenizer's batch encode: UTF-8 bytes + 1 (0 is padding), cut/padded to 64."""
    out = np.zeros((len(texts), PAD), np.int32)
    for r, t in enumerate(texts):
        b = np.frombuffer(t.encode()[:PAD], np.uint8)
        out[r, : len(b)] = b.astype(np.int32) + 1
    return out


SERVE = {
    "images": dict(fields=None),
    "images+emb+tok": dict(fields=["emb", "tok"], pad={"tok": PAD}),
    "images+caption_fn": dict(fields=["caption"], field_fn={"caption": byte_tokenizer}),
}


def serve_worker(kind: str, path: str, n_batches: int) -> dict:
    import tbljax

    ld = tbljax.loader(
        path, B, seed=0, num_epochs=None, augment=tbljax.Augment(size=(OUT, OUT)), dtype="float32", **SERVE[kind]
    )
    it = iter(ld)

    def take():
        b = next(it)
        for v in b.values():  # every array the step would get, touched
            np.asarray(v).reshape(-1)[0].item()

    for _ in range(WARMUP):
        take()
    t0, c0 = time.perf_counter(), cpu_seconds()
    for _ in range(n_batches):
        take()
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    ld.close()
    return {
        "kind": kind,
        "img_s": n_batches * B / wall,
        "cpu_s_per_1k": cpu / (n_batches * B) * 1e3,
        "fields_us_per_img": fields_cost(path, kind),
    }


def fields_cost(path: str, kind: str, reps: int = 50) -> float:
    """The producer thread's work for this configuration's fields alone (what a step adds to
    the image kernel), µs per image: one batch of random records built `reps` times, in this
    process, timed by the thread's CPU clock (steady on a loaded machine)."""
    import tbljax
    from tbljax._src.engine.batch_fields import FieldServing

    kw = SERVE[kind]
    fs = FieldServing(tbljax.open(path), kw.get("fields"), kw.get("field_fn"), kw.get("pad"))
    if not fs:
        return 0.0
    rng = np.random.default_rng(0)
    batches = [rng.choice(len(fs.dataset), B, replace=False) for _ in range(reps)]  # step order: random
    fs.build([batches[0]], [B], 0, 0)
    t0 = time.thread_time()
    for idx in batches:
        fs.build([idx], [B], 0, 0)
    return (time.thread_time() - t0) / (reps * B) * 1e6


def convert_worker(kind: str, tar: str) -> dict:
    import tbljax

    with tempfile.TemporaryDirectory() as d:
        t0, c0 = time.perf_counter(), cpu_seconds()
        s = tbljax.convert(
            tar,
            Path(d) / "out.tbl",
            image_size=SIDE,
            progress=False,
            fields=FIELDS if kind == "convert+fields" else None,
        )
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return {"kind": kind, "img_s": s.written / wall, "cpu_s_per_1k": cpu / s.written * 1e3, "records": s.written}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "PATH", "BATCHES"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--tar-repeat", type=int, default=1, help="copies of the photos in the conversion TAR")
    a = ap.parse_args()
    if a.worker:
        kind, path, nb = a.worker
        res = convert_worker(kind, path) if kind.startswith("convert") else serve_worker(kind, path, int(nb))
        print(json.dumps(res))
        return
    if not (SHARED_DATA / "kodak").is_dir():
        sys.exit(f"needs {SHARED_DATA / 'kodak'} (real photos beside the repo)")
    with tempfile.TemporaryDirectory() as d:
        served, tar = Path(d) / "served.tbl", Path(d) / "photos.tar"
        make_served_file(served, a.records)
        write_tar(tar, a.tar_repeat)
        configs = {k: [k, str(served), str(a.batches)] for k in SERVE}
        configs.update({k: [k, str(tar), "0"] for k in ("convert", "convert+fields")})
        res = rounds(Path(__file__), configs, a.rounds)
    m = {k: median(v, "img_s") for k, v in res.items()}
    c = {k: median(v, "cpu_s_per_1k") for k, v in res.items()}
    f = {k: median(v, "fields_us_per_img") for k, v in res.items() if k in SERVE}
    print(
        f"\nbench_fields: kodak ({len(kodak_photos())} photos) at {SIDE} px, {a.records} records, RRC + flip -> "
        f"{OUT} px float32, batch {B}, {WARMUP} warm-up + {a.batches} timed batches; conversion of "
        f"{a.tar_repeat * len(kodak_photos())} TAR records at {SIDE} px; median of {a.rounds} rounds\n"
        f"machine: {machine()}\n"
    )
    print(
        "| configuration | img/s (wall) | CPU s / 1000 img | cost (CPU time) | cost (wall) | target |\n"
        "|---|---|---|---|---|---|"
    )
    for k, base, target in (
        ("images", "images", ""),
        ("images+emb+tok", "images", "<= 10%"),
        ("images+caption_fn", "images", "<= 15%"),
        ("convert", "convert", ""),
        ("convert+fields", "convert", "<= 10%"),
    ):
        cpu_cost, wall_cost = c[k] / c[base] - 1, m[base] / m[k] - 1
        costs = "| |" if k == base else f"| {cpu_cost:+.1%} | {wall_cost:+.1%} |"
        print(f"| {k} | {m[k]:.0f} | {c[k]:.3f} {costs} {target} |")
    print(
        "\nthe producer's field work alone (FieldServing.build, thread CPU time), against the images' "
        "CPU time per image:\n\n| configuration | fields µs / img | of the images' CPU time |\n|---|---|---|"
    )
    for k in ("images+emb+tok", "images+caption_fn"):
        print(f"| {k} | {f[k]:.2f} | {f[k] / (c['images'] * 1e3):+.1%} |")


if __name__ == "__main__":
    main()

"""Conversion speed from each Hugging Face / TFDS source vs the WebDataset TAR path, on the same
real photos (../shared/data/kodak, or --photos DIR): a TAR, a datasets.Dataset, Parquet files,
TFRecord and ArrayRecord files of tf.train.Example. Each conversion runs in rounds, sources
interleaved, and the median img/s is reported with its ratio to the TAR path (target: within
15%).

    python benchmarks/bench_sources.py --size 160 --rounds 5
"""

from __future__ import annotations

import argparse
import io
import statistics
import struct
import tarfile
import tempfile
import time
from pathlib import Path

import tbljax

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", default=str(SHARED / "kodak"), help="a folder of JPEG photos")
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    import datasets
    from array_record.python.array_record_module import ArrayRecordWriter

    from tbljax._src.sources.tf_example import example_class
    from tbljax._src.sources.tfds import masked_crc32c

    files = sorted(p for p in Path(a.photos).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    photos = [(p.read_bytes(), k % 10) for k, p in enumerate(files)]
    d = Path(tempfile.mkdtemp(prefix="bench-sources-"))
    with tarfile.open(d / "train.tar", "w") as tf:
        for i, (b, c) in enumerate(photos):
            for ext, payload in (("jpg", b), ("cls", str(c).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
    names = [str(i) for i in range(10)]
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b, _ in photos], "label": [c for _, c in photos]},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)}),
    )
    ds.to_parquet(d / "train.parquet", batch_size=256)
    Example = example_class()
    records = []
    for b, c in photos:
        e = Example()
        e.features.feature["image"].bytes_list.value.append(b)
        e.features.feature["label"].int64_list.value.append(c)
        records.append(e.SerializeToString())
    with open(d / "train.tfrecord", "wb") as f:
        for r in records:
            head = struct.pack("<Q", len(r))
            f.write(head + struct.pack("<I", masked_crc32c(head)) + r + struct.pack("<I", masked_crc32c(r)))
    w = ArrayRecordWriter(str(d / "train.array_record"), "group_size:1")
    for r in records:
        w.write(r)
    w.close()
    sources = {
        "tar": str(d / "train.tar"),
        "datasets.Dataset": ds,
        "parquet": str(d / "train.parquet"),
        "tfrecord": str(d / "train.tfrecord"),
        "array_record": str(d / "train.array_record"),
    }
    rates: dict[str, list[float]] = {k: [] for k in sources}
    for _ in range(a.rounds):
        for name, src in sources.items():
            t0 = time.perf_counter()
            s = tbljax.convert(
                src,
                d / "out.tbl",
                image_size=a.size,
                threads=a.threads,
                overwrite=True,
                classes=names if name == "tar" else None,
                progress=False,
            )
            rates[name].append(s.written / (time.perf_counter() - t0))
    tar = statistics.median(rates["tar"])
    print(f"{len(photos)} photos from {a.photos}, image_size={a.size}, {a.rounds} rounds (median)")
    for name, r in rates.items():
        m = statistics.median(r)
        print(f"  {name:18s} {m:8.0f} img/s   {m / tar:6.2f}x the TAR path")


if __name__ == "__main__":
    main()

"""The datasets of the combination matrix (tests/test_matrix.py and its 2-process worker): every
record kind tbljax writes, as one file and as two shard files, made from the same small JPEG
photos, and each record's reference pixels taken from the file's bytes by an independent reader
(NumPy over the index for RAW records, Pillow for JPEG records, the RAW twin for records that
are decoded and resized at serve time). The "fields" kind is the same photos in a real
WebDataset TAR with a str, a json, a fixed and a ragged ndarray member per record; its source
values (`field_values`) are what every path must serve."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np

import tbljax
from tbljax._src.file.format import FORMATS

N = 10  # records per dataset
S = 16  # stored side
OUT = (8, 8)  # served crop
# kind: convert's arguments. Every kind is made from the same JPEG sources.
KINDS = {
    "raw_square": dict(resize="center_crop", format="raw"),
    "raw_shorter_side": dict(resize="shorter_side", format="raw"),
    "raw_max_side": dict(resize="max_side", format="raw"),
    "compact_square": dict(resize="center_crop", format="jpeg", quality=90),
    "compact_full_aspect": dict(resize="shorter_side", format="jpeg", quality=90),
    # Compact records with those costliest to decode stored RAW: at 16 px a JPEG is most of its
    # pixels' size, so a budget of 0.9 keeps both kinds in the file and in each shard file.
    "compact_raw_budget": dict(resize="shorter_side", format="jpeg", quality=90, raw_budget=0.9),
    "original_jpeg": dict(resize="center_crop", format="jpeg"),
    "lz4": dict(resize="center_crop", format="lz4"),
    # RAW records converted from a TAR whose records carry fields (see `field_values`).
    "fields": dict(
        resize="center_crop",
        format="raw",
        fields={"caption": "txt", "tags": "json", "emb": "emb.npy", "tok": "tok.npy"},
    ),
}
# What serving the fields kind needs: its ragged field cut or padded to 3 rows.
SERVE = {"fields": dict(pad={"tok": 3})}
PAD = 3
# Records decoded and resized at serve time have the pixels of the RAW conversion of the same
# sources with the same recipe (DESIGN §3): that twin is their reference.
TWIN = {"original_jpeg": "raw_square", "lz4": "raw_square"}
LAYOUTS = ("file", "shards")


def photos(d: Path) -> list[Path]:
    """N small JPEG photos of different shapes (smooth content, so LZ4 and JPEG both work)."""
    from PIL import Image

    rng = np.random.default_rng(7)
    paths = []
    for i in range(N):
        h, w = int(rng.integers(18, 40)), int(rng.integers(18, 40))
        y, x = np.mgrid[0:h, 0:w] // 14  # flat blocks: LZ4 finds repeats after the resize
        img = rng.integers(0, 256, (h // 14 + 1, w // 14 + 1, 3))[y, x].astype(np.uint8)
        p = d / f"c{i % 3}" / f"img{i:02d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(p, "JPEG", quality=92)
        paths.append(p)
    return paths


def field_values() -> list[dict]:
    """Record i's source values of the fields kind: a str (non-ASCII), a JSON object, a fixed
    (3,) float16 array and an int32 array of 0..5 values (ragged; longer and shorter than PAD)."""
    rng = np.random.default_rng(11)
    return [
        {
            "caption": f"photo {i} of c{i % 3} — é",
            "tags": {"tags": [f"c{i % 3}", i], "w": i / 2},
            "emb": rng.standard_normal(3).astype(np.float16),
            "tok": rng.integers(0, 300, i % 6).astype(np.int32),
        }
        for i in range(N)
    ]


def _npy(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def write_fields_tars(d: Path, src: list[Path]) -> list[str]:
    """Two WebDataset shards of the photos (records 0-4, 5-9): key.jpg, key.cls (label i) and
    the field members."""
    paths = [d / "fields-0.tar", d / "fields-1.tar"]
    values = field_values()
    for k, path in enumerate(paths):
        with tarfile.open(path, "w") as tf:
            for i in range(k * N // 2, (k + 1) * N // 2):
                _add_record(tf, i, src[i], values[i])
    return [str(p) for p in paths]


def _add_record(tf: tarfile.TarFile, i: int, p: Path, v: dict) -> None:
    members = {
        "jpg": p.read_bytes(),
        "cls": str(i).encode(),
        "txt": v["caption"].encode(),
        "json": json.dumps(v["tags"]).encode(),
        "emb.npy": _npy(v["emb"]),
        "tok.npy": _npy(v["tok"]),
    }
    for ext, data in members.items():
        ti = tarfile.TarInfo(f"rec{i:02d}.{ext}")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))


def make(d: Path) -> dict[tuple[str, str], object]:
    """{(kind, layout): path or [shard paths]} under folder d."""
    src = photos(d / "src")
    tars = write_fields_tars(d, src)
    out = {}
    for kind, kw in KINDS.items():
        if kind == "fields":  # labels from the .cls members
            source, labels = tars, {}
        else:
            source, labels = [str(p) for p in src], {"labels": list(range(N))}
        one = d / f"{kind}.tbl"
        tbljax.convert(source, one, image_size=S, progress=False, **labels, **kw)
        parts = [d / f"{kind}-{k}.tbl" for k in range(2)]
        for k, p in enumerate(parts):
            tbljax.convert(source, p, image_size=S, shard=(k, 2), progress=False, **labels, **kw)
        out[kind, "file"], out[kind, "shards"] = str(one), [str(p) for p in parts]
    return out


def _stored(path: str) -> list[np.ndarray]:
    """Each record's pixels, read from the file's bytes without tbljax's decoders: NumPy over
    the index for uncompressed RAW, Pillow for JPEG records."""
    from PIL import Image

    ds = tbljax.open(path)
    data = np.fromfile(path, np.uint8)
    out = []
    for e in ds.index:
        blob = data[int(e["offset"]) : int(e["offset"]) + int(e["size"])]
        if int(e["format"]) == FORMATS["JPEG"]:
            with Image.open(io.BytesIO(blob.tobytes())) as im:
                out.append(np.asarray(im.convert("RGB")))
        else:
            out.append(blob.reshape(int(e["height"]), int(e["width"]), 3))
    return out


def references(files: dict) -> dict[tuple[str, str], list[np.ndarray]]:
    """{(kind, layout): every record's reference pixels, by global record index}."""
    refs = {}
    for (kind, layout), where in files.items():
        paths = [where] if isinstance(where, str) else where
        twin = TWIN.get(kind)
        if twin is not None:
            tw = files[twin, layout]
            paths = [tw] if isinstance(tw, str) else tw
        refs[kind, layout] = [img for p in paths for img in _stored(p)]
    return refs


# The geometric row (issue 48): every record kind's conversion of the same photos from one TAR
# whose records carry a mask (.seg.png, the photo's size) and boxes with labels (.boxes.json).
GEO_FIELDS = {"seg": tbljax.Mask("seg.png", ignore=255), "boxes": tbljax.Boxes("boxes.json", labels="box_labels")}
# One kind stores its masks compress="lz4" (compact files' option): every geometric row serves it.
GEO_LZ4 = ("compact_full_aspect",)
# Original JPEG bytes keep the photo's own geometry: the conversion refuses geometric fields there.
GEO_REFUSED = ("original_jpeg",)
GEO_KINDS = {k: kw for k, kw in KINDS.items() if k not in ("fields", *GEO_REFUSED)}
MAXB = 3


def geometric_values(src: list[Path]) -> list[dict]:
    """Record i's source mask (labels 0..3 at the photo's size) and 1..4 boxes inside the photo."""
    from PIL import Image

    rng = np.random.default_rng(13)
    out = []
    for i, p in enumerate(src):
        with Image.open(p) as im:
            w, h = im.size
        n = i % 4 + 1
        xy = rng.uniform(0, [w / 2, h / 2], (n, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(3, [w / 2, h / 2], (n, 2))], 1)
        out.append({"seg": rng.integers(0, 4, (h, w)).astype(np.uint8), "boxes": boxes, "labels": np.arange(n) + i})
    return out


def make_geometric(d: Path) -> dict[str, str]:
    """{kind: path} of each record kind converted from the geometric TAR (one file each)."""
    from PIL import Image

    src = photos(d / "src")
    values = geometric_values(src)
    tar = d / "geo.tar"
    with tarfile.open(tar, "w") as tf:
        for i, (p, v) in enumerate(zip(src, values)):
            png = io.BytesIO()
            Image.fromarray(v["seg"]).save(png, "PNG")
            boxes = {"boxes": v["boxes"].tolist(), "labels": v["labels"].tolist()}
            members = {"jpg": p.read_bytes(), "cls": str(i).encode(), "seg.png": png.getvalue()}
            members["boxes.json"] = json.dumps(boxes).encode()
            for ext, data in members.items():
                ti = tarfile.TarInfo(f"rec{i:02d}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    out = {"tar": str(tar)}
    for kind, kw in GEO_KINDS.items():
        out[kind] = str(d / f"geo-{kind}.tbl")
        fields = (
            {**GEO_FIELDS, "seg": tbljax.Mask("seg.png", ignore=255, compress="lz4")} if kind in GEO_LZ4 else GEO_FIELDS
        )
        tbljax.convert([str(tar)], out[kind], image_size=S, progress=False, fields=fields, **kw)
    return out


def geometric_references(files: dict) -> dict[str, list[np.ndarray]]:
    """{kind: every geometric record's reference pixels}: read from the file's bytes as
    `references` does (records decoded and resized at serve time: their RAW twin's)."""
    return {kind: _stored(files[TWIN.get(kind, kind)]) for kind in GEO_KINDS}


# The linear dense-map row: a float32 map a record (the photo's size; 0 = invalid on about a
# third of its samples, and on its left third in every other record, so that some served
# values have no valid tap) stored DenseMap(interpolation="linear"), on two record kinds.
DENSE = tbljax.DenseMap("depth.npy", interpolation="linear", invalid=0.0)
DENSE_KINDS = ("raw_square", "compact_full_aspect")


def dense_values(src: list[Path]) -> list[np.ndarray]:
    from PIL import Image

    rng = np.random.default_rng(17)
    out = []
    for i, p in enumerate(src):
        with Image.open(p) as im:
            w, h = im.size
        a = rng.uniform(1, 10, (h, w)).astype(np.float32)
        a[rng.random((h, w)) < 0.3] = 0
        a[:, : w // 3 if i % 2 else 0] = 0
        out.append(a)
    return out


def make_dense(d: Path) -> tuple[dict[str, str], list[np.ndarray]]:
    """({kind: path} of DENSE_KINDS converted from a TAR of the photos and their maps, the maps)."""
    src = photos(d / "src")
    values = dense_values(src)
    tar = d / "dense.tar"
    with tarfile.open(tar, "w") as tf:
        for i, (p, v) in enumerate(zip(src, values)):
            for ext, data in {"jpg": p.read_bytes(), "cls": str(i).encode(), "depth.npy": _npy(v)}.items():
                ti = tarfile.TarInfo(f"rec{i:02d}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    out = {k: str(d / f"dense-{k}.tbl") for k in DENSE_KINDS}
    for kind, path in out.items():
        tbljax.convert([str(tar)], path, image_size=S, progress=False, fields={"depth": DENSE}, **KINDS[kind])
    return out, values

"""convert on real photos: labels and keys survive, pixels match an independent Pillow
reference, every kind of bad input is skipped and reported (or stops a strict run with no
output), interrupted runs leave nothing, and turboloader's files and ours agree."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

import tbljax
from tbljax import _core
from tbljax._src.sources.files import expand_braces

PIL_FILTERS = {
    "bilinear": Image.BILINEAR,
    "triangle": Image.BILINEAR,
    "bicubic": Image.BICUBIC,
    "lanczos": Image.LANCZOS,
    "lanczos3": Image.LANCZOS,
}
# Same filter as Pillow, different fixed-point rounding: without DCT-domain downscaling the two
# agree within 1 level (tests/test_decode.py). When the source is >= 2x the output, libjpeg's
# DCT downscaling is used, which is not bit-identical to a full decode; measured on caltech101
# + kodak its worst image is ~33 dB PSNR vs Pillow, median ~50 dB. Asserted with margin:
MIN_PSNR_DB = 30.0
MEAN_ABS_TOL = 2.0


def pil_reference(data: bytes, size: int, mode: str) -> np.ndarray:
    """Independent reference: Pillow decode + EXIF transpose + Pillow's antialiased resize."""
    im = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    w, h = im.size
    filt = PIL_FILTERS[_core.native_info().get("resize_filter", "bilinear").lower()]
    if mode == "squash":
        return np.asarray(im.resize((size, size), filt))
    side = min(w, h)  # center_crop: the centred square of the short side, scaled to S×S
    box = ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)
    return np.asarray(im.resize((size, size), filt, box=box))


def assert_close_to_reference(ours: np.ndarray, ref: np.ndarray, what: str):
    d = np.abs(ours.astype(np.int16) - ref.astype(np.int16))
    assert ours.shape == ref.shape, what
    mse = float((d.astype(np.float64) ** 2).mean())
    psnr = 10 * np.log10(255**2 / mse) if mse else np.inf
    assert psnr >= MIN_PSNR_DB and d.mean() <= MEAN_ABS_TOL, (
        f"{what}: PSNR {psnr:.1f} dB, mean |diff| {d.mean():.2f}, max {d.max()}"
    )


def caltech_rows(root: Path) -> list[dict[str, str]]:
    with open(root / "labels.csv") as f:
        return list(csv.DictReader(f))


def make_tar(path: Path, members: list[tuple[str, bytes]]):
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))


def test_expand_braces():
    assert expand_braces("t-{000..002}.tar") == ["t-000.tar", "t-001.tar", "t-002.tar"]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    assert expand_braces("plain.tar") == ["plain.tar"]


def test_caltech_folder_labels_keys_pixels(caltech101, tmp_path):
    dst = tmp_path / "c.tbl"
    s = tbljax.convert(caltech101 / "images", dst, image_size=64, progress=False)
    rows = caltech_rows(caltech101)
    assert s.written == len(rows) == 1010 and s.skipped == []
    ds = tbljax.open(dst)
    assert ds.classes == (caltech101 / "classes.txt").read_text().split()
    want = {r["path"].removeprefix("images/"): int(r["label"]) for r in rows}
    assert dict(zip(ds.keys, ds.labels.tolist())) == want
    assert ds.image_shape == (64, 64) and ds.recipe["resize"] == "center_crop"
    rng = np.random.default_rng(0)
    for i in rng.choice(len(ds), 40, replace=False):
        data = (caltech101 / "images" / ds.keys[i]).read_bytes()
        assert_close_to_reference(ds.read(i), pil_reference(data, 64, "center_crop"), ds.keys[i])
    gray = [r["path"].removeprefix("images/") for r in rows if r["mode"] == "L"]
    assert len(gray) > 0
    key_to_i = {k: i for i, k in enumerate(ds.keys)}
    for k in gray:
        img = ds.read(key_to_i[k]).astype(int)
        assert (img[..., 0] == img[..., 1]).all() and (img[..., 1] == img[..., 2]).all(), k


@pytest.mark.parametrize("mode", ["squash", "center_crop"])
def test_kodak_pixels_match_pillow(kodak, tmp_path, mode):
    files = sorted((kodak / "images").rglob("*.jpg"))[::25]
    dst = tmp_path / "k.tbl"
    tbljax.convert(files, dst, image_size=160, resize=mode, progress=False)
    ds = tbljax.open(dst)
    assert len(ds) == len(files)
    for i, f in enumerate(files):
        assert_close_to_reference(ds.read(i), pil_reference(f.read_bytes(), 160, mode), f.name)


def test_max_side_keeps_aspect(caltech101, tmp_path):
    files = sorted((caltech101 / "images" / "Faces").glob("*.jpg"))[:3]
    tbljax.convert(files, tmp_path / "m.tbl", image_size=100, resize="max_side", progress=False)
    ds = tbljax.open(tmp_path / "m.tbl")
    for i, f in enumerate(files):
        with Image.open(f) as im:
            w, h = im.size
        img = ds.read(i)
        assert max(img.shape[:2]) == 100
        assert abs(img.shape[1] / img.shape[0] - w / h) < 0.02


def webdataset_shards(caltech101: Path, tmp_path: Path, n_shards=3, per=6):
    rows = caltech_rows(caltech101)[::40][: n_shards * per]
    for s in range(n_shards):
        members = []
        for j, r in enumerate(rows[s * per : (s + 1) * per]):
            key = f"sample{s:02d}{j:03d}"
            members.append((f"{key}.jpg", (caltech101 / r["path"]).read_bytes()))
            if j % 2:
                members.append((f"{key}.cls", r["label"].encode()))
            else:
                members.append((f"{key}.json", f'{{"label": {r["label"]}, "name": "x"}}'.encode()))
        make_tar(tmp_path / f"shard-{s:03d}.tar", members)
    return rows


def test_webdataset_shards_with_brace_pattern(caltech101, tmp_path):
    rows = webdataset_shards(caltech101, tmp_path)
    dst = tmp_path / "w.tbl"
    s = tbljax.convert(str(tmp_path / "shard-{000..002}.tar"), dst, image_size=48, progress=False)
    ds = tbljax.open(dst)
    assert s.written == len(ds) == len(rows)
    assert ds.keys == [f"sample{s:02d}{j:03d}" for s in range(3) for j in range(6)]
    assert ds.labels.tolist() == [int(r["label"]) for r in rows]
    assert ds.recipe["sources"] == [str(tmp_path / f"shard-{s:03d}.tar") for s in range(3)]


def bad_members(caltech101: Path):
    good = (caltech101 / "images/Faces/image_0021.jpg").read_bytes()
    return good, [
        ("ok1.jpg", good),
        ("truncated.jpg", good[: len(good) // 2]),
        ("zero.jpg", b""),
        ("garbage.jpg", bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8))),
        ("text.png", b"this is a text file, not an image"),
        ("corrupt.jpg", good[:600] + bytes(2000) + good[2600:]),
        ("nolabel_only.cls", b"3"),
        ("ok2.jpg", good),
    ]


def test_bad_members_are_skipped_and_listed(caltech101, tmp_path):
    good, members = bad_members(caltech101)
    make_tar(tmp_path / "bad.tar", members)
    dst = tmp_path / "b.tbl"
    s = tbljax.convert(tmp_path / "bad.tar", dst, image_size=32, progress=False)
    reasons = {x["key"]: x["reason"] for x in s.skipped}
    assert set(reasons) == {"truncated", "zero", "garbage", "text", "corrupt", "nolabel_only"}
    assert all(x["source"] == str(tmp_path / "bad.tar") for x in s.skipped)
    assert "empty" in reasons["zero"] and "no image" in reasons["nolabel_only"]
    ds = tbljax.open(dst)
    assert ds.keys == ["ok1", "ok2"] and [x["key"] for x in ds.skipped] == [x["key"] for x in s.skipped]
    np.testing.assert_array_equal(ds.read(0), ds.read(1))
    assert "skipped 6" in str(s) and "truncated" in str(s)


def test_truncated_jpeg_is_never_written_grey(caltech101, tmp_path):
    good = (caltech101 / "images/Faces/image_0021.jpg").read_bytes()
    for cut in (0.3, 0.6, 0.95):
        with pytest.raises((tbljax.DecodeError, ValueError)):
            _core.decode_jpeg(good[: int(len(good) * cut)])


def test_strict_stops_and_writes_nothing(caltech101, tmp_path):
    _, members = bad_members(caltech101)
    make_tar(tmp_path / "bad.tar", members)
    dst = tmp_path / "b.tbl"
    with pytest.raises(tbljax.ConversionError, match="strict") as e:
        tbljax.convert(tmp_path / "bad.tar", dst, image_size=32, strict=True, progress=False)
    assert {x["key"] for x in e.value.skipped} >= {"truncated", "zero", "garbage"}
    assert sorted(os.listdir(tmp_path)) == ["bad.tar"]


def test_existing_destination_is_kept(caltech101, tmp_path):
    dst = tmp_path / "out.tbl"
    dst.write_bytes(b"keep me")
    files = sorted((caltech101 / "images/Faces").glob("*.jpg"))[:2]
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tbljax.convert(files, dst, image_size=16, progress=False)
    assert dst.read_bytes() == b"keep me"
    tbljax.convert(files, dst, image_size=16, overwrite=True, progress=False)
    assert len(tbljax.open(dst)) == 2


def test_numpy_arrays_with_labels(tmp_path):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (5, 20, 30, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (20, 30), dtype=np.uint8)
    s = tbljax.convert(
        list(imgs) + [gray],
        tmp_path / "a.tbl",
        image_size=20,
        resize="center_crop",
        labels=[0, 1, 2, 3, 4, 5],
        progress=False,
    )
    ds = tbljax.open(tmp_path / "a.tbl")
    assert s.written == 6 and ds.labels.tolist() == [0, 1, 2, 3, 4, 5]
    # A 20x30 image center-cropped to 20x20 with no scaling is exactly its central columns.
    np.testing.assert_array_equal(ds.read(0), imgs[0][:, 5:25])
    np.testing.assert_array_equal(ds.read(5), np.repeat(gray[:, 5:25, None], 3, axis=2))
    with pytest.raises(ValueError, match="labels"):
        tbljax.convert(imgs, tmp_path / "b.tbl", image_size=8, labels=[1, 2])


def test_png_and_other_formats_through_pillow(tmp_path):
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
    for ext in ("png", "bmp", "webp"):
        Image.fromarray(img).save(tmp_path / f"a.{ext}", lossless=True) if ext == "webp" else Image.fromarray(img).save(
            tmp_path / f"a.{ext}"
        )
    files = [tmp_path / f"a.{e}" for e in ("png", "bmp", "webp")]
    tbljax.convert(files, tmp_path / "p.tbl", image_size=40, progress=False)
    ds = tbljax.open(tmp_path / "p.tbl")
    for i in range(3):
        np.testing.assert_array_equal(ds.read(i), img)  # same size: resize is the identity


@pytest.mark.parametrize("fmt", ["jpeg", "lz4"])
def test_jpeg_and_lz4_files_serve_the_raw_pixels(caltech101, tmp_path, fmt):
    files = sorted((caltech101 / "images").rglob("*.jpg"))[::50]
    tbljax.convert(files, tmp_path / "raw.tbl", image_size=56, progress=False)
    tbljax.convert(files, tmp_path / "x.tbl", image_size=56, format=fmt, progress=False)
    raw, other = tbljax.open(tmp_path / "raw.tbl"), tbljax.open(tmp_path / "x.tbl")
    assert other.record_format == fmt and other.image_shape == (56, 56)
    for i in range(len(raw)):
        np.testing.assert_array_equal(other.read(i), raw.read(i))
    out = np.empty((len(raw), 56, 56, 3), np.uint8)
    other.read_into(np.arange(len(raw)), out)
    np.testing.assert_array_equal(out, raw.view())
    if fmt == "jpeg":
        assert os.path.getsize(tmp_path / "x.tbl") < os.path.getsize(tmp_path / "raw.tbl") * 2


INTERRUPT_SCRIPT = r"""
import signal, sys, numpy as np, tbljax
# A shell that starts jobs in the background (a CI runner, `nohup ... &`) makes them ignore
# SIGINT, and children inherit that: Ctrl-C would then never reach Python. Restore it.
signal.signal(signal.SIGINT, signal.default_int_handler)
rng = np.random.default_rng(0)
imgs = [rng.integers(0, 256, (300, 300, 3), dtype=np.uint8) for _ in range(64)]
print("started", flush=True)
tbljax.convert(imgs * 400, sys.argv[1], image_size=200, progress=False)
print("finished", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill"])
def test_interrupted_convert_leaves_no_file(tmp_path, sig):
    dst = tmp_path / "out.tbl"
    p = subprocess.Popen(
        [sys.executable, "-c", INTERRUPT_SCRIPT, str(dst)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "started"
    time.sleep(1.0)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert "finished" not in out, "conversion ended before the signal: make the workload larger"
    assert not dst.exists()
    assert os.listdir(tmp_path) == []  # no temporary left either
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err


def test_cli_convert_progress_and_summary(caltech101, tmp_path):
    files = [str(f) for f in sorted((caltech101 / "images/Leopards").glob("*.jpg"))]
    r = subprocess.run(
        [sys.executable, "-m", "tbljax", "convert", *files, "-o", str(tmp_path / "c.tbl"), "-s", "32"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "img/s" in r.stderr and f"wrote {len(files)} records" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "tbljax", "convert", *files, "-o", str(tmp_path / "c.tbl"), "-s", "32"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "already exists" in r.stderr


# ---- turboloader 2.39 interop on real photos ----


@pytest.fixture
def tl():
    # Per test, not at module level: a module-level importorskip skips every test of the file
    # where turboloader is absent (as in CI's job on the oldest dependency versions).
    return pytest.importorskip(
        "turboloader", reason="turboloader 2.39 is the interop peer (pip install 'tbljax[test]')"
    )


def test_turboloader_preprocess_to_tbl_opens_identically(tl, kodak, tmp_path):
    files = sorted((kodak / "images").rglob("*.jpg"))[:24]
    make_tar(tmp_path / "k.tar", [(f"{i:04d}.jpg", f.read_bytes()) for i, f in enumerate(files)])
    dst = tmp_path / "tl.tbl"
    n = tl.preprocess_to_tbl(str(tmp_path / "k.tar"), str(dst), image_size=64, num_workers=2)
    ds = tbljax.open(dst)
    assert len(ds) == n == 24 and ds.record_format == "raw" and ds.image_shape == (64, 64)
    r = tl.TblReaderV2(str(dst), verify_checksums=True)
    for i in range(n):
        assert ds.read(i).tobytes() == r.read_sample(i)
    assert ds.verify() == []


def test_turboloader_jpeg_records_decode_like_pillow(tl, caltech101, tmp_path):
    files = sorted((caltech101 / "images").rglob("*.jpg"))[::101]
    p = tmp_path / "tlj.tbl"
    w = tl.TblWriterV2(str(p), enable_compression=True)
    for f in files:
        w.add_sample(f.read_bytes(), tl.SampleFormat.JPEG, width=0, height=0)
    w.finalize()
    ds = tbljax.open(p)
    assert len(ds) == len(files)
    for i, f in enumerate(files):
        with Image.open(f) as im:
            ref = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
        np.testing.assert_array_equal(ds.read(i), ref)  # both libjpeg-turbo ISLOW: identical


def test_our_converted_file_serves_through_turboloader(tl, caltech101, tmp_path):
    files = sorted((caltech101 / "images").rglob("*.jpg"))[::60]
    tbljax.convert(files, tmp_path / "o.tbl", image_size=40, progress=False)
    ds = tbljax.open(tmp_path / "o.tbl")
    r = tl.TblReaderV2(str(tmp_path / "o.tbl"), verify_checksums=True)
    assert [r.read_sample(i) for i in range(len(ds))] == [ds.read(i).tobytes() for i in range(len(ds))]
    loader = tl.TblRawImageLoader(
        str(tmp_path / "o.tbl"), batch_size=len(ds), shuffle=False, mean=None, std=None, prefetch_batches=0
    )
    batch, meta = next(iter(loader))
    got = np.rint(np.asarray(batch).transpose(0, 2, 3, 1) * 255).astype(np.uint8)
    np.testing.assert_array_equal(got, ds.view()[np.asarray(meta["indices"])])


# ---- labels: names, tables, unreadable labels ----


def tiny_jpeg(seed: int) -> bytes:
    b = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(b, "JPEG")
    return b.getvalue()


def named_label_shards(tmp_path: Path) -> dict[str, str]:
    """Two shards whose labels are WordNet ids in every spelling a WebDataset shard carries
    them; returns key -> name."""
    names = {"a": "n02", "b": "n01", "c": "n03", "d": "n01", "e": "n02", "f": "n03"}
    make_tar(
        tmp_path / "s-0.tar",
        [
            ("a.jpg", tiny_jpeg(0)),
            ("a.cls", b"n02\n"),
            ("b.jpg", tiny_jpeg(1)),
            ("b.json", b'{"label": "n01", "x": 1}'),
            ("c.jpg", tiny_jpeg(2)),
            ("c.json", b'"n03"'),
        ],
    )
    make_tar(
        tmp_path / "s-1.tar",
        [
            ("d.jpg", tiny_jpeg(3)),
            ("d.cls2", b"n01"),
            ("e.jpg", tiny_jpeg(4)),
            ("e.label", b" n02 "),
            ("f.jpg", tiny_jpeg(5)),
            ("f.json", b'{"class": "n03"}'),
        ],
    )
    return names


def test_class_names_in_tar_shards_build_a_sorted_table(tmp_path):
    names = named_label_shards(tmp_path)
    s = tbljax.convert(str(tmp_path / "s-{0..1}.tar"), tmp_path / "o.tbl", image_size=16, progress=False)
    ds = tbljax.open(tmp_path / "o.tbl")
    assert ds.classes == s.classes == ["n01", "n02", "n03"] and s.label_errors == []
    assert [ds.classes[i] for i in ds.labels] == [names[k] for k in ds.keys]


def test_classes_fix_the_ids_for_every_source(tmp_path):
    names = named_label_shards(tmp_path)
    order = ["n03", "n01", "n02", "n99"]
    (tmp_path / "classes.txt").write_text("\n".join(order) + "\n\n")
    for classes in (order, tmp_path / "classes.txt", str(tmp_path / "classes.txt")):
        tbljax.convert(
            str(tmp_path / "s-{0..1}.tar"),
            tmp_path / "o.tbl",
            image_size=16,
            classes=classes,
            overwrite=True,
            progress=False,
        )
        ds = tbljax.open(tmp_path / "o.tbl")
        assert ds.classes == order and ds.labels.tolist() == [order.index(names[k]) for k in ds.keys]
    # An image folder: subfolder names take their ids from the list (extra names allowed).
    for c in ("cat", "dog"):
        (tmp_path / "folder" / c).mkdir(parents=True)
        (tmp_path / "folder" / c / "x.jpg").write_bytes(tiny_jpeg(len(c)))
    tbljax.convert(
        tmp_path / "folder", tmp_path / "f.tbl", image_size=16, classes=["eel", "dog", "cat"], progress=False
    )
    ds = tbljax.open(tmp_path / "f.tbl")
    assert ds.classes == ["eel", "dog", "cat"]
    assert dict(zip(ds.keys, ds.labels.tolist())) == {"cat/x.jpg": 2, "dog/x.jpg": 1}
    with pytest.raises(ValueError, match="'dog'.*not in classes"):
        tbljax.convert(tmp_path / "folder", tmp_path / "g.tbl", image_size=16, classes=["cat"])
    # Arrays: names as labels=, with or without a table; ids checked against one.
    imgs = np.zeros((3, 8, 8, 3), np.uint8)
    tbljax.convert(imgs, tmp_path / "a.tbl", image_size=8, labels=["dog", "cat", "dog"], progress=False)
    ds = tbljax.open(tmp_path / "a.tbl")
    assert ds.classes == ["cat", "dog"] and ds.labels.tolist() == [1, 0, 1]
    tbljax.convert((imgs, [2, 0, 1]), tmp_path / "b.tbl", image_size=8, classes=["x", "y", "z"], progress=False)
    assert tbljax.open(tmp_path / "b.tbl").classes == ["x", "y", "z"]
    with pytest.raises(ValueError, match="out of range"):
        tbljax.convert((imgs, [3, 0, 1]), tmp_path / "c.tbl", image_size=8, classes=["x", "y", "z"])
    with pytest.raises(ValueError, match="appears twice"):
        tbljax.convert(imgs, tmp_path / "c.tbl", image_size=8, classes=["x", "y", "x"])
    with pytest.raises(FileNotFoundError, match="classes file"):
        tbljax.convert(imgs, tmp_path / "c.tbl", image_size=8, classes=tmp_path / "nope.txt")


def test_integer_labels_leave_classes_none(tmp_path):
    make_tar(
        tmp_path / "i.tar",
        [("a.jpg", tiny_jpeg(0)), ("a.cls", b"7"), ("b.jpg", tiny_jpeg(1)), ("b.json", b'{"label": 2}')],
    )
    s = tbljax.convert(tmp_path / "i.tar", tmp_path / "i.tbl", image_size=16, progress=False)
    ds = tbljax.open(tmp_path / "i.tbl")
    assert ds.labels.tolist() == [7, 2] and ds.classes is None and s.classes is None
    assert str(s).splitlines()[0].endswith("; skipped 0; classes 2")  # distinct ids, without names


def test_summary_says_the_class_count_or_that_nothing_is_labelled(caltech101, kodak, tmp_path):
    s = tbljax.convert(caltech101 / "images", tmp_path / "c.tbl", image_size=16, progress=False)
    assert str(s).splitlines() == [str(s).splitlines()[0]] and str(s).endswith("; skipped 0; classes 101")
    # A flat folder of photos: every label -1, said in one line with where labels come from.
    s = tbljax.convert(kodak / "images", tmp_path / "k.tbl", image_size=16, progress=False)
    assert (tbljax.open(tmp_path / "k.tbl").labels == -1).all() and s.num_classes == 0
    assert str(s).splitlines()[0].endswith("; skipped 0; unlabelled")
    assert str(s).splitlines()[1:] == [
        "  unlabelled: every record's label is -1; an image folder takes its "
        "labels from one subfolder per class, named after it"
    ]
    make_tar(tmp_path / "u.tar", [("a.jpg", tiny_jpeg(0)), ("a.txt", b"a caption")])
    s = tbljax.convert(tmp_path / "u.tar", tmp_path / "u.tbl", image_size=8, progress=False)
    assert str(s).splitlines()[1] == (
        "  unlabelled: every record's label is -1; TAR shards take labels from a "
        ".cls, .cls2, .label or .json member beside each image (label_ext= "
        "names another)"
    )  # the CLI's summary names --label-ext
    s = tbljax.convert(np.zeros((2, 8, 8, 3), np.uint8), tmp_path / "a.tbl", image_size=8, progress=False)
    assert str(s).splitlines()[1].endswith("; arrays take labels from labels=, one per image")


def test_unreadable_labels_are_reported_and_strict_stops(tmp_path):
    make_tar(
        tmp_path / "l.tar",
        [
            ("ok.jpg", tiny_jpeg(0)),
            ("ok.cls", b"n01"),
            ("binary.jpg", tiny_jpeg(1)),
            ("binary.cls", b"\xff\xfe\x00"),
            ("empty.jpg", tiny_jpeg(2)),
            ("empty.cls", b""),
            ("badjson.jpg", tiny_jpeg(3)),
            ("badjson.json", b"{nope"),
            ("float.jpg", tiny_jpeg(4)),
            ("float.json", b'{"label": 1.5}'),
            ("meta.jpg", tiny_jpeg(5)),
            ("meta.json", b'{"caption": "a dog"}'),  # metadata, not a label
            ("nolabel.jpg", tiny_jpeg(6)),
        ],
    )
    s = tbljax.convert(tmp_path / "l.tar", tmp_path / "l.tbl", image_size=16, progress=False)
    ds = tbljax.open(tmp_path / "l.tbl")
    assert s.written == 7 and s.skipped == [] and ds.classes == ["n01"]
    assert ds.labels.tolist() == [0, -1, -1, -1, -1, -1, -1]
    reasons = {e["key"]: e["reason"] for e in s.label_errors}
    assert set(reasons) == {"binary", "empty", "badjson", "float"}
    assert "UTF-8" in reasons["binary"] and "empty" in reasons["empty"] and "JSON" in reasons["badjson"]
    assert "labels unreadable 4" in str(s) and ds.recipe["label_errors"] == 4
    with pytest.raises(tbljax.ConversionError, match="label unreadable") as e:
        tbljax.convert(tmp_path / "l.tar", tmp_path / "strict.tbl", image_size=16, strict=True, progress=False)
    assert {x["key"] for x in e.value.skipped} >= {"binary", "empty"} and not (tmp_path / "strict.tbl").exists()
    # A name missing from a given table is unreadable too; ids beyond it as well.
    s = tbljax.convert(tmp_path / "l.tar", tmp_path / "t.tbl", image_size=16, classes=["n02"], progress=False)
    assert "'n01' is not in classes" in {e["key"]: e["reason"] for e in s.label_errors}["ok"]


def test_label_ext_reads_class_names_from_txt(tmp_path):
    make_tar(
        tmp_path / "t.tar",
        [
            ("a.jpg", tiny_jpeg(0)),
            ("a.txt", b"tench\n"),
            ("a.cls", b"5"),
            ("b.jpg", tiny_jpeg(1)),
            ("b.txt", b"goldfish"),
        ],
    )
    s = tbljax.convert(tmp_path / "t.tar", tmp_path / "default.tbl", image_size=16, progress=False)
    assert tbljax.open(tmp_path / "default.tbl").labels.tolist() == [5, -1] and s.label_errors == []
    tbljax.convert(tmp_path / "t.tar", tmp_path / "txt.tbl", image_size=16, label_ext="txt", progress=False)
    ds = tbljax.open(tmp_path / "txt.tbl")
    assert ds.classes == ["goldfish", "tench"] and ds.labels.tolist() == [1, 0]


def test_mixed_ids_and_names_are_an_error(tmp_path):
    make_tar(tmp_path / "m.tar", [("a.jpg", tiny_jpeg(0)), ("a.cls", b"3"), ("b.jpg", tiny_jpeg(1)), ("b.cls", b"n01")])
    with pytest.raises(tbljax.ConversionError, match="mix integer ids"):
        tbljax.convert(tmp_path / "m.tar", tmp_path / "m.tbl", image_size=16, progress=False)
    assert not (tmp_path / "m.tbl").exists()


# ---- conversions that write nothing, missing inputs ----


def test_a_conversion_that_writes_no_record_is_an_error(tmp_path):
    images = np.zeros((4, 8, 8, 3), np.uint8)
    labels = np.arange(4)
    make_tar(tmp_path / "empty.tar", [])
    make_tar(tmp_path / "labels-only.tar", [("a.cls", b"1"), ("b.cls", b"2")])
    make_tar(tmp_path / "all-bad.tar", [("a.jpg", b"not a jpeg"), ("b.jpg", b"")])
    cases = [
        (tmp_path / "empty.tar", "no images"),
        (tmp_path / "labels-only.tar", "no images"),
        (tmp_path / "all-bad.tar", "all 2 items were skipped"),
        ([np.zeros((8, 8), np.float32)] * 3, "all 3 items were skipped"),
    ]
    for src, msg in cases:
        with pytest.raises(tbljax.ConversionError, match=msg):
            tbljax.convert(src, tmp_path / "o.tbl", image_size=8, progress=False)
        assert not (tmp_path / "o.tbl").exists()
    # A folder of TAR shards is not an image folder: the error counts them and says how to pass them.
    (tmp_path / "shards").mkdir()
    (tmp_path / "mixed").mkdir()
    for i in range(3):
        make_tar(tmp_path / "shards" / f"train-{i:03d}.tar", [("a.jpg", tiny_jpeg(i))])
    make_tar(tmp_path / "mixed" / "a.tar", [])
    make_tar(tmp_path / "mixed" / "b7.tar", [])
    with pytest.raises(
        ValueError,
        match=r"^image folder .*shards holds no images but 3 TAR files \(train-000.tar, "
        r"\.\.\.\): pass the shards themselves, e\.g\. '.*shards/train-\{000\.\.002\}\.tar'$",
    ):
        tbljax.convert(tmp_path / "shards", tmp_path / "o.tbl", image_size=8, progress=False)
    with pytest.raises(
        ValueError,
        match=r"holds no images but 2 TAR files .*: pass the shards themselves, "
        r"e\.g\. .*mixed/\*\.tar \(a shell expands it into the list of files\)$",
    ):
        tbljax.convert(tmp_path / "mixed", tmp_path / "o.tbl", image_size=8, progress=False)
    assert (
        tbljax.convert(
            str(tmp_path / "shards" / "train-{000..002}.tar"), tmp_path / "o.tbl", image_size=8, progress=False
        ).written
        == 3
    )
    os.remove(tmp_path / "o.tbl")
    # The spelling of issue 11 that used to write an empty file: now it converts.
    assert tbljax.convert((images, labels), tmp_path / "x.tbl", image_size=32, progress=False).written == 4


def test_missing_inputs_raise_file_not_found(tmp_path):
    for src in (
        str(tmp_path / "s-{0..2}.tar"),
        tmp_path / "nope.jpg",
        tmp_path / "nofolder",
        [tmp_path / "a.png", tmp_path / "b.png"],
    ):
        with pytest.raises(FileNotFoundError, match="not found"):
            tbljax.convert(src, tmp_path / "o.tbl", image_size=8, progress=False)
    with pytest.raises(FileNotFoundError, match="destination directory"):
        tbljax.convert(np.zeros((1, 8, 8, 3), np.uint8), tmp_path / "no" / "o.tbl", image_size=8)


def test_sharded_conversion_with_class_names_needs_classes(tmp_path):
    names = named_label_shards(tmp_path)
    pattern = str(tmp_path / "s-{0..1}.tar")
    with pytest.raises(tbljax.ConversionError, match="classes="):
        tbljax.convert(pattern, tmp_path / "p-{shard}.tbl", image_size=16, shard="1/2", progress=False)
    order = ["n03", "n02", "n01"]
    for i in range(2):
        tbljax.convert(pattern, tmp_path / "p-{shard}.tbl", image_size=16, shard=(i, 2), classes=order, progress=False)
    parts = [tmp_path / f"p-{i:05d}-of-00002.tbl" for i in range(2)]
    ds = tbljax.open(parts)
    assert all(tbljax.open(p).classes == order for p in parts)
    assert [order[i] for i in ds.labels] == [names[k] for k in ds.keys]
    with pytest.raises(ValueError, match="empty"):  # more shares than TAR files
        tbljax.convert(pattern, tmp_path / "q-{shard}.tbl", image_size=16, shard="0/3", classes=order)


# ---- progress where stderr goes ----


def test_progress_in_logs_is_a_line_every_interval_with_rate_and_eta():
    from tbljax._src.conversion.progress import Progress

    now = [0.0]
    out = io.StringIO()
    bar = Progress(0, "log", 0.1, clock=lambda: now[0], stream=out)
    bar.start(1000)
    for done in range(0, 1001, 50):  # 50 images every 0.05 s: a line every other update
        now[0] += 0.05
        bar.update(done, skipped=done // 500)
    bar.update(1000, 2, final=True)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and 9 <= len(lines) <= 12
    assert lines[0].startswith("convert: 50/1000 (5%), 500 img/s, 0 skipped") and "ETA 1.9 s" in lines[0]
    assert lines[-1].startswith("convert: 1000/1000 (100%)") and lines[-1].endswith("done")


def test_progress_on_a_terminal_redraws_one_line():
    from tbljax._src.conversion.progress import Progress

    now = [0.0]
    out = io.StringIO()
    bar = Progress(0, "tty", None, clock=lambda: now[0], stream=out)
    bar.start(10)
    for done in range(11):
        now[0] += 0.3
        bar.update(done, 0)
    bar.update(10, 0, final=True)
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n") and text.rstrip().endswith("done") and text.count("\r") >= 5


def test_progress_in_jupyter_is_a_tqdm_bar(monkeypatch, tmp_path):
    import types

    from tbljax._src.conversion import progress

    made = []

    class FakeBar:
        def __init__(self, **kw):
            self.kw, self.n, self.closed = kw, 0, False
            made.append(self)

        def reset(self, total):
            self.kw["total"] = total

        def update(self, k):
            self.n += k

        def set_postfix(self, **kw):
            pass

        def close(self):
            self.closed = True

    auto = types.ModuleType("tqdm.auto")
    auto.tqdm = FakeBar
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", auto)
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    assert progress.progress_mode(None) == "notebook" and progress.progress_mode(False) is None
    tbljax.convert(np.zeros((5, 8, 8, 3), np.uint8), tmp_path / "n.tbl", image_size=8)
    assert len(made) == 1 and made[0].n == 5 and made[0].kw["total"] == 5 and made[0].closed
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # Jupyter without tqdm: a redrawn line
    assert progress.progress_mode(None) == "tty"


def test_compressed_shards_are_counted_with_progress_and_plain_ones_from_headers(tmp_path, monkeypatch):
    import gzip

    members = [("000.bin", bytes(2_000_000))] + [(f"{i:03d}.jpg", tiny_jpeg(i)) for i in range(40)]
    make_tar(tmp_path / "p.tar", members)
    (tmp_path / "c.tar.gz").write_bytes(gzip.compress((tmp_path / "p.tar").read_bytes()))
    # Counting a plain .tar reads headers and seeks over the data.
    read = [0]
    real_open = tarfile.bltn_open

    def counting_open(*a, **kw):
        f = real_open(*a, **kw)
        real_read = f.read

        def read_and_count(*ra):
            b = real_read(*ra)
            read[0] += len(b)
            return b

        f.read = read_and_count
        return f

    from tbljax._src.sources.tar_shards import TarSource

    with monkeypatch.context() as m:  # (not monkeypatch.undo: it would undo the scratch cwd too)
        m.setattr(tarfile, "bltn_open", counting_open)
        assert TarSource([str(tmp_path / "p.tar")]).count() == 40
    assert read[0] < 100_000, read[0]  # the file is 2.7 MB
    # cwd: `python -m` puts it first on the path; the source folder there has no native module.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tbljax",
            "convert",
            str(tmp_path / "c.tar.gz"),
            "-s",
            "8",
            "-o",
            str(tmp_path / "c.tbl"),
            "--progress-interval",
            "0.1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "counting images in compressed TAR shards: 1/1" in r.stderr and "\r" not in r.stderr
    assert "convert: 40/40 (100%)" in r.stderr and "wrote 40 records" in r.stdout


def test_folder_lists_files_left_out_for_their_extension(tmp_path):
    # Issue 45 item 10: a folder's files that are not named as images are counted and listed
    # (a few, then "and N more"); .jfif is a JPEG; a file that is no image names no io.BytesIO.
    from PIL import Image

    d = tmp_path / "f" / "cat"
    d.mkdir(parents=True)
    img = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    Image.fromarray(img).save(d / "a.png")
    Image.fromarray(img).save(d / "b.jfif", "JPEG")
    (d / "bad.jpg").write_text("not an image")
    names = ["notes.txt", *(f"n{i}.doc" for i in range(5))]
    for n in [*names, ".DS_Store"]:
        (d / n).write_text("x")
    s = tbljax.convert(tmp_path / "f", tmp_path / "o.tbl", image_size=8, progress=False)
    assert sorted(tbljax.open(tmp_path / "o.tbl").keys) == ["cat/a.png", "cat/b.jfif"]
    assert sorted(s.left_out) == sorted(f"cat/{n}" for n in names)
    lines = str(s).splitlines()
    assert lines[0].endswith("; left out 6 (extension)"), lines[0]
    assert lines[1].startswith("  left out for their extension (images are bmp, gif, jfif, jpeg, jpg, ")
    assert lines[1].endswith(": " + ", ".join(s.left_out[:5]) + " and 1 more"), lines[1]
    assert [x["key"] for x in s.skipped] == ["cat/bad.jpg"] and "BytesIO" not in s.skipped[0]["reason"], s.skipped

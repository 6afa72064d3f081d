"""convert(..., format="jpeg", quality=Q, raw_budget=F): compact records with the ones costliest
to decode stored as their pixels, while the records stay within F of their RAW size. Checked
against the plain compact and the RAW conversions of the same images (every record is one of
them, byte for byte), a NumPy reference of which records go RAW, and served batches against the
NumPy oracle over the records' pixels as Pillow and NumPy read them from the file."""

from __future__ import annotations

import io

import numpy as np
import pytest

import tbljax
from tbljax._src.conversion.image_records import choose_raw
from tbljax._src.file.format import FORMATS

import oracle

N, S = 12, 64
RECIPE = dict(image_size=S, resize="shorter_side", format="jpeg", quality=90)


def images() -> list[np.ndarray]:
    """N images 80x96 whose detail (and so JPEG size) differs, in no particular order: smooth
    gradients with noise of amplitude 0..88 added."""
    rng = np.random.default_rng(5)
    y, x = np.mgrid[0:80, 0:96]
    base = np.stack([y * 3, x * 2, (x + y)], -1).astype(np.int32)
    amps = rng.permutation(N) * 8
    return [np.clip(base + rng.integers(-a, a + 1, base.shape), 0, 255).astype(np.uint8) for a in amps]


def _records(path) -> list[tuple[int, bytes]]:
    """(format code, payload bytes) of every record, read with NumPy over the index."""
    ds = tbljax.open(path)
    data = np.fromfile(path, np.uint8)
    return [(int(e["format"]), data[int(e["offset"]) : int(e["offset"]) + int(e["size"])].tobytes()) for e in ds.index]


def _pixels(path) -> list[np.ndarray]:
    """Every record's pixels: Pillow for a JPEG record, NumPy for a RAW one."""
    from PIL import Image

    ds = tbljax.open(path)
    out = []
    for (fmt, blob), e in zip(_records(path), ds.index):
        if fmt == FORMATS["JPEG"]:
            with Image.open(io.BytesIO(blob)) as im:
                out.append(np.asarray(im.convert("RGB")))
        else:
            out.append(np.frombuffer(blob, np.uint8).reshape(int(e["height"]), int(e["width"]), 3))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("raw_budget")
    imgs = images()
    labels = list(range(N))
    paths = {}
    for name, kw in {
        "compact": RECIPE,
        "raw": dict(RECIPE, format="raw", quality=None),
        "budget": dict(RECIPE, raw_budget=0.5),
    }.items():
        paths[name] = str(d / f"{name}.tbl")
        tbljax.convert(imgs, paths[name], labels=labels, progress=False, **kw)
    return paths


def test_the_costliest_records_go_raw_within_the_budget(files):
    compact, raw, mixed = (_records(files[k]) for k in ("compact", "raw", "budget"))
    jpeg_bytes = np.array([len(b) for _f, b in compact])
    raw_bytes = np.array([len(b) for _f, b in raw])
    # The reference choice (one chunk holds all N): most JPEG bytes per RAW byte first, each
    # taken while its extra bytes fit in what the budget leaves over the JPEG records.
    left = 0.5 * raw_bytes.sum() - jpeg_bytes.sum()
    want = np.zeros(N, bool)
    for i in sorted(range(N), key=lambda i: (-jpeg_bytes[i] / raw_bytes[i], i)):
        if raw_bytes[i] - jpeg_bytes[i] <= left:
            left -= raw_bytes[i] - jpeg_bytes[i]
            want[i] = True
    got = np.array([f == FORMATS["RAW_U8"] for f, _b in mixed])
    assert got.tolist() == want.tolist()
    assert 0 < got.sum() < N  # the budget keeps some of each
    # Every record is the compact conversion's JPEG or the RAW conversion's pixels, exactly.
    for i, (_f, b) in enumerate(mixed):
        assert b == (raw[i][1] if got[i] else compact[i][1]), i
    assert sum(len(b) for _f, b in mixed) <= 0.5 * raw_bytes.sum()
    ds = tbljax.open(files["budget"])
    assert ds.record_format == "mixed" and ds.compact and ds.recipe["raw_budget"] == 0.5
    assert ds.describe()["record_formats"] == {"JPEG": N - int(got.sum()), "RAW_U8": int(got.sum())}
    assert ds.jpeg_records().stored_raw.tolist() == got.astype(int).tolist()


def test_a_budget_the_jpeg_records_already_pass_keeps_every_record_a_jpeg(files, tmp_path):
    p = tmp_path / "small.tbl"
    tbljax.convert(images(), p, labels=list(range(N)), progress=False, **RECIPE, raw_budget=0.01)
    assert _records(p) == _records(files["compact"])
    assert tbljax.open(p).record_format == "jpeg"


def test_choose_raw_takes_the_most_bytes_per_pixel_that_fit():
    assert choose_raw([30, 10, 20], [100, 100, 100], 150) == [0, 2]
    assert choose_raw([30, 10, 20], [100, 100, 100], 69) == []
    assert choose_raw([30, 10, 20], [100, 100, 100], 90) == [0]  # then 20 bytes left: 2 and 1 do not fit
    assert choose_raw([60, 20], [300, 100], 100) == [1]  # a tie goes to 0 first, which does not fit
    assert choose_raw([50, 10], [100, 20], 1000) == [0, 1]


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_served_boxes_are_the_oracle_over_the_stored_pixels(files, dtype):
    ds = tbljax.open(files["budget"])
    ref = _pixels(files["budget"])
    rng = np.random.default_rng(1)
    idx = rng.permutation(N)
    boxes, flips = [], rng.integers(0, 2, N).astype(np.uint8)
    for i in idx:
        h, w = ref[i].shape[:2]
        bh, bw = int(rng.integers(8, h + 1)), int(rng.integers(8, w + 1))
        boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
    boxes = np.array(boxes, np.int32)
    mean, std = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)) if dtype == "float32" else (None, None)
    out = np.empty((N, 40, 40, 3), dtype)
    src = tbljax.kernels.jpeg_source(*ds.jpeg_records())
    tbljax.kernels.serve_jpeg(src, idx, out, crop=boxes, flip=flips, mean=mean, std=std)
    want = oracle.gather(ref, idx, (40, 40), crop=boxes, flip=flips, dtype=np.dtype(dtype), mean=mean, std=std)
    np.testing.assert_array_equal(out, want)


def test_host_loader_serves_the_stored_pixels(files):
    from tbljax._src.rules.augment import sample
    from tbljax._src.rules.record_geometry import RecordGeometry

    ref = _pixels(files["budget"])
    aug = tbljax.Augment(size=(48, 48))
    opts = tbljax.LoaderOptions(batch_size=4, num_epochs=1, seed=2, augment=aug, dtype="uint8")
    geo = RecordGeometry(np.array([r.shape[0] for r in ref]), np.array([r.shape[1] for r in ref]))
    seen = []
    for batch in tbljax.HostLoader(tbljax.open(files["budget"]), opts):
        idx = batch.index.copy()
        boxes, flips = sample(aug, idx, geometry=geo, seed=2, epoch=0)
        np.testing.assert_array_equal(np.array(batch.image), oracle.gather(ref, idx, (48, 48), crop=boxes, flip=flips))
        seen += idx.tolist()
    assert sorted(seen) == list(range(N))


def test_a_record_marked_raw_whose_size_is_not_its_pixels_is_refused(files):
    r = tbljax.open(files["compact"]).jpeg_records()
    marks = np.zeros(N, np.uint8)
    marks[3] = 1  # a JPEG record's bytes are not 64xWx3
    with pytest.raises(tbljax.CorruptFileError, match=r"record 3 is stored RAW but its \d+ bytes are not"):
        tbljax.kernels.jpeg_source(*r[:6], marks)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(format="jpeg", raw_budget=0.2), "raw_budget= applies to re-encoded JPEG records"),
        (dict(format="raw", raw_budget=0.2), "raw_budget= applies to re-encoded JPEG records"),
        (dict(format="jpeg", quality=90, raw_budget=0), r"raw_budget must be .* in \(0, 1\]"),
        (dict(format="jpeg", quality=90, raw_budget=1.5), r"raw_budget must be .* in \(0, 1\]"),
        (dict(format="jpeg", quality=90, raw_budget=True), "raw_budget must be"),
        (dict(format="jpeg", quality=90, raw_budget="0.2"), "raw_budget must be"),
    ],
)
def test_bad_raw_budget_is_refused_by_name(tmp_path, kw, match):
    dst = tmp_path / "x.tbl"
    with pytest.raises(ValueError, match=match):
        tbljax.convert(images()[:2], dst, image_size=S, labels=[0, 1], progress=False, **kw)
    assert not dst.exists()


def test_a_tbl_source_refuses_raw_budget(files, tmp_path):
    with pytest.raises(ValueError, match="raw_budget does not apply"):
        tbljax.convert(files["budget"], tmp_path / "y.tbl", raw_budget=0.2, progress=False)


def test_tbl_to_raw_of_a_mixed_file_keeps_every_records_pixels(files, tmp_path):
    dst = tmp_path / "back.tbl"
    tbljax.convert(files["budget"], dst, format="raw", progress=False)
    out = tbljax.open(dst)
    assert out.record_format == "raw"
    for i, want in enumerate(_pixels(files["budget"])):
        np.testing.assert_array_equal(out.read(i), want)


def test_cli_convert_takes_raw_budget(tmp_path, files):
    from tbljax._src.tools.cli import main

    src = tmp_path / "imgs"
    src.mkdir()
    from PIL import Image

    for i, img in enumerate(images()):
        Image.fromarray(img).save(src / f"{i:02d}.png")
    dst = tmp_path / "cli.tbl"
    assert (
        main(
            [
                "convert",
                str(src),
                "-o",
                str(dst),
                "-s",
                str(S),
                "--resize",
                "shorter_side",
                "--format",
                "jpeg",
                "--quality",
                "90",
                "--raw-budget",
                "0.5",
                "--quiet",
            ]
        )
        == 0
    )
    ds = tbljax.open(dst)
    assert ds.recipe["raw_budget"] == 0.5 and 0 < ds.jpeg_records().stored_raw.sum() < N

"""Hugging Face and TFDS sources: the same real photos converted from a `datasets.Dataset`, an
IterableDataset, Parquet files, TFRecord and ArrayRecord files of tf.train.Example equal their
conversion from a WebDataset TAR (the reference path), pixel for pixel and label for label,
odd inputs (grayscale, CMYK, truncated) included; sharded conversions equal the single job;
TFRecord checksums are checked. The TFRecords are written here through an independent
encoder: protobuf's wire format and TFRecord's framing, written out from the public schema."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import tbljax

from _source_files import example, masked, tfrecord

datasets = pytest.importorskip("datasets")
pq = pytest.importorskip("pyarrow.parquet")
google_crc32c = pytest.importorskip("google_crc32c")
PIL_Image = pytest.importorskip("PIL.Image")

CLASSES = ["Faces", "Leopards", "accordion"]
SIZE = 40


@pytest.fixture(scope="module")
def photos():
    """(bytes, class id) of 8 real photos per class, then a CMYK JPEG, a grayscale PNG and a
    truncated JPEG (its class: 0, 1, 2)."""
    from conftest import shared_dir

    root = shared_dir("caltech101") / "images"
    out = [(p.read_bytes(), c) for c, name in enumerate(CLASSES) for p in sorted((root / name).glob("*.jpg"))[:8]]
    rgb = PIL_Image.open(io.BytesIO(out[0][0])).convert("RGB")
    cmyk, gray = io.BytesIO(), io.BytesIO()
    rgb.convert("CMYK").save(cmyk, "JPEG", quality=90)
    rgb.convert("L").save(gray, "PNG")
    return out + [(cmyk.getvalue(), 0), (gray.getvalue(), 1), (out[5][0][: len(out[5][0]) // 3], 2)]


@pytest.fixture(scope="module")
def reference(photos, tmp_path_factory):
    """The photos converted from a WebDataset TAR."""
    d = tmp_path_factory.mktemp("ref")
    with tarfile.open(d / "ref.tar", "w") as tf:
        for i, (data, c) in enumerate(photos):
            for ext, payload in (("jpg", data), ("cls", str(c).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
    s = tbljax.convert(d / "ref.tar", d / "ref.tbl", image_size=SIZE, classes=CLASSES, progress=False)
    assert len(s.skipped) == 1 and s.written == len(photos) - 1  # the truncated one
    return tbljax.open(d / "ref.tbl")


def assert_same_fingerprint(parts, single):
    # The content-only fingerprint (issue 20: the recipe's shard and per-part fields left out)
    # is on the `fast` branch; until it merges, parts carry their shard in the fingerprint.
    from tbljax._src.datasets.reader import NOT_FINGERPRINTED

    if "shard" in NOT_FINGERPRINTED:
        assert parts.fingerprint == single.fingerprint


def pixels(ds):
    return np.concatenate(ds.shard_views())


def assert_same(ds, ref):
    assert len(ds) == len(ref)
    np.testing.assert_array_equal(ds.view(), ref.view())
    assert ds.labels.tolist() == ref.labels.tolist()
    assert ds.classes == ref.classes == CLASSES
    assert len(ds.skipped) == len(ref.skipped) == 1


def hf_dataset(photos):
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES), "caption": datasets.Value("string")}
    )
    return datasets.Dataset.from_dict(
        {
            "image": [{"bytes": b, "path": None} for b, _ in photos],
            "label": [c for _, c in photos],
            "caption": [f"photo {i}" for i in range(len(photos))],
        },
        features=features,
    )


# ---- Hugging Face ----------------------------------------------------------------------------


def test_dataset_equals_tar(photos, reference, tmp_path):
    tbljax.convert(hf_dataset(photos), tmp_path / "hf.tbl", image_size=SIZE, progress=False)
    assert_same(tbljax.open(tmp_path / "hf.tbl"), reference)


def test_iterable_dataset_equals_tar_and_shards_by_file(photos, reference, tmp_path):
    it = hf_dataset(photos).to_iterable_dataset(num_shards=3)
    tbljax.convert(it, tmp_path / "it.tbl", image_size=SIZE, progress=False)
    assert_same(tbljax.open(tmp_path / "it.tbl"), reference)
    parts = [
        tbljax.convert(it, tmp_path / "p-{shard}.tbl", image_size=SIZE, shard=(i, 3), progress=False).dst
        for i in range(3)
    ]
    np.testing.assert_array_equal(pixels(tbljax.open(parts)), reference.view())
    with pytest.raises(ValueError, match="3 shards"):
        tbljax.convert(it, tmp_path / "x.tbl", image_size=SIZE, shard=(0, 4), progress=False)


def test_parquet_files_equal_tar_read_by_row_group_and_sharded(photos, reference, tmp_path):
    ds = hf_dataset(photos)
    for i in range(2):  # two files of row groups of 5 rows, written by datasets itself
        ds.shard(2, i, contiguous=True).to_parquet(tmp_path / f"train-{i}.parquet", batch_size=5)
    groups = [pq.ParquetFile(tmp_path / f"train-{i}.parquet").num_row_groups for i in range(2)]
    assert groups == [3, 3]
    single = tbljax.convert(str(tmp_path / "train-*.parquet"), tmp_path / "pq.tbl", image_size=SIZE, progress=False)
    assert single.classes == CLASSES  # from the ClassLabel in the schema's metadata
    one = tbljax.open(tmp_path / "pq.tbl")
    assert_same(one, reference)
    assert one.keys[:2] == ["train-0.parquet:0", "train-0.parquet:1"]
    parts = [
        tbljax.convert(
            str(tmp_path / "train-{0,1}.parquet"),
            tmp_path / "part-{shard}.tbl",
            image_size=SIZE,
            shard=f"{i}/4",
            progress=False,
        ).dst
        for i in range(4)
    ]
    many = tbljax.open(parts)
    assert many.keys == one.keys and many.labels.tolist() == one.labels.tolist()
    np.testing.assert_array_equal(pixels(many), one.view())
    assert_same_fingerprint(many, one)


def test_parquet_at_a_url_and_columns_named(photos, reference, tmp_path):
    import fsspec
    import pyarrow as pa

    # A plain Parquet file (no datasets metadata): binary image column, class-name labels.
    table = pa.table({"jpg": [b for b, _ in photos], "cls": [CLASSES[c] for _, c in photos]})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=7)
    with fsspec.open("memory://hf/plain.parquet", "wb") as f:
        f.write(buf.getvalue())
    with pytest.raises(ValueError, match="image_column="):
        tbljax.convert("memory://hf/plain.parquet", tmp_path / "x.tbl", image_size=SIZE, progress=False)
    with pytest.raises(ValueError, match="'nope' is not a column"):
        tbljax.convert(
            "memory://hf/plain.parquet", tmp_path / "x.tbl", image_size=SIZE, image_column="nope", progress=False
        )
    tbljax.convert(
        "memory://hf/plain.parquet",
        tmp_path / "u.tbl",
        image_size=SIZE,
        image_column="jpg",
        label_column="cls",
        classes=CLASSES,
        progress=False,
    )
    assert_same(tbljax.open(tmp_path / "u.tbl"), reference)


def test_fields_strict_and_wrong_arguments(photos, tmp_path):
    from tbljax._src.sources.huggingface import HFDatasetSource

    items = list(HFDatasetSource(hf_dataset(photos[:3]), fields=["caption"]))
    assert [it.fields for it in items] == [{"caption": f"photo {i}"} for i in range(3)]
    assert [it.label for it in items] == [0, 0, 0] and items[1].data == photos[1][0]
    with pytest.raises(tbljax.ConversionError, match="strict"):
        tbljax.convert(hf_dataset(photos), tmp_path / "s.tbl", image_size=SIZE, strict=True, progress=False)
    with pytest.raises(ValueError, match="image_key"):
        tbljax.convert(hf_dataset(photos), tmp_path / "s.tbl", image_size=SIZE, image_key="image", progress=False)
    with pytest.raises(ValueError, match="classes= differs"):
        tbljax.convert(hf_dataset(photos), tmp_path / "s.tbl", image_size=SIZE, classes=["a", "b", "c"], progress=False)


# ---- TFDS: tf.train.Example in TFRecord and ArrayRecord ----------------------------------------


def test_crc32c_is_the_castagnoli_checksum():
    assert google_crc32c.value(b"123456789") == 0xE3069283  # the CRC-32C check value
    from tbljax._src.sources.tfds import masked_crc32c

    assert masked_crc32c(b"123456789") == masked(b"123456789")


def write_tfds_folder(d, photos, keys=("image", "label"), files=2):
    d.mkdir()
    exs = [example({keys[0]: b, keys[1]: c}) for b, c in photos]
    for i in range(files):
        part = exs[len(exs) * i // files : len(exs) * (i + 1) // files]
        (d / f"caltech-train.tfrecord-{i:05d}-of-{files:05d}").write_bytes(tfrecord(part))
    return exs


def test_tfrecord_tfds_folder_equals_tar_and_shards(photos, reference, tmp_path):
    d = tmp_path / "caltech" / "1.0.0"
    d.parent.mkdir()
    write_tfds_folder(d, photos)
    (d / "features.json").write_text(
        json.dumps(
            {
                "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
                "featuresDict": {
                    "features": {
                        "image": {"pythonClassName": "tensorflow_datasets.core.features.image_feature.Image"},
                        "label": {
                            "pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                            "classLabel": {"numClasses": "3"},
                        },
                    }
                },
            }
        )
    )
    (d / "label.labels.txt").write_text("\n".join(CLASSES) + "\n")
    s = tbljax.convert(str(d / "caltech-train.tfrecord*"), tmp_path / "tf.tbl", image_size=SIZE, progress=False)
    assert s.classes == CLASSES
    one = tbljax.open(tmp_path / "tf.tbl")
    assert_same(one, reference)
    assert one.keys[0] == "caltech-train.tfrecord-00000-of-00002:0"
    parts = [
        tbljax.convert(
            str(d / "caltech-train.tfrecord*"),
            tmp_path / "p-{shard}.tbl",
            image_size=SIZE,
            shard=(i, 2),
            progress=False,
        ).dst
        for i in range(2)
    ]
    many = tbljax.open(parts)
    np.testing.assert_array_equal(pixels(many), one.view())
    assert many.labels.tolist() == one.labels.tolist()
    assert_same_fingerprint(many, one)


def test_tfrecord_classic_keys_and_bad_checksums(photos, reference, tmp_path):
    d = tmp_path / "classic"
    exs = write_tfds_folder(d, photos, keys=("image/encoded", "image/class/label"), files=1)
    path = d / "caltech-train.tfrecord-00000-of-00001"
    tbljax.convert(path, tmp_path / "c.tbl", image_size=SIZE, classes=CLASSES, progress=False)
    assert_same(tbljax.open(tmp_path / "c.tbl"), reference)
    # Record 2's data corrupted: skipped, named by file and record; the others still read.
    raw = bytearray(path.read_bytes())
    at = sum(16 + len(e) for e in exs[:2]) + 12 + 40
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    s = tbljax.convert(path, tmp_path / "bad.tbl", image_size=SIZE, classes=CLASSES, progress=False)
    reasons = [x["reason"] for x in s.skipped]
    assert s.written == len(photos) - 2
    assert any("record 2: data CRC-32C mismatch" in r for r in reasons), reasons
    assert s.skipped[0]["source"] == str(path)
    with pytest.raises(tbljax.ConversionError, match="record 2: data CRC-32C"):
        tbljax.convert(path, tmp_path / "strict.tbl", image_size=SIZE, classes=CLASSES, strict=True, progress=False)
    # A broken length: the rest of the file is skipped, the records before it kept.
    raw = bytearray(tfrecord(exs[:4]))
    raw[sum(16 + len(e) for e in exs[:3])] ^= 0x01
    path.write_bytes(bytes(raw))
    s = tbljax.convert(path, tmp_path / "len.tbl", image_size=SIZE, classes=CLASSES, progress=False)
    assert s.written == 3 and "record 3: length CRC-32C mismatch" in s.skipped[0]["reason"]


def test_tfrecord_keys_named_and_missing(photos, tmp_path):
    path = tmp_path / "x.tfrecord"
    path.write_bytes(tfrecord([example({"jpeg": photos[0][0], "y": b"Faces", "id": 17})]))
    with pytest.raises(tbljax.ConversionError, match="no image feature"):
        tbljax.convert(path, tmp_path / "a.tbl", image_size=SIZE, progress=False)
    s = tbljax.convert(
        path, tmp_path / "b.tbl", image_size=SIZE, image_key="jpeg", label_key="y", classes=CLASSES, progress=False
    )
    assert s.written == 1 and tbljax.open(tmp_path / "b.tbl").labels.tolist() == [0]
    from tbljax._src.sources.tfds import TFRecordSource

    (item,) = TFRecordSource([str(path)], image_key="jpeg", fields=["id", "y"])
    assert item.fields["id"].tolist() == [17] and item.fields["id"].dtype == np.int64
    assert item.fields["y"] == b"Faces" and item.data == photos[0][0]


def test_array_record_equals_tar_and_shards_by_record(photos, reference, tmp_path):
    ar = pytest.importorskip("array_record.python.array_record_module")
    files = []
    for i, part in enumerate((photos[:10], photos[10:])):
        files.append(str(tmp_path / f"caltech-train.array_record-{i:05d}-of-00002"))
        w = ar.ArrayRecordWriter(files[-1], "group_size:1")
        for b, c in part:
            w.write(example({"image": b, "label": c}))
        w.close()
    tbljax.convert(files, tmp_path / "ar.tbl", image_size=SIZE, classes=CLASSES, progress=False)
    one = tbljax.open(tmp_path / "ar.tbl")
    assert_same(one, reference)
    parts = [
        tbljax.convert(
            files, tmp_path / "p-{shard}.tbl", image_size=SIZE, classes=CLASSES, shard=(i, 3), progress=False
        ).dst
        for i in range(3)
    ]
    sizes = [len(tbljax.open(p)) + len(tbljax.open(p).skipped) for p in parts]
    assert sizes == [9, 9, 9]  # records, not files: 27 split three ways
    many = tbljax.open(parts)
    np.testing.assert_array_equal(pixels(many), one.view())
    assert many.keys == one.keys and many.labels.tolist() == one.labels.tolist()


def test_no_tensorflow_is_imported(photos, tmp_path):
    path = tmp_path / "t.tfrecord"
    path.write_bytes(tfrecord([example({"image": b, "label": c}) for b, c in photos[:2]]))
    code = (
        f"import sys, tbljax; tbljax.convert({str(path)!r}, {str(tmp_path / 't.tbl')!r}, "
        "image_size=16, progress=False); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_datasets')); "
        "assert not bad, bad; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ---- columns and features as record fields (fields=[...]) -------------------------------------


def _captioned(photos):
    """A datasets.Dataset of the 8 Faces photos with a caption and a float32 embedding."""
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((8, 5)).astype(np.float32)
    captions = [f"photo {i}: ünïcode" for i in range(8)]
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "caption": datasets.Value("string"),
            "emb": datasets.List(datasets.Value("float32"), length=5),
            "meta": {"n": datasets.Value("int32")},
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": b, "path": None} for b, _ in photos[:8]],
            "caption": captions,
            "emb": emb.tolist(),
            "meta": [{"n": i} for i in range(8)],
        },
        features=features,
    )
    return ds, captions, emb


def test_hf_and_parquet_columns_become_fields(photos, tmp_path):
    ds, captions, emb = _captioned(photos)
    parquet = tmp_path / "cap.parquet"
    ds.to_parquet(str(parquet))  # written by datasets: its features in the schema metadata
    for name, source in (("ds", ds), ("pq", str(parquet))):
        out = tmp_path / f"{name}.tbl"
        tbljax.convert(source, out, image_size=SIZE, fields=["caption", "emb", "meta"], progress=False)
        got = tbljax.open(out)
        assert {n: f.kind for n, f in got.fields.items()} == {"caption": "str", "emb": "ndarray", "meta": "json"}, name
        assert list(got.field("caption")) == captions
        assert got.field("emb").dtype == np.float32
        np.testing.assert_array_equal(got.field("emb"), emb)
        assert list(got.field("meta")) == [{"n": i} for i in range(8)]
    with pytest.raises(ValueError, match="'nope' is not a column"):
        tbljax.convert(ds, tmp_path / "x.tbl", image_size=SIZE, fields=["nope"], progress=False)
    with pytest.raises(ValueError, match="give a list of their names"):
        tbljax.convert(ds, tmp_path / "x.tbl", image_size=SIZE, fields={"caption": "txt"}, progress=False)


def test_tfrecord_features_become_fields(photos, tmp_path):
    captions = [f"a photo of {CLASSES[c]} #{i}" for i, (_, c) in enumerate(photos[:6])]
    embs = [[float(i), i / 4, -1.5] for i in range(6)]
    path = tmp_path / "cap.tfrecord"
    path.write_bytes(
        tfrecord(
            [
                example({"image": b, "label": c, "caption": t.encode(), "emb": e})
                for (b, c), t, e in zip(photos[:6], captions, embs)
            ]
        )
    )
    tbljax.convert(
        path, tmp_path / "t.tbl", image_size=SIZE, classes=CLASSES, fields=["caption", "emb"], progress=False
    )
    got = tbljax.open(tmp_path / "t.tbl")
    assert {n: f.kind for n, f in got.fields.items()} == {"caption": "str", "emb": "ndarray"}
    assert list(got.field("caption")) == captions
    np.testing.assert_array_equal(got.field("emb"), np.array(embs, np.float32))
    with pytest.raises(ValueError, match="first record .* does not have"):
        tbljax.convert(path, tmp_path / "x.tbl", image_size=SIZE, fields=["nope"], progress=False)


def test_a_list_of_fields_for_a_tar_source_is_refused_by_name(tmp_path):
    tar = tmp_path / "a.tar"
    with tarfile.open(tar, "w"):
        pass
    with pytest.raises(ValueError, match=r"fields= as a list of names \['caption'\]"):
        tbljax.convert(tar, tmp_path / "a.tbl", image_size=SIZE, fields=["caption"], progress=False)


def test_integer_label_column_is_the_default_label(tmp_path):
    # Issue 45 item 4: a `label: Value("int64")` column (no ClassLabel) gives the labels, from a
    # Dataset and from its Parquet file; without one the hint names where labels come from.
    imgs = [np.full((8, 8, 3), 40 * i, np.uint8) for i in range(3)]
    png = []
    for a in imgs:
        b = io.BytesIO()
        PIL_Image.fromarray(a).save(b, "PNG")
        png.append({"bytes": b.getvalue(), "path": None})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": png, "label": [2, 0, 5]}, features=features)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    for src, name in ((ds, "hf"), (str(tmp_path / "d.parquet"), "pq")):
        s = tbljax.convert(src, tmp_path / f"{name}.tbl", image_size=8, progress=False)
        assert tbljax.open(tmp_path / f"{name}.tbl").labels.tolist() == [2, 0, 5], name
        assert "unlabelled" not in str(s)
    unlabelled = datasets.Dataset.from_dict({"image": png}, features=datasets.Features({"image": datasets.Image()}))
    s = str(tbljax.convert(unlabelled, tmp_path / "u.tbl", image_size=8, progress=False))
    assert "every record's label is -1; a Hugging Face dataset or Parquet file takes labels from" in s, s
    assert "label_column= names another" in s, s


# ---- hostile source files (issue 46): each bad file or record named, skipped or refused as
# strict= says, never a bare library error; the command exits 1 with one line naming it ------

from _source_files import (  # noqa: E402 (on the first line, where ruff format keeps it)
    damaged_array_record,
    forge_parquet_rows,
    jpegs,
    parquet,
    tfrecord_header,
    unreadable_array_records,
)


def convert_small(src, dst, **kw):
    return tbljax.convert(src, dst, image_size=8, progress=False, **kw)


def test_a_damaged_array_record_record_skips_only_itself(tmp_path):
    pytest.importorskip("array_record.python.array_record_module")
    images = jpegs(120)
    path = tmp_path / "d.array_record"
    damaged_array_record(path, images)
    bad = unreadable_array_records(path)  # array_record itself, one record at a time
    assert 0 < len(bad) < 4
    s = convert_small(path, tmp_path / "d.tbl")
    assert [x["key"] for x in s.skipped] == [f"d.array_record:{k}" for k in bad]
    assert all("unreadable (Corrupted Riegeli" in x["reason"] for x in s.skipped), s.skipped
    ds = tbljax.open(tmp_path / "d.tbl")
    good = [k for k in range(120) if k not in bad]
    assert ds.keys == [f"d.array_record:{k}" for k in good]
    assert ds.labels.tolist() == [k % 3 for k in good]


@pytest.mark.parametrize("declared", [1 << 34, 1 << 41])
@pytest.mark.parametrize("values_too", [False, True], ids=["rows", "rows+values"])
def test_parquet_rows_read_not_rows_declared_size_the_file(tmp_path, declared, values_too):
    images = jpegs(40)
    path = tmp_path / "p.parquet"
    parquet(path, images)
    forge_parquet_rows(path, 40, declared, values_too)
    s = convert_small(path, tmp_path / "p.tbl")
    assert s.written == 40 and s.bytes < 1 << 20  # not an index for `declared` records
    assert os.path.getsize(tmp_path / "p.tbl") == s.bytes
    (report,) = s.skipped
    assert report["source"] == str(path)
    assert f"p.parquet rows 0..: row group 0 declares {declared} rows" in report["reason"]
    assert "40 rows read" in report["reason"]
    ds = tbljax.open(tmp_path / "p.tbl")
    assert ds.keys == [f"p.parquet:{k}" for k in range(40)] and ds.labels.tolist() == [k % 3 for k in range(40)]
    with pytest.raises(tbljax.ConversionError, match="p.parquet rows 0..: row group 0 declares"):
        convert_small(path, tmp_path / "strict.tbl", strict=True)


def test_parquet_declaring_fewer_rows_than_its_columns_hold_is_reported(tmp_path):
    path = tmp_path / "p.parquet"
    parquet(path, jpegs(40))
    forge_parquet_rows(path, 40, 20, values_too=False)  # the column chunks still say 40
    s = convert_small(path, tmp_path / "p.tbl")
    assert s.written == 20
    (report,) = s.skipped
    assert "row group 0 declares 20 rows, its column 'image.bytes' holds 40 values; 20 rows read" in report["reason"], (
        report
    )


def _tfrecord_of_2_40(path, image):
    """A good record, then a header claiming 2**40 bytes with a valid length CRC, then 100 bytes."""
    from _source_files import example

    path.write_bytes(tfrecord([example({"image": image, "label": 1})]) + tfrecord_header(1 << 40) + bytes(100))


HOSTILE = ["tfrecord-2**40", "not-parquet", "truncated-parquet", "not-array-record", "later-parquet-without-label"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """{case: (files, what its error must say)} for item 9 of issue 46."""
    pytest.importorskip("array_record.python.array_record_module")
    d = tmp_path_factory.mktemp("hostile")
    (image,) = jpegs(1)
    _tfrecord_of_2_40(d / "huge.tfrecord", image)
    good = d / "good.parquet"
    parquet(good, jpegs(4))
    (d / "text.parquet").write_bytes(b"not parquet at all " * 10)
    (d / "cut.parquet").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    (d / "text.array_record").write_bytes(b"not an array record " * 10)
    parquet(d / "nolabel.parquet", jpegs(3), label=False)
    return {
        "tfrecord-2**40": ([d / "huge.tfrecord"], "huge.tfrecord record 1: truncated (100 of 1099511627776 bytes)"),
        "not-parquet": ([d / "text.parquet"], "text.parquet: not a readable Parquet file"),
        "truncated-parquet": ([d / "cut.parquet"], "cut.parquet: not a readable Parquet file"),
        "not-array-record": ([d / "text.array_record"], "text.array_record: not a readable ArrayRecord file"),
        "later-parquet-without-label": ([good, d / "nolabel.parquet"], "nolabel.parquet: has no column 'label'"),
    }


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_files_are_skipped_by_name_or_refused_when_strict(hostile, case, tmp_path):
    paths, words = hostile[case]
    written = {"tfrecord-2**40": 1, "later-parquet-without-label": 4}.get(case, 0)  # the good records
    if written:
        s = convert_small(paths, tmp_path / "o.tbl")
        assert s.written == written and [words in x["reason"] for x in s.skipped] == [True], s.skipped
        assert s.skipped[0]["source"] == str(paths[-1])
    else:
        with pytest.raises(tbljax.ConversionError, match="no record written") as e:
            convert_small(paths, tmp_path / "o.tbl")
        assert words in str(e.value)
    with pytest.raises(tbljax.ConversionError, match="strict conversion stopped") as e:
        convert_small(paths, tmp_path / "strict.tbl", strict=True)
    assert words in str(e.value) and not (tmp_path / "strict.tbl").exists()


_CLI_CHILD = """
import contextlib, io, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a 2**40 allocation fails fast
from tbljax._src.tools import cli
out = {}
for case, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = cli.main(argv)  # an exception it lets out ends this child with a traceback
    out[case] = [status, err.getvalue()]
print(json.dumps(out))
"""


def test_hostile_files_exit_1_from_the_command_with_one_line(hostile, tmp_path):
    """`tbljax convert --strict` on each: exit 1, one line naming the file, no traceback (in one
    child limited to 4 GiB of address space)."""
    cases = hostile
    argv = {
        case: ["convert", *map(str, paths), "-o", str(tmp_path / f"{case}.tbl"), "-s", "8", "--strict", "-q"]
        for case, (paths, _) in cases.items()
    }
    r = subprocess.run(
        [sys.executable, "-c", _CLI_CHILD, json.dumps(argv)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for case, (status, err) in json.loads(r.stdout).items():
        lines = err.strip().splitlines()
        assert status == 1 and "Traceback" not in err, (case, status, err)
        assert lines[0].startswith("tbljax convert: error: strict conversion stopped"), (case, lines)
        assert cases[case][1] in lines[0] and len(lines) == 2, (case, lines)  # the error, the bad item
        assert not (tmp_path / f"{case}.tbl").exists()

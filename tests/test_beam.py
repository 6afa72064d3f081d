"""Conversion on Apache Beam: N parts converted by Beam workers (the DirectRunner with two
worker processes) opened together equal the single-job conversion record for record — order,
keys, labels, classes, pixels — through the PTransform and through `python -m tbljax.beam`,
with the output local or at a URL (written locally, then uploaded). apache-beam pins
pillow<13 and protobuf<7, below the test extra's, so it lives in a venv of its own (.ci/run);
here it skips where apache_beam is absent."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import tbljax

beam = pytest.importorskip(
    "apache_beam",
    reason="apache-beam is not installed: .ci/run tests it in build/venv-beam (it pins pillow<13 and protobuf<7)",
)

CLASSES = ["Faces", "Leopards", "accordion", "airplanes"]
TWO_WORKERS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """5 WebDataset TARs of 8 real photos each (4 classes, labelled by name), and the
    single-job conversion of them."""
    from conftest import shared_dir

    root = shared_dir("caltech101") / "images"
    photos = [(p, name) for name in CLASSES for p in sorted((root / name).glob("*.jpg"))[:10]]
    d = tmp_path_factory.mktemp("beam")
    paths = []
    for s in range(5):
        paths.append(str(d / f"train-{s}.tar"))
        with tarfile.open(paths[-1], "w") as tf:
            for k, (p, name) in enumerate(photos[s * 8 : (s + 1) * 8]):
                for ext, payload in (("jpg", p.read_bytes()), ("cls", name.encode())):
                    info = tarfile.TarInfo(f"{s}-{k:03d}.{ext}")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
    (d / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    tbljax.convert(paths, d / "single.tbl", image_size=32, classes=str(d / "classes.txt"), progress=False)
    return paths, d


def assert_parts_equal_single(parts, single):
    many, one = tbljax.open(parts), tbljax.open(single)
    assert len(many) == len(one) == 40
    assert many.keys == one.keys and many.labels.tolist() == one.labels.tolist()
    assert many.classes == one.classes == CLASSES
    np.testing.assert_array_equal(np.concatenate(many.shard_views()), one.view())
    from tbljax._src.datasets.reader import NOT_FINGERPRINTED

    if "shard" in NOT_FINGERPRINTED:  # the content-only fingerprint (issue 20, branch `fast`)
        assert many.fingerprint == one.fingerprint


def test_ptransform_on_two_worker_processes(shards, tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    import tbljax.beam

    paths, d = shards
    with beam.Pipeline(options=PipelineOptions(TWO_WORKERS)) as p:
        out = p | tbljax.beam.ConvertShards(
            paths, str(tmp_path / "part-{shard}.tbl"), num_shards=3, image_size=32, classes=str(d / "classes.txt")
        )
        assert_that(out | beam.Map(lambda r: (r["shard"], r["written"])), equal_to([(0, 8), (1, 16), (2, 16)]))
    parts = [str(tmp_path / f"part-{i:05d}-of-00003.tbl") for i in range(3)]
    assert_parts_equal_single(parts, d / "single.tbl")


def test_command_line_to_a_url(shards, tmp_path):
    paths, d = shards
    (tmp_path / "remote").mkdir()  # the bucket
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tbljax.beam",
            *paths,
            "-o",
            f"file://{tmp_path}/remote/train-{{shard}}.tbl",
            "--num-shards",
            "2",
            "-s",
            "32",
            "--classes",
            str(d / "classes.txt"),
            *TWO_WORKERS,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    parts = [str(tmp_path / "remote" / f"train-{i:05d}-of-00002.tbl") for i in range(2)]
    assert_parts_equal_single(parts, d / "single.tbl")
    assert "part 1: 24 records" in out.stdout  # 5 TARs: share 1 of 2 is TARs 2, 3, 4


def test_arguments_checked():
    import tbljax.beam

    with pytest.raises(ValueError, match="'{shard}'"):
        tbljax.beam.ConvertShards("a.tar", "out.tbl", num_shards=2)
    with pytest.raises(ValueError, match="num_shards"):
        tbljax.beam.ConvertShards("a.tar", "out-{shard}.tbl", num_shards=0)


# ---- hostile sources on Beam (issue 46): the same named skips and errors as a single job --------


def _convert_on_beam(sources, out, num_shards, **options):
    from apache_beam.options.pipeline_options import PipelineOptions

    import tbljax.beam

    with beam.Pipeline(options=PipelineOptions(TWO_WORKERS)) as p:
        p | tbljax.beam.ConvertShards(
            sources, str(out / "part-{shard}.tbl"), num_shards=num_shards, image_size=8, **options
        )
    return [str(out / f"part-{i:05d}-of-{num_shards:05d}.tbl") for i in range(num_shards)]


def test_hostile_sources_on_beam_skip_by_name(tmp_path):
    pytest.importorskip("array_record.python.array_record_module")
    from _source_files import damaged_array_record, jpegs, parquet, unreadable_array_records

    ar = tmp_path / "d.array_record"
    damaged_array_record(ar, jpegs(120))
    bad = unreadable_array_records(ar)  # array_record itself, one record at a time
    parts = _convert_on_beam(str(ar), tmp_path, 2)
    ds = tbljax.open(parts)
    assert sorted(s["key"] for p in parts for s in tbljax.open(p).skipped) == sorted(f"d.array_record:{k}" for k in bad)
    assert ds.keys == [f"d.array_record:{k}" for k in range(120) if k not in bad]
    # A later Parquet file without the label column: its one bad item names it.
    parquet(tmp_path / "a.parquet", jpegs(4))
    parquet(tmp_path / "b.parquet", jpegs(3), label=False)
    (tmp_path / "pq").mkdir()
    (part,) = _convert_on_beam([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], tmp_path / "pq", 1)
    (skip,) = tbljax.open(part).skipped
    assert skip["source"] == str(tmp_path / "b.parquet") and "b.parquet: has no column 'label'" in skip["reason"]
    assert len(tbljax.open(part)) == 4


def test_hostile_sources_on_beam_refused_by_name_when_strict(tmp_path):
    from _source_files import example, jpegs, parquet, tfrecord, tfrecord_header

    (image,) = jpegs(1)
    (tmp_path / "huge.tfrecord").write_bytes(
        tfrecord([example({"image": image})]) + tfrecord_header(1 << 40) + bytes(100)
    )
    parquet(tmp_path / "good.parquet", jpegs(4))
    (tmp_path / "text.parquet").write_bytes(b"not parquet at all " * 10)
    for k, (sources, words) in enumerate(
        (
            (str(tmp_path / "huge.tfrecord"), "huge.tfrecord record 1: truncated"),
            (
                [str(tmp_path / "good.parquet"), str(tmp_path / "text.parquet")],
                "text.parquet: not a readable Parquet file",
            ),
        )
    ):
        out = tmp_path / f"out{k}"
        out.mkdir()
        with pytest.raises(Exception, match="strict conversion stopped") as e:
            _convert_on_beam(sources, out, 1, strict=True)
        assert words in str(e.value)
        assert not list(out.iterdir())

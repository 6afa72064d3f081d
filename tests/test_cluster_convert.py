"""Conversion at cluster scale: `convert --shard i/n` jobs run in parallel and their outputs,
opened as one dataset, are exactly the single-job conversion; `info` shows source sizes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tbljax
from tbljax._src.rules.partition import parse_part


def test_parse_shard():
    assert parse_part("3/16", "shard") == (3, 16) and parse_part((0, 1), "shard") == (0, 1)
    assert parse_part(" 3 / 16 ", "shard") == (3, 16)
    # Refused: bools, signs and underscores (int() would take them), not a pair.
    for bad in ("4/4", "-1/3", "a/b", "3", (2, 1), "+1/4", "1_0/20", (False, True), "1/2/3", 5):
        with pytest.raises(ValueError, match="shard"):
            parse_part(bad, "shard")


def test_four_parallel_jobs_equal_one(caltech101, tmp_path):
    src = caltech101 / "images"
    single = tmp_path / "single.tbl"
    tbljax.convert(src, single, image_size=32, progress=False)
    jobs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tbljax",
                "convert",
                str(src),
                "-s",
                "32",
                "-q",
                "--shard",
                f"{i}/4",
                "-o",
                str(tmp_path / "part-{shard}.tbl"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for j in jobs:
        out, err = j.communicate(timeout=300)
        assert j.returncode == 0, err
    parts = sorted(tmp_path.glob("part-*-of-00004.tbl"))
    assert [p.name for p in parts] == [f"part-{i:05d}-of-00004.tbl" for i in range(4)]
    one, many = tbljax.open(single), tbljax.open(parts)
    assert len(many) == len(one) == 1010
    assert many.keys == one.keys and many.labels.tolist() == one.labels.tolist()
    assert all(tbljax.open(p).classes == one.classes for p in parts)
    np.testing.assert_array_equal(np.concatenate(many.shard_views()), one.view())
    assert many.fingerprint == one.fingerprint
    # Served as one dataset: one global order over the union, every record once per epoch.
    seen = [
        int(i) for b in tbljax.loader(parts, 101, seed=3, num_epochs=1, dtype="uint8") for i in np.asarray(b["index"])
    ]
    assert sorted(seen) == list(range(1010))


def test_info_prints_source_size_histogram(caltech101, tmp_path):
    files = sorted((caltech101 / "images" / "Faces").glob("*.jpg"))
    tbljax.convert(files, tmp_path / "f.tbl", image_size=32, progress=False)
    sizes = tbljax.open(tmp_path / "f.tbl").recipe["source_sizes"]
    assert sizes["count"] == len(files) == sum(sizes["longer_side"]) == sum(sizes["shorter_side"])
    r = subprocess.run(
        [sys.executable, "-m", "tbljax", "info", str(tmp_path / "f.tbl")], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "source sizes (10 images" in r.stdout and "#" in r.stdout, r.stdout


def test_parallel_jobs_over_shards_labelled_by_name_need_a_classes_file(tmp_path):
    """Each job sees only its shards' class names: tables sorted per job would disagree, so a
    sharded conversion takes the names from --classes, and without it refuses (exit 1)."""
    import io
    import tarfile

    from PIL import Image

    wnids = ["n01440764", "n01443537", "n01484850", "n01491361"]
    want = {}
    for s in range(4):
        with tarfile.open(tmp_path / f"train-{s:02d}.tar", "w") as tf:
            for j in range(3):
                key, wnid = f"s{s}{j}", wnids[(s * 3 + j) % 3 + (s == 3)]  # shard 3 holds the 4th class
                want[key] = wnid
                b = io.BytesIO()
                Image.fromarray(np.full((12, 12, 3), 20 * j + s, np.uint8)).save(b, "JPEG")
                for name, data in ((f"{key}.jpg", b.getvalue()), (f"{key}.cls", wnid.encode())):
                    ti = tarfile.TarInfo(name)
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
    (tmp_path / "classes.txt").write_text("\n".join(wnids) + "\n")
    pattern = str(tmp_path / "train-{00..03}.tar")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tbljax",
            "convert",
            pattern,
            "-s",
            "8",
            "-q",
            "--shard",
            "0/2",
            "-o",
            str(tmp_path / "x-{shard}.tbl"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "--classes" in r.stderr and "Traceback" not in r.stderr, r.stderr
    jobs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tbljax",
                "convert",
                pattern,
                "-s",
                "8",
                "-q",
                "--classes",
                str(tmp_path / "classes.txt"),
                "--shard",
                f"{i}/2",
                "-o",
                str(tmp_path / "part-{shard}.tbl"),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for j in jobs:
        assert j.wait(timeout=120) == 0, j.stderr.read()
        j.stderr.close()
    parts = [tmp_path / f"part-{i:05d}-of-00002.tbl" for i in range(2)]
    ds = tbljax.open(parts)
    assert ds.classes == wnids and [wnids[i] for i in ds.labels] == [want[k] for k in ds.keys]
    assert len(ds) == 12
    # The parts opened together are the single-job dataset: the same fingerprint (the recipe's
    # shard and per-part source sizes are about the run), so a loader state moves both ways.
    single = tmp_path / "single.tbl"
    tbljax.convert(pattern, single, image_size=8, classes=tmp_path / "classes.txt", progress=False)
    one = tbljax.open(single)
    assert one.recipe["shard"] is None and tbljax.open(parts[0]).recipe["shard"] == [0, 2]
    assert one.recipe["source_sizes"] != tbljax.open(parts[0]).recipe["source_sizes"]
    assert ds.fingerprint == one.fingerprint
    for a, b in ((single, parts), (parts, single)):
        first = tbljax.loader(a, 4, seed=5, num_epochs=1, dtype="uint8")
        it = iter(first)
        next(it)
        state = first.state_dict()
        rest = [np.asarray(x["index"]).tolist() for x in it]
        first.close()
        resumed = tbljax.loader(b, 4, seed=5, num_epochs=1, dtype="uint8")
        resumed.load_state_dict(state)
        assert [np.asarray(x["index"]).tolist() for x in resumed] == rest and len(rest) == 2
        resumed.close()

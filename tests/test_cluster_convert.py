"""Conversion at cluster scale: `convert --shard i/n` jobs run in parallel and their outputs,
opened as one dataset, are exactly the single-job conversion; `info` shows source sizes."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tbljax
from tbljax.sources import parse_shard


def test_parse_shard():
    assert parse_shard("3/16") == (3, 16) and parse_shard((0, 1)) == (0, 1)
    for bad in ("4/4", "-1/3", "a/b", "3", (2, 1)):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)


def test_four_parallel_jobs_equal_one(caltech101, tmp_path):
    src = caltech101 / "images"
    single = tmp_path / "single.tbl"
    tbljax.convert(src, single, image_size=32, progress=False)
    jobs = [subprocess.Popen([sys.executable, "-m", "tbljax.cli", "convert", str(src), "-s", "32", "-q",
                              "--shard", f"{i}/4", "-o", str(tmp_path / "part-{shard}.tbl")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
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
    # Served as one dataset: one global order over the union, every record once per epoch.
    seen = [int(i) for b in tbljax.loader(parts, 101, seed=3, num_epochs=1, dtype="uint8")
            for i in np.asarray(b["index"])]
    assert sorted(seen) == list(range(1010))


def test_info_prints_source_size_histogram(caltech101, tmp_path):
    files = sorted((caltech101 / "images" / "Faces").glob("*.jpg"))
    tbljax.convert(files, tmp_path / "f.tbl", image_size=32, progress=False)
    sizes = tbljax.open(tmp_path / "f.tbl").recipe["source_sizes"]
    assert sizes["count"] == len(files) == sum(sizes["longer_side"]) == sum(sizes["shorter_side"])
    r = subprocess.run([sys.executable, "-m", "tbljax.cli", "info", str(tmp_path / "f.tbl")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "source sizes (10 images" in r.stdout and "#" in r.stdout, r.stdout

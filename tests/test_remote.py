"""convert from URLs through fsspec: a real HTTP server on localhost (with Range requests, and
connections dropped mid-body), fsspec's memory:// and file:// filesystems. A conversion from
URLs must equal the conversion of the same local files record for record; a dropped connection
is resumed at the byte where it broke; a shard that keeps failing is skipped and reported (or
stops a strict run); memory stays flat in the shard's size."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tbljax
from tbljax._src.remote import remote

pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (pip install 'tbljax[http]')")
Image = pytest.importorskip("PIL.Image", reason="the test shards are JPEGs made with Pillow")

from _http_testing import Drop, Server  # noqa: E402 - after the skips

PAD = 6 << 20  # a caption member this large puts a shard's later records past fsspec's first 5 MiB block


def jpeg(seed: int, size: int = 48) -> bytes:
    rng = np.random.default_rng(seed)
    img = np.linspace(0, 255, size * size * 3).reshape(size, size, 3) + rng.integers(0, 60, (size, size, 3))
    buf = io.BytesIO()
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_shards(root: Path, shards: int = 3, per_shard: int = 6, pad: bool = False) -> list[Path]:
    """WebDataset shards of JPEGs with .cls labels; with pad, a big .txt caption in the middle."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        p = root / f"train-{s}.tar"
        with tarfile.open(p, "w") as tf:
            for k in range(per_shard):
                key = f"s{s}-{k:03d}"
                members = [(f"{key}.jpg", jpeg(100 * s + k)), (f"{key}.cls", str((s + k) % 4).encode())]
                if pad and k == per_shard // 2:
                    members.append((f"{key}.txt", b"x" * PAD))
                for name, data in members:
                    ti = tarfile.TarInfo(name)
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        paths.append(p)
    return paths


def assert_same_dataset(a: Path, b: Path) -> None:
    """Two converted files hold the same records, labels and keys (compared with NumPy)."""
    da, db = tbljax.open(a), tbljax.open(b)
    assert len(da) == len(db) > 0
    np.testing.assert_array_equal(da.view(), db.view())
    np.testing.assert_array_equal(da.labels, db.labels)
    assert da.keys == db.keys


@pytest.fixture
def server(tmp_path):
    (tmp_path / "www").mkdir()
    s = Server(tmp_path / "www")
    yield s
    s.close()


def convert(src, dst, **kw):
    return tbljax.convert(src, dst, image_size=32, progress=False, retry_backoff=0.01, **kw)


def test_http_brace_pattern_equals_local(server, tmp_path):
    make_shards(server.root)
    convert(str(server.root / "train-{0..2}.tar"), tmp_path / "local.tbl")
    s = convert(f"{server.url}/train-{{0..2}}.tar", tmp_path / "http.tbl")
    assert s.written == 18 and s.skipped == []
    assert_same_dataset(tmp_path / "local.tbl", tmp_path / "http.tbl")
    assert tbljax.open(tmp_path / "http.tbl").recipe["sources"] == [f"{server.url}/train-{i}.tar" for i in range(3)]


def test_http_glob_lists_the_directory(server, tmp_path):
    make_shards(server.root)
    assert remote.expand(f"{server.url}/train-*.tar") == [f"{server.url}/train-{i}.tar" for i in range(3)]


def test_memory_and_file_urls_equal_local(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    paths = make_shards(tmp_path / "shards")
    convert(str(tmp_path / "shards" / "train-{0..2}.tar"), tmp_path / "local.tbl")
    mem = fsspec.filesystem("memory")
    for p in paths:
        mem.pipe(f"/tbljax-test/{p.name}", p.read_bytes())
    try:
        convert("memory://tbljax-test/train-{0..2}.tar", tmp_path / "mem.tbl")
        convert("memory://tbljax-test/train-*.tar", tmp_path / "memglob.tbl")
    finally:
        mem.rm("/tbljax-test", recursive=True)
    convert(f"file://{tmp_path}/shards/train-*.tar", tmp_path / "file.tbl")
    for other in ("mem.tbl", "memglob.tbl", "file.tbl"):
        assert_same_dataset(tmp_path / "local.tbl", tmp_path / other)


def test_dropped_connection_is_resumed_where_it_broke(server, tmp_path):
    make_shards(server.root, pad=True)
    size = (server.root / "train-1.tar").stat().st_size
    at = size - 50_000  # in the shard's second block: records before and after the break
    server.drops["train-1.tar"] = Drop(at=at, times=2)
    s = convert(f"{server.url}/train-{{0..2}}.tar", tmp_path / "http.tbl")
    assert s.skipped == [] and s.written == 18
    convert(str(server.root / "train-{0..2}.tar"), tmp_path / "local.tbl")
    assert_same_dataset(tmp_path / "local.tbl", tmp_path / "http.tbl")  # nothing lost, nothing twice
    gets = server.gets("train-1.tar")
    cut = [g for g in gets if 0 < g <= at]
    assert server.drops["train-1.tar"].times == 0, "both drops happened"
    # After the counting pass, the converting pass read from byte 0; every retry after a drop
    # asked for the bytes from where the reader stood, never from the start again.
    assert gets.count(0) == 2 and len(cut) >= 3, gets


def test_shard_that_keeps_failing_is_skipped_or_stops_strict(server, tmp_path):
    make_shards(server.root, pad=True)
    size = (server.root / "train-1.tar").stat().st_size
    server.drops["train-1.tar"] = Drop(at=size - 50_000, times=-1)
    s = convert(f"{server.url}/train-{{0..2}}.tar", tmp_path / "http.tbl", retries=2)
    bad = [x for x in s.skipped if x["source"] == f"{server.url}/train-1.tar"]
    assert len(bad) == 1 and "RemoteReadError" in bad[0]["reason"] and "rest of shard skipped" in bad[0]["reason"]
    assert f"{server.url}/train-1.tar" in bad[0]["reason"] and "3 times in a row" in bad[0]["reason"]
    keys = tbljax.open(tmp_path / "http.tbl").keys
    # Shards 0 and 2 whole; of shard 1 the records before the break, which falls in the big
    # caption of s1-003, whose image and label were read whole before it (as for a local shard).
    assert [k for k in keys if not k.startswith("s1-")] == [f"s{s}-{k:03d}" for s in (0, 2) for k in range(6)]
    assert [k for k in keys if k.startswith("s1-")] == [f"s1-{k:03d}" for k in range(4)]
    with pytest.raises(tbljax.ConversionError, match="train-1.tar"):
        convert(f"{server.url}/train-{{0..2}}.tar", tmp_path / "strict.tbl", retries=1, strict=True)
    assert not (tmp_path / "strict.tbl").exists()


def test_shard_whose_count_failed_stops_there_when_the_network_is_back(server, tmp_path):
    """The count sizes the file's index: a shard the count could not read is not read past
    that point later, even when the server answers again (no overflowing index)."""
    make_shards(server.root)
    server.drops["train-1.tar"] = Drop(at=100, times=2)  # exactly the counting pass's two tries
    s = convert(f"{server.url}/train-{{0..2}}.tar", tmp_path / "http.tbl", retries=1)
    assert server.drops["train-1.tar"].times == 0 and s.written == 12
    (bad,) = s.skipped
    assert bad["source"] == f"{server.url}/train-1.tar" and "while counting" in bad["reason"]
    assert "RemoteReadError" in bad["reason"]
    assert not any(k.startswith("s1-") for k in tbljax.open(tmp_path / "http.tbl").keys)


def test_shard_option_with_urls_matches_local(server, tmp_path):
    make_shards(server.root, shards=4)
    from tbljax._src.tools.cli import main

    for i in range(2):
        assert (
            main(
                [
                    "convert",
                    f"{server.url}/train-{{0..3}}.tar",
                    "-o",
                    str(tmp_path / f"u{i}.tbl"),
                    "-s",
                    "32",
                    "-q",
                    "--shard",
                    f"{i}/2",
                    "--retry-backoff",
                    "0.01",
                ]
            )
            == 0
        )
        convert(str(server.root / "train-{0..3}.tar"), tmp_path / f"l{i}.tbl", shard=(i, 2))
        assert_same_dataset(tmp_path / f"l{i}.tbl", tmp_path / f"u{i}.tbl")
    assert tbljax.open(tmp_path / "u1.tbl").keys[0] == "s2-000"


def test_missing_url_and_missing_backend_are_clear_errors(server, tmp_path):
    make_shards(server.root, shards=1)
    with pytest.raises(FileNotFoundError, match=r"train-7\.tar"):
        convert(f"{server.url}/train-{{0,7}}.tar", tmp_path / "x.tbl")
    with pytest.raises(ValueError, match="must be TAR shards"):
        convert(f"{server.url}/a.jpg", tmp_path / "x.tbl")
    for proto, extra, module in (("gs", "gcs", "gcsfs"), ("s3", "s3", "s3fs")):
        try:
            __import__(module)
        except ImportError:
            with pytest.raises(ImportError, match=rf"pip install 'tbljax\[{extra}\]'"):
                convert(f"{proto}://bucket/train-{{0..1}}.tar", tmp_path / "x.tbl")


def test_retry_settings_are_checked():
    with pytest.raises(ValueError, match="retries must be an integer >= 0, got -1"):
        remote.Retry(-1)
    with pytest.raises(ValueError, match="backoff"):
        remote.Retry(3, float("nan"))
    assert [remote.Retry(5, 0.5, 3.0).wait(k) for k in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]


def test_streaming_memory_is_flat_in_shard_size(server, tmp_path):
    """Shards of 16 and 96 MiB streamed over HTTP: resident memory grows by the same few
    blocks of fsspec's cache for both, far less than either shard."""
    pytest.importorskip("psutil", reason="RSS is read with psutil")
    growth = {}
    for mib in (16, 96):
        with tarfile.open(server.root / f"big{mib}.tar", "w") as tf:
            for k in range(mib):
                ti = tarfile.TarInfo(f"k{k:03d}.jpg")
                ti.size = 1 << 20
                tf.addfile(ti, io.BytesIO(os.urandom(1 << 20)))
        script = textwrap.dedent(f"""
            import json
            import psutil
            from tbljax._src.remote import remote
            from tbljax._src.sources.tar_shards import TarSource
            url = "{server.url}/big{mib}.tar"
            remote.size_of(url)  # the HTTP client and its threads exist before the baseline
            proc = psutil.Process()
            base = peak = proc.memory_info().rss
            n = 0
            for item in TarSource([url]):
                n += len(item.data)
                peak = max(peak, proc.memory_info().rss)
            print(json.dumps({{"bytes": n, "growth": peak - base}}))
        """)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout)
        assert r["bytes"] == mib << 20
        growth[mib] = r["growth"]
    mib_grown = {k: round(v / 2**20, 1) for k, v in growth.items()}
    assert growth[96] < 40 << 20, f"RSS grew {mib_grown} MiB streaming shards of 16 and 96 MiB"
    assert growth[96] - growth[16] < 12 << 20, f"RSS grew {mib_grown} MiB: it grows with the shard"

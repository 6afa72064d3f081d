"""The TBL file: layout checked byte by byte against the spec with `struct`, checksums against
independent references, corrupt files, atomic writes, and turboloader 2.39 reading our files
and writing files we read."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest

import tbljax
from tbljax import _core
from tbljax._src.file.format import Writer


def crc16_modbus_bitwise(data: bytes) -> int:
    crc = 0xFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


def write_raw(path, imgs, **meta):
    with Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(**meta)


def rand_imgs(n, h=12, w=10, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def test_checksums_match_references():
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 8, 9, 63, 1000):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert _core.crc32(data) == zlib.crc32(data.tobytes())
        assert _core.crc16_modbus(data) == crc16_modbus_bitwise(data.tobytes())
    assert _core.crc16_modbus(np.frombuffer(b"123456789", np.uint8)) == 0x4B37  # the standard check value


def test_crc16_every_simd_target_any_length_and_alignment():
    # The writer's per-record CRC-16 runs by carry-less multiplication (PCLMULQDQ) from 64
    # bytes on, except on the "scalar" target, which keeps the tables: both against the
    # bitwise definition at every length around the 64- and 16-byte steps, at odd starts.
    rng = np.random.default_rng(2)
    buf = rng.integers(0, 256, 80_000, dtype=np.uint8)
    cases = [(n, off) for n in range(0, 300) for off in (0, 1, 7)]
    cases += [(int(rng.integers(300, 5000)), int(rng.integers(0, 64))) for _ in range(40)]
    want = {(n, off): crc16_modbus_bitwise(buf[off : off + n].tobytes()) for n, off in cases}
    big = [(76_800, 0), (76_800, 3), (79_999, 1)]  # a 160 px record, odd starts and lengths
    try:
        big_crcs = []
        for target in _core.supported_kernel_targets():
            _core.set_kernel_target(target)
            for (n, off), crc in want.items():
                assert _core.crc16_modbus(buf[off : off + n]) == crc, (target, n, off)
            big_crcs.append([_core.crc16_modbus(buf[off : off + n]) for n, off in big])
        assert all(c == big_crcs[0] for c in big_crcs)
        assert big_crcs[0][0] == crc16_modbus_bitwise(buf[:76_800].tobytes())
    finally:
        _core.set_kernel_target("auto")


def test_layout_matches_spec(tmp_path):
    imgs = rand_imgs(5)
    p = tmp_path / "a.tbl"
    write_raw(p, imgs, labels=[3, 1, 4, 1, 5])
    b = p.read_bytes()
    magic, version, n, header_size, _pad, meta_off, meta_size, flags, crc = struct.unpack_from("<4sIQIIQQII", b)
    assert (magic, version, n, header_size) == (b"TBL\x02", 2, 5, 64 + 24 * 5)
    h = bytearray(b[:64])
    h[44:48] = b"\0\0\0\0"
    assert crc == zlib.crc32(bytes(h))
    assert flags & 4 and flags & 2 and not flags & 1  # checksums, metadata, no compression
    rec = imgs[0].nbytes
    for i in range(5):
        off, size, usize, w, hgt, fmt, fl, c16 = struct.unpack_from("<QIIHHBBH", b, 64 + 24 * i)
        assert (size, usize, w, hgt, fmt, fl) == (rec, rec, 10, 12, 8, 0)
        assert off == 4096 + i * rec  # first RAW payload 4 KiB-aligned, records contiguous
        assert b[off : off + size] == imgs[i].tobytes()
        assert c16 == crc16_modbus_bitwise(imgs[i].tobytes())
    sample, size, mtype, json_crc = struct.unpack_from("<QIHH", b, meta_off)
    assert (sample, mtype) == (2**64 - 1, 255) and 16 + size == meta_size
    assert json_crc == crc16_modbus_bitwise(b[meta_off + 16 : meta_off + 16 + size])
    assert meta_off + meta_size == len(b)


def test_roundtrip_metadata_and_view(tmp_path):
    imgs = rand_imgs(7)
    p = tmp_path / "a.tbl"
    write_raw(
        p,
        imgs,
        labels=[0, 1, 2, 0, 1, 2, 9],
        keys=[f"k/{i}" for i in range(7)],
        classes=["x", "y", "z"],
        recipe={"image_size": 12},
    )
    ds = tbljax.open(p)
    assert len(ds) == 7 and ds.record_format == "raw" and ds.image_shape == (12, 10)
    assert ds.labels.tolist() == [0, 1, 2, 0, 1, 2, 9]
    assert ds.keys == [f"k/{i}" for i in range(7)]
    assert ds.classes == ["x", "y", "z"] and ds.recipe["image_size"] == 12
    v = ds.view()
    assert v.shape == (7, 12, 10, 3) and not v.flags.writeable
    assert v.ctypes.data % 4096 == 0  # zero-copy device_put on CPU needs 64-byte alignment
    np.testing.assert_array_equal(v, imgs)
    np.testing.assert_array_equal(ds.read(-1), imgs[-1])
    assert ds.verify() == []
    with pytest.raises(IndexError, match="out of range"):
        ds.read(7)


def test_shards_read_as_one(tmp_path):
    a, b = rand_imgs(3, seed=1), rand_imgs(4, seed=2)
    write_raw(tmp_path / "a.tbl", a, labels=[1, 2, 3])
    write_raw(tmp_path / "b.tbl", b, labels=[4, 5, 6, 7])
    ds = tbljax.open([tmp_path / "a.tbl", tmp_path / "b.tbl"])
    assert len(ds) == 7 and ds.labels.tolist() == [1, 2, 3, 4, 5, 6, 7]
    np.testing.assert_array_equal(np.stack([ds.read(i) for i in range(7)]), np.concatenate([a, b]))
    assert [v.shape[0] for v in ds.shard_views()] == [3, 4]
    with pytest.raises(ValueError, match="shard_views"):
        ds.view()


def test_lz4_records_roundtrip(tmp_path):
    imgs = np.zeros((3, 16, 16, 3), np.uint8)
    imgs[1, 4:8] = 200  # compressible
    p = tmp_path / "z.tbl"
    with Writer(p, 3) as w:
        for im in imgs:
            w.add_raw(im, lz4=True)
    ds = tbljax.open(p)
    assert ds.record_format == "lz4" and ds.info(0).lz4 and ds.info(0).size < imgs[0].nbytes
    for i in range(3):
        np.testing.assert_array_equal(ds.read(i), imgs[i])
    assert ds.verify() == []


def test_failed_write_leaves_nothing_and_keeps_existing(tmp_path):
    p = tmp_path / "a.tbl"
    with pytest.raises(RuntimeError):
        with Writer(p, 2) as w:
            w.add_raw(rand_imgs(1)[0])
            raise RuntimeError("boom")
    assert not p.exists() and os.listdir(tmp_path) == []
    p.write_bytes(b"precious")
    with pytest.raises(ValueError, match="already exists"):
        Writer(p, 1)
    assert p.read_bytes() == b"precious"
    with Writer(p, 1, overwrite=True) as w:
        w.add_raw(rand_imgs(1)[0])
    assert len(tbljax.open(p)) == 1 and os.listdir(tmp_path) == ["a.tbl"]


def test_writer_rejects_bad_records(tmp_path):
    w = Writer(tmp_path / "a.tbl", 1)
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8"):
        w.add_raw(np.zeros((4, 4), np.uint8))
    w.add_raw(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="capacity"):
        w.add_raw(np.zeros((4, 4, 3), np.uint8))
    w.abort()
    assert not (tmp_path / "a.tbl").exists()


@pytest.fixture
def good_file(tmp_path):
    p = tmp_path / "good.tbl"
    write_raw(p, rand_imgs(6), labels=range(6))
    return p


def damaged(src, tmp_path, fn):
    b = bytearray(src.read_bytes())
    fn(b)
    p = tmp_path / "bad.tbl"
    p.write_bytes(bytes(b))
    return p


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b.__delitem__(slice(30, None)), "shorter than the 64-byte"),
        (lambda b: b.__delitem__(slice(0, None)), "shorter than the 64-byte"),
        (lambda b: b.__setitem__(slice(0, 4), b"PK\x03\x04"), "not a TBL file"),
        (lambda b: b.__setitem__(12, 0x7F), "header checksum"),
        (lambda b: b.__delitem__(slice(4200, None)), "truncated"),
        (lambda b: b.__delitem__(slice(100, None)), "truncated"),
        (lambda b: b.__delitem__(slice(len(b) - 5, None)), "truncated"),
        (lambda b: b.__setitem__(len(b) - 3, b[len(b) - 3] ^ 4), "metadata block checksum"),
    ],
    ids=[
        "short",
        "empty",
        "magic",
        "header-bitflip",
        "truncated-payload",
        "truncated-index",
        "truncated-metadata",
        "metadata-bitflip",
    ],
)
def test_corrupt_files_fail_at_open(good_file, tmp_path, damage, message):
    p = damaged(good_file, tmp_path, damage)
    with pytest.raises(tbljax.CorruptFileError, match=message) as e:
        tbljax.open(p)
    assert str(p) in str(e.value)


def test_index_damage_names_the_record(good_file, tmp_path):
    def bad_size(b):
        struct.pack_into("<I", b, 64 + 24 * 4 + 8, 999)  # record 4: size no longer W*H*3

    p = damaged(good_file, tmp_path, bad_size)
    with pytest.raises(tbljax.CorruptFileError, match="record 4"):
        tbljax.open(p)


def test_payload_bitflip_found_by_verify(good_file, tmp_path):
    p = damaged(good_file, tmp_path, lambda b: b.__setitem__(4096 + 2 * 360 + 17, b[4096 + 2 * 360 + 17] ^ 1))
    ds = tbljax.open(p)  # open is O(1) in payload bytes: it checks structure only
    problems = ds.verify()
    assert [(i, "checksum" in m) for _, i, m in problems] == [(2, True)]
    with pytest.raises(tbljax.CorruptFileError, match="record 2: checksum"):
        _core.TblFile(str(p)).read_payload(2, verify=True)


def test_cli_verify_and_info(good_file, tmp_path, capsys):
    from tbljax._src.tools.cli import main

    assert main(["verify", str(good_file)]) == 0
    assert "all checksums match" in capsys.readouterr().out
    p = damaged(good_file, tmp_path, lambda b: b.__setitem__(5000, b[5000] ^ 0xFF))
    assert main(["verify", str(p)]) == 1
    assert "record 2: checksum mismatch" in capsys.readouterr().out
    assert main(["info", "--json", str(good_file)]) == 0
    assert '"records": 6' in capsys.readouterr().out


# ---- turboloader 2.39 interop (the real package) ----


@pytest.fixture
def tl():
    return pytest.importorskip(
        "turboloader", reason="turboloader 2.39 is the interop peer (pip install 'tbljax[test]')"
    )


def test_turboloader_reads_our_raw_file(tmp_path, tl):
    imgs = rand_imgs(9, 16, 20)
    p = tmp_path / "ours.tbl"
    write_raw(p, imgs, labels=range(9), keys=[str(i) for i in range(9)])
    r = tl.TblReaderV2(str(p), verify_checksums=True)
    assert r.num_samples() == 9
    for i in range(9):
        assert r.read_sample(i) == imgs[i].tobytes()
        info = r.get_sample_info(i)
        assert (info["width"], info["height"], int(info["format"])) == (20, 16, 8)
    loader = tl.TblRawImageLoader(
        str(p), batch_size=4, shuffle=False, mean=None, std=None, prefetch_batches=0, drop_last=False
    )
    seen = []
    for batch, meta in loader:
        x = np.asarray(batch).transpose(0, 2, 3, 1)  # its output: NCHW float in [0, 1]
        np.testing.assert_array_equal(np.rint(x * 255).astype(np.uint8), imgs[np.asarray(meta["indices"])])
        seen.extend(np.asarray(meta["indices"]).tolist())
    assert sorted(seen) == list(range(9))


def test_turboloader_reads_our_lz4_file(tmp_path, tl):
    imgs = np.zeros((2, 8, 8, 3), np.uint8)
    imgs[1, :4] = 7
    p = tmp_path / "ours.tbl"
    with Writer(p, 2) as w:
        for im in imgs:
            w.add_raw(im, lz4=True)
    r = tl.TblReaderV2(str(p), verify_checksums=True)
    assert [r.read_sample(i) for i in range(2)] == [im.tobytes() for im in imgs]


def test_we_read_turboloader_written_records(tmp_path, tl):
    imgs = rand_imgs(3, 8, 8)
    smooth = np.zeros((8, 8, 3), np.uint8)
    p = tmp_path / "theirs.tbl"
    w = tl.TblWriterV2(str(p), enable_compression=True)
    for i, im in enumerate([imgs[0], smooth, imgs[2]]):
        idx = w.add_sample(im.tobytes(), tl.SampleFormat.RAW_U8, width=8, height=8)
        w.add_metadata(idx, f'{{"label": {10 + i}}}', tl.MetadataType.JSON)
    w.finalize()
    ds = tbljax.open(p)
    assert len(ds) == 3 and ds.info(1).lz4  # it compressed the flat image
    for i, im in enumerate([imgs[0], smooth, imgs[2]]):
        np.testing.assert_array_equal(ds.read(i), im)
    assert ds.labels.tolist() == [10, 11, 12]
    assert ds.verify() == []


def test_the_run_entries_of_a_recipe_have_one_home(tmp_path):
    # Issue 44 §4: both conversion drivers write the run's entries through file/format.run_entries,
    # and exactly those keys (RUN_KEYS) are left out of the fingerprint.
    import datetime

    from tbljax._src.file import format as fmt

    imgs = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3), np.uint8)
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    tbljax.convert(imgs, tmp_path / "a.tbl", image_size=8, progress=False)
    tbljax.convert(tmp_path / "a.tbl", tmp_path / "b.tbl", format="lz4", progress=False)
    for name, sources in (("a.tbl", None), ("b.tbl", [str(tmp_path / "a.tbl")])):
        recipe = tbljax.open(tmp_path / name).recipe
        assert recipe["tbljax"] == tbljax.__version__
        assert (
            before <= datetime.datetime.fromisoformat(recipe["created"]) <= datetime.datetime.now(datetime.timezone.utc)
        )
        if sources is not None:
            assert recipe["sources"] == sources
        assert {"sources", "tbljax", "created"} <= set(recipe) and set(recipe) & fmt.RUN_KEYS
    from tbljax._src.datasets.reader import NOT_FINGERPRINTED

    assert NOT_FINGERPRINTED is fmt.RUN_KEYS
    with pytest.raises(ValueError, match=r"\['when'\] are not recipe run keys"):
        fmt.run_entries([], when="now")

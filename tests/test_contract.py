"""Every member of the dataset contract (`rules/dataset.py`), called on every dataset kind — a
file, shard files, a host part of records, a mixture — against the source arrays written into
the files (the reference), and a resident dataset of a host part with a fixed field."""

from __future__ import annotations

import numpy as np
import pytest

import tbljax
from tbljax._src.datasets.host_part import PartDataset
from tbljax._src.rules.dataset import RecordDataset, members

N, H, W = 12, 8, 6
RNG = np.random.default_rng(3)
IMAGES = RNG.integers(0, 256, (N, H, W, 3), np.uint8)
EMB = RNG.standard_normal((N, 4)).astype(np.float32)
CAPTION = [f"caption {i}" for i in range(N)]


def _write(path, rows):
    tbljax.convert(
        {"image": IMAGES[rows], "label": np.asarray(rows), "emb": EMB[rows], "caption": [CAPTION[i] for i in rows]},
        path,
        image_size=max(H, W),
        resize="max_side",
        progress=False,
    )
    return str(path)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """{kind: (dataset, the source rows its records are, in order)}."""
    d = tmp_path_factory.mktemp("contract")
    one = _write(d / "one.tbl", list(range(N)))
    shards = [_write(d / "s0.tbl", list(range(5))), _write(d / "s1.tbl", list(range(5, N)))]
    whole = tbljax.open(one)
    mixed = tbljax.mix({"a": shards[0], "b": shards[1]}, {"a": 1, "b": 1}, steps_per_epoch=2)
    return {
        "file": (whole, list(range(N))),
        "shards": (tbljax.open(shards), list(range(N))),
        "part": (PartDataset(whole, 4, 10, "fp"), list(range(4, 10))),
        "mixture": (mixed, list(range(N))),
    }


KINDS = ["file", "shards", "part", "mixture"]


def crc16_modbus(data: bytes) -> int:
    """CRC-16/MODBUS (poly 0xA001 reflected, init 0xFFFF), bit by bit: the payload checksum the
    TBL index holds, written here from its definition."""
    crc = 0xFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


@pytest.mark.parametrize("kind", KINDS)
def test_every_member_on_every_kind_against_the_source_arrays(kinds, kind):
    ds, rows = kinds[kind]
    assert isinstance(ds, RecordDataset)
    called = set()

    def use(name):
        called.add(name)
        return getattr(ds, name)

    n = len(rows)
    called.add("__len__")
    assert len(ds) == n
    assert use("draws_by_weight") == (kind == "mixture")
    assert use("labels").tolist() == rows
    keys = use("keys")  # each file numbers its keys from 0: the source row within that file
    assert len(keys) == n and keys == [ds.read_record(i)["key"] for i in range(n)]
    assert use("classes") is None
    assert use("record_format") == "raw" and use("compact") is False
    assert use("image_shape") == (H, W) and use("geometry").shape == (H, W)
    assert isinstance(use("fingerprint"), str) and use("paths") == list(dict.fromkeys(ds.paths))
    r = use("records")()
    assert int(r.counts.sum()) == n and len(r.views) == len(ds.paths)
    views = use("shard_views")()
    np.testing.assert_array_equal(np.concatenate(views), IMAGES[rows])
    raw = use("raw_records")()
    assert int(raw.counts.sum()) == n and (raw.heights == H).all() and (raw.widths == W).all()
    with pytest.raises(ValueError, match="only JPEG records"):
        use("jpeg_records")()
    files, offsets, sizes = use("byte_ranges")(np.arange(n))
    for i in range(n):  # the bytes there are the record's pixels
        np.testing.assert_array_equal(
            r.views[files[i]][offsets[i] : offsets[i] + sizes[i]], IMAGES[rows[i]].reshape(-1)
        )
    assert use("files_of")(np.arange(n)).tolist() == sorted(set(files.tolist()))
    for i in (0, n - 1, -1):
        np.testing.assert_array_equal(use("read")(i), IMAGES[rows[i]])
        record = use("__getitem__")(i)
        np.testing.assert_array_equal(record["image"], IMAGES[rows[i]])
        assert record["label"] == rows[i] and record["caption"] == CAPTION[rows[i]]
        np.testing.assert_array_equal(record["emb"], EMB[rows[i]])
        assert use("read_record")(i)["label"] == rows[i]
    out = np.zeros((3, H, W, 3), np.uint8)
    np.testing.assert_array_equal(use("read_into")(np.array([2, 0, n - 1]), out), IMAGES[[rows[2], rows[0], rows[-1]]])
    path, j = use("locate")(n - 1)
    np.testing.assert_array_equal(tbljax.open(path).read(j), IMAGES[rows[-1]])
    assert use("describe_record")(n - 1) == f"{path}: record {j}"
    use("check_unchanged")()
    assert list(use("fields")) == ["emb", "caption"]
    np.testing.assert_array_equal(use("field_rows")("emb", [1, n - 1]), EMB[[rows[1], rows[-1]]])
    assert ds.field_rows("caption", [0]) == [CAPTION[rows[0]]]
    out, lengths = np.ones((2, 6), np.float32), np.zeros(2, np.int64)
    use("field_padded")("emb", [0, -1], 6, out, lengths)  # 4 values, zero-padded to 6
    np.testing.assert_array_equal(out, np.pad(EMB[[rows[0], rows[-1]]], ((0, 0), (0, 2))))
    assert lengths.tolist() == [4, 4]
    assert use("served_bytes")() == n * H * W * 3
    assert use("checksums")().tolist() == [crc16_modbus(IMAGES[k].tobytes()) for k in rows]
    assert called >= set(members()), sorted(set(members()) - called)


def test_resident_dataset_of_a_host_part_holds_its_fixed_field(kinds):
    ds, rows = kinds["part"]
    rd = tbljax.ResidentDataset(ds)
    assert rd.left_out == {"caption": "str: not numeric (serve it with tbljax.loader)"}
    np.testing.assert_array_equal(np.asarray(rd.fields["emb"]), EMB[rows])
    np.testing.assert_array_equal(np.asarray(rd.labels), rows)


@pytest.mark.parametrize(
    "call, value",
    [
        (lambda v: tbljax.loader(v, 4), list(range(500))),  # rules/dataset
        (lambda v: tbljax.convert(v, "o.tbl", image_size=8), [(1, 2)] * 400),  # sources/files
    ],
)
def test_a_long_value_in_a_message_is_cut_and_says_so(call, value):
    # Issue 44 §4: one rule (rules/errors.shown) for a huge argument in a message: its repr's
    # start, then how long it was; the message's own words after it are kept.
    with pytest.raises(TypeError) as e:
        call(value)
    text = repr(value)
    assert text[:200] in str(e.value) and f"... ({len(text)} characters)" in str(e.value)
    assert len(str(e.value)) < 1000


def test_record_numbers_against_numpy():
    """In-range indices come back as they are (int64), negative ones count from the end, and
    one past either end is an IndexError naming it: the plain-NumPy rule, whichever path."""
    from tbljax._src.rules.contract import record_numbers

    n = 10
    for given in ([3, 0, 9], np.array([3, 0, 9], np.int32), np.array([-1, 2, -10], np.int64), np.array([], np.int64)):
        want = np.asarray(given, np.int64) % n if len(given) else np.zeros(0, np.int64)
        got = record_numbers(given, n)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
    for bad, first in (([0, 10], 10), ([-11, 1], -11)):
        with pytest.raises(IndexError, match=f"record {first} out of range"):
            record_numbers(bad, n)

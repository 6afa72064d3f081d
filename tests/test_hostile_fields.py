"""Hostile input on the record fields, the dataset metadata and mixtures (issue 46): int64
values never wrapped by JAX, mixture options applied or refused by name, damaged field values
and metadata as CorruptFileError naming file, record and field, field indices by `read`'s
rules, `pad` lengths refused before allocating. Each value is compared with the source's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tbljax
from tbljax import _core
from tbljax._src.file.format import FORMATS

N = 32
BIG = np.arange(N, dtype=np.int64) + 2**40 + 7
CAPTIONS = [f"caption {i} ü" for i in range(N)]
TAGS = [{"i": i, "t": ["x"] * (i % 3)} for i in range(N)]
TOKS = [np.arange(i % 5, dtype=np.int32) + i for i in range(N)]


@pytest.fixture(scope="module")
def tbl(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    imgs = np.random.default_rng(0).integers(0, 255, (N, 8, 8, 3), np.uint8)
    path = str(d / "a.tbl")
    tbljax.convert(
        {
            "image": imgs,
            "label": np.arange(N) % 3,
            "caption": CAPTIONS,
            "tags": TAGS,
            "big": BIG,
            "small": np.arange(N, dtype=np.int64) - 5,
            "tok": TOKS,
        },
        path,
        image_size=8,
        progress=False,
    )
    return path


def _first_batch(loader):
    return next(iter(loader))


# ---- item 2: int64 values ----
def test_int64_field_out_of_int32_is_refused_by_the_jax_loader_and_resident(tbl):
    ds = tbljax.open(tbl)
    np.testing.assert_array_equal(ds.field("big"), BIG)
    with pytest.raises(ValueError, match=r"field 'big'.*does not fit int32.*jax_enable_x64"):
        tbljax.loader(ds, 8, fields=["big"])
    with pytest.raises(ValueError, match=r"field 'big'.*does not fit int32"):
        tbljax.ResidentDataset(ds, fields=["big"])


def test_int64_field_that_fits_is_served_exactly_and_x64_serves_int64(tbl):
    import jax

    ds = tbljax.open(tbl)
    b = _first_batch(tbljax.loader(ds, 8, fields=["small"], shuffle=False))
    np.testing.assert_array_equal(np.asarray(b["small"]), np.arange(8) - 5)
    jax.config.update("jax_enable_x64", True)  # global: the producer thread reads it too
    try:
        b = _first_batch(tbljax.loader(ds, 8, fields=["big"], shuffle=False))
        assert b["big"].dtype == np.int64
        np.testing.assert_array_equal(np.asarray(b["big"]), BIG[:8])
    finally:
        jax.config.update("jax_enable_x64", False)


def test_a_field_fn_output_that_would_wrap_names_the_field(tbl):
    ds = tbljax.open(tbl)
    loader = tbljax.loader(ds, 8, fields=["caption"], field_fn={"caption": lambda v: np.full(len(v), 2**40)})
    with pytest.raises(ValueError, match=r"field 'caption' holds 1099511627776 at epoch 0"):
        _first_batch(loader)


def test_a_label_that_does_not_fit_int32_is_refused(tbl):
    ds = tbljax.open(tbl)
    m = tbljax.mix({"a": ds, "b": ds}, {"a": 1, "b": 1}, steps_per_epoch=2, label_offset={"b": 2**31 - 2})
    assert m.labels.max() == 2**31 - 2 + 2
    with pytest.raises(ValueError, match=r"label 2147483648, which does not fit the int32"):
        tbljax.loader(m, 8, fields=None)


# ---- item 3: mixture options ----
def test_mixture_options_are_applied_or_refused_by_name(tbl):
    ds = tbljax.open(tbl)
    m = tbljax.mix({1: ds, 2: ds}, {1: 1, 2: 1}, steps_per_epoch=2, label_offset={1: 1000})
    assert m.label_offsets == (1000, 0)
    np.testing.assert_array_equal(m.labels[:N], np.arange(N) % 3 + 1000)
    bad = [
        (({1: ds, "1": ds}, {1: 1, "1": 1}, {}), r"sources has keys 1 and '1'"),
        (({"a": ds, "b": ds}, {"a": 1, "b": "x"}, {}), r"weights\['b'\] must be a finite number"),
        (({"a": ds, "b": ds}, {"a": 1, "b": 1}, {"label_offset": {"a": 1.5}}), r"label_offset\['a'\]"),
        (({"a": ds, "b": ds}, {"a": 1, "b": 1}, {"label_offset": {"a": 2**32 + 5}}), r"label_offset\['a'\]"),
        (({"a": ds, "b": ds}, {"a": 1, "b": 1}, {"steps_per_epoch": 10**30}), r"steps_per_epoch"),
        (
            ({"a": ds, "m": tbljax.mix({"x": ds}, {"x": 1}, steps_per_epoch=2)}, {"a": 1, "m": 1}, {}),
            r"source 'm' is itself a mixture",
        ),
    ]
    for (sources, weights, kw), match in bad:
        kw = {"steps_per_epoch": 2, **kw}
        with pytest.raises((ValueError, TypeError), match=match):
            tbljax.mix(sources, weights, **kw)


def test_huge_weights_keep_their_ratio(tbl):
    ds = tbljax.open(tbl)
    m = tbljax.mix({"a": ds, "b": ds}, {"a": 1.5e308, "b": 0.5e308}, steps_per_epoch=2)
    b = _first_batch(tbljax.loader(m, 64, fields=None))
    np.testing.assert_array_equal(np.bincount(np.asarray(b["source"]), minlength=2), [48, 16])


# ---- item 5: field indices ----
def test_field_rows_index_rules_are_reads(tbl):
    ds = tbljax.open(tbl)
    assert ds.field_rows("caption", [-1, 0]) == [CAPTIONS[-1], CAPTIONS[0]]
    for i in (-N - 8, N):
        with pytest.raises(IndexError, match=rf"record {i} out of range for a dataset of {N} records"):
            ds.field_rows("caption", [i])
        with pytest.raises(IndexError, match=rf"record {i} out of range"):
            ds.field_rows("big", [i])
    m = tbljax.mix({"a": ds, "b": ds}, {"a": 1, "b": 1}, steps_per_epoch=2)
    with pytest.raises(IndexError, match=rf"record {2 * N} out of range for a mixture"):
        m.field_rows("caption", [2 * N])


# ---- item 8: pad ----
def test_a_pad_too_long_to_allocate_is_refused_at_construction(tbl):
    ds = tbljax.open(tbl)
    with pytest.raises(ValueError, match=r"pad\['tok'\]"):
        tbljax.loader(ds, 8, fields=["tok"], pad={"tok": 10**12})
    with pytest.raises(ValueError, match=r"pad\['tok'\]"):
        tbljax.ResidentDataset(ds, fields=["tok"], pad={"tok": 10**9})
    b = _first_batch(tbljax.loader(ds, 8, fields=["tok"], pad={"tok": 3}, shuffle=False))
    want = np.zeros((8, 3), np.int32)
    for i in range(8):
        want[i, : min(3, len(TOKS[i]))] = TOKS[i][:3]
    np.testing.assert_array_equal(np.asarray(b["tok"]), want)


# ---- item 4: damaged values ----
def _damaged(tbl, tmp_path, field, block, at, byte=None, delta=0):
    """A copy of `tbl` with one byte of a field's block changed (the CRC-32 left stale)."""
    ds = tbljax.open(tbl)
    meta = json.loads(_core.TblFile(tbl).dataset_json)["fields"][field][block]
    data = bytearray(Path(tbl).read_bytes())
    pos = meta["offset"] + at
    if byte is not None:
        data[pos] = byte
    else:  # an int64 offset moved by delta
        v = int.from_bytes(data[pos : pos + 8], "little") + delta
        data[pos : pos + 8] = v.to_bytes(8, "little", signed=True)
    out = tmp_path / "damaged.tbl"
    out.write_bytes(bytes(data))
    del ds
    return str(out)


@pytest.mark.parametrize("field,what", [("caption", "UTF-8 text"), ("tags", "JSON")])
def test_a_damaged_str_or_json_value_names_file_record_and_field(tbl, tmp_path, field, what):
    path = _damaged(tbl, tmp_path, field, "values", 0, byte=0xFF)
    ds = tbljax.open(path)
    pattern = rf"damaged.tbl: record 0: field '{field}' holds no valid {what}"
    for call in (lambda: ds.field(field)[0], lambda: ds.read_record(0), lambda: ds.field_rows(field, [0])):
        with pytest.raises(_core.CorruptFileError, match=pattern):
            call()
    assert ds.field(field)[1] == (CAPTIONS if field == "caption" else TAGS)[1]
    assert any(field in msg for _, _, msg in ds.verify())


def test_offsets_that_fall_name_the_record(tbl, tmp_path):
    path = _damaged(tbl, tmp_path, "tok", "offsets", 8 * 3, delta=-5)  # record 2 ends before it starts
    ds = tbljax.open(path)
    with pytest.raises(_core.CorruptFileError, match=r"field 'tok': offsets do not rise .*record 2 "):
        ds.field("tok")[5]


# ---- item 7: field metadata ----
def _with_fields_meta(tmp_path, fields_meta, name="m.tbl"):
    """A file whose (checksummed) dataset metadata holds `fields_meta` as given."""
    path = str(tmp_path / name)
    w = _core.TblWriter(path, 2, False)  # the native writer: it takes any metadata text
    for _ in range(2):
        w.add(np.zeros(4 * 4 * 3, np.uint8), FORMATS["RAW_U8"], 4, 4, False)
    data = np.arange(2, dtype="<i8").view(np.uint8)
    blk = {"offset": int(w.add_extra(data, 64)), "bytes": data.size, "crc32": _core.crc32(data, 0)}
    meta = {"tbljax_metadata": 1, "num_records": 2, "fields": {k: {**v, "values": blk} for k, v in fields_meta.items()}}
    w.finalize(json.dumps(meta))
    return path


@pytest.mark.parametrize(
    "fields_meta,match",
    [
        ({"x": {"kind": "ndarray", "dtype": None, "shape": []}}, "dtype is a numeric NumPy dtype"),
        ({"x": {"kind": "ndarray", "dtype": "<U4", "shape": []}}, "dtype is a numeric NumPy dtype"),
        ({"x": {"kind": "ndarray", "dtype": "<i8", "shape": [2**39, 2**39]}}, "shape"),
        ({"x": {"kind": "str", "dtype": "<i8", "shape": []}}, "dtype null and shape"),
        # fuzz/fuzz_fields.py's finding 3 (seed 0, run 43): a TypeError from np.dtype before
        ({"x": {"kind": "str", "dtype": 2147483648, "shape": []}}, "dtype null and shape"),
        ({"label": {"kind": "ndarray", "dtype": "<i8", "shape": []}}, "field name 'label'"),
        ({"index": {"kind": "ndarray", "dtype": "<i8", "shape": []}}, "field name 'index'"),
        ({"image": {"kind": "ndarray", "dtype": "<i8", "shape": []}}, "field name 'image'"),
        ({"tok_length": {"kind": "ndarray", "dtype": "<i8", "shape": []}}, "field name 'tok_length'"),
    ],
)
def test_bad_field_metadata_is_a_corrupt_file_everywhere(tmp_path, fields_meta, match):
    path = _with_fields_meta(tmp_path, fields_meta)
    ds = tbljax.open(path)
    for call in (lambda: ds.fields, lambda: ds.verify(), lambda: ds.describe(), lambda: ds.labels):
        with pytest.raises(_core.CorruptFileError, match=rf"m.tbl: .*{match}"):
            call()


def test_good_field_metadata_written_by_hand_reads_back(tmp_path):
    ds = tbljax.open(_with_fields_meta(tmp_path, {"x": {"kind": "ndarray", "dtype": "<i8", "shape": []}}))
    np.testing.assert_array_equal(ds.field("x"), [0, 1])


@pytest.mark.parametrize("name", ["valid", "source", "label_length"])
def test_conversion_refuses_the_batch_s_own_keys_as_field_names(tmp_path, name):
    imgs = np.zeros((2, 4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match=rf"field name '{name}'"):
        tbljax.convert({"image": imgs, name: np.arange(2)}, str(tmp_path / "x.tbl"), image_size=4, progress=False)


# ---- item 10: a state of another mixture ----
def test_a_state_of_another_mixture_says_what_differs(tbl):
    ds = tbljax.open(tbl)
    a = tbljax.mix({"a": ds, "b": ds}, {"a": 1, "b": 1}, steps_per_epoch=4)
    state = tbljax.loader(a, 8, fields=None).state_dict()
    for other, match in [
        ({"a": 1, "b": 3}, r"weights \(state \[1.0, 1.0\], this loader \[1.0, 3.0\]\)"),
        ({"a": 1, "c": 1}, r"sources \(state \['a', 'b'\], this loader \['a', 'c'\]\)"),
    ]:
        b = tbljax.mix({n: ds for n in other}, other, steps_per_epoch=4)
        with pytest.raises(ValueError, match=r"the mixtures differ in " + match):
            tbljax.loader(b, 8, fields=None).load_state_dict(state)
    b = tbljax.mix({"a": ds, "b": ds}, {"a": 1, "b": 1}, steps_per_epoch=5)
    with pytest.raises(ValueError, match=r"steps_per_epoch \(state 4, this loader 5\)"):
        tbljax.loader(b, 8, fields=None).load_state_dict(state)

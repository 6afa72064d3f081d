"""Record fields besides the image (issue 22): str, json and ndarray (fixed and ragged) fields
converted from real WebDataset TARs, image folders with sidecar files and dict sources, read
back as columns and records, checked by verify, kept by shards and TBL→TBL conversion, bad
values skipped like bad images, and the file still served by turboloader 2.39. Every value is
compared with the value the source held."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

import tbljax
from tbljax._src.file.fields import parse_field_value


def _npy(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def _jpeg(seed: int, h: int = 24, w: int = 32) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    b = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), np.uint8)).save(b, "JPEG", quality=95)
    return b.getvalue()


def _source(n: int, seed: int = 0):
    """The values every record holds: caption, tags, a fixed (6,) float16 embedding, ragged tokens."""
    rng = np.random.default_rng(seed)
    return [
        {
            "key": f"s{seed}-{i:04d}",
            "caption": f"a photo of thing {i} — ünï",
            "tags": {"tags": [f"t{i % 3}", i], "score": i / 4},
            "emb": rng.standard_normal(6).astype(np.float16),
            "tok": rng.integers(0, 1000, int(rng.integers(0, 9))).astype(np.int32),
        }
        for i in range(n)
    ]


def write_tar(path, samples, *, drop=None, corrupt=None):
    """A WebDataset shard written with tarfile: key.jpg, key.cls, key.txt, key.json,
    key.emb.npy, key.tok.npy (a member left out or damaged where asked)."""
    with tarfile.open(path, "w") as tf:
        for i, s in enumerate(samples):
            members = {
                "jpg": _jpeg(i),
                "cls": str(i % 2).encode(),
                "txt": s["caption"].encode(),
                "json": json.dumps(s["tags"]).encode(),
                "emb.npy": _npy(s["emb"]),
                "tok.npy": _npy(s["tok"]),
            }
            if drop and drop[0] == i:
                del members[drop[1]]
            if corrupt and corrupt[0] == i:
                members[corrupt[1]] = corrupt[2]
            for ext, data in members.items():
                ti = tarfile.TarInfo(f"{s['key']}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))


FIELDS = {"caption": "txt", "tags": "json", "emb": "emb.npy", "tok": "tok.npy"}


def check_against(ds, samples):
    assert len(ds) == len(samples)
    assert list(ds.field("caption")) == [s["caption"] for s in samples]
    assert list(ds.field("tags")) == [s["tags"] for s in samples]
    np.testing.assert_array_equal(ds.field("emb"), np.stack([s["emb"] for s in samples]))
    toks = ds.field("tok")
    assert len(toks) == len(samples)
    for t, s in zip(toks, samples):
        assert t.dtype == np.int32
        np.testing.assert_array_equal(t, s["tok"])
    for i in (0, len(samples) - 1):
        r = ds.read_record(i)
        assert r["key"] == samples[i]["key"] and r["caption"] == samples[i]["caption"]
        assert r["tags"] == samples[i]["tags"]
        np.testing.assert_array_equal(r["emb"], samples[i]["emb"])
        np.testing.assert_array_equal(r["tok"], samples[i]["tok"])
        np.testing.assert_array_equal(r["image"], ds.read(i))


def test_webdataset_tar_fields_round_trip(tmp_path):
    samples = _source(12)
    write_tar(tmp_path / "a.tar", samples)
    s = tbljax.convert(tmp_path / "a.tar", tmp_path / "a.tbl", image_size=16, fields=FIELDS, progress=False)
    assert s.written == 12 and s.skipped == []
    ds = tbljax.open(tmp_path / "a.tbl")
    f = ds.fields
    assert list(f) == list(FIELDS)
    assert (f["caption"].kind, f["caption"].dtype, f["caption"].shape) == ("str", None, ())
    assert f["tags"].kind == "json"
    assert (f["emb"].kind, f["emb"].dtype, f["emb"].shape) == ("ndarray", np.dtype(np.float16), (6,))
    assert (f["tok"].kind, f["tok"].dtype, f["tok"].shape) == ("ndarray", np.dtype(np.int32), (None,))
    emb = ds.field("emb")
    assert not emb.flags.writeable and not emb.flags.owndata  # a view of the mapping
    assert emb.ctypes.data % 64 == 0
    check_against(ds, samples)
    assert ds.labels.tolist() == [i % 2 for i in range(12)]  # labels still read from .cls
    assert ds.verify() == []
    d = ds.describe()["fields"]
    assert d["emb"] == {"kind": "ndarray", "dtype": "float16", "shape": [6], "bytes": 12 * 6 * 2}
    assert d["tok"]["shape"] == [None]


def test_fields_change_the_fingerprint_and_verify_finds_damage(tmp_path):
    samples = _source(6)
    write_tar(tmp_path / "a.tar", samples)
    tbljax.convert(tmp_path / "a.tar", tmp_path / "a.tbl", image_size=16, fields=FIELDS, progress=False)
    tbljax.convert(tmp_path / "a.tar", tmp_path / "b.tbl", image_size=16, fields={"caption": "txt"}, progress=False)
    tbljax.convert(tmp_path / "a.tar", tmp_path / "c.tbl", image_size=16, progress=False)
    fps = {tbljax.open(tmp_path / p).fingerprint for p in ("a.tbl", "b.tbl", "c.tbl")}
    assert len(fps) == 3
    from tbljax import _core

    blk = json.loads(_core.TblFile(str(tmp_path / "a.tbl")).dataset_json)["fields"]["emb"]["values"]
    raw = bytearray((tmp_path / "a.tbl").read_bytes())
    raw[blk["offset"] + 3] ^= 0xFF
    (tmp_path / "d.tbl").write_bytes(bytes(raw))
    bad = tbljax.open(tmp_path / "d.tbl").verify()
    assert len(bad) == 1 and bad[0][1] == -1 and "'emb' values block: checksum mismatch" in bad[0][2]


@pytest.mark.parametrize(
    "where, ext, data, reason",
    [
        ("drop", "txt", None, "field 'caption': missing (no .txt member"),
        ("corrupt", "txt", b"\xff\xfe bad", "field 'caption': not UTF-8"),
        ("corrupt", "json", b"{not json", "field 'tags': not valid JSON"),
        (
            "corrupt",
            "emb.npy",
            _npy(np.zeros(6, np.float32)),
            "field 'emb': dtype float32 where the field's is float16",
        ),
        ("corrupt", "emb.npy", _npy(np.zeros((6, 2), np.float16)), "field 'emb': shape (6, 2)"),
        ("corrupt", "tok.npy", b"not an npy", "field 'tok': not a readable .npy"),
        ("corrupt", "tok.npy", _npy(np.zeros((2, 2), np.int32)), "field 'tok': shape (2, 2)"),
    ],
)
def test_a_bad_field_skips_the_record_and_strict_stops(tmp_path, where, ext, data, reason):
    samples = _source(8)
    kw = {"drop": (5, ext)} if where == "drop" else {"corrupt": (5, ext, data)}
    write_tar(tmp_path / "a.tar", samples, **kw)
    s = tbljax.convert(tmp_path / "a.tar", tmp_path / "a.tbl", image_size=16, fields=FIELDS, progress=False)
    assert [x["key"] for x in s.skipped] == [samples[5]["key"]]
    assert s.skipped[0]["reason"].startswith(reason), s.skipped[0]["reason"]
    ds = tbljax.open(tmp_path / "a.tbl")
    assert ds.skipped == s.skipped
    check_against(ds, samples[:5] + samples[6:])
    with pytest.raises(tbljax.ConversionError, match=f"{samples[5]['key']}.*{reason[:14]}"):
        tbljax.convert(
            tmp_path / "a.tar", tmp_path / "s.tbl", image_size=16, fields=FIELDS, strict=True, progress=False
        )
    assert not (tmp_path / "s.tbl").exists()


def test_an_extension_no_record_has_is_an_error(tmp_path):
    write_tar(tmp_path / "a.tar", _source(4))
    with pytest.raises(tbljax.ConversionError, match=r"'caps'.*\.cap\b.*which no record has"):
        tbljax.convert(
            tmp_path / "a.tar", tmp_path / "a.tbl", image_size=16, fields={"caps": "cap.txt"}, progress=False
        )
    assert not (tmp_path / "a.tbl").exists()
    with pytest.raises(ValueError, match="a field is read from a .txt"):
        tbljax.convert(tmp_path / "a.tar", tmp_path / "a.tbl", image_size=16, fields={"x": "cls"})


def test_shards_concatenate_fields_and_sharded_conversion_carries_them(tmp_path):
    a, b = _source(5, seed=1), _source(7, seed=2)
    write_tar(tmp_path / "a.tar", a)
    write_tar(tmp_path / "b.tar", b)
    for i in range(2):
        tbljax.convert(
            [tmp_path / "a.tar", tmp_path / "b.tar"],
            tmp_path / "p-{shard}.tbl",
            image_size=16,
            fields=FIELDS,
            shard=(i, 2),
            progress=False,
        )
    ds = tbljax.open(sorted(str(p) for p in tmp_path.glob("p-*.tbl")))
    check_against(ds, a + b)
    rows = ds.field_rows("emb", [11, 0, 5])
    np.testing.assert_array_equal(rows, np.stack([b[6]["emb"], a[0]["emb"], b[0]["emb"]]))
    assert [t.tolist() for t in ds.field_rows("tok", [6, 4])] == [b[1]["tok"].tolist(), a[4]["tok"].tolist()]
    # TBL → TBL keeps them
    tbljax.convert(ds.paths, tmp_path / "all.tbl", format="lz4", progress=False)
    check_against(tbljax.open(tmp_path / "all.tbl"), a + b)


def test_a_fixed_field_whose_size_differs_between_shards_is_ragged_over_them(tmp_path):
    imgs = np.zeros((4, 8, 8, 3), np.uint8)
    tbljax.convert({"image": imgs, "v": np.ones((4, 3), np.int16)}, tmp_path / "a.tbl", image_size=8, progress=False)
    tbljax.convert({"image": imgs, "v": np.ones((4, 5), np.int16)}, tmp_path / "b.tbl", image_size=8, progress=False)
    ds = tbljax.open([tmp_path / "a.tbl", tmp_path / "b.tbl"])
    assert ds.fields["v"].shape == (None,)
    assert [len(v) for v in ds.field("v")] == [3] * 4 + [5] * 4


def test_image_folder_sidecar_files(tmp_path):
    samples = _source(6)
    for i, s in enumerate(samples):
        d = tmp_path / "root" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{s['key']}.jpg").write_bytes(_jpeg(i))
        (d / f"{s['key']}.txt").write_text(s["caption"], encoding="utf-8")
        (d / f"{s['key']}.emb.npy").write_bytes(_npy(s["emb"]))
    s = tbljax.convert(
        tmp_path / "root",
        tmp_path / "f.tbl",
        image_size=16,
        fields={"caption": "txt", "emb": "emb.npy"},
        progress=False,
    )
    ds = tbljax.open(tmp_path / "f.tbl")
    order = sorted(range(6), key=lambda i: (i % 2, samples[i]["key"]))  # subfolders, then names
    assert s.written == 6 and len(ds) == 6  # the sidecars are not image items
    assert list(ds.field("caption")) == [samples[i]["caption"] for i in order]
    np.testing.assert_array_equal(ds.field("emb"), np.stack([samples[i]["emb"] for i in order]))


def test_dict_source_every_other_key_is_a_field(tmp_path):
    rng = np.random.default_rng(3)
    imgs = rng.integers(0, 255, (9, 12, 12, 3), np.uint8)
    caps = [f"caption {i}" for i in range(9)]
    emb = rng.standard_normal((9, 4, 2)).astype(np.float32)
    score = np.arange(9, dtype=np.float64)
    tags = [[i, "x"] for i in range(9)]
    tbljax.convert(
        {"image": imgs, "label": np.arange(9) % 3, "caption": caps, "emb": emb, "score": score, "tags": tags},
        tmp_path / "d.tbl",
        image_size=12,
        progress=False,
    )
    ds = tbljax.open(tmp_path / "d.tbl")
    assert ds.fields["emb"].shape == (4, 2) and ds.fields["score"].shape == ()
    np.testing.assert_array_equal(ds.field("emb"), emb)
    np.testing.assert_array_equal(ds.field("score"), score)
    assert list(ds.field("caption")) == caps and list(ds.field("tags")) == tags
    with pytest.raises(ValueError, match="field 'caption' holds 2 values for 9 images"):
        tbljax.convert({"image": imgs, "caption": caps[:2]}, tmp_path / "e.tbl", image_size=12)
    with pytest.raises(KeyError, match="no field 'nope'"):
        ds.field("nope")


def test_parse_field_value():
    assert parse_field_value("str", "é".encode()) == "é"
    assert parse_field_value("json", b'{"a": [1]}') == {"a": [1]}
    np.testing.assert_array_equal(parse_field_value("ndarray", _npy(np.arange(3))), np.arange(3))
    with pytest.raises(ValueError, match="numeric"):
        parse_field_value("ndarray", np.array(["a"]))
    with pytest.raises(ValueError, match="not a JSON value"):
        parse_field_value("json", object())


def test_turboloader_still_serves_a_file_with_fields(tmp_path):
    tl = pytest.importorskip("turboloader", reason="turboloader 2.39 is the interop peer")
    samples = _source(10)
    write_tar(tmp_path / "a.tar", samples)
    tbljax.convert(tmp_path / "a.tar", tmp_path / "a.tbl", image_size=16, fields=FIELDS, progress=False)
    ds = tbljax.open(tmp_path / "a.tbl")
    r = tl.TblReaderV2(str(tmp_path / "a.tbl"), verify_checksums=True)
    assert [r.read_sample(i) for i in range(len(ds))] == [ds.read(i).tobytes() for i in range(len(ds))]
    loader = tl.TblRawImageLoader(
        str(tmp_path / "a.tbl"), batch_size=len(ds), shuffle=False, mean=None, std=None, prefetch_batches=0
    )
    batch, meta = next(iter(loader))
    got = np.rint(np.asarray(batch).transpose(0, 2, 3, 1) * 255).astype(np.uint8)
    np.testing.assert_array_equal(got, ds.view()[np.asarray(meta["indices"])])


def test_cli_convert_field_info_and_verify(tmp_path):
    import subprocess
    import sys

    samples = _source(5)
    write_tar(tmp_path / "a.tar", samples)

    def run(*a):
        return subprocess.run([sys.executable, "-m", "tbljax", *a], capture_output=True, text=True, cwd=tmp_path)

    r = run(
        "convert",
        str(tmp_path / "a.tar"),
        "-o",
        str(tmp_path / "a.tbl"),
        "--image-size",
        "16",
        "--field",
        "caption=txt",
        "--field",
        "emb=emb.npy",
        "--field",
        "tok=tok.npy",
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    check = tbljax.open(tmp_path / "a.tbl")
    assert list(check.field("caption")) == [s["caption"] for s in samples]
    r = run("info", str(tmp_path / "a.tbl"))
    assert r.returncode == 0, r.stderr
    assert "field.caption" in r.stdout and "str" in r.stdout
    assert any(
        line.split()[:4] == ["field.emb", "ndarray", "float16", "(6,)"] and "60 bytes" in line
        for line in r.stdout.splitlines()
    ), r.stdout
    assert any(line.split()[:4] == ["field.tok", "ndarray", "int32", "(n,)"] for line in r.stdout.splitlines())
    r = run("verify", str(tmp_path / "a.tbl"))
    assert r.returncode == 0 and "ok" in r.stdout


# ---- serving through tbljax.loader ----


@pytest.fixture
def served(tmp_path):
    samples = _source(11, seed=5)
    write_tar(tmp_path / "a.tar", samples)
    tbljax.convert(tmp_path / "a.tar", tmp_path / "a.tbl", image_size=16, fields=FIELDS, progress=False)
    return tmp_path / "a.tbl", samples


def _batches(loader):
    return [{k: (v if isinstance(v, list) else np.asarray(v)) for k, v in b.items()} for b in loader]


def test_loader_serves_every_field_beside_the_image(served):
    path, samples = served
    batches = _batches(tbljax.loader(path, batch_size=4, num_epochs=1, drop_remainder=False, pad={"tok": 5}))
    seen = []
    for b in batches:
        assert b["emb"].shape == (4, 6) and b["emb"].dtype == np.float16
        assert b["tok"].shape == (4, 5) and b["tok_length"].dtype == np.int32
        for r, i in enumerate(b["index"].tolist()):
            if i < 0:  # padding rows
                assert b["caption"][r] == "" and b["tags"][r] is None
                assert not b["emb"][r].any() and not b["tok"][r].any() and b["tok_length"][r] == 0
                continue
            s = samples[i]
            seen.append(i)
            assert b["caption"][r] == s["caption"] and b["tags"][r] == s["tags"]
            np.testing.assert_array_equal(b["emb"][r], s["emb"])
            ref = np.zeros(5, np.int32)
            ref[: min(5, len(s["tok"]))] = s["tok"][:5]
            np.testing.assert_array_equal(b["tok"][r], ref)
            assert b["tok_length"][r] == len(s["tok"])  # before the cut
    assert sorted(seen) == list(range(11))


def test_loader_fields_selection_and_construction_errors(served):
    path, _ = served
    b = next(iter(tbljax.loader(path, batch_size=4, fields=["caption"])))
    assert set(b) == {"image", "label", "index", "caption"}
    b = next(iter(tbljax.loader(path, batch_size=4, fields=None)))
    assert set(b) == {"image", "label", "index"}
    with pytest.raises(ValueError, match="field 'tok' is ragged.*pad="):
        tbljax.loader(path, batch_size=4)
    with pytest.raises(KeyError, match="'nope'"):
        tbljax.loader(path, batch_size=4, fields=["nope"])


def test_field_fn_tokenizer_and_its_errors(served):
    path, samples = served

    def encode(texts):  # a byte-level tokenizer: UTF-8 bytes, cut/padded to 12
        out = np.zeros((len(texts), 12), np.int32)
        for r, t in enumerate(texts):
            b = list(t.encode())[:12]
            out[r, : len(b)] = b
        return out

    ld = tbljax.loader(path, batch_size=4, num_epochs=1, fields=["caption", "emb"], field_fn={"caption": encode})
    for b in _batches(ld):
        assert b["caption"].shape == (4, 12)
        np.testing.assert_array_equal(b["caption"], encode([samples[i]["caption"] for i in b["index"]]))

    def broken(texts):
        raise ZeroDivisionError("boom")

    ld = tbljax.loader(path, batch_size=4, fields=["caption"], field_fn={"caption": broken})
    with pytest.raises(RuntimeError, match=r"field_fn\['caption'\] failed at the step of epoch 0, position 0.*boom"):
        next(iter(ld))


def test_state_dict_resume_serves_the_same_fields(served):
    path, _ = served
    kw = dict(batch_size=3, seed=7, fields=["caption", "emb"])
    full = _batches(tbljax.loader(path, num_epochs=2, **kw))
    ld = tbljax.loader(path, num_epochs=2, **kw)
    it = iter(ld)
    for _ in range(4):
        next(it)
    state = ld.state_dict()
    rest = tbljax.loader(path, num_epochs=2, **kw)
    rest.load_state_dict(state)
    for a, b in zip(full[4:], _batches(rest)):
        assert a["caption"] == b["caption"]
        np.testing.assert_array_equal(a["emb"], b["emb"])


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_torch_and_mlx_serve_every_field(served, framework):
    """The adapters carry the same fields on `batch.fields` (tensors / mx.arrays, lists for
    text), row for row with the batch's index."""
    path, samples = served
    if framework == "torch":
        pytest.importorskip("torch")
        import tbljax.torch

        ld = tbljax.torch.loader(path, 4, drop_remainder=False, pad={"tok": 5})
        to_np = lambda x: x.numpy()  # noqa: E731
    else:
        pytest.importorskip("mlx.core")
        import tbljax.mlx

        ld = tbljax.mlx.loader(path, 4, drop_remainder=False, pad={"tok": 5})
        to_np = np.array
    seen = []
    for b in ld:
        f = b.fields
        assert sorted(f) == ["caption", "emb", "tags", "tok", "tok_length"]
        for r, i in enumerate(to_np(b.index).tolist()):
            if i < 0:
                assert f["caption"][r] == "" and to_np(f["tok_length"])[r] == 0
                continue
            s = samples[i]
            seen.append(i)
            assert f["caption"][r] == s["caption"] and f["tags"][r] == s["tags"]
            np.testing.assert_array_equal(to_np(f["emb"])[r], s["emb"])
            assert to_np(f["tok_length"])[r] == len(s["tok"])
            n = min(5, len(s["tok"]))
            np.testing.assert_array_equal(to_np(f["tok"])[r][:n], s["tok"][:n])
    assert sorted(seen) == list(range(11))
    with pytest.raises(ValueError, match="tok"):  # a ragged field needs a length, by name
        (tbljax.torch if framework == "torch" else tbljax.mlx).loader(path, 4)


def test_field_padded_cuts_and_pads_like_numpy_over_shards(tmp_path):
    """The padded gather the producer runs each step, against a per-record NumPy reference:
    records longer and shorter than the length, empty ones, and a shard file whose records are
    all empty; indices across both files, negative ones counted from the end."""
    imgs = np.zeros((4, 8, 8, 3), np.uint8)
    a = [np.arange(k * 10, k * 10 + k, dtype=np.int16).reshape(k, 1).repeat(2, 1) for k in (0, 1, 3, 6)]
    b = [np.zeros((0, 2), np.int16)] * 4  # one length in this file: fixed (0, 2) there
    tbljax.convert({"image": imgs, "v": a}, tmp_path / "a.tbl", image_size=8, progress=False)
    tbljax.convert({"image": imgs, "v": b}, tmp_path / "b.tbl", image_size=8, progress=False)
    ds = tbljax.open([tmp_path / "a.tbl", tmp_path / "b.tbl"])
    src = a + b
    idx = np.array([3, 5, 2, 0, -1, 1, 3])
    out, lengths = np.full((len(idx), 4, 2), 7, np.int16), np.full(len(idx), 7, np.int32)
    ds.field_padded("v", idx, 4, out, lengths)
    for r, i in enumerate(idx):
        want = np.zeros((4, 2), np.int16)
        v = src[i]
        want[: min(4, len(v))] = v[:4]
        np.testing.assert_array_equal(out[r], want)
        assert lengths[r] == len(v)
    # ... and a shard whose records are all of one non-zero length (fixed in that file)
    c = [np.full((5, 2), k, np.int16) for k in range(4)]
    tbljax.convert({"image": imgs, "v": c}, tmp_path / "c.tbl", image_size=8, progress=False)
    ds = tbljax.open([tmp_path / "a.tbl", tmp_path / "c.tbl"])
    ds.field_padded("v", [7, 3, 4], 4, out[:3], lengths[:3])
    np.testing.assert_array_equal(out[:3], [c[3][:4], a[3][:4], c[0][:4]])
    assert lengths[:3].tolist() == [5, 6, 5]


def test_tar_shards_at_a_url_carry_fields(tmp_path):
    # A source at a URL reads its members through fsspec (remote/remote.py): the fields come along.
    fsspec = pytest.importorskip("fsspec")
    samples = _source(9, seed=3)
    write_tar(tmp_path / "a.tar", samples)
    fs = fsspec.filesystem("memory")
    fs.pipe("/fields-url/a.tar", (tmp_path / "a.tar").read_bytes())
    try:
        s = tbljax.convert(
            "memory://fields-url/a.tar", tmp_path / "u.tbl", image_size=16, fields=FIELDS, progress=False
        )
    finally:
        fs.rm("/fields-url", recursive=True)
    assert s.written == 9 and s.skipped == []
    check_against(tbljax.open(tmp_path / "u.tbl"), samples)

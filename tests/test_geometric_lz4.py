"""Masks and dense maps stored compress="lz4" (issue 48): bit-exact against the source maps and
the raw-stored file on every record kind, served through the loader; a damaged block and an
unknown encoding are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from test_geometric_serving import KINDS, _blocky, _classes, _crops

import tbljax
from tbljax import _core
from tbljax._src.file.field_meta import check_field_meta
from tbljax._src.rules import geometry


def _convert(tmp_path, kind, compress, n=7, side=32):
    """Records stored at their source size (no resize), so the stored maps are the sources."""
    rng = np.random.default_rng(5)
    images = [_blocky(rng, side, side) for _ in range(n)]
    seg = [_classes(im) for im in images]
    depth = [rng.standard_normal((side, side, 2)).astype(np.float32) for _ in images]
    path = tmp_path / f"{kind}-{compress}.tbl"
    tbljax.convert(
        {"image": images, "seg": seg, "depth": depth},
        path,
        image_size=side,
        progress=False,
        fields={
            "seg": tbljax.Mask(ignore=255, compress=compress),
            "depth": tbljax.DenseMap(invalid=0.0, compress=compress),
        },
        **KINDS[kind],
    )
    return path, seg, depth


@pytest.mark.parametrize("kind", list(KINDS))
def test_lz4_maps_round_trip_bit_exact_through_the_loader(tmp_path, kind):
    path, seg, depth = _convert(tmp_path, kind, "lz4")
    raw_path, _, _ = _convert(tmp_path, kind, None)
    ds, raw = tbljax.open(path), tbljax.open(raw_path)
    assert ds.field_bytes("seg") < raw.field_bytes("seg")  # blocky masks compress well
    assert ds.verify() == []  # the values, offsets and blocks blocks' CRC-32s
    for k in range(len(ds)):  # stored: the source maps, whatever the record's layout
        np.testing.assert_array_equal(np.asarray(ds.field("seg")[k]).reshape(32, 32), seg[k])
        np.testing.assert_array_equal(np.asarray(ds.field("depth")[k]).reshape(32, 32, 2), depth[k])
    aug = tbljax.Augment(size=(20, 28))
    opts = tbljax.LoaderOptions(batch_size=4, augment=aug, drop_remainder=False, num_epochs=2)
    seen = 0
    for hb, rb in zip(tbljax.HostLoader(ds, opts), tbljax.HostLoader(raw, opts)):
        np.testing.assert_array_equal(hb.fields["seg"][0], rb.fields["seg"][0])
        np.testing.assert_array_equal(hb.fields["depth"][0], rb.fields["depth"][0])
        valid = hb.index >= 0
        boxes, flips = _crops(ds, aug, hb.index[valid], hb.epoch)
        for r, (k, box, flip) in enumerate(zip(hb.index[valid], boxes, flips)):
            want = geometry.serve_mask(seg[k], tuple(box), (20, 28), bool(flip))
            np.testing.assert_array_equal(hb.fields["seg"][0][r], want)
            seen += 1
    assert seen == 2 * len(ds)


def test_lz4_masks_serve_through_tbljax_loader(tmp_path):
    path, seg, _ = _convert(tmp_path, "compact_jpeg", "lz4")
    ld = tbljax.loader(str(path), batch_size=7, shuffle=False, num_epochs=1, fields=["seg"])
    (b,) = list(ld)
    np.testing.assert_array_equal(np.asarray(b["seg"]), np.stack(seg)[np.asarray(b["index"])])


def test_a_damaged_lz4_block_names_the_file_record_and_field(tmp_path):
    path, seg, _ = _convert(tmp_path, "raw_square", "lz4")
    data = bytearray(path.read_bytes())
    block = _core.lz4_compress(seg[3].reshape(-1))  # only to find record 3's block in the file
    at = data.find(block)
    assert at > 0 and data.find(block, at + 1) < 0
    data[at : at + len(block)] = bytes(len(block))  # zeros: an LZ4 match at offset 0, invalid
    path.write_bytes(bytes(data))
    ds = tbljax.open(path)
    np.testing.assert_array_equal(ds.field_rows("seg", [2, 4]), np.stack([seg[2], seg[4]]))  # its neighbours
    with pytest.raises(tbljax.CorruptFileError, match=rf"{path.name}: record 3: field 'seg': its LZ4 block"):
        ds.field_rows("seg", [2, 3])
    opts = tbljax.LoaderOptions(batch_size=7, num_epochs=1, shuffle=False, fields=["seg"])
    with pytest.raises(tbljax.CorruptFileError, match=r"record 3: field 'seg'"):
        list(tbljax.HostLoader(ds, opts))


def test_an_unknown_encoding_is_refused_by_name():
    meta = {
        "kind": "ndarray",
        "dtype": "|u1",
        "shape": [4, 4],
        "encoding": "zstd",
        "values": {"offset": 0, "bytes": 0, "crc32": 0},
        "blocks": {"offset": 0, "bytes": 0, "crc32": 0},
        "role": {"role": "mask", "ignore": 255},
    }
    with pytest.raises(tbljax.CorruptFileError, match=r"x\.tbl: field 'seg' is stored with encoding \"zstd\""):
        check_field_meta("seg", meta, "x.tbl")


def test_compress_takes_none_or_lz4():
    assert tbljax.Mask("png").compress is None and tbljax.DenseMap("npy", compress="lz4").compress == "lz4"
    with pytest.raises(ValueError, match=r"Mask\(compress=\) must be None \(raw\) or one of \('lz4',\), got 'zip'"):
        tbljax.Mask("png", compress="zip")

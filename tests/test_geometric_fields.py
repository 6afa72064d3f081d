"""Geometric fields at conversion (issue 48): masks, boxes and keypoints read with real photos
(image-folder sidecars, WebDataset members) are stored at the record's geometry. The oracles
are written here from the photos' own pixels: a mask is the luminance class of its source
photo, so the stored mask must be that map nearest-resized (the rule spelled out below) and
must agree region-wise with the stored image's own luminance classes."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
from conftest import shared_dir
from PIL import Image

import tbljax
from tbljax import _core
from tbljax._src.file.field_meta import check_field_meta


def _rgb(p):
    with Image.open(p) as im:
        return np.asarray(im.convert("RGB"))


def _size(p):
    with Image.open(p) as im:
        return im.size


def _photos(n=4):
    root = shared_dir("kodak") / "images"
    if not root.is_dir():
        pytest.skip("../shared/data/kodak is not here")
    return sorted(root.rglob("*.jpg"))[:n]


def _classes(rgb):
    """Four luminance classes of an RGB image (the mask the tests make from a photo)."""
    lum = rgb.astype(np.float64) @ [0.299, 0.587, 0.114]
    return np.digitize(lum, [64, 128, 192]).astype(np.uint8)


def _png(a):
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _nearest(length, out):
    """torchvision's nearest rule, in float32: floor(o * (length / out)), at most length - 1."""
    return np.minimum(
        np.floor(np.arange(out, dtype=np.float32) * (np.float32(length) / np.float32(out))), length - 1
    ).astype(int)


def test_folder_masks_follow_the_image(tmp_path):
    size = 64
    src = tmp_path / "photos"
    src.mkdir()
    masks = []
    for p in _photos():
        rgb = _rgb(p)
        (src / p.name).write_bytes(p.read_bytes())
        m = _classes(rgb)
        (src / (p.stem + ".mask.png")).write_bytes(_png(m))
        masks.append(m)
    s = tbljax.convert(
        src, tmp_path / "a.tbl", image_size=size, progress=False, fields={"seg": tbljax.Mask("mask.png", ignore=255)}
    )
    assert s.written == len(masks) and not s.skipped and not s.left_out
    ds = tbljax.open(tmp_path / "a.tbl")
    stored = np.asarray(ds.field("seg"))
    assert stored.shape == (len(masks), size, size) and stored.dtype == np.uint8
    for k, m in enumerate(masks):
        h, w = m.shape
        side = min(h, w)
        y0, x0 = (h - side) // 2, (w - side) // 2  # center_crop's box, its start rounded down
        want = m[np.ix_(y0 + _nearest(side, size), x0 + _nearest(side, size))]
        np.testing.assert_array_equal(stored[k], want)
        # Region-wise against the stored image: its own classes agree with the mask better than
        # with the mask moved two pixels any way (the antialiased resize blurs texture, so not
        # everywhere; torchvision's floor rule sits up to half an output pixel up-left of the
        # image, so a one-pixel shift down/right can tie or win).
        img_classes = _classes(ds.read(k))[3:-3, 3:-3]
        agree = {
            (dy, dx): (img_classes == stored[k][3 + dy : size - 3 + dy, 3 + dx : size - 3 + dx]).mean()
            for dy in range(-2, 3)
            for dx in range(-2, 3)
        }
        shifted = max(v for (dy, dx), v in agree.items() if 2 in (abs(dy), abs(dx)))
        assert agree[0, 0] > shifted, (agree[0, 0], shifted)


def test_max_side_masks_are_flat_rows_of_the_record(tmp_path):
    src = tmp_path / "photos"
    src.mkdir()
    p = _photos(1)[0]
    (src / p.name).write_bytes(p.read_bytes())
    m = _classes(_rgb(p))
    (src / (p.stem + ".mask.png")).write_bytes(_png(m))
    tbljax.convert(
        src,
        tmp_path / "a.tbl",
        image_size=48,
        resize="max_side",
        progress=False,
        fields={"seg": tbljax.Mask("mask.png")},
    )
    ds = tbljax.open(tmp_path / "a.tbl")
    h, w = m.shape
    oh, ow = (round(h * 48 / w), 48) if w >= h else (48, round(w * 48 / h))
    got = np.asarray(ds.field("seg")[0]).reshape(oh, ow)
    np.testing.assert_array_equal(got, m[np.ix_(_nearest(h, oh), _nearest(w, ow))])


def _tar(path, samples):
    with tarfile.open(path, "w") as tf:
        for key, members in samples.items():
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def _npy(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_tar_boxes_and_keypoints_follow_the_image_and_bad_ones_are_named(tmp_path):
    photos = _photos(4)
    sizes = [_size(p) for p in photos]  # (w, h)
    samples = {}
    for k, (p, (w, h)) in enumerate(zip(photos, sizes)):
        boxes = [[10.0, 20.0, w / 2, h / 2], [0.0, 0.0, float(w), float(h)]]
        kpts = np.array([[w / 4, h / 4], [w / 2, h / 2], [1.0, 1.0]], np.float32)
        samples[f"s{k}"] = {
            "jpg": p.read_bytes(),
            "boxes.json": json.dumps({"boxes": boxes, "labels": [3, 7]}).encode(),
            "kpts.npy": _npy(kpts),
        }
    w1, h1 = sizes[1]
    samples["s1"]["boxes.json"] = json.dumps({"boxes": [[0, 0, w1 + 5, 10]], "labels": [1]}).encode()
    samples["s2"]["kpts.npy"] = _npy(np.zeros((2, 2), np.float32))
    _tar(tmp_path / "a.tar", samples)
    fields = {
        "boxes": tbljax.Boxes("boxes.json", format="xyxy", labels="box_labels"),
        "kpts": tbljax.Keypoints("kpts.npy", flip_permutation=[1, 0, 2]),
    }
    s = tbljax.convert(tmp_path / "a.tar", tmp_path / "a.tbl", image_size=32, progress=False, fields=fields)
    reasons = {x["key"]: x["reason"] for x in s.skipped}
    assert set(reasons) == {"s1", "s2"}
    assert "field 'boxes'" in reasons["s1"] and "not inside" in reasons["s1"]
    assert "field 'kpts'" in reasons["s2"] and "3 points" in reasons["s2"]
    ds = tbljax.open(tmp_path / "a.tbl")
    for row, k in enumerate([0, 3]):
        w, h = sizes[k]
        side = min(w, h)
        x0, y0 = (w - side) / 2, (h - side) / 2  # the image's continuous center-crop box
        sc = 32 / side
        want = np.array([[10.0, 20.0, w / 2, h / 2], [0, 0, w, h]])
        want = (want - [x0, y0, x0, y0]) * sc
        want = np.clip(want, 0, 32)
        np.testing.assert_allclose(ds.field("boxes")[row], want, atol=1e-4)
        np.testing.assert_array_equal(ds.field("box_labels")[row], [3, 7])
        kp = ds.field("kpts")[row]
        assert kp.shape == (1, 3, 3)
        np.testing.assert_allclose(
            kp[0, :2, :2], (np.array([[w / 4, h / 4], [w / 2, h / 2]]) - [x0, y0]) * sc, atol=1e-4
        )
        assert kp[0, 0, 2] == 2 and kp[0, 2, 2] == (2 if x0 < 1 and y0 < 1 else 0)  # (1, 1): cropped off?
    with pytest.raises(tbljax.ConversionError, match="field 'boxes'"):
        tbljax.convert(
            tmp_path / "a.tar", tmp_path / "b.tbl", image_size=32, progress=False, fields=fields, strict=True
        )


def test_mask_of_another_size_is_skipped_naming_the_field(tmp_path):
    src = tmp_path / "photos"
    src.mkdir()
    p = _photos(1)[0]
    (src / p.name).write_bytes(p.read_bytes())
    (src / (p.stem + ".mask.png")).write_bytes(_png(np.zeros((7, 9), np.uint8)))
    (src / "b.jpg").write_bytes(p.read_bytes())
    w, h = _size(p)
    (src / "b.mask.png").write_bytes(_png(np.zeros((h, w), np.uint8)))
    s = tbljax.convert(src, tmp_path / "a.tbl", image_size=16, progress=False, fields={"seg": tbljax.Mask("mask.png")})
    assert s.written == 1
    assert s.skipped[0]["key"] == p.name and f"field 'seg': 7x9 where the image is {h}x{w}" in s.skipped[0]["reason"]


def test_unsupported_combinations_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="geometric fields.*quality"):
        tbljax.convert(
            np.zeros((2, 8, 8, 3), np.uint8),
            tmp_path / "a.tbl",
            image_size=8,
            format="jpeg",
            fields={"seg": tbljax.Mask("png")},
        )
    with pytest.raises(ValueError, match="format"):
        tbljax.Boxes("json", format="yxxy")
    with pytest.raises(ValueError, match="flip_permutation"):
        tbljax.Keypoints("npy", flip_permutation=[0, 0])


def test_field_role_metadata_is_checked_at_open():
    good = {
        "kind": "ndarray",
        "dtype": "<f4",
        "shape": [None, 4],
        "values": {"offset": 0, "bytes": 0, "crc32": 0},
        "offsets": {"offset": 0, "bytes": 8, "crc32": 0},
        "role": {"role": "boxes", "format": "xyxy", "labels": None},
    }
    check_field_meta("boxes", good, "x.tbl")
    for role, shape in [
        ({"role": "boxes", "format": "xywh", "labels": None}, [None, 4]),
        ({"role": "boxes", "format": "xyxy", "labels": None}, [None, 5]),
        ({"role": "keypoints", "flip_permutation": [0, 0]}, [None, 2, 3]),
        ({"role": "paint"}, [None, 4]),
    ]:
        with pytest.raises(_core.CorruptFileError, match="field 'boxes' metadata"):
            check_field_meta("boxes", {**good, "role": role, "shape": shape}, "x.tbl")


def _center_crop_boxes(xyxy, w, h, size):
    """xyxy source boxes in a center_crop record of side `size`: shifted, scaled, clipped."""
    side = min(w, h)
    x0, y0 = (w - side) / 2, (h - side) / 2
    return np.clip((np.asarray(xyxy, np.float64) - [x0, y0, x0, y0]) * (size / side), 0, size)


def _center_crop_mask(m, size):
    h, w = m.shape
    side = min(h, w)
    y0, x0 = (h - side) // 2, (w - side) // 2
    return m[np.ix_(y0 + _nearest(side, size), x0 + _nearest(side, size))]


def test_dict_source_declares_which_keys_are_geometric(tmp_path):
    photos = _photos(3)
    images = [_rgb(p) for p in photos]
    masks = [_classes(im) for im in images]
    # xywh, about the centre (inside the crop)
    boxes = [
        {"boxes": [[m.shape[1] / 2 - 20, m.shape[0] / 2 - 15, 40.0, 30.0]], "labels": [k + 1]}
        for k, m in enumerate(masks)
    ]
    s = tbljax.convert(
        {"image": images, "seg": masks, "objects": boxes, "caption": ["a", "b", "c"]},
        tmp_path / "a.tbl",
        image_size=32,
        progress=False,
        fields={
            "seg": tbljax.Mask(ignore=255),
            "boxes": tbljax.Boxes(key="objects", format="xywh", labels="box_labels"),
        },
    )
    assert s.written == 3 and not s.skipped
    ds = tbljax.open(tmp_path / "a.tbl")
    assert sorted(ds.fields) == ["box_labels", "boxes", "caption", "seg"]  # "objects" read as "boxes"
    for k, m in enumerate(masks):
        h, w = m.shape
        np.testing.assert_array_equal(ds.field("seg")[k], _center_crop_mask(m, 32))
        want = _center_crop_boxes([[w / 2 - 20, h / 2 - 15, w / 2 + 20, h / 2 + 15]], w, h, 32)
        np.testing.assert_allclose(ds.field("boxes")[k], want, atol=1e-4)
        np.testing.assert_array_equal(ds.field("box_labels")[k], [k + 1])
    with pytest.raises(ValueError, match="ext=.*a dict source read a geometric field by key="):
        tbljax.convert(
            {"image": images, "seg": masks},
            tmp_path / "b.tbl",
            image_size=32,
            progress=False,
            fields={"seg": tbljax.Mask("png")},
        )
    with pytest.raises(ValueError, match="key 'sge'"):
        tbljax.convert(
            {"image": images, "seg": masks},
            tmp_path / "b.tbl",
            image_size=32,
            progress=False,
            fields={"seg": tbljax.Mask(key="sge")},
        )


def _voc_folder(root, photos, mask_dir: str) -> dict:
    """The VOC layout under `root`: the photos in JPEGImages, each one's class mask (from its
    own pixels) as a PNG of its stem in `mask_dir`; returns {photo name: mask}."""
    (root / "JPEGImages").mkdir()
    (root / mask_dir).mkdir()
    masks = {}
    for p in photos:
        (root / "JPEGImages" / p.name).write_bytes(p.read_bytes())
        masks[p.name] = _classes(_rgb(p))
        (root / mask_dir / (p.stem + ".png")).write_bytes(_png(masks[p.name]))
    return masks


def test_parallel_folder_masks_voc_layout(tmp_path):
    photos = _photos(3)
    masks = _voc_folder(tmp_path, photos, "SegmentationClass")
    (tmp_path / "SegmentationClass" / (photos[2].stem + ".png")).unlink()  # one photo without its mask
    s = tbljax.convert(
        tmp_path / "JPEGImages",
        tmp_path / "a.tbl",
        image_size=24,
        progress=False,
        fields={"seg": tbljax.Mask("png", folder=tmp_path / "SegmentationClass")},
    )
    assert s.written == 2 and [x["key"] for x in s.skipped] == [photos[2].name]
    assert "field 'seg': missing" in s.skipped[0]["reason"]
    ds = tbljax.open(tmp_path / "a.tbl")
    for k, key in enumerate(ds.keys):
        np.testing.assert_array_equal(ds.field("seg")[k], _center_crop_mask(masks[key], 24))
    with pytest.raises(ValueError, match="inside the image folder"):
        tbljax.convert(
            tmp_path,
            tmp_path / "b.tbl",
            image_size=24,
            progress=False,
            fields={"seg": tbljax.Mask("png", folder=tmp_path / "SegmentationClass")},
        )
    with pytest.raises(ValueError, match="key=.*TAR shards read a geometric field by ext="):
        _tar(tmp_path / "a.tar", {"s0": {"jpg": photos[0].read_bytes()}})
        tbljax.convert(
            tmp_path / "a.tar",
            tmp_path / "b.tbl",
            image_size=24,
            progress=False,
            fields={"seg": tbljax.Mask(key="seg")},
        )


def _role_kinds(tmp_path):
    """A file, shard files, a host part and a mixture holding geometric fields."""
    from tbljax._src.datasets.host_part import PartDataset

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 8, 8, 3), np.uint8)
    cols = {
        "seg": rng.integers(0, 4, (6, 8, 8), np.uint8),
        "det": [{"boxes": [[0, 0, 4, 4]], "labels": [1]}] * 6,
        "kp": rng.uniform(0, 8, (6, 2, 2)).astype(np.float32),
    }
    fields = {
        "seg": tbljax.Mask(ignore=9),
        "det": tbljax.Boxes(format="xyxy", labels="det_labels"),
        "kp": tbljax.Keypoints(flip_permutation=[1, 0]),
    }
    paths = []
    for name, rows in (("s0", slice(0, 3)), ("s1", slice(3, 6))):
        tbljax.convert(
            {"image": images[rows], **{k: v[rows] for k, v in cols.items()}},
            tmp_path / f"{name}.tbl",
            image_size=8,
            progress=False,
            fields=fields,
        )
        paths.append(str(tmp_path / f"{name}.tbl"))
    one = tbljax.open(paths[0])
    return {
        "file": one,
        "shards": tbljax.open(paths),
        "part": PartDataset(one, 1, 3, "fp"),
        "mixture": tbljax.mix({"a": paths[0], "b": paths[1]}, {"a": 1, "b": 1}, steps_per_epoch=2),
    }


def test_roles_read_back_through_field_info_on_every_kind(tmp_path):
    for kind, ds in _role_kinds(tmp_path).items():
        f = ds.fields
        assert f["seg"].role == {"role": "mask", "ignore": 9}, kind
        assert f["det"].role == {"role": "boxes", "format": "xyxy", "labels": "det_labels"}, kind
        assert f["det_labels"].role == {"role": "box_labels", "of": "det"}, kind
        assert f["kp"].role == {"role": "keypoints", "flip_permutation": [1, 0]}, kind
        assert f["seg"].kind == "ndarray" and f["seg"].shape == (8, 8), kind


def test_hugging_face_image_mask_column_and_box_sequence(tmp_path):
    datasets = pytest.importorskip("datasets")
    photos = _photos(3)
    masks = [_classes(_rgb(p)) for p in photos]
    sizes = [_size(p) for p in photos]
    bbox = [[[w / 2 - 20, h / 2 - 15, 40.0, 30.0]] for w, h in sizes]  # xywh about the centre
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "seg": datasets.Image(),
            "bbox": datasets.Sequence(datasets.Sequence(datasets.Value("float32"), length=4)),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": p.read_bytes(), "path": None} for p in photos],
            "seg": [{"bytes": _png(m), "path": None} for m in masks],
            "bbox": bbox,
        },
        features=features,
    )
    s = tbljax.convert(
        ds,
        tmp_path / "a.tbl",
        image_size=32,
        progress=False,
        fields={"seg": tbljax.Mask(), "boxes": tbljax.Boxes(key="bbox", format="xywh")},
    )
    assert s.written == 3 and not s.skipped
    got = tbljax.open(tmp_path / "a.tbl")
    for k, (m, (w, h)) in enumerate(zip(masks, sizes)):
        np.testing.assert_array_equal(got.field("seg")[k], _center_crop_mask(m, 32))
        x, y, bw, bh = np.float32(bbox[k][0]).astype(np.float64)  # as the float32 column holds them
        np.testing.assert_allclose(
            got.field("boxes")[k], _center_crop_boxes([[x, y, x + bw, y + bh]], w, h, 32), atol=1e-4
        )
    with pytest.raises(ValueError, match="ext=.*Hugging Face dataset or Parquet file read a geometric field by key="):
        tbljax.convert(ds, tmp_path / "b.tbl", image_size=32, progress=False, fields={"seg": tbljax.Mask("png")})


def test_tfds_segmentation_bytes_and_normalized_yxyx_boxes(tmp_path):
    pytest.importorskip("google_crc32c")
    from _source_files import example, tfrecord

    photos = _photos(3)
    masks = [_classes(_rgb(p)) for p in photos]
    sizes = [_size(p) for p in photos]
    # TFDS's BBoxFeature: ymin, xmin, ymax, xmax as fractions of the height and width
    yxyx = [[0.25, 0.375, 0.75, 0.625, 0.5, 0.5, 0.5625, 0.5625] for _ in photos]
    records = [
        example({"image": p.read_bytes(), "segmentation_mask": _png(m), "objects/bbox": b})
        for p, m, b in zip(photos, masks, yxyx)
    ]
    (tmp_path / "a.tfrecord").write_bytes(tfrecord(records))
    s = tbljax.convert(
        tmp_path / "a.tfrecord",
        tmp_path / "a.tbl",
        image_size=32,
        progress=False,
        fields={
            "seg": tbljax.Mask(key="segmentation_mask"),
            "boxes": tbljax.Boxes(key="objects/bbox", format="yxyx", normalized=True),
        },
    )
    assert s.written == 3 and not s.skipped
    got = tbljax.open(tmp_path / "a.tbl")
    for k, (m, (w, h)) in enumerate(zip(masks, sizes)):
        np.testing.assert_array_equal(got.field("seg")[k], _center_crop_mask(m, 32))
        b = np.float32(yxyx[k]).astype(np.float64).reshape(-1, 4)  # float_list: float32
        xyxy = np.stack([b[:, 1] * w, b[:, 0] * h, b[:, 3] * w, b[:, 2] * h], 1)
        np.testing.assert_allclose(got.field("boxes")[k], _center_crop_boxes(xyxy, w, h, 32), atol=1e-4)


def test_cli_field_role_spelling(tmp_path, capsys):
    from tbljax._src.tools import cli

    photos = _photos(2)
    (tmp_path / "JPEGImages").mkdir()
    (tmp_path / "Seg").mkdir()
    masks = {}
    for p in photos:
        (tmp_path / "JPEGImages" / p.name).write_bytes(p.read_bytes())
        masks[p.name] = _classes(_rgb(p))
        (tmp_path / "Seg" / (p.stem + ".png")).write_bytes(_png(masks[p.name]))
        w, h = _size(p)
        (tmp_path / "JPEGImages" / (p.stem + ".kpts.npy")).write_bytes(
            _npy(np.array([[w / 2, h / 2], [w / 2 + 10, h / 2]], np.float32))
        )
    rc = cli.main(
        [
            "convert",
            str(tmp_path / "JPEGImages"),
            "-o",
            str(tmp_path / "a.tbl"),
            "-s",
            "24",
            "-q",
            "--field",
            f"seg=png:mask,ignore=7,folder={tmp_path / 'Seg'}",
            "--field",
            "kpts=kpts.npy:keypoints,flip_permutation=1/0",
        ]
    )
    assert rc == 0
    ds = tbljax.open(tmp_path / "a.tbl")
    assert ds.fields["seg"].role == {"role": "mask", "ignore": 7}
    assert ds.fields["kpts"].role == {"role": "keypoints", "flip_permutation": [1, 0]}
    for k, key in enumerate(ds.keys):
        np.testing.assert_array_equal(ds.field("seg")[k], _center_crop_mask(masks[key], 24))
    for bad, said in [
        ("seg=png:maks", "role 'maks' must be one of"),
        ("seg=png:mask,ignroe=1", "'ignroe=1'"),
        ("seg=png:mask,ignore=x", "ignore='x' is not a valid value"),
    ]:
        assert (
            cli.main(
                [
                    "convert",
                    str(tmp_path / "JPEGImages"),
                    "-o",
                    str(tmp_path / "b.tbl"),
                    "-s",
                    "24",
                    "-q",
                    "--field",
                    bad,
                ]
            )
            == 2
        )  # a usage error, one line on stderr
        assert said in capsys.readouterr().err


def test_cli_field_compress_spelling(tmp_path, capsys):
    """--field seg=png:mask,compress=lz4 declares Mask("png", compress="lz4") (the same option
    parsing gives :dense its compress=): the masks stored as LZ4 blocks, fewer bytes than the raw
    file, the same values; an unknown encoding is a usage error naming the field."""
    from tbljax._src.tools import cli

    masks = _voc_folder(tmp_path, _photos(2), "Seg")

    def convert(out, spec):
        args = ["convert", str(tmp_path / "JPEGImages"), "-o", str(tmp_path / out), "-s", "24", "-q"]
        return cli.main([*args, "--field", f"seg=png:mask,folder={tmp_path / 'Seg'}{spec}"])

    assert convert("lz4.tbl", ",compress=lz4") == 0 and convert("raw.tbl", "") == 0
    lz4, raw = tbljax.open(tmp_path / "lz4.tbl"), tbljax.open(tmp_path / "raw.tbl")
    assert lz4.field_bytes("seg") < raw.field_bytes("seg")
    for k, key in enumerate(lz4.keys):
        np.testing.assert_array_equal(lz4.field("seg")[k], _center_crop_mask(masks[key], 24))
    assert convert("bad.tbl", ",compress=zstd") == 2  # a usage error, one line on stderr
    assert "--field seg: Mask(compress=) must be None (raw) or one of ('lz4',)" in capsys.readouterr().err


def test_exif_rotated_photo_fields_are_read_in_the_displayed_frame(tmp_path):
    """A real photo re-saved with EXIF orientation 6 (displayed turned 90° clockwise): the
    decoder applies it, so the record is the displayed photo, and a mask or boxes given in the
    displayed frame follow it; a mask in the stored (unturned) frame is skipped, the reason
    naming the orientation."""
    from PIL import ImageOps

    p = _photos(1)[0]
    with Image.open(p) as im:
        exif = Image.Exif()
        exif[0x0112] = 6
        buf = io.BytesIO()
        im.convert("RGB").save(buf, "JPEG", quality=95, exif=exif.tobytes())
    src = tmp_path / "photos"
    src.mkdir()
    (src / "a.jpg").write_bytes(buf.getvalue())
    (src / "b.jpg").write_bytes(buf.getvalue())
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        stored = np.asarray(im.convert("RGB"))
        shown = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert shown.shape[:2] == stored.shape[1::-1] != stored.shape[:2]  # a turned, non-square photo
    h, w = shown.shape[:2]
    (src / "a.mask.png").write_bytes(_png(_classes(shown)))
    (src / "b.mask.png").write_bytes(_png(_classes(stored)))
    box = [w / 2 - 20, h / 2 - 15, w / 2 + 20, h / 2 + 15]  # displayed frame, about the centre
    for k in "ab":
        (src / f"{k}.boxes.json").write_bytes(json.dumps([box]).encode())
    s = tbljax.convert(
        src,
        tmp_path / "a.tbl",
        image_size=32,
        progress=False,
        fields={"seg": tbljax.Mask("mask.png"), "boxes": tbljax.Boxes("boxes.json")},
    )
    assert s.written == 1 and s.skipped[0]["key"] == "b.jpg"
    assert "EXIF orientation 6" in s.skipped[0]["reason"] and "field 'seg'" in s.skipped[0]["reason"]
    ds = tbljax.open(tmp_path / "a.tbl")
    np.testing.assert_array_equal(ds.field("seg")[0], _center_crop_mask(_classes(shown), 32))
    np.testing.assert_allclose(ds.field("boxes")[0], _center_crop_boxes([box], w, h, 32), atol=1e-4)
    # The record is the displayed photo: its luminance classes agree with the displayed-frame
    # mask better than with the stored frame's turned the other way (rot90 of the stored mask).
    mine = _classes(ds.read(0))
    other = _center_crop_mask(np.ascontiguousarray(np.rot90(_classes(stored))), 32)
    assert (mine == ds.field("seg")[0]).mean() > (mine == other).mean() + 0.1

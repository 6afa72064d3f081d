"""COCO JSON as a source (`tbljax.coco`): a tiny COCO JSON written here over real photos, with
polygons, compressed and uncompressed RLE, a crowd region, an image without annotations and
non-contiguous category ids. The oracles: pycocotools' own `COCO.annToMask` for each
annotation's pixels (the real package), the JSON itself for boxes and category ids; the
geometry is squash's, written out here (x' = x * S / w, and the nearest rule of
tests/test_geometric_fields.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import shared_dir

import tbljax

mask_utils = pytest.importorskip("pycocotools.mask")
from pycocotools.coco import COCO  # noqa: E402

S = 48
CATEGORIES = [
    {"id": 1, "name": "person"},
    {"id": 18, "name": "dog"},
    {"id": 44, "name": "bottle"},
    {"id": 90, "name": "toothbrush"},
]


def _photos(n):
    root = shared_dir("kodak") / "images"
    if not root.is_dir():
        pytest.skip("../shared/data/kodak is not here")
    return sorted(root.rglob("*.jpg"))[:n]


def _size(p):
    from PIL import Image

    with Image.open(p) as im:
        return im.size


def _uncompressed_rle(m):
    """COCO's uncompressed RLE of a binary mask, from its definition: run lengths of the
    column-major pixels, starting with a run of zeros."""
    flat = m.T.reshape(-1)
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]]))
    counts = ([0] if flat[0] else []) + runs.tolist()
    return {"size": list(m.shape), "counts": counts}


def _write_coco(tmp_path):
    photos = _photos(3)
    (tmp_path / "images").mkdir()
    images, anns = [], []
    for k, p in enumerate(photos):
        (tmp_path / "images" / p.name).write_bytes(p.read_bytes())
        w, h = _size(p)
        images.append({"id": 100 + k, "file_name": p.name, "width": w, "height": h})
    w, h = images[0]["width"], images[0]["height"]
    crowd = np.zeros((h, w), np.uint8)
    crowd[h // 2 :, : w // 3] = 1
    anns += [
        # two polygon objects overlapping (the later one wins), one of two parts
        {
            "id": 1,
            "image_id": 100,
            "category_id": 18,
            "iscrowd": 0,
            "bbox": [10, 20, 200, 150],
            "segmentation": [[10, 20, 210, 20, 210, 170, 10, 170]],
        },
        {
            "id": 2,
            "image_id": 100,
            "category_id": 44,
            "iscrowd": 0,
            "bbox": [100, 100, 150, 120],
            "segmentation": [[100, 100, 250, 100, 175, 220], [300, 10, 340, 10, 340, 60, 300, 60]],
        },
        {
            "id": 3,
            "image_id": 100,
            "category_id": 1,
            "iscrowd": 1,
            "bbox": [0, h // 2, w // 3, h - h // 2],
            "segmentation": _uncompressed_rle(crowd),
        },
    ]
    w2, h2 = images[1]["width"], images[1]["height"]
    blob = np.zeros((h2, w2), np.uint8)
    blob[h2 // 4 : h2 // 2, w2 // 2 :] = 1
    rle = mask_utils.encode(np.asfortranarray(blob))
    # A box passing the right edge by a fraction of a pixel, as COCO's do: clipped.
    anns.append(
        {
            "id": 4,
            "image_id": 101,
            "category_id": 90,
            "iscrowd": 0,
            "bbox": [w2 / 2, h2 / 4, w2 / 2 + 0.4, h2 / 4],
            "segmentation": {"size": rle["size"], "counts": rle["counts"].decode()},
        }
    )
    js = {"images": images, "annotations": anns, "categories": CATEGORIES}  # image 102: no annotation
    (tmp_path / "instances.json").write_text(json.dumps(js))
    return tmp_path / "instances.json", images, anns


def _squash(m):
    h, w = m.shape
    idx = [
        np.minimum(np.floor(np.arange(S, dtype=np.float32) * (np.float32(n) / np.float32(S))), n - 1).astype(int)
        for n in (h, w)
    ]
    return m[np.ix_(*idx)]


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # pycocotools' annToMask
@pytest.mark.parametrize("kind", ["semantic", "instance"])
def test_coco_boxes_and_masks_against_pycocotools_and_the_json(tmp_path, kind):
    path, images, anns = _write_coco(tmp_path)
    s = tbljax.convert(
        tbljax.coco(path, image_dir=tmp_path / "images", masks=kind),
        tmp_path / "a.tbl",
        image_size=S,
        resize="squash",
        progress=False,
    )
    assert s.written == 3 and not s.skipped
    ds = tbljax.open(tmp_path / "a.tbl")
    assert list(ds.keys) == [im["file_name"] for im in images]
    assert ds.fields["masks"].role["role"] == "mask" and ds.fields["boxes"].role["labels"] == "box_labels"
    oracle = COCO(str(path))
    ignore = 255 if kind == "semantic" else 65535
    for r, im in enumerate(images):
        w, h = im["width"], im["height"]
        mine = [a for a in anns if a["image_id"] == im["id"]]
        want = np.zeros((h, w), np.int64)
        k = 0
        for a in mine:  # painted in the JSON's order; crowd regions ignore
            m = oracle.annToMask(oracle.anns[a["id"]]).astype(bool)
            if a["iscrowd"]:
                want[m] = ignore
            else:
                k += 1
                want[m] = a["category_id"] if kind == "semantic" else k
        got = ds.field("masks")[r]
        assert got.dtype == (np.uint8 if kind == "semantic" else np.uint16)
        np.testing.assert_array_equal(got, _squash(want))
        solid = [a for a in mine if not a["iscrowd"]]
        boxes = np.array([a["bbox"] for a in solid], np.float64).reshape(-1, 4)
        xyxy = np.clip(np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], 1), 0, [w, h, w, h])
        np.testing.assert_allclose(ds.field("boxes")[r], xyxy * [S / w, S / h, S / w, S / h], atol=1e-4)
        np.testing.assert_array_equal(ds.field("box_labels")[r], [a["category_id"] for a in solid])
    assert len(ds.field("boxes")[2]) == 0 and not ds.field("masks")[2].any()  # no annotation


def test_coco_bad_input_is_named(tmp_path):
    path, images, anns = _write_coco(tmp_path)
    js = json.loads(path.read_text())
    js["images"][2]["height"] += 1  # the JSON disagrees with the photo
    js["annotations"][1]["segmentation"] = [[1, 2, 3]]  # not a polygon
    (tmp_path / "bad.json").write_text(json.dumps(js))
    s = tbljax.convert(
        tbljax.coco(tmp_path / "bad.json", image_dir=tmp_path / "images", masks="semantic"),
        tmp_path / "a.tbl",
        image_size=S,
        resize="squash",
        progress=False,
    )
    reasons = {x["key"]: x["reason"] for x in s.skipped}
    assert s.written == 1
    assert "image 100: annotation 2: polygons need at least 3 points" in reasons[images[0]["file_name"]]
    assert "field 'masks'" in reasons[images[2]["file_name"]]
    assert "where the image is" in reasons[images[2]["file_name"]]
    js["categories"].append({"id": 300, "name": "big"})
    (tmp_path / "big.json").write_text(json.dumps(js))
    with pytest.raises(ValueError, match="category id 300 does not fit a semantic mask"):
        tbljax.coco(tmp_path / "big.json", image_dir=tmp_path / "images", masks="semantic")
    with pytest.raises(ValueError, match=r"annotations\[0\] must have an image_id and a category_id"):
        js["annotations"][0]["category_id"] = 7
        (tmp_path / "cat.json").write_text(json.dumps(js))
        tbljax.coco(tmp_path / "cat.json", image_dir=tmp_path / "images")
    with pytest.raises(ValueError, match="fields= does not apply to a COCO source"):
        tbljax.convert(
            tbljax.coco(path, image_dir=tmp_path / "images"),
            tmp_path / "b.tbl",
            image_size=S,
            fields={"seg": tbljax.Mask("png")},
        )
    with pytest.raises(ValueError, match="geometric fields.*quality"):
        tbljax.convert(
            tbljax.coco(path, image_dir=tmp_path / "images"), tmp_path / "b.tbl", image_size=S, format="jpeg"
        )

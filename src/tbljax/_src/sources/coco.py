"""COCO JSON as a conversion source (`tbljax.coco`): each image of the JSON's "images" read
from `image_dir`, with its annotations as geometric fields — boxes (xywh, clipped to the
image) with their category ids, and masks painted from polygons or RLE through pycocotools
(the `coco` extra): "instance" (k + 1 at the k-th box's pixels) or "semantic" (category ids).

Rules (docs/reference.md "COCO"): crowd annotations (iscrowd=1) give no box and paint `ignore`;
annotations paint in the JSON's order (a later one wins where they overlap); an image without
annotations is a record with no box and a mask of 0; category ids are the JSON's own."""

from __future__ import annotations

import copy
import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tbljax._src.file.fields import Boxes, Mask
from tbljax._src.sources.items import Item, share

MASK_KINDS = ("instance", "semantic")
INSTANCE_IGNORE = (1 << 16) - 1  # instance maps are uint16: up to 65534 instances an image
SEMANTIC_IGNORE = 255  # semantic maps are uint8: category ids 1..254


def coco(
    annotations: str | os.PathLike, image_dir: str | os.PathLike, *, boxes: bool = True, masks: str | None = None
) -> CocoSource:
    """A COCO detection / segmentation JSON (e.g. instances_train2017.json) as a source for
    `tbljax.convert`: every entry of "images" is a record (its file_name under image_dir, key
    the file_name), with

    - boxes=True: fields "boxes" (the non-crowd annotations' boxes, xywh in the JSON, stored
      as xyxy at the record's geometry) and "box_labels" (their category ids, as the JSON has
      them: COCO's 1..90 with gaps);
    - masks="instance": field "masks", a uint16 map, k + 1 at the pixels of the image's k-th
      non-crowd annotation (box row k while no box is cropped away), 0 elsewhere, 65535
      (ignore) under crowd regions; masks="semantic": a uint8 map of category ids, 0
      background, 255 (ignore) under crowd regions. Needs pycocotools (the `coco` extra).

    >>> tbljax.convert(tbljax.coco("instances_val2017.json", image_dir="val2017", masks="semantic"),
    ...                "val.tbl", image_size=512, resize="max_side")
    """
    return CocoSource(annotations, image_dir, boxes=boxes, masks=masks)


class CocoSource:
    """The records of a COCO JSON: its images in the JSON's order, annotations by image."""

    LABELS_FROM = ("a COCO JSON has no image labels: its category ids are the boxes' labels",)
    count_is_slow = False

    def __init__(
        self,
        annotations: str | os.PathLike,
        image_dir: str | os.PathLike,
        *,
        boxes: bool = True,
        masks: str | None = None,
    ):
        if not isinstance(boxes, bool):
            raise ValueError(f"coco(boxes=) must be True or False, got {boxes!r}")
        if masks not in (None, *MASK_KINDS):
            raise ValueError(f"coco(masks=) must be None or one of {MASK_KINDS}, got {masks!r}")
        if not boxes and masks is None:
            raise ValueError("coco(boxes=False, masks=None) reads no annotation: give boxes=True or masks=")
        self.path, self.image_dir = os.fspath(annotations), Path(image_dir)
        if not self.image_dir.is_dir():
            raise FileNotFoundError(f"coco(image_dir=): {self.image_dir} is not a directory")
        if masks is not None:
            _mask_module()  # said at construction, not per record
        self.boxes, self.masks = boxes, masks
        self.images, self.by_image, self.category_ids = _read(self.path)
        if masks == "semantic":
            bad = [c for c in self.category_ids if not 0 < c < SEMANTIC_IGNORE]
            if bad:
                raise ValueError(
                    f"{self.path}: category id {bad[0]} does not fit a semantic mask (uint8 ids "
                    f"1..{SEMANTIC_IGNORE - 1}, 0 background, {SEMANTIC_IGNORE} ignore); use "
                    "masks='instance'"
                )
        self.classes = None  # records have no image label
        self.geometric: dict[str, Any] = {}
        self.field_kinds: dict[str, str] = {}
        if boxes:
            self.geometric["boxes"] = Boxes(format="xywh", labels="box_labels")
            self.field_kinds["boxes"] = "json"
        if masks is not None:
            ignore = INSTANCE_IGNORE if masks == "instance" else SEMANTIC_IGNORE
            self.geometric["masks"] = Mask(ignore=ignore)
            self.field_kinds["masks"] = "ndarray"

    def select(self, i: int, n: int) -> CocoSource:
        part = copy.copy(self)
        part.images = share(self.images, i, n, "images")
        return part

    def describe(self) -> list[str]:
        return [f"{self.path} ({self.image_dir})"]

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        return len(self.images)

    def __iter__(self) -> Iterator[Item]:
        for im in self.images:
            name = im["file_name"]
            path = self.image_dir / name
            try:
                data = path.read_bytes()
            except OSError as e:
                yield Item(name, str(path), None, error=f"cannot read: {e}")
                continue
            anns = self.by_image.get(im["id"], [])
            fields: dict[str, Any] = {}
            try:
                if self.boxes:
                    fields["boxes"] = _boxes(anns, im)
                if self.masks is not None:
                    fields["masks"] = self._mask(anns, im)
            except ValueError as e:
                yield Item(name, str(path), None, error=f"{self.path}: image {im['id']}: {e}")
                continue
            yield Item(name, str(path), data, fields=fields)

    def _mask(self, anns: list[dict[str, Any]], im: dict[str, Any]) -> np.ndarray:
        """The image's instance or semantic map, painted in the JSON's order."""
        h, w = im["height"], im["width"]
        instance = self.masks == "instance"
        out = np.zeros((h, w), np.uint16 if instance else np.uint8)
        k = 0
        for a in anns:
            m = _ann_mask(a, h, w).astype(bool)
            if a.get("iscrowd", 0):
                out[m] = INSTANCE_IGNORE if instance else SEMANTIC_IGNORE
            else:
                k += 1
                out[m] = k if instance else a["category_id"]
        return out


def _mask_module() -> Any:
    try:
        import pycocotools.mask as mask_utils
    except ImportError:
        raise ImportError("coco(masks=) paints masks with pycocotools: pip install 'tbljax[coco]'") from None
    return mask_utils


def _ann_mask(a: dict[str, Any], h: int, w: int) -> np.ndarray:
    """One annotation's (h, w) uint8 mask from its polygons, uncompressed or compressed RLE."""
    mask_utils = _mask_module()
    seg = a.get("segmentation")
    try:
        if isinstance(seg, list):  # polygons: one object may have several parts
            if not seg or not all(isinstance(p, list) and len(p) >= 6 for p in seg):
                raise ValueError("polygons need at least 3 points (6 numbers) each")
            rle = mask_utils.merge(mask_utils.frPyObjects(seg, h, w))
        elif isinstance(seg, dict) and isinstance(seg.get("counts"), list):  # uncompressed RLE
            rle = mask_utils.frPyObjects(seg, *seg["size"])
        elif isinstance(seg, dict) and isinstance(seg.get("counts"), (str, bytes)):
            rle = dict(seg, counts=seg["counts"].encode() if isinstance(seg["counts"], str) else seg["counts"])
        else:
            raise ValueError(f"segmentation is neither polygons nor RLE: {str(seg)[:60]}")
        with warnings.catch_warnings():  # pycocotools 2.0.11's decode warns under NumPy 2, harmlessly
            warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
            m = mask_utils.decode(rle)
    except (TypeError, KeyError, IndexError, ValueError) as e:
        raise ValueError(f"annotation {a.get('id')}: {e}") from None
    if m.shape != (h, w):
        raise ValueError(f"annotation {a.get('id')}: its RLE is {m.shape[0]}x{m.shape[1]} where the image is {h}x{w}")
    return m


def _boxes(anns: list[dict[str, Any]], im: dict[str, Any]) -> dict[str, list]:
    """The non-crowd annotations' xywh boxes, clipped to the image (COCO's boxes pass its edge
    by a fraction of a pixel at times), and their category ids."""
    w, h = im["width"], im["height"]
    boxes, labels = [], []
    for a in anns:
        if a.get("iscrowd", 0):
            continue
        try:
            x, y, bw, bh = (float(v) for v in a["bbox"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"annotation {a.get('id')}: bbox must be [x, y, width, height], got {a.get('bbox')!r:.60}"
            ) from None
        x0, y0 = min(max(x, 0.0), w), min(max(y, 0.0), h)
        boxes.append([x0, y0, min(x + bw, w) - x0, min(y + bh, h) - y0])
        labels.append(a["category_id"])
    return {"boxes": boxes, "labels": labels}


def _read(path: str) -> tuple[list[dict[str, Any]], dict[Any, list[dict[str, Any]]], list[int]]:
    """(images, annotations by image id in the JSON's order, category ids), checked enough
    that a record's failure names its image, not a KeyError."""
    try:
        with open(path, encoding="utf-8") as f:
            js = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"COCO annotations not found: {path}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path} is not a COCO JSON: {e}") from None
    if not isinstance(js, dict) or not isinstance(js.get("images"), list):
        raise ValueError(f"{path} is not a COCO JSON: it has no 'images' list")
    for k, im in enumerate(js["images"]):
        if not (
            isinstance(im, dict)
            and isinstance(im.get("file_name"), str)
            and "id" in im
            and all(isinstance(im.get(d), int) and im[d] > 0 for d in ("height", "width"))
        ):
            raise ValueError(
                f"{path}: images[{k}] must have id, file_name, and positive integer height and "
                f"width, got {json.dumps(im)[:120]}"
            )
    categories = js.get("categories", [])
    ids = [c.get("id") for c in categories if isinstance(c, dict)]
    if len(ids) != len(categories) or not all(isinstance(i, int) for i in ids):
        raise ValueError(f"{path}: every entry of 'categories' must have an integer id")
    known = set(ids)
    by_image: dict[Any, list[dict[str, Any]]] = {}
    for k, a in enumerate(js.get("annotations", [])):
        if not isinstance(a, dict) or "image_id" not in a or a.get("category_id") not in known:
            raise ValueError(
                f"{path}: annotations[{k}] must have an image_id and a category_id of 'categories', "
                f"got {json.dumps(a)[:120]}"
            )
        by_image.setdefault(a["image_id"], []).append(a)
    return js["images"], by_image, ids

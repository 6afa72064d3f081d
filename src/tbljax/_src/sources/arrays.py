"""In-memory conversion sources: NumPy (or jax, torch) arrays, lists of images or batches,
`(images, labels)` tuples and dicts whose other keys are record fields (`ArraySource`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tbljax._src.file.fields import check_name, kind_of_value
from tbljax._src.rules.contract import Arg
from tbljax._src.rules.partition import host_part
from tbljax._src.sources.items import Item, Label, share


class ArraySource:
    """Decoded images in memory: an (N, H, W[, C]) uint8 array, or a sequence whose elements
    are (H, W[, C]) images or (B, H, W, C) batches, read in order."""

    LABELS_FROM = ("arrays take labels from ", Arg("labels", ...), ", one per image")

    def __init__(
        self,
        images: Any,
        labels: Sequence[Label] | None,
        classes: list[str] | None = None,
        _rows: list[tuple[int, int]] | None = None,
        fields: dict[str, Any] | None = None,
        _first: int = 0,
    ):
        self.images = images
        # Field name -> a column of one value per image (a dict source's other keys).
        self.fields = dict(fields or {})
        self.field_kinds = {k: _column_kind(k, v) for k, v in self.fields.items()}
        self.first = _first  # this share's first row in the columns
        # Row r is images[k] (k, -1) or images[k][j] (k, j) for elements that are batches.
        self.rows = _rows if _rows is not None else _array_rows(images)
        n = len(self.rows)
        self.labels: list[Label] = list(labels) if labels is not None else [-1] * n
        if len(self.labels) != n:
            raise ValueError(f"labels must have shape ({n},) to match the {n} images, got ({len(self.labels)},)")
        self.classes = classes

    def select(self, i: int, n: int) -> ArraySource:
        rows = share(self.rows, i, n, "images")
        mine = host_part(len(self.rows), i, n)
        lo, hi = mine.start, mine.stop
        return ArraySource(self.images, self.labels[lo:hi], self.classes, rows, self.fields, self.first + lo)

    def describe(self) -> list[str]:
        return [f"<{len(self.rows)} arrays>"]

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        return len(self.rows)

    count_is_slow = False

    def __iter__(self) -> Iterator[Item]:
        for r, ((k, j), label) in enumerate(zip(self.rows, self.labels)):
            img = np.asarray(self.images[k] if j < 0 else self.images[k][j])
            err = None
            if img.dtype != np.uint8 or img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] not in (1, 3, 4)):
                err = f"array of {img.dtype} {img.shape} is not an (H, W[, 1|3|4]) uint8 image"
            fields = {name: col[self.first + r] for name, col in self.fields.items()}
            yield Item(str(r), "<array>", img, label, error=err, fields=fields)


def _column_kind(name: str, column: Any) -> str:
    """A dict source's field column: one value per image; its kind is its first value's."""
    check_name(name)
    if isinstance(column, (str, bytes)) or not hasattr(column, "__len__") or not hasattr(column, "__getitem__"):
        raise TypeError(
            f"field {name!r} of a dict source must hold one value per image (a list or an "
            f"array of N rows), got {type(column).__name__}"
        )
    if len(column) == 0:
        raise ValueError(f"field {name!r} of a dict source is empty")
    return kind_of_value(column[0])


# ---- what convert's `sources` argument may be ---------------------------------------------

IMAGE_KEYS = ("image", "images", "img")
LABEL_KEYS = ("label", "labels")
ACCEPTED_FORMS = (
    "a path or brace pattern ('train-{000..099}.tar'), a list of paths (TAR shards or image "
    "files), an image folder, a uint8 array (N, H, W, 3) or (N, H, W), a list of (H, W[, C]) "
    "images or (B, H, W, C) batches, a tuple (images, labels), or a dict "
    "{'image': images, 'label': labels} ('images'/'img', 'labels' also accepted)"
)


def _is_array(x: Any) -> bool:
    """numpy arrays and what converts to one without guessing (jax, torch, tf tensors)."""
    return isinstance(x, np.ndarray) or (
        hasattr(x, "__array__") and hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (str, bytes))
    )


def _check_batch(arr: np.ndarray, what: str) -> None:
    """A whole array of images is checked up front: one clear error, not N skipped items."""
    if arr.ndim not in (3, 4):
        raise ValueError(f"{what} must be (N, H, W, C) or (N, H, W) images, got shape {tuple(arr.shape)}")
    if arr.ndim == 4 and arr.shape[3] not in (1, 3, 4):
        hint = f" (it looks channels-first: pass {what}.transpose(0, 2, 3, 1))" if arr.shape[1] in (1, 3, 4) else ""
        raise ValueError(f"{what} of shape {tuple(arr.shape)} is not channels-last (N, H, W, 1|3|4){hint}")
    if np.dtype(arr.dtype) != np.uint8:
        raise ValueError(
            f"{what} must be uint8 pixels 0..255, got {arr.dtype} (for floats in [0, 1]: "
            "np.rint(x * 255).astype(np.uint8))"
        )


def _array_rows(images: Any) -> list[tuple[int, int]]:
    if _is_array(images):
        _check_batch(images, "images")
        return [(i, -1) for i in range(len(images))]
    rows: list[tuple[int, int]] = []
    for k, x in enumerate(images):
        if not _is_array(x):
            raise TypeError(
                f"element {k} of the image list is {type(x).__name__}, not an array; sources may be {ACCEPTED_FORMS}"
            )
        if x.ndim == 4:
            _check_batch(x, f"element {k} (a batch)")
            rows.extend((k, j) for j in range(len(x)))
        elif x.ndim in (2, 3):
            rows.append((k, -1))
        else:
            raise TypeError(
                f"element {k} of the image list has shape {tuple(x.shape)}: each must be an "
                "(H, W[, C]) image or a (B, H, W, C) batch (for (images, labels) pass a tuple)"
            )
    return rows


def _is_label_vector(x: Any) -> bool:
    if isinstance(x, (str, bytes)) or not (_is_array(x) or isinstance(x, (list, tuple))):
        return False
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError):
        return False
    return (arr.ndim == 1 or (arr.ndim == 2 and arr.shape[1] == 1)) and arr.dtype.kind in "iuUO"


def split_images_labels(sources: Any, labels: Any) -> tuple[Any, Any] | None:
    """(images, labels) for the in-memory spellings, or None when sources are paths."""
    if isinstance(sources, Mapping):
        ik = [k for k in IMAGE_KEYS if k in sources]
        lk = [k for k in LABEL_KEYS if k in sources]
        if len(ik) != 1 or len(lk) > 1:
            raise TypeError(
                f"a dict of sources needs exactly one image key of {list(IMAGE_KEYS)} and at "
                f"most one label key of {list(LABEL_KEYS)}, got keys {sorted(map(str, sources))}"
            )
        if lk and labels is not None:
            raise ValueError(f"labels given twice: the dict's {lk[0]!r} and labels=")
        return sources[ik[0]], (sources[lk[0]] if lk else labels)
    if (
        isinstance(sources, tuple)
        and len(sources) == 2
        and _is_label_vector(sources[1])
        and (
            _is_array(sources[0]) or (isinstance(sources[0], (list, tuple)) and sources[0] and _is_array(sources[0][0]))
        )
        and len(sources[0]) == len(sources[1])
    ):
        if labels is not None:
            raise ValueError("labels given twice: the (images, labels) tuple and labels=")
        return sources
    if _is_array(sources):
        return sources, labels
    if isinstance(sources, (list, tuple)) and sources and all(_is_array(x) for x in sources):
        return sources, labels
    return None

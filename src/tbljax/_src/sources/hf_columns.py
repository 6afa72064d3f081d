"""Which columns of a Hugging Face dataset or Parquet file a conversion reads (the features'
`Image` and `ClassLabel`, or `image_column=` / `label_column=`), each field's kind and dtype,
and a batch of rows → `Item`s (image cells' bytes, labels, field cells). The sources that read
the rows are `huggingface.py`'s.

`datasets` is the `hf` extra, imported only when such a source is given (`import_hf`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tbljax._src.remote import remote
from tbljax._src.rules.contract import Arg, is_integer
from tbljax._src.sources.items import Item, Label

__all__ = ["LABELS_FROM", "Columns", "import_hf"]


def import_hf(name: str) -> Any:
    try:
        return __import__(name, fromlist=["_"])
    except ImportError:
        raise ImportError(
            f"Hugging Face and Parquet sources need {name.split('.')[0]}: pip install 'tbljax[hf]'"
        ) from None


class Columns:
    """Which columns a source reads, from its features (a `datasets.Features`, or None when an
    IterableDataset does not know them) and convert's arguments; the classes of a ClassLabel."""

    def __init__(
        self,
        features: Any,
        names: Sequence[str],
        where: str,
        image_column: str | None,
        label_column: str | None,
        fields: Sequence[str] | Mapping[str, str],
        classes: list[str] | None,
    ):
        datasets = import_hf("datasets")
        features = features or {}
        names = list(names) or list(features)
        # Field name -> the column holding it (a geometric field's key=; else its own name).
        self.column = dict(fields) if isinstance(fields, Mapping) else {f: f for f in fields}
        for what, col in (
            ("image_column", image_column),
            ("label_column", label_column),
            *(("fields", f) for f in self.column.values()),
        ):
            if col is not None and names and col not in names:
                raise ValueError(f"{where}: {what} {col!r} is not a column; columns: {names}")
        if image_column is None:
            images = [
                c for c, f in features.items() if isinstance(f, datasets.Image) and c not in self.column.values()
            ]  # an Image field (a mask) is not the photo
            if len(images) != 1:
                found = f"Image features {images}" if images else "no Image feature"
                raise ValueError(f"{where} has {found}: name the image column with image_column= (columns: {names})")
            image_column = images[0]
        if label_column is None:
            labels = [c for c, f in features.items() if isinstance(f, datasets.ClassLabel)]
            if len(labels) > 1:
                raise ValueError(f"{where} has several ClassLabel features {labels}: name the label with label_column=")
            label_column = labels[0] if labels else _default_label(features, names)
        self.image, self.label, self.fields = image_column, label_column, list(fields)
        if self.fields and not features:
            raise ValueError(
                f"{where}: its features are unknown (an IterableDataset without "
                f"features), so the kinds of fields {self.fields} are not known: "
                "give the dataset its features (IterableDataset.cast)"
            )
        # Each field's kind and, for ndarray fields, the dtype its cells are read at; an Image
        # column (a mask as PNG) is read as its encoded bytes.
        self.encoded = {f for f, c in self.column.items() if isinstance(features[c], datasets.Image)}
        typed = {
            f: ("ndarray", None) if f in self.encoded else _field_kind(features[c], where, c)
            for f, c in self.column.items()
        }
        self.kinds = {f: k for f, (k, _) in typed.items()}
        self.dtypes = {f: d for f, (_, d) in typed.items() if d is not None}
        names_of = getattr(features.get(label_column), "names", None) if label_column else None
        if classes is not None and names_of is not None and list(classes) != list(names_of):
            diff = next(
                (k for k, (a, b) in enumerate(zip(classes, names_of)) if a != b), min(len(classes), len(names_of))
            )
            raise ValueError(
                f"{where}: classes= differs from the ClassLabel names of {label_column!r} "
                f"at id {diff} (the file's ids are kept as they are, so the names must match)"
            )
        self.classes = classes if classes is not None else (list(names_of) if names_of else None)

    @property
    def read(self) -> list[str]:
        return list(dict.fromkeys([self.image, *([self.label] if self.label else []), *self.column.values()]))

    def items(self, rows: dict[str, list[Any]], keys: Sequence[str], source: str) -> Iterator[Item]:
        """The items of a batch of rows, given column by column (`pyarrow` `to_pydict`)."""
        labels = rows[self.label] if self.label else [-1] * len(keys)
        for r, key in enumerate(keys):
            data, error = _image_bytes(rows[self.image][r])
            label, label_error = _label(labels[r], self.label)
            yield Item(
                key,
                source,
                data,
                label,
                error=error,
                label_error=label_error,
                fields={
                    f: _image_bytes(rows[c][r])[0] if f in self.encoded else _cell(rows[c][r], self.dtypes.get(f))
                    for f, c in self.column.items()
                },
            )


def _numeric_dtype(feature: Any) -> np.dtype | None:
    """The NumPy dtype of a numeric `Value`, ClassLabel, or list/array of them, else None."""
    datasets = import_hf("datasets")
    if isinstance(feature, datasets.ClassLabel):
        return np.dtype(np.int64)
    if isinstance(feature, (datasets.Value, datasets.Array2D, datasets.Array3D, datasets.Array4D, datasets.Array5D)):
        try:
            dtype = np.dtype(feature.dtype)
        except TypeError:
            return None
        return dtype if dtype.kind in "biuf" and dtype.itemsize <= 8 else None
    if isinstance(feature, (datasets.List, datasets.LargeList, datasets.Sequence)):
        return _numeric_dtype(feature.feature)
    if isinstance(feature, list) and len(feature) == 1:
        return _numeric_dtype(feature[0])
    return None


def _field_kind(feature: Any, where: str, column: str) -> tuple[str, np.dtype | None]:
    """(kind, dtype) of a column stored as a record field, from its feature: text → str;
    a number or a list/array of numbers → ndarray (at the feature's dtype); other lists and
    structs → json."""
    datasets = import_hf("datasets")
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string"):
        return "str", None
    dtype = _numeric_dtype(feature)
    if dtype is not None:
        return "ndarray", dtype
    if isinstance(feature, (dict, list, datasets.List, datasets.LargeList, datasets.Sequence)):
        return "json", None
    raise ValueError(
        f"{where}: column {column!r} is {feature!r:.80}, which a record field "
        "cannot hold: a field takes text, numbers, or lists and structs of them"
    )


def _cell(value: Any, dtype: np.dtype | None) -> Any:
    """A cell as a field value: numbers as an array of the feature's dtype (what cannot be
    one is left as it is, for `parse_field_value` to say why)."""
    if dtype is None or value is None:
        return value
    try:
        return np.asarray(value, dtype)
    except (TypeError, ValueError):
        return value


def _image_bytes(cell: Any) -> tuple[bytes | None, str | None]:
    """An image cell's encoded bytes: raw bytes, or an `Image` struct's "bytes" (else the file
    at its "path"), with the reason when there are none."""
    if isinstance(cell, dict):
        if cell.get("bytes"):
            return bytes(cell["bytes"]), None
        path = cell.get("path")
        if not path:
            return None, "image cell has neither bytes nor a path"
        try:
            with remote.open_input(path) as f:
                return f.read(), None
        except OSError as e:
            return None, f"image cell has no bytes and its path cannot be read: {e}"
    if isinstance(cell, (bytes, bytearray, memoryview)):
        return (bytes(cell), None) if len(cell) else (None, "image cell is empty")
    return None, f"image cell is {type(cell).__name__}, not bytes or an Image {{'bytes', 'path'}} struct"


def _default_label(features: Any, names: Sequence[str]) -> str | None:
    """With no ClassLabel feature: a column named `label` of integer ids (or of a type unknown,
    as in an IterableDataset without features), else none."""
    if "label" not in names:
        return None
    f = features.get("label")
    dtype = _numeric_dtype(f) if f is not None else np.dtype(np.int64)
    return "label" if dtype is not None and dtype.kind in "iu" else None


# Where labels come from: convert says it when no record has one.
LABELS_FROM = (
    "a Hugging Face dataset or Parquet file takes labels from its ClassLabel column, else a "
    "column named label holding integer ids; ",
    Arg("label_column", ...),
    " names another",
)


def _label(cell: Any, column: str | None) -> tuple[Label, str | None]:
    if cell is None:
        return -1, None
    if is_integer(cell):
        return cell, None
    if isinstance(cell, str) and cell.strip() and "\n" not in cell:
        return cell.strip(), None
    return -1, f"label column {column!r} holds {type(cell).__name__} {cell!r:.60}, not an integer id or a class name"

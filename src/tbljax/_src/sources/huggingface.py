"""Hugging Face sources: a `datasets.Dataset` (one split) or `IterableDataset`, and Parquet
files (local, or at a URL through fsspec) as `datasets` writes them. The features say which
column is the image (`Image`: a `{"bytes", "path"}` struct) and which the label (`ClassLabel`:
its names become the classes, ids kept); `image_column=` / `label_column=` name them instead.
Parquet is read row group by row group, so memory stays flat in the file's size, and a
conversion's `--shard i/n` takes a contiguous share of the (file, row group) units. A file
that cannot be read, or lacks a column, is one bad item; a row group's rows are those read,
not those its footer declares, when the footer contradicts itself.

`datasets` and `pyarrow` are the `hf` extra, imported only when such a source is given.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tbljax._src.remote import remote
from tbljax._src.rules.contract import Arg
from tbljax._src.rules.partition import host_part
from tbljax._src.sources.items import Item, Label, paths_of, share

__all__ = ["PARQUET_SUFFIXES", "HFDatasetSource", "ParquetSource", "is_hf_dataset", "is_parquet", "resolve"]

PARQUET_SUFFIXES = (".parquet", ".parq")
BATCH_ROWS = 256  # rows turned into Python objects at a time (a row group may hold many more)


def _import(name: str) -> Any:
    try:
        return __import__(name, fromlist=["_"])
    except ImportError:
        raise ImportError(
            f"Hugging Face and Parquet sources need {name.split('.')[0]}: pip install 'tbljax[hf]'"
        ) from None


def is_hf_dataset(x: Any) -> bool:
    """Whether x is a `datasets.Dataset` or `IterableDataset` (without importing datasets)."""
    return type(x).__module__.startswith("datasets.") and type(x).__name__ in ("Dataset", "IterableDataset")


def is_parquet(paths: Sequence[str]) -> bool:
    return bool(paths) and all(remote.name_of(p).lower().endswith(PARQUET_SUFFIXES) for p in paths)


class _Columns:
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
        datasets = _import("datasets")
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


def _in_column(path: str, column: str) -> bool:
    """Whether a Parquet leaf path ('image.bytes') belongs to the top-level column."""
    return path == column or path.startswith(column + ".")


def _numeric_dtype(feature: Any) -> np.dtype | None:
    """The NumPy dtype of a numeric `Value`, ClassLabel, or list/array of them, else None."""
    datasets = _import("datasets")
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
    datasets = _import("datasets")
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
    if isinstance(cell, int) and not isinstance(cell, bool):
        return cell, None
    if isinstance(cell, str) and cell.strip() and "\n" not in cell:
        return cell.strip(), None
    return -1, f"label column {column!r} holds {type(cell).__name__} {cell!r:.60}, not an integer id or a class name"


class ParquetSource:
    """Parquet files: the features from the schema's `huggingface` metadata (or inferred from
    the Arrow types); rows read by row group, in file order."""

    count_is_slow = False
    LABELS_FROM = LABELS_FROM

    @property
    def field_kinds(self) -> dict[str, str]:
        """The record fields conversion stores from this source (fields=): name → kind."""
        return self.columns.kinds if self.columns else {}  # None: no file could be read

    def __init__(
        self,
        paths: Sequence[str],
        classes: list[str] | None = None,
        image_column: str | None = None,
        label_column: str | None = None,
        fields: Sequence[str] | Mapping[str, str] = (),
        retry: remote.Retry = remote.DEFAULT_RETRY,
        units: list[tuple[str, int, int]] | None = None,
        columns: _Columns | None = None,
        problems: dict[tuple[str, int], str] | None = None,
    ):
        self.paths, self.retry = list(paths), retry
        # (file, row group) -> what is wrong, reported as one bad item where the rows would
        # be; row group -1: the whole file (unreadable, or without a column that is read).
        self.problems = dict(problems or {})
        if units is None:
            metas = {}
            for p in self.paths:
                try:
                    with self._open(p) as f:
                        pf = _import("pyarrow.parquet").ParquetFile(f)
                        metas[p] = (pf.metadata, pf.schema_arrow)
                except (OSError, _import("pyarrow").ArrowException) as e:
                    if isinstance(e, FileNotFoundError):
                        raise
                    self.problems[(p, -1)] = f"not a readable Parquet file ({e})"
            if columns is None and metas:
                schema = next(iter(metas.values()))[1]
                features = _import("datasets").Features.from_arrow_schema(schema)
                columns = _Columns(
                    features, schema.names, next(iter(metas)), image_column, label_column, fields, classes
                )
            units = []
            for p in self.paths:
                if p in metas:
                    units += self._row_groups(p, *metas[p], columns)
                if (p, -1) in self.problems:
                    units.append((p, -1, 1))  # the bad item that reports it
        self.units = units  # (file, row group, rows), in order
        self.columns = columns
        self.classes = columns.classes if columns else classes

    def _row_groups(self, path: str, meta: Any, schema: Any, columns: _Columns) -> list[tuple[str, int, int]]:
        """The (file, row group, rows) units of a file. A group's rows are counted by reading
        when its footer's count is not to be trusted: a read column that holds one value a row
        holds another number, or the image column has under a byte a row (a forged count would
        otherwise size the TBL file's index). A file without a read column is a problem."""
        missing = [c for c in columns.read if c not in schema.names]
        if missing:
            self.problems[(path, -1)] = f"has no column {missing[0]!r} (columns: {schema.names[:12]}); file skipped"
            return []
        units = []
        for g in range(meta.num_row_groups):
            rg, declared = meta.row_group(g), meta.row_group(g).num_rows
            leaves = [
                rg.column(c)
                for c in range(rg.num_columns)
                if meta.schema.column(c).max_repetition_level == 0  # one value a row
                and any(_in_column(rg.column(c).path_in_schema, col) for col in columns.read)
            ]
            odd = [
                f"its column {c.path_in_schema!r} holds {c.num_values} values"
                for c in leaves
                if c.num_values != declared
            ]
            image_bytes = sum(c.total_uncompressed_size for c in leaves if _in_column(c.path_in_schema, columns.image))
            if not odd and image_bytes >= declared:
                units.append((path, g, declared))
                continue
            rows, why = self._count_rows(path, g, columns.image)
            if odd or rows != declared:
                self.problems[(path, g)] = (
                    f"row group {g} declares {declared} rows{''.join(', ' + o for o in odd[:1])}; {rows} rows read{why}"
                )
            units.append((path, g, rows))
        return units

    def _count_rows(self, path: str, group: int, column: str) -> tuple[int, str]:
        """The rows of a row group that `column` really yields, and why it stopped if it failed."""
        pa, pq = _import("pyarrow"), _import("pyarrow.parquet")
        rows = 0
        try:
            with self._open(path) as f:
                for batch in pq.ParquetFile(f).iter_batches(BATCH_ROWS, row_groups=[group], columns=[column]):
                    rows += batch.num_rows
        except (OSError, pa.ArrowException) as e:
            return rows, f" ({e})"
        return rows, ""

    def _open(self, path: str) -> Any:
        if not remote.is_url(path) and not os.path.isfile(path):
            raise FileNotFoundError(f"Parquet file not found: {path}")
        return remote.open_input(path, self.retry)

    def select(self, i: int, n: int) -> ParquetSource:
        """Shard i of n: a contiguous share of the (file, row group) units."""
        part = share(self.units, i, n, "Parquet row groups")
        return ParquetSource(
            list(dict.fromkeys(u[0] for u in part)),
            retry=self.retry,
            units=part,
            columns=self.columns,
            problems=self.problems,
        )

    def describe(self) -> list[str]:
        return self.paths

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        return sum(u[2] for u in self.units)

    def __iter__(self) -> Iterator[Item]:
        by_file: dict[str, list[tuple[int, int]]] = {}
        for p, g, rows in self.units:
            by_file.setdefault(p, []).append((g, rows))
        for p, groups in by_file.items():
            if (p, -1) in self.problems:
                yield Item(
                    f"{remote.name_of(p)}:<file>", p, None, error=f"{remote.name_of(p)}: {self.problems[(p, -1)]}"
                )
                continue
            yield from self._iter_file(p, groups)

    def _iter_file(self, path: str, groups: list[tuple[int, int]]) -> Iterator[Item]:
        """The rows of a file's row groups, each group at most the rows counted for it (so the
        writer, sized by `count`, holds them); a group that fails to read, or that holds other
        than it declares, is reported as a bad item naming it."""
        pa, pq = _import("pyarrow"), _import("pyarrow.parquet")
        name = remote.name_of(path)
        with self._open(path) as f:
            pf = pq.ParquetFile(f)
            row = sum(pf.metadata.row_group(g).num_rows for g in range(groups[0][0]))
            for g, rows in groups:
                start, read, why = row, 0, self.problems.get((path, g))
                try:
                    for batch in pf.iter_batches(BATCH_ROWS, row_groups=[g], columns=self.columns.read):
                        n = min(batch.num_rows, rows - read)
                        keys = [f"{name}:{r}" for r in range(row, row + n)]
                        yield from self.columns.items(batch.slice(0, n).to_pydict(), keys, path)
                        row, read = row + n, read + n
                        if read == rows:
                            break
                except (OSError, pa.ArrowException) as e:
                    why = f"row group {g}: unreadable after {read} of {rows} rows ({e}); rest of row group skipped"
                if why is None and read < rows:
                    why = f"row group {g} ends after {read} of its {rows} rows"
                if why is not None:
                    yield Item(f"{name}:<row group {g}>", path, None, error=f"{name} rows {start}..: {why}")
                row = start + pf.metadata.row_group(g).num_rows


class HFDatasetSource:
    """A `datasets.Dataset` (read as Arrow, images never decoded by `datasets`) or an
    `IterableDataset` (read with decoding off); keys are row numbers."""

    LABELS_FROM = LABELS_FROM

    @property
    def field_kinds(self) -> dict[str, str]:
        """The record fields conversion stores from this source (fields=): name → kind."""
        return self.columns.kinds

    def __init__(
        self,
        ds: Any,
        classes: list[str] | None = None,
        image_column: str | None = None,
        label_column: str | None = None,
        fields: Sequence[str] | Mapping[str, str] = (),
        rows: range | None = None,
        columns: _Columns | None = None,
    ):
        datasets = _import("datasets")
        self.ds, self.iterable = ds, isinstance(ds, datasets.IterableDataset)
        if columns is None:
            names = ds.column_names or []
            columns = _Columns(ds.features, names, f"{type(ds).__name__}", image_column, label_column, fields, classes)
        self.columns, self.classes = columns, columns.classes
        self.rows = rows if rows is not None or self.iterable else range(len(ds))
        self.first_row = 0 if self.rows is None else self.rows.start

    @property
    def count_is_slow(self) -> bool:
        return self._known_count() is None

    def _known_count(self) -> int | None:
        if not self.iterable:
            return len(self.rows)
        splits = self.ds.info.splits
        split = splits.get(str(self.ds.split)) if splits and self.ds.split is not None else None
        return split.num_examples if split is not None and split.num_examples else None

    def select(self, i: int, n: int) -> HFDatasetSource:
        """Shard i of n: contiguous rows of a Dataset; contiguous shards (files) of an
        IterableDataset (`IterableDataset.shard`, which needs n <= its num_shards)."""
        if not self.iterable:
            part = host_part(len(self.rows), i, n)
            share(self.rows, i, n, "rows")
            return HFDatasetSource(self.ds, rows=self.rows[part.start : part.stop], columns=self.columns)
        if n > self.ds.num_shards:
            raise ValueError(
                f"shard {i}/{n}: this IterableDataset has {self.ds.num_shards} shards (files), "
                f"and is split by whole shards: use at most {self.ds.num_shards} shares"
            )
        part = HFDatasetSource(self.ds.shard(n, i, contiguous=True), columns=self.columns)
        return part

    def describe(self) -> list[str]:
        name = getattr(self.ds.info, "dataset_name", None) or type(self.ds).__name__
        return [f"<{name} {self.ds.split or ''}>".replace(" >", ">")]

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        known = self._known_count()
        if known is not None:
            return known
        return sum(1 for _ in self.ds.select_columns([self.columns.image]).decode(False))

    def __iter__(self) -> Iterator[Item]:
        cols = self.columns.read
        if self.iterable:
            row = 0
            for batch in self.ds.select_columns(cols).decode(False).iter(BATCH_ROWS):
                n = len(batch[self.columns.image])
                yield from self.columns.items(batch, [str(r) for r in range(row, row + n)], "<dataset>")
                row += n
            return
        table = self.ds.with_format("arrow").select_columns(cols)
        for lo in range(self.rows.start, self.rows.stop, BATCH_ROWS):
            hi = min(lo + BATCH_ROWS, self.rows.stop)
            yield from self.columns.items(table[lo:hi].to_pydict(), [str(r) for r in range(lo, hi)], "<dataset>")


def resolve(
    sources: Any,
    classes: list[str] | None,
    image_column: str | None,
    label_column: str | None,
    fields: Sequence[str] | Mapping[str, str] = (),
    retry: remote.Retry = remote.DEFAULT_RETRY,
) -> ParquetSource | HFDatasetSource | None:
    """The Hugging Face source `sources` names (a dataset object, or Parquet paths and
    patterns), or None when it names none."""
    if is_hf_dataset(sources):
        return HFDatasetSource(sources, classes, image_column, label_column, fields)
    paths = paths_of(sources, is_parquet)
    if paths is None:
        return None
    return ParquetSource(paths, classes, image_column, label_column, fields, retry)

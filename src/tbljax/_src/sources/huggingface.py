"""Hugging Face sources: a `datasets.Dataset` (one split) or `IterableDataset`, and Parquet
files (local, or at a URL through fsspec) as `datasets` writes them. The features say which
column is the image (`Image`: a `{"bytes", "path"}` struct) and which the label (`ClassLabel`:
its names become the classes, ids kept); `image_column=` / `label_column=` name them instead
(`hf_columns.py`).
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

from tbljax._src.remote import remote
from tbljax._src.rules.partition import host_part
from tbljax._src.sources.hf_columns import LABELS_FROM, Columns, import_hf
from tbljax._src.sources.items import Item, paths_of, share

__all__ = ["PARQUET_SUFFIXES", "HFDatasetSource", "ParquetSource", "is_hf_dataset", "is_parquet", "resolve"]

PARQUET_SUFFIXES = (".parquet", ".parq")
BATCH_ROWS = 256  # rows turned into Python objects at a time (a row group may hold many more)


def is_hf_dataset(x: Any) -> bool:
    """Whether x is a `datasets.Dataset` or `IterableDataset` (without importing datasets)."""
    return type(x).__module__.startswith("datasets.") and type(x).__name__ in ("Dataset", "IterableDataset")


def is_parquet(paths: Sequence[str]) -> bool:
    return bool(paths) and all(remote.name_of(p).lower().endswith(PARQUET_SUFFIXES) for p in paths)


def _in_column(path: str, column: str) -> bool:
    """Whether a Parquet leaf path ('image.bytes') belongs to the top-level column."""
    return path == column or path.startswith(column + ".")


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
        columns: Columns | None = None,
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
                        pf = import_hf("pyarrow.parquet").ParquetFile(f)
                        metas[p] = (pf.metadata, pf.schema_arrow)
                except (OSError, import_hf("pyarrow").ArrowException) as e:
                    if isinstance(e, FileNotFoundError):
                        raise
                    self.problems[(p, -1)] = f"not a readable Parquet file ({e})"
            if columns is None and metas:
                schema = next(iter(metas.values()))[1]
                features = import_hf("datasets").Features.from_arrow_schema(schema)
                columns = Columns(
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

    def _row_groups(self, path: str, meta: Any, schema: Any, columns: Columns) -> list[tuple[str, int, int]]:
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
        pa, pq = import_hf("pyarrow"), import_hf("pyarrow.parquet")
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
        pa, pq = import_hf("pyarrow"), import_hf("pyarrow.parquet")
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
        columns: Columns | None = None,
    ):
        datasets = import_hf("datasets")
        self.ds, self.iterable = ds, isinstance(ds, datasets.IterableDataset)
        if columns is None:
            names = ds.column_names or []
            columns = Columns(ds.features, names, f"{type(ds).__name__}", image_column, label_column, fields, classes)
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

"""TFDS sources without TensorFlow: TFRecord files (`*.tfrecord*`) and ArrayRecord files
(`*.array_record*`, read by the `array_record` package) of `tf.train.Example` protos, parsed
with `protobuf` (`tf_example.py`); which features are what is `tfds_features.py`'s job.

TFRecord framing, per record: length (u64 little-endian), masked CRC-32C of the length, data,
masked CRC-32C of the data. Both checksums are checked (`google-crc32c`): a record whose data
fails is skipped and listed like a bad image, naming file and record number; a length that
fails leaves nothing to resynchronise on, so the rest of that file is skipped; a length past
the end of the file is a truncated record. An ArrayRecord file array_record cannot open is one
bad item, and a damaged record only itself. `--shard i/n`
takes whole TFRecord files, and contiguous records of ArrayRecord files (random access).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tbljax._src.remote import remote
from tbljax._src.rules.partition import host_part
from tbljax._src.sources.items import Item, paths_of, share
from tbljax._src.sources.tfds_features import IMAGE_KEYS, LABEL_KEYS, Features, field_kinds

__all__ = ["IMAGE_KEYS", "LABEL_KEYS", "ArrayRecordSource", "TFRecordSource", "field_kinds", "masked_crc32c", "resolve"]

READ_BATCH = 64  # ArrayRecord records read per call
READ_PIECE = 16 << 20  # a TFRecord record's data is read in pieces: its length is not trusted


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant (mod 2**32)."""
    try:
        import google_crc32c
    except ImportError:
        raise ImportError("TFRecord sources check CRC-32C with google-crc32c: pip install 'tbljax[tfds]'") from None
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _is_tfrecord(paths: Sequence[str]) -> bool:
    return bool(paths) and all(".tfrecord" in remote.name_of(p).lower() for p in paths)


def _is_array_record(paths: Sequence[str]) -> bool:
    return bool(paths) and all(".array_record" in remote.name_of(p).lower() for p in paths)


class TFRecordSource:
    """TFRecord files of tf.train.Example, read in order, both CRC-32Cs checked."""

    @property
    def field_kinds(self) -> dict[str, str]:
        """The record fields conversion stores from this source (fields=): name → kind."""
        return field_kinds(self)

    def __init__(
        self,
        paths: Sequence[str],
        classes: list[str] | None = None,
        image_key: str | None = None,
        label_key: str | None = None,
        fields: Sequence[str] | Mapping[str, str] = (),
        retry: remote.Retry = remote.DEFAULT_RETRY,
        features: Features | None = None,
    ):
        self.paths, self.retry = list(paths), retry
        missing = [p for p in self.paths if not remote.is_url(p) and not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"TFRecord file not found: {missing[0]}")
        self.features = features or Features(self.paths[0], image_key, label_key, fields, classes)
        self.classes = self.features.classes
        self.counted: dict[str, tuple[int, str]] = {}  # files whose count stopped early: (records, why)

    count_is_slow = False

    def select(self, i: int, n: int) -> TFRecordSource:
        """Shard i of n: a contiguous share of whole files."""
        return TFRecordSource(share(self.paths, i, n, "TFRecord files"), retry=self.retry, features=self.features)

    def describe(self) -> list[str]:
        return self.paths

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        """An upper bound of the records: the framing walked, seeking over the data."""
        total = 0
        for k, p in enumerate(self.paths):
            n, problem = 0, None
            try:
                with remote.open_input(p, self.retry) as f:
                    while (head := f.read(12)) and len(head) == 12:
                        n += 1
                        f.seek(struct.unpack("<Q", head[:8])[0] + 4, os.SEEK_CUR)
            except OSError as e:
                problem = f"{type(e).__name__}: {e}"
            if problem is not None:
                self.counted[p] = (n, problem)
            total += n
            if report is not None:
                report(k + 1, len(self.paths))
        return total

    def __iter__(self) -> Iterator[Item]:
        for p in self.paths:
            left = self.counted.get(p, (None, ""))[0]
            for item in self._iter_file(p):
                if left is not None:
                    if left == 0:
                        yield Item(
                            f"{remote.name_of(p)}:<rest>",
                            p,
                            None,
                            error="unreadable TFRecord "
                            f"data while counting ({self.counted[p][1]}); rest of file skipped",
                        )
                        break
                    left -= 1
                yield item

    def _iter_file(self, path: str) -> Iterator[Item]:
        name = remote.name_of(path)
        k = 0
        try:
            with remote.open_input(path, self.retry) as f:
                while head := f.read(12):
                    where, key = f"{name} record {k}", f"{name}:{k}"
                    if len(head) < 12:
                        yield Item(key, path, None, error=f"{where}: truncated header; end of file")
                        return
                    length, length_crc = struct.unpack("<QI", head)
                    if masked_crc32c(head[:8]) != length_crc:
                        yield Item(
                            key,
                            path,
                            None,
                            error=f"{where}: length CRC-32C mismatch (the framing is broken); rest of file skipped",
                        )
                        return
                    data, tail = _read_at_most(f, length), f.read(4)
                    if len(data) < length or len(tail) < 4:
                        yield Item(
                            key, path, None, error=f"{where}: truncated ({len(data)} of {length} bytes); end of file"
                        )
                        return
                    if masked_crc32c(data) != struct.unpack("<I", tail)[0]:
                        yield Item(key, path, None, error=f"{where}: data CRC-32C mismatch; record skipped")
                    else:
                        yield self.features.item(data, key, path, where)
                    k += 1
        except OSError as e:
            yield Item(
                f"{name}:{k}",
                path,
                None,
                error=f"{name} record {k}: unreadable ({type(e).__name__}: {e}); rest of file skipped",
            )


def _read_at_most(f: Any, n: int) -> bytes:
    """Up to n bytes, read in pieces so that a length claimed by a damaged header (2**40) costs
    only the bytes the file really holds, not an allocation of n."""
    pieces = []
    while n > 0 and (piece := f.read(min(n, READ_PIECE))):
        pieces.append(piece)
        n -= len(piece)
    return b"".join(pieces)


class ArrayRecordSource:
    """ArrayRecord files of tf.train.Example (local paths: the reader is array_record's C++)."""

    @property
    def field_kinds(self) -> dict[str, str]:
        """The record fields conversion stores from this source (fields=): name → kind."""
        return field_kinds(self)

    count_is_slow = False

    def __init__(
        self,
        paths: Sequence[str],
        classes: list[str] | None = None,
        image_key: str | None = None,
        label_key: str | None = None,
        fields: Sequence[str] | Mapping[str, str] = (),
        features: Features | None = None,
        units: list[tuple[str, int, int]] | None = None,
        broken: dict[str, str] | None = None,
    ):
        self.paths = list(paths)
        urls = [p for p in self.paths if remote.is_url(p)]
        if urls:
            raise ValueError(
                f"ArrayRecord files are read from local paths (array_record's reader); "
                f"{urls[0]!r} is a URL: stage the files first (tbljax.stage)"
            )
        missing = [p for p in self.paths if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"ArrayRecord file not found: {missing[0]}")
        self.features = features or Features(self.paths[0], image_key, label_key, fields, classes)
        self.classes = self.features.classes
        self.broken = dict(broken or {})  # file -> why it cannot be read: one bad item
        if units is None:  # (file, first record, end) runs; one per file until sharded
            units = []
            for p in self.paths:
                try:
                    with _reader(p) as r:
                        units.append((p, 0, r.num_records()))
                except _Unreadable as e:
                    self.broken[p] = str(e)
                    units.append((p, 0, 1))  # the bad item that reports it
        self.units = units

    def select(self, i: int, n: int) -> ArrayRecordSource:
        """Shard i of n: contiguous records over all the files (random access)."""
        part = host_part(self.count(), i, n)
        share(range(self.count()), i, n, "ArrayRecord records")  # refuses an empty share
        units, offset = [], 0
        for p, lo, hi in self.units:  # the part's records, as runs of one file each
            a, b = max(part.start - offset, 0), min(part.stop - offset, hi - lo)
            if a < b:
                units.append((p, lo + a, lo + b))
            offset += hi - lo
        return ArrayRecordSource(
            [u[0] for u in units],
            features=self.features,
            units=units,
            broken={p: self.broken[p] for p, _, _ in units if p in self.broken},
        )

    def describe(self) -> list[str]:
        return list(dict.fromkeys(self.paths))

    def count(self, report: Callable[[int, int], None] | None = None) -> int:
        return sum(hi - lo for _, lo, hi in self.units)

    def __iter__(self) -> Iterator[Item]:
        for p, lo, hi in self.units:
            name = remote.name_of(p)
            if p in self.broken:
                yield Item(f"{name}:<file>", p, None, error=self.broken[p])
                continue
            with _reader(p) as r:
                for start in range(lo, hi, READ_BATCH):
                    for k, data in _read_batch(r, start, min(hi, start + READ_BATCH)):
                        where, key = f"{name} record {k}", f"{name}:{k}"
                        if isinstance(data, Exception):
                            yield Item(key, p, None, error=f"{where}: unreadable ({data})")
                        else:
                            yield self.features.item(data, key, p, where)


def _read_batch(r: Any, start: int, end: int) -> list[tuple[int, bytes | Exception]]:
    """(record number, bytes) of records [start, end), or the exception of each record that
    fails: a batch that fails is read again record by record, so one damaged record costs only
    itself."""
    try:
        return list(zip(range(start, end), r.read(start, end)))
    except Exception:  # array_record raises RuntimeError/ValueError from C++
        pass
    out: list[tuple[int, bytes | Exception]] = []
    for k in range(start, end):
        try:
            out.append((k, r.read([k])[0]))
        except Exception as e:
            out.append((k, e))
    return out


class _Unreadable(Exception):
    """An ArrayRecord file array_record cannot open; the message names it."""


class _reader:
    """An ArrayRecordReader as a context manager."""

    def __init__(self, path: str):
        try:
            from array_record.python.array_record_module import ArrayRecordReader
        except ImportError:
            raise ImportError("ArrayRecord sources need array_record: pip install 'tbljax[tfds]'") from None
        self.path = path
        self.reader = ArrayRecordReader(path)
        if not self.reader.ok():  # a file it cannot read opens "not ok"; close() says why
            try:
                self.reader.close()
                why = "array_record cannot read it"
            except Exception as e:
                why = str(e)
            raise _Unreadable(f"{remote.name_of(path)}: not a readable ArrayRecord file ({why})")

    def __enter__(self) -> Any:
        return self.reader

    def __exit__(self, *exc: Any) -> None:
        self.reader.close()


def resolve(
    sources: Any,
    classes: list[str] | None,
    image_key: str | None,
    label_key: str | None,
    fields: Sequence[str] | Mapping[str, str] = (),
    retry: remote.Retry = remote.DEFAULT_RETRY,
) -> TFRecordSource | ArrayRecordSource | None:
    """The TFDS source `sources` names (TFRecord or ArrayRecord paths and patterns), or None."""
    paths = paths_of(sources, _is_tfrecord)
    if paths is not None:
        return TFRecordSource(paths, classes, image_key, label_key, fields, retry)
    paths = paths_of(sources, _is_array_record)
    if paths is not None:
        return ArrayRecordSource(paths, classes, image_key, label_key, fields)
    return None

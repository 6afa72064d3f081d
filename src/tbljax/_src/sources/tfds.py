"""TFDS sources without TensorFlow: TFRecord files (`*.tfrecord*`) and ArrayRecord files
(`*.array_record*`, read by the `array_record` package) of `tf.train.Example` protos, parsed
with `protobuf` (`tf_example.py`).

The image is the bytes feature `image_key` (default: TFDS's `image`, else the classic
`image/encoded`), the label the int64 or bytes feature `label_key` (default: `label`, else
`image/class/label`). A TFDS data folder describes the features beside the files:
`features.json` (or `dataset_info.json`) names the Image and ClassLabel features, and
`<label>.labels.txt` holds the ClassLabel's names, which become the classes.

TFRecord framing, per record: length (u64 little-endian), masked CRC-32C of the length, data,
masked CRC-32C of the data. Both checksums are checked (`google-crc32c`): a record whose data
fails is skipped and listed like a bad image, naming file and record number; a length that
fails leaves nothing to resynchronise on, so the rest of that file is skipped; a length past
the end of the file is a truncated record. An ArrayRecord file array_record cannot open is one
bad item, and a damaged record only itself. `--shard i/n`
takes whole TFRecord files, and contiguous records of ArrayRecord files (random access).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tbljax._src.remote import remote
from tbljax._src.rules.partition import host_part
from tbljax._src.sources.items import Item, Label, paths_of, share
from tbljax._src.sources.tf_example import example_class

__all__ = ["IMAGE_KEYS", "LABEL_KEYS", "ArrayRecordSource", "TFRecordSource", "field_kinds", "masked_crc32c", "resolve"]

IMAGE_KEYS = ("image", "image/encoded")  # TFDS's, then the classic (TF-slim) one
LABEL_KEYS = ("label", "image/class/label")
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


class _Features:
    """Which features of an Example are the image, the label and the fields; the classes."""

    def __init__(
        self,
        first: str,
        image_key: str | None,
        label_key: str | None,
        fields: Sequence[str] | Mapping[str, str],
        classes: list[str] | None,
    ):
        info = {} if remote.is_url(first) else _tfds_folder(os.path.dirname(first))
        self.image_keys = (image_key,) if image_key else tuple(info.get("image", ())) or IMAGE_KEYS
        self.label_keys = (label_key,) if label_key else tuple(info.get("label", ())) or LABEL_KEYS
        self.label_required = label_key is not None
        # Field name -> the feature holding it (a geometric field's key=, e.g. 'objects/bbox').
        self.feature = dict(fields) if isinstance(fields, Mapping) else {f: f for f in fields}
        self.fields = list(self.feature)
        self.kinds: dict[str, str] | None = None if self.fields else {}  # see `field_kinds`
        names = info.get("names")
        if classes is not None and names is not None and list(classes) != names:
            raise ValueError(
                f"classes= differs from the ClassLabel names in {os.path.dirname(first)} "
                "(the records' ids are kept as they are, so the names must match)"
            )
        self.classes = classes if classes is not None else names

    def item(self, data: bytes, key: str, source: str, where: str) -> Item:
        try:
            feats = example_class().FromString(data).features.feature
        except Exception as e:  # protobuf's DecodeError, whichever runtime is loaded
            return Item(key, source, None, error=f"{where} is not a tf.train.Example ({e})")
        image = next((k for k in self.image_keys if k in feats), None)
        if image is None:
            return Item(
                key,
                source,
                None,
                error=f"{where} has no image feature (looked for "
                f"{list(self.image_keys)}; it has {sorted(feats)[:12]}): name it with image_key=",
            )
        values = _values(feats[image])
        if len(values) != 1 or not isinstance(values[0], bytes):
            return Item(key, source, None, error=f"{where}: feature {image!r} is not one bytes value")
        label, problem = self._label(feats, where)
        fields = {f: _field_value(feats[k]) for f, k in self.feature.items() if k in feats}
        return Item(
            key,
            source,
            values[0] or None,
            label,
            label_error=problem,
            fields=fields,
            error=None if values[0] else f"{where}: feature {image!r} is empty",
        )

    def _label(self, feats: Any, where: str) -> tuple[Label, str | None]:
        k = next((k for k in self.label_keys if k in feats), None)
        if k is None:
            return -1, f"{where} has no feature {self.label_keys[0]!r}" if self.label_required else None
        values = _values(feats[k])
        if len(values) != 1:
            return -1, f"{where}: label feature {k!r} holds {len(values)} values, not one"
        v = values[0]
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8").strip()
            except UnicodeDecodeError:
                return -1, f"{where}: label feature {k!r} is not UTF-8 text"
            return (v, None) if v and "\n" not in v else (-1, f"{where}: label {v!r:.60} is not a class name")
        if isinstance(v, float):
            return -1, f"{where}: label feature {k!r} is a float ({v}), not an id or a name"
        return v, None


def _field_value(feature: Any) -> Any:
    """A feature as a field value: a bytes_list of one value as its bytes (a str field reads
    it as UTF-8), int64_list / float_list as a 1-D int64 / float32 array."""
    kind = feature.WhichOneof("kind")
    if kind in _ARRAY_DTYPES:
        return np.asarray(getattr(feature, kind).value, _ARRAY_DTYPES[kind])
    v = _values(feature)
    return v[0] if len(v) == 1 else v


_ARRAY_DTYPES = {"int64_list": np.int64, "float_list": np.float32}


def field_kinds(source: Any) -> dict[str, str]:
    """The kinds of `source`'s fields (fields=), from its first readable record: bytes → str,
    int64_list / float_list → ndarray. Cached on the source's `_Features`, which its shares
    keep."""
    features = source.features
    if features.kinds is None:
        first = next((item for item in source if item.error is None), None)
        if first is None and features.fields:
            raise ValueError(
                f"fields= {features.fields}: {source.describe()[0]} has no readable "
                "record to take the fields' kinds from"
            )
        kinds = {}
        for f in features.fields:
            if f not in first.fields:
                raise ValueError(
                    f"fields= names {features.feature[f]!r}, which the first record ({first.key}) does not have"
                )
            kinds[f] = "ndarray" if isinstance(first.fields[f], np.ndarray) else "str"
        features.kinds = kinds
    return features.kinds


def _values(feature: Any) -> list[Any]:
    kind = feature.WhichOneof("kind")
    return list(getattr(feature, kind).value) if kind else []


def _tfds_folder(folder: str) -> dict[str, Any]:
    """What a TFDS data folder says: the Image and ClassLabel feature names and the label's
    class names ({"image": [...], "label": [...], "names": [...]}), or {} when it is not one."""
    spec = None
    for name in ("features.json", "dataset_info.json"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as f:
                doc = json.load(f)
            spec = doc.get("features", doc) if name == "dataset_info.json" else doc
            if spec:
                break
    if not spec:
        return {}
    kinds = dict(_feature_kinds(spec))
    out: dict[str, Any] = {
        k: [n for n, c in kinds.items() if c.endswith(cls)]
        for k, cls in (("image", ".Image"), ("label", ".ClassLabel"))
    }
    if len(out["label"]) == 1:
        p = os.path.join(folder, f"{out['label'][0].replace('/', '-')}.labels.txt")
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as f:
                out["names"] = [line.strip() for line in f if line.strip()]
    return out


def _feature_kinds(node: Any, name: str = "") -> Iterator[tuple[str, str]]:
    """(feature name, its class name) of a TFDS feature spec, in both of TFDS's JSON forms:
    {"pythonClassName", "featuresDict": {"features": {...}}} and {"type", "content": {...}}."""
    if not isinstance(node, dict):
        return
    cls = node.get("pythonClassName") or node.get("type")
    if isinstance(cls, str) and not cls.endswith("FeaturesDict"):
        yield name, cls
        return
    children = (node.get("featuresDict") or {}).get("features") or node.get("content") or (node if cls is None else {})
    for k, v in children.items() if isinstance(children, dict) else ():
        yield from _feature_kinds(v, f"{name}/{k}" if name else k)


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
        features: _Features | None = None,
    ):
        self.paths, self.retry = list(paths), retry
        missing = [p for p in self.paths if not remote.is_url(p) and not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"TFRecord file not found: {missing[0]}")
        self.features = features or _Features(self.paths[0], image_key, label_key, fields, classes)
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
        features: _Features | None = None,
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
        self.features = features or _Features(self.paths[0], image_key, label_key, fields, classes)
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

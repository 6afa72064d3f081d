"""Source files for conversion tests, written here through independent encoders (protobuf's
wire format and TFRecord's framing written out from the public schema; Parquet footers edited
through the Thrift compact protocol's bytes), and the hostile ones of issue 46: a damaged
ArrayRecord record, Parquet footers that lie about their rows, a TFRecord length of 2**40
with a valid checksum, files that are not what their name says."""

from __future__ import annotations

import struct

import numpy as np


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 on the wire: two's complement
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _ld(number: int, payload: bytes) -> bytes:  # a length-delimited field (wire type 2)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(features: dict[str, bytes | int | list[float]]) -> bytes:
    """tf.train.Example's bytes, from feature.proto and example.proto: Example{features=1}
    Features{map<string, Feature> feature=1} Feature{oneof bytes_list=1, float_list=2,
    int64_list=3}, BytesList{repeated bytes value=1}, FloatList{repeated float value=1
    [packed]}, Int64List{repeated int64 value=1 [packed]}."""
    entries = b""
    for key, v in features.items():
        if isinstance(v, bytes):
            feature = _ld(1, _ld(1, v))
        elif isinstance(v, list):
            feature = _ld(2, _ld(1, struct.pack(f"<{len(v)}f", *v)))
        else:
            feature = _ld(3, _ld(1, _varint(v)))
        entries += _ld(1, _ld(1, key.encode()) + _ld(2, feature))
    return _ld(1, entries)


def masked(data: bytes) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_header(length: int) -> bytes:
    head = struct.pack("<Q", length)
    return head + struct.pack("<I", masked(head))


def tfrecord(records: list[bytes]) -> bytes:
    return b"".join(tfrecord_header(len(r)) + r + struct.pack("<I", masked(r)) for r in records)


def jpegs(n: int, side: int = 8, seed: int = 0) -> list[bytes]:
    """n small JPEGs of noise (each distinct), encoded by Pillow."""
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(b, "JPEG")
        out.append(b.getvalue())
    return out


# ---- hostile files ---------------------------------------------------------------------------


def damaged_array_record(path, images: list[bytes]) -> None:
    """The images as Examples (label = index % 3), one record a chunk (group_size:1), with 64
    bytes zeroed a third of the way into the records' bytes."""
    from array_record.python.array_record_module import ArrayRecordWriter

    w = ArrayRecordWriter(str(path), "group_size:1")
    for k, b in enumerate(images):
        w.write(example({"image": b, "label": k % 3}))
    w.close()
    raw = bytearray(path.read_bytes())
    at = sum(len(b) for b in images) // 3
    raw[at : at + 64] = bytes(64)
    path.write_bytes(bytes(raw))


def unreadable_array_records(path) -> list[int]:
    """The records of an ArrayRecord file that array_record fails to read one at a time."""
    from array_record.python.array_record_module import ArrayRecordReader

    r = ArrayRecordReader(str(path))
    bad = []
    for k in range(r.num_records()):
        try:
            r.read([k])
        except Exception:
            bad.append(k)
    r.close()
    return bad


def parquet(path, images: list[bytes], label: bool = True) -> None:
    """A Parquet file as `datasets` writes one: an Image column (and a ClassLabel 'label'), one
    row group."""
    import datasets

    feats = {"image": datasets.Image()}
    cols = {"image": [{"bytes": b, "path": None} for b in images]}
    if label:
        feats["label"] = datasets.ClassLabel(names=["a", "b", "c"])
        cols["label"] = [k % 3 for k in range(len(images))]
    datasets.Dataset.from_dict(cols, features=datasets.Features(feats)).to_parquet(str(path), batch_size=len(images))


def forge_parquet_rows(path, real: int, declared: int, values_too: bool) -> None:
    """Rewrites the footer's row counts from `real` to `declared`: FileMetaData.num_rows and
    RowGroup.num_rows (field 3, i64), and with values_too every ColumnMetaData.num_values
    (field 5, i64) as well, so that the footer agrees with itself. In the Thrift compact
    protocol each is the field header 0x16 (id delta 1, type i64) then a zigzag varint; a
    footer of one row group of `real` rows holds it at exactly these places."""
    import pyarrow.parquet as pq

    sizes = _column_sizes(pq.ParquetFile(path).metadata)
    raw = path.read_bytes()
    size = struct.unpack("<I", raw[-8:-4])[0]
    footer = raw[-8 - size : -8]
    old, new = (b"\x16" + _varint((n << 1) ^ (n >> 63)) for n in (real, declared))
    parts = footer.split(old)
    # Order in the footer: FileMetaData.num_rows, then the row group's column chunks'
    # num_values, then RowGroup.num_rows.
    assert len(parts) - 1 >= 3, "a footer of one row group was expected"
    last = len(parts) - 2
    footer = parts[0] + b"".join((new if values_too or k in (0, last) else old) + p for k, p in enumerate(parts[1:]))
    path.write_bytes(raw[: -8 - size] + footer + struct.pack("<I", len(footer)) + b"PAR1")
    meta = pq.ParquetFile(path).metadata  # the edit hit the counts and nothing else
    rg = meta.row_group(0)
    assert meta.num_rows == rg.num_rows == declared and _column_sizes(meta) == sizes
    assert all(rg.column(c).num_values == (declared if values_too else real) for c in range(rg.num_columns))


def _column_sizes(meta) -> list[tuple[int, ...]]:
    rg = meta.row_group(0)
    return [
        (c.file_offset, c.data_page_offset, c.total_compressed_size, c.total_uncompressed_size)
        for c in map(rg.column, range(rg.num_columns))
    ]

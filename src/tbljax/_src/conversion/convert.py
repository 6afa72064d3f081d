"""Convert: decode a dataset once into a TBL file.

Items stream from a source (`sources/`, chosen by `sources/choose.py`) in chunks, ahead of
the writer, and become records (`image_records.py`: the C++ pool decodes, resizes and
re-encodes them with the GIL released); good records are written in source order by the
streaming writer, bad ones skipped and reported (`record_writer.RecordWriter`). A TBL file as
the source is decoded record for record into RAW (`convert_tbl.py`). Labels leave as ids against one classes table
(`label_table.LabelTable`); progress goes to stderr in the form that suits where it goes
(`progress.Progress`). The arguments are checked once, in `convert_options.ConvertOptions`.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tbljax._src.conversion.convert_options import (
    CHUNK,
    ConversionError,
    ConvertOptions,
    ConvertSummary,
    OutputExistsError,
    num_classes,
)
from tbljax._src.conversion.convert_tbl import convert_tbl, tbl_paths
from tbljax._src.conversion.geometric_fields import GeometricFields
from tbljax._src.conversion.image_records import (
    Encoded,
    decode_chunk,
    encode_chunk,
)
from tbljax._src.conversion.label_table import LabelTable
from tbljax._src.conversion.progress import Progress, progress_mode
from tbljax._src.conversion.record_writer import RecordWriter
from tbljax._src.file import fields as _fields
from tbljax._src.file.format import Writer
from tbljax._src.remote import remote
from tbljax._src.rules import contract
from tbljax._src.sources import choose
from tbljax._src.sources.coco import CocoSource
from tbljax._src.sources.items import Item, load_classes


def _prefetch(it: Iterable[Any], depth: int = 2) -> Iterator[Any]:
    """Runs `it` in a background thread `depth` items ahead (TAR reading overlaps decoding)."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for x in it:
                while not stop.is_set():
                    try:
                        q.put(x, timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # handed to the consumer, raised there
            q.put(e)

    t = threading.Thread(target=produce, name="tbljax-convert-reader", daemon=True)
    t.start()
    try:
        while True:
            x = q.get()
            if x is done:
                return
            if isinstance(x, BaseException):
                raise x
            yield x
    finally:
        stop.set()
        t.join(timeout=5)


def _decode_ahead(
    chunks: Iterable[list[Item]], decode: Any, executor: ThreadPoolExecutor
) -> Iterator[tuple[list[Item], Any]]:
    """(chunk, decode(chunk)) in order, the next chunk decoding (GIL released, all cores)
    while the caller writes this one, so the decode pool does not idle during writes."""
    pending = None
    for chunk in chunks:
        future = executor.submit(decode, chunk)
        if pending is not None:
            yield pending[0], pending[1].result()
        pending = (chunk, future)
    if pending is not None:
        yield pending[0], pending[1].result()


def _chunks(items: Iterable[Item], n: int) -> Iterator[list[Item]]:
    """Lists of up to n items; the first ones smaller so decoding starts while reading goes on."""
    size = min(16, n)
    chunk: list[Item] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
            size = min(2 * size, n)
    if chunk:
        yield chunk


def convert(
    sources: Any,
    dst: str | os.PathLike,
    *,
    image_size: int | None = None,
    resize: str = contract.DEFAULT_RESIZE,
    max_long_side: int | None = None,
    format: str = "raw",  # noqa: A002 - the natural name
    quality: int | None = None,
    chroma: str | None = None,
    raw_budget: float | None = None,
    threads: int | None = None,
    strict: bool = False,
    overwrite: bool = False,
    labels: Sequence[int | str] | None = None,
    classes: Sequence[str] | str | os.PathLike | None = None,
    label_ext: str | None = None,
    shard: tuple[int, int] | str | None = None,
    progress: bool | None = None,
    progress_interval: float | None = None,
    retries: int = 5,
    retry_backoff: float = 0.5,
    image_column: str | None = None,
    label_column: str | None = None,
    image_key: str | None = None,
    label_key: str | None = None,
    fields: dict[str, str] | list[str] | None = None,
) -> ConvertSummary:
    """Decodes `sources` once into the TBL file `dst`.

    sources: WebDataset TAR shards (a path, a brace pattern such as 'train-{000..099}.tar' —
      expanded exactly as bash does —, or a list; or URLs read through fsspec, e.g.
      'gs://bucket/train-{0000..1023}.tar', s3://, https://, file://, memory://, with glob
      characters matched where the filesystem can list), an image folder with one subfolder per
      class, a list of image files, or images in memory: a uint8 (N, H, W, 3) or (N, H, W)
      array, a list of (H, W[, C]) arrays or (B, H, W, C) batches, a tuple (images, labels) or
      a dict {'image': images, 'label': labels}. A source named twice is an error.
      Hugging Face: a `datasets.Dataset` or `IterableDataset`, or Parquet files
      ('data/train-*.parquet', local or URLs); TFDS: TFRecord ('*.tfrecord*') or ArrayRecord
      ('*.array_record*') files of tf.train.Example (no TensorFlow). See the reference's
      "From Hugging Face / TFDS".
      A TBL file (or shard files, '*.tbl') is decoded record for record into a RAW (or lz4)
      file: same labels, keys, order and geometry (see `format`); image_size, resize and the
      other recipe arguments do not apply to it.
    image_size: output side S (required unless the source is a TBL file). resize:
      'center_crop' (shorter side to S, then the centre S×S; default), 'squash' (S×S ignoring
      aspect), 'max_side' (longer side S, aspect kept) or 'shorter_side' (shorter side S,
      aspect kept). The last two give each record its own size (`Dataset.image_shape` None).
    max_long_side: with resize='shorter_side', a cap L >= S on the longer side: an image whose
      longer side would pass L gets longer side L and a shorter side under S (torchvision's
      Resize(S, max_size=L)). None: no cap.
    format: 'raw' (decoded uint8: fastest to serve), 'jpeg' (JPEG records: smallest), or 'lz4'
      (LZ4-compressed RAW). With format='jpeg', quality=None keeps the original JPEG bytes
      (decoded with this recipe when served; fixed-size modes only), and quality=1..100 makes
      compact records: each image re-encoded by libjpeg-turbo at its converted geometry, so
      serving it is a plain decode; any resize mode.
    chroma: chroma subsampling of compact records: '420' (default) or '444' (sharper colour
      edges, more bytes).
    raw_budget: with compact records, a bound on the records' bytes as a fraction of their
      RAW pixels' (e.g. 0.2): the records costliest to decode (most JPEG bytes per pixel) are
      stored as their pixels, uncompressed, while the records stay within that fraction (a
      running total in source order). They serve with no decode at all; a JPEG record serves
      the pixels it decodes to, a RAW one the converted pixels themselves. None: every record
      a JPEG.
    labels: integer ids or class names for arrays and file lists.
    classes: the class names, in id order: a list, or a text file of one name per line. Names
      met in the data (TAR `.cls`/`.json` holding e.g. 'n01440764', labels= names, subfolders)
      take their id from it. Without it, names get ids in sorted order and integer ids stay as
      they are (`Dataset.classes` is then None: no names are invented). A sharded conversion
      of TAR shards labelled by name needs it, so that every job gives a name the same id.
    label_ext: the TAR member that holds the label (e.g. 'txt'); default: the first of .cls,
      .cls2, .label, .json. Records whose label member cannot be read are written with label
      -1 and listed in `summary.label_errors` (strict=True stops on them).
    image_column, label_column: the image and label columns of a Hugging Face dataset or
      Parquet file (default: its Image and ClassLabel features; a ClassLabel's names become the
      classes, ids kept). image_key, label_key: the image and label features of
      tf.train.Examples (default: 'image' else 'image/encoded'; 'label' else
      'image/class/label'; a TFDS folder's features.json and <label>.labels.txt give names).
    fields: {name: extension} of the record's other fields: for TAR shards the member with that
      extension (the member name after the key, e.g. 'txt', 'json', 'emb.npy'), for an image
      folder the sidecar file beside each image (a/img1.jpg + a/img1.txt). .txt is a str field
      (UTF-8), .json a json field, .npy an ndarray field (numeric; one shape in every record:
      fixed; a first dimension that varies: ragged). A dict source needs none: its keys besides
      image and label are its fields ({'image': imgs, 'caption': [...], 'emb': (N, 768)}).
      A Hugging Face dataset, Parquet, TFRecord or ArrayRecord source takes a list of column
      (feature) names: a string column is a str field, numbers or lists/arrays of numbers an
      ndarray field at the column's dtype, other lists and structs a json field; a
      tf.train.Example bytes_list is a str field (UTF-8), int64_list / float_list a 1-D
      ndarray field (int64 / float32). A record whose field is missing or unreadable (bad
      UTF-8/JSON/.npy, a dtype or trailing shape that disagrees with the field's) is skipped
      like a bad image; an extension that no record has is a ConversionError. A TBL source keeps its fields.
    Bad items (corrupt, truncated, empty, not an image) are skipped and listed in the summary
    and in the file; with strict=True the first chunk holding one stops the conversion with
    ConversionError and nothing is written. A conversion that would write no record raises
    ConversionError. An existing dst is kept unless overwrite=True, and is replaced only when
    the new file is complete.
    shard: (i, n) or "i/n" converts only the i-th of n contiguous shares of the sources (whole
      TAR files for shards; items otherwise), so n jobs on any runner convert in parallel;
      `tbljax.open([part_0, ..., part_n-1])` then reads exactly the single-job dataset.
      A '{shard}' in dst becomes 'iiiii-of-nnnnn'.
    progress: None or True: report on stderr — a line redrawn on a terminal, a tqdm bar in
      Jupyter (when tqdm is installed), and elsewhere (Slurm logs, CI) one line every
      progress_interval seconds (default 10; 0.5 on a terminal) with count, rate and ETA.
      False: silent.
    retries, retry_backoff: a shard at a URL whose connection drops is re-opened and resumed
      at the byte where it broke, after retry_backoff seconds (doubled each time, at most 30);
      after `retries` failures in a row with no byte read between them the rest of the shard
      is skipped and reported like a bad item (strict=True: ConversionError).

    >>> s = tbljax.convert("train-{000..099}.tar", "train.tbl", image_size=160)
    >>> print(s)
    >>> tbljax.convert("train/", "train-256-q90.tbl", image_size=256, resize="max_side",
    ...                format="jpeg", quality=90)        # compact records, the whole photo
    >>> tbljax.convert("train-256-q90.tbl", "train-256.tbl", format="raw")  # back to RAW
    """
    dst = os.fspath(dst)
    tbl_files = tbl_paths(sources)
    opts = ConvertOptions(
        image_size=image_size,
        resize=resize,
        max_long_side=max_long_side,
        format=format,
        quality=quality,
        chroma=chroma,
        raw_budget=raw_budget,
        threads=threads,
        strict=strict,
        overwrite=overwrite,
        labels=labels,
        classes=classes,
        label_ext=label_ext,
        shard=shard,
        progress=progress,
        progress_interval=progress_interval,
        retries=retries,
        retry_backoff=retry_backoff,
        image_column=image_column,
        label_column=label_column,
        image_key=image_key,
        label_key=label_key,
        fields=fields,
        from_tbl=tbl_files is not None,
        declared=sources.geometric if isinstance(sources, CocoSource) else {},
    )
    if opts.shard is not None:
        dst = dst.replace("{shard}", f"{opts.shard[0]:05d}-of-{opts.shard[1]:05d}")
    if os.path.isdir(dst):  # said before "exists": overwrite= would not help
        raise IsADirectoryError(f"{dst} is a directory: the output must be a file path")
    if os.path.exists(dst) and not opts.overwrite:
        raise OutputExistsError(dst)
    out_dir = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(out_dir):
        raise FileNotFoundError(f"destination directory does not exist: {out_dir}")
    if tbl_files is not None:
        return convert_tbl(tbl_files, dst, opts)
    return _convert_images(sources, dst, opts)


def _convert_images(sources: Any, dst: str, opts: ConvertOptions) -> ConvertSummary:
    """Decodes the images of `sources` (all checked in `opts`) into the TBL file `dst`."""
    retry = remote.Retry(opts.retries, opts.retry_backoff)
    table = load_classes(opts.classes)
    ext = opts.label_ext.lower() if opts.label_ext else None
    src = choose.resolve(
        sources,
        labels=opts.labels,
        classes=table,
        label_ext=ext,
        fields=opts.fields,
        image_column=opts.image_column,
        label_column=opts.label_column,
        image_key=opts.image_key,
        label_key=opts.label_key,
        retry=retry,
        geometric=opts.geometric,
    )
    if opts.shard is not None:
        src = src.select(*opts.shard)
    bar = Progress(0, progress_mode(opts.progress), opts.progress_interval)
    total = src.count(bar.counting if src.count_is_slow else None)
    if total == 0:
        # A shard unreadable from its first byte is no TAR file: say so, not "no images".
        unreadable = [f"{p} is not a TAR file ({why})" for p, (n, why) in getattr(src, "cut_short", {}).items()]
        what = "; ".join(unreadable) or f"the sources hold no images ({_describe(src)})"
        raise ConversionError(f"no record to write: {what}; {dst} was not written")
    t0 = time.perf_counter()
    exts = opts.fields if isinstance(opts.fields, dict) else {}  # TAR members, sidecar files
    geo = GeometricFields(opts.geometric, int(opts.image_size), opts.resize, opts.max_long_side or 0)
    columns = _fields.Columns(
        {**src.field_kinds, **geo.kinds}, exts, os.path.dirname(os.path.abspath(dst)), geo.roles, geo.encodings
    )
    records = RecordWriter(dst, opts, LabelTable(src.classes, sharded=opts.shard is not None), columns, geo)
    bar.start(total)
    with (
        records.columns,
        Writer(dst, total, overwrite=opts.overwrite) as w,
        ThreadPoolExecutor(opts.pool_threads) as pool,
        ThreadPoolExecutor(1, thread_name_prefix="tbljax-convert-decode") as decoder,
    ):
        decode = functools.partial(_decode_records, opts=opts, pool=pool)
        for chunk, results in _decode_ahead(_prefetch(_chunks(src, CHUNK)), decode, decoder):
            records.add(chunk, results, w)
            bar.update(records.seen, len(records.skipped))
        out_labels, out_classes = records.finish(w, src)
    bar.update(records.seen, len(records.skipped), final=True)
    return ConvertSummary(
        dst=dst,
        written=len(records.keys),
        skipped=records.skipped,
        seconds=time.perf_counter() - t0,
        bytes=os.path.getsize(dst),
        label_errors=records.label_errors,
        classes=out_classes,
        num_classes=num_classes(out_labels, out_classes),
        labels_from=getattr(src, "LABELS_FROM", ()),
        left_out=getattr(src, "left_out", []),
    )


def _decode_records(
    chunk: list[Item], *, opts: ConvertOptions, pool: ThreadPoolExecutor
) -> list[np.ndarray | Encoded | str]:
    """A chunk's records as the file stores them: pixels, or (quality=) compact JPEG records;
    a string for an item that failed, saying why."""
    threads = opts.threads or 0
    pixels = decode_chunk(chunk, int(opts.image_size), opts.resize, threads, pool, opts.max_long_side or 0)
    if opts.quality is None:
        return pixels  # type: ignore[return-value]
    return encode_chunk(
        pixels,
        opts.quality,
        opts.chroma,
        threads,  # type: ignore[arg-type]
        keep_pixels=opts.raw_budget is not None,
    )


def _describe(src: Any) -> str:
    d = src.describe()
    return ", ".join(d[:3]) + (f" and {len(d) - 3} more" if len(d) > 3 else "")

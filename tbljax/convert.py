"""convert: decode a dataset once into a TBL file.

Items stream from a source (tbljax.sources) in chunks; JPEGs are decoded and resized in the
C++ pool with the GIL released, other formats through Pillow with the same C++ resize; good
records are written in source order by the streaming writer, bad ones skipped and reported.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tbljax import _core, sources as _sources
from tbljax.format import Writer

RESIZE_MODES = ("center_crop", "squash", "max_side")
RECORD_FORMATS = ("raw", "jpeg", "lz4")
CHUNK = 32  # items decoded per call into the C++ pool: peak RSS flat in N (256 grew it 2.3x at 4x N)


class ConversionError(RuntimeError):
    """A strict conversion met bad input; `.skipped` lists every bad item (key, source, reason)."""

    def __init__(self, message: str, skipped: list[dict[str, str]]):
        super().__init__(message)
        self.skipped = skipped


@dataclasses.dataclass
class ConvertSummary:
    """What a conversion did."""

    dst: str
    written: int
    skipped: list[dict[str, str]]
    seconds: float
    bytes: int

    @property
    def images_per_second(self) -> float:
        return (self.written + len(self.skipped)) / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        lines = [f"wrote {self.written} records to {self.dst} ({self.bytes / 2**20:.1f} MiB) in "
                 f"{self.seconds:.1f} s ({self.images_per_second:.0f} img/s); skipped {len(self.skipped)}"]
        for s in self.skipped[:20]:
            lines.append(f"  skipped {s['key']} ({s['source']}): {s['reason']}")
        if len(self.skipped) > 20:
            lines.append(f"  ... and {len(self.skipped) - 20} more (Dataset.skipped lists all)")
        return "\n".join(lines)


def _is_jpeg(data: Any) -> bool:
    return isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:3]) == b"\xff\xd8\xff"


def _source_size(data: Any) -> tuple[int, int]:
    """(width, height) of a source image as displayed, from its header only; (0, 0) if unknown."""
    if isinstance(data, np.ndarray):
        return int(data.shape[1]), int(data.shape[0])
    if _is_jpeg(data):
        info = _core.jpeg_info(data)
        return int(info["width"]), int(info["height"])
    try:
        from PIL import Image
        import io

        with Image.open(io.BytesIO(data)) as im:
            return im.size
    except Exception:  # only statistics: an unreadable header just goes uncounted
        return 0, 0


SIZE_BINS = [0, 128, 256, 384, 512, 768, 1024, 2048, 4096]


def size_histogram(widths: Sequence[int], heights: Sequence[int]) -> dict[str, Any]:
    """Source-size statistics kept in the recipe (shown by `tbljax info`)."""
    w, h = np.asarray(widths, np.int64), np.asarray(heights, np.int64)
    known = (w > 0) & (h > 0)
    w, h = w[known], h[known]
    edges = SIZE_BINS + [np.iinfo(np.int64).max]
    return {
        "count": int(w.size),
        "bins": SIZE_BINS,
        "longer_side": np.histogram(np.maximum(w, h), edges)[0].tolist(),
        "shorter_side": np.histogram(np.minimum(w, h), edges)[0].tolist(),
        "median_wh": [int(np.median(w)), int(np.median(h))] if w.size else [0, 0],
        "min_wh": [int(w.min()), int(h.min())] if w.size else [0, 0],
        "max_wh": [int(w.max()), int(h.max())] if w.size else [0, 0],
    }


def _pil_decode(data: bytes) -> np.ndarray:
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise ValueError("not a JPEG; other formats need Pillow (pip install 'tbljax[pil]')") from None
    import io

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            im = ImageOps.exif_transpose(im)
            return np.asarray(im.convert("RGB"))
    except Exception as e:  # Pillow raises many types for bad data; all mean "cannot decode"
        raise ValueError(f"cannot decode image: {type(e).__name__}: {e}") from None


def _as_rgb(img: np.ndarray) -> np.ndarray:
    if img.ndim == 2:
        img = img[:, :, None]
    if img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    elif img.shape[2] == 4:
        img = img[:, :, :3]
    return np.ascontiguousarray(img)


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


def _decode_ahead(chunks: Iterable[list[_sources.Item]], decode: Any,
                  executor: ThreadPoolExecutor) -> Iterator[tuple[list[_sources.Item], Any]]:
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


def _chunks(items: Iterable[_sources.Item], n: int) -> Iterator[list[_sources.Item]]:
    """Lists of up to n items; the first ones smaller so decoding starts while reading goes on."""
    size = min(16, n)
    chunk: list[_sources.Item] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
            size = min(2 * size, n)
    if chunk:
        yield chunk


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.t0 = self.last = time.perf_counter()

    def update(self, done: int, skipped: int, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self.last < 0.5):
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        pct = 100.0 * done / self.total if self.total else 100.0
        sys.stderr.write(f"\rconvert: {done}/{self.total} ({pct:.0f}%) {rate:.0f} img/s, {skipped} skipped")
        if force:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _decode_chunk(chunk: list[_sources.Item], size: int, mode: str, threads: int,
                  pool: ThreadPoolExecutor) -> list[np.ndarray | str]:
    """Decoded + resized pixels for each item, or the reason it failed."""
    out: list[np.ndarray | str | None] = [None] * len(chunk)
    for i, item in enumerate(chunk):
        if item.error is not None:
            out[i] = item.error
        elif item.data is None or (not isinstance(item.data, np.ndarray) and len(item.data) == 0):
            out[i] = "empty (zero-byte) image"
    jpeg_rows = [i for i, it in enumerate(chunk) if out[i] is None and _is_jpeg(it.data)]
    if jpeg_rows and mode != "max_side":
        buf = np.empty((len(jpeg_rows), size, size, 3), np.uint8)
        errors = _core.decode_resize_into([chunk[i].data for i in jpeg_rows], buf, mode, threads)
        for k, (i, err) in enumerate(zip(jpeg_rows, errors)):
            out[i] = buf[k] if err is None else err
    rest = [i for i in range(len(chunk)) if out[i] is None]

    def one(i: int) -> np.ndarray | str:
        data = chunk[i].data
        try:
            if isinstance(data, np.ndarray):
                return _core.resize(_as_rgb(data), size, mode)
            if _is_jpeg(data):
                return _core.decode_resize(data, size, mode)
            return _core.resize(_pil_decode(data), size, mode)
        except (ValueError, _core.DecodeError) as e:
            return str(e)

    for i, r in zip(rest, pool.map(one, rest)):
        out[i] = r
    return out  # type: ignore[return-value]


def convert(
    sources: Any,
    dst: str | os.PathLike,
    *,
    image_size: int,
    resize: str = "center_crop",
    format: str = "raw",  # noqa: A002 - the natural name
    threads: int | None = None,
    strict: bool = False,
    overwrite: bool = False,
    labels: Sequence[int] | None = None,
    shard: tuple[int, int] | str | None = None,
    progress: bool | None = None,
) -> ConvertSummary:
    """Decodes `sources` once into the TBL file `dst`.

    sources: WebDataset TAR shards (a path, a brace pattern such as 'train-{000..099}.tar', or
      a list), an image folder with one subfolder per class, a list of image files, or numpy
      arrays ((N, H, W, 3) uint8 or a list of (H, W[, 3]) arrays) with `labels`.
    image_size: output side S. resize: 'center_crop' (shorter side to S, then the centre S×S;
      default), 'squash' (S×S ignoring aspect) or 'max_side' (longer side S, aspect kept).
    format: 'raw' (decoded uint8: fastest to serve), 'jpeg' (the original JPEG bytes: smallest;
      decoded with this recipe when served), or 'lz4' (LZ4-compressed RAW).
    Bad items (corrupt, truncated, empty, not an image) are skipped and listed in the summary
    and in the file; with strict=True the first chunk holding one stops the conversion with
    ConversionError and nothing is written. An existing dst is kept unless overwrite=True.
    shard: (i, n) or "i/n" converts only the i-th of n contiguous shares of the sources (whole
      TAR files for shards; items otherwise), so n jobs on any runner convert in parallel;
      `tbljax.open([part_0, ..., part_n-1])` then reads exactly the single-job dataset.
      A '{shard}' in dst becomes 'iiiii-of-nnnnn'.

    >>> s = tbljax.convert("train-{000..099}.tar", "train.tbl", image_size=160)
    >>> print(s)
    """
    dst = os.fspath(dst)
    if shard is not None:
        shard = _sources.parse_shard(shard)
        dst = dst.replace("{shard}", f"{shard[0]:05d}-of-{shard[1]:05d}")
    if not isinstance(image_size, (int, np.integer)) or not 1 <= image_size <= 65535:
        raise ValueError(f"image_size must be an int in [1, 65535], got {image_size!r}")
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {RESIZE_MODES}, got {resize!r}")
    if format not in RECORD_FORMATS:
        raise ValueError(f"format must be one of {RECORD_FORMATS}, got {format!r}")
    if format == "jpeg" and resize == "max_side":
        raise ValueError("format='jpeg' serves square batches: use resize='center_crop' or 'squash'")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer))
                                or not 1 <= threads <= 1024):
        raise ValueError(f"threads must be an integer in [1, 1024] or None (all CPUs), got {threads!r}")
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst} already exists (pass overwrite=True to replace it)")
    src = _sources.resolve(sources, labels)
    if shard is not None:
        src = src.select(*shard)
    size = int(image_size)
    nthreads = threads or _core.native_info()["default_threads"]
    progress = sys.stderr.isatty() if progress is None else progress
    total = src.count()

    t0 = time.perf_counter()
    keys: list[str] = []
    out_labels: list[int] = []
    src_w: list[int] = []
    src_h: list[int] = []
    skipped: list[dict[str, str]] = []
    bar = _Progress(total, progress)
    seen = 0
    with Writer(dst, total, overwrite=overwrite) as w, ThreadPoolExecutor(nthreads) as pool, \
            ThreadPoolExecutor(1, thread_name_prefix="tbljax-convert-decode") as decoder:
        def decode(chunk: list[_sources.Item]) -> list[np.ndarray | str]:
            return _decode_chunk(chunk, size, resize, threads or 0, pool)

        for chunk, results in _decode_ahead(_prefetch(_chunks(src, CHUNK)), decode, decoder):
            bad = [{"key": it.key, "source": it.source, "reason": r}
                   for it, r in zip(chunk, results) if isinstance(r, str)]
            if bad and strict:
                skipped.extend(bad)
                raise ConversionError(
                    f"strict conversion stopped: {len(bad)} bad item(s), first {bad[0]['key']} "
                    f"({bad[0]['source']}): {bad[0]['reason']}; {dst} was not written", skipped)
            skipped.extend(bad)
            for it, r in zip(chunk, results):
                if isinstance(r, str):
                    continue
                width, height = _source_size(it.data)
                src_w.append(width)
                src_h.append(height)
                if format == "jpeg" and _is_jpeg(it.data):
                    w.add_encoded(bytes(it.data), "JPEG", width, height)
                else:
                    w.add_raw(r, lz4=(format == "lz4"))
                keys.append(it.key)
                out_labels.append(it.label)
            seen += len(chunk)
            bar.update(seen, len(skipped))
        w.set_metadata(
            labels=np.asarray(out_labels, np.int64), keys=keys, classes=src.classes, skipped=skipped,
            recipe={
                "image_size": size, "resize": resize, "format": format,
                "idct": "islow", "resize_filter": _core.native_info().get("resize_filter", ""),
                "sources": src.describe(), "shard": list(shard) if shard else None,
                "source_sizes": size_histogram(src_w, src_h), "tbljax": _core.native_info()["version"],
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            },
        )
    bar.update(seen, len(skipped), force=True)
    summary = ConvertSummary(dst=dst, written=len(keys), skipped=skipped,
                             seconds=time.perf_counter() - t0, bytes=os.path.getsize(dst))
    return summary

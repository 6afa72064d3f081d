"""convert: decode a dataset once into a TBL file.

Items stream from a source (tbljax.sources) in chunks; JPEGs are decoded and resized in the
C++ pool with the GIL released, other formats through Pillow with the same C++ resize; compact
JPEG records (quality=) are re-encoded at the converted geometry in the same pool; good records
are written in source order by the streaming writer, bad ones skipped and reported. A TBL file
as the source is decoded record for record into RAW (`_convert_tbl`).
Labels arrive as ids or class names and leave as ids against one classes table
(`_LabelTable`); progress goes to stderr in the form that suits where it goes (`_Progress`).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from tbljax import _core
from tbljax._src.rules import contract
from tbljax._src.io import remote
from tbljax._src.io import reader as _reader
from tbljax._src.io import sources as _sources
from tbljax._src.rules.braces import expand_braces
from tbljax._src.io.format import Writer

RESIZE_MODES = ("center_crop", "squash", "max_side", "shorter_side")
FIXED_SIZE_MODES = ("center_crop", "squash")  # every record S x S
RECORD_FORMATS = ("raw", "jpeg", "lz4")
CHROMA = ("420", "444")
_MCU_WIDTH = {"420": 16, "444": 8}  # an MCU's width in pixels at each chroma subsampling
# Compact records carry a restart marker every COMPACT_RESTART_MCUS MCUs (1 where a row's MCU
# count is odd: segments must not span rows), so serving a crop box entropy-decodes only the
# segments it covers (ffi/core/jpeg_restart.h). Measured here: 817 real photos (kodak, half of
# caltech101) at max side 256, q90 4:2:0, RRC boxes resized to 160 px, one thread, medians of 9
# rounds in each of 3 processes. No markers: 15.04 KiB a record, 213-216 us an image. Every MCU:
# +4.7 % bytes, 0.86-0.87x the time; every 2 (odd rows: none) +2.3 %, 0.83-0.84x; every 4 (one
# run) +1.2 %, 0.88x; every 2 (odd rows: 1) +2.7 %, 0.80-0.81x: taken. A whole-image box costs
# 1.08x (restart handling in libjpeg; every MCU: 1.09x).
COMPACT_RESTART_MCUS = 2
CHUNK = 32  # items decoded per call into the C++ pool: peak RSS flat in N (256 grew it 2.3x at 4x N)


class ConversionError(RuntimeError):
    """A conversion that cannot give a sound file: a strict run met bad input, no record could
    be written, or the labels cannot be made into one classes table. `.skipped` lists the bad
    items (key, source, reason). Nothing is left at the destination, and a file that was
    already there (overwrite=True) is kept as it was."""

    def __init__(self, message: str, skipped: list[dict[str, str]] | None = None):
        super().__init__(message)
        self.skipped = list(skipped or [])


@dataclasses.dataclass
class ConvertSummary:
    """What a conversion did. `label_errors` lists the written records whose label could not
    be read (their label is -1), each {'key', 'source', 'reason'}."""

    dst: str
    written: int
    skipped: list[dict[str, str]]
    seconds: float
    bytes: int
    label_errors: list[dict[str, str]] = dataclasses.field(default_factory=list)
    classes: list[str] | None = None
    num_classes: int = 0            # class names, or distinct label ids; 0: no record has a label
    labels_from: str = ""           # where the sources' labels come from (said when there are none)

    @property
    def images_per_second(self) -> float:
        return (self.written + len(self.skipped)) / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        head = (f"wrote {self.written} records to {self.dst} ({self.bytes / 2**20:.1f} MiB) in "
                f"{self.seconds:.1f} s ({self.images_per_second:.0f} img/s); skipped {len(self.skipped)}")
        if self.label_errors:
            head += f"; labels unreadable {len(self.label_errors)}"
        head += f"; classes {self.num_classes}" if self.num_classes else "; unlabelled"
        lines = [head]
        if not self.num_classes and self.written:
            lines.append(f"  unlabelled: every record's label is -1; {self.labels_from}")
        for title, items in (("skipped", self.skipped), ("label unreadable", self.label_errors)):
            for s in items[:20]:
                lines.append(f"  {title} {s['key']} ({s['source']}): {s['reason']}")
            if len(items) > 20:
                where = "Dataset.skipped lists all" if title == "skipped" else "summary.label_errors lists all"
                lines.append(f"  ... and {len(items) - 20} more ({where})")
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


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (whose stderr is no terminal, yet is watched)."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _progress_mode(progress: bool | None) -> str | None:
    """None (off), 'notebook' (a tqdm.auto bar), 'tty' (one line redrawn in place) or 'log'
    (a line every interval: Slurm logs, CI, files)."""
    if progress is False:
        return None
    if _in_notebook():
        try:
            import tqdm.auto  # noqa: F401 - optional
            return "notebook"
        except ImportError:
            return "tty"  # Jupyter renders carriage returns
    try:
        return "tty" if sys.stderr.isatty() else "log"
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return "log"


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


class _Progress:
    """Conversion progress on stderr in the form that suits where it goes (`_progress_mode`):
    count, percentage, rate, skipped items, elapsed time and ETA. `interval` is the time
    between reports (default 0.5 s redrawn on a terminal, 10 s as lines in a log)."""

    def __init__(self, total: int, mode: str | None, interval: float | None,
                 clock: Callable[[], float] = time.monotonic, stream: Any = None):
        self.total, self.mode, self.clock = total, mode, clock
        self.interval = interval if interval is not None else (10.0 if mode == "log" else 0.5)
        self.stream = stream
        self.t0 = self.last = clock()
        self.width = 0
        self.bar: Any = None
        if mode == "notebook":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="img", desc="convert", smoothing=0.1)

    def _write(self, text: str, final: bool = False) -> None:
        out = self.stream or sys.stderr
        if self.mode == "log":
            out.write(text + "\n")
        else:
            out.write("\r" + text.ljust(self.width) + ("\n" if final else ""))
            self.width = 0 if final else len(text)
        out.flush()

    def counting(self, done: int, shards: int) -> None:
        """Reports the pass that counts the images of compressed TAR shards."""
        now = self.clock()
        if self.mode is None or (now - self.last < self.interval and done < shards):
            return
        self.last = now
        self._write(f"convert: counting images in compressed TAR shards: {done}/{shards} shards, "
                    f"{_duration(now - self.t0)}", final=done == shards and self.mode != "log")

    def start(self, total: int) -> None:
        """Conversion proper starts (after any counting pass)."""
        self.total = total
        self.t0 = self.last = self.clock()
        if self.bar is not None:
            self.bar.reset(total=total)

    def update(self, done: int, skipped: int, final: bool = False) -> None:
        if self.mode is None:
            return
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix(skipped=skipped, refresh=False)
            if final:
                self.bar.close()
            return
        now = self.clock()
        if not final and now - self.last < self.interval:
            return
        self.last = now
        elapsed = now - self.t0
        rate = done / elapsed if elapsed > 0 else 0.0
        total = max(self.total, done)  # the count bounds images; samples without one count too
        pct = 100.0 * done / total if total else 100.0
        text = (f"convert: {done}/{total} ({pct:.0f}%), {rate:.0f} img/s, {skipped} skipped, "
                f"{_duration(elapsed)} elapsed")
        if final:
            text += ", done"
        else:
            left = total - done
            text += f", ETA {_duration(left / rate)}" if rate > 0 else ", ETA ?"
        self._write(text, final)


class _LabelTable:
    """Labels as int ids against one classes table.

    With a table (given, or known before reading: an image folder's subfolders, the labels= of
    arrays and file lists) names map through it and ids must lie in [-1, len). Without one,
    ids pass through and names are collected; at the end they get ids in sorted order, so every
    conversion that sees the same names makes the same table. A sharded conversion of TAR
    shards sees only some names, so there a name without a table is an error."""

    def __init__(self, classes: list[str] | None, sharded: bool):
        self.classes = classes
        self.index = {c: i for i, c in enumerate(classes)} if classes is not None else None
        self.sharded = sharded
        self.values: list[int | str] = []
        self.first_id: tuple[str, int] | None = None
        self.first_name: tuple[str, str] | None = None

    def add(self, key: str, label: int | str) -> str | None:
        """Records one written record's label; returns why it is unusable (then it is -1)."""
        if self.index is not None:
            if isinstance(label, str):
                i = self.index.get(label, -1)
                self.values.append(i)
                return None if i >= 0 else f"class name {label!r} is not in classes"
            ok = -1 <= label < len(self.index)
            self.values.append(label if ok else -1)
            return None if ok else f"label id {label} is out of range for {len(self.index)} classes"
        if isinstance(label, str):
            if self.sharded:
                raise ConversionError(
                    f"record {key} is labelled by class name ({label!r}), and this is a sharded "
                    "conversion: each job sees only some names, so tables sorted per job would give "
                    "the same class different ids. Pass the full list of names as classes= (CLI: "
                    "--classes FILE, one name per line)")
            self.first_name = self.first_name or (key, label)
        elif label != -1:
            self.first_id = self.first_id or (key, label)
        if self.first_name and self.first_id:
            raise ConversionError(
                f"labels mix integer ids (record {self.first_id[0]}: {self.first_id[1]}) and class "
                f"names (record {self.first_name[0]}: {self.first_name[1]!r}); pass classes= to say "
                "which id each name has")
        self.values.append(label)
        return None

    def finish(self) -> tuple[np.ndarray, list[str] | None]:
        if self.index is None and self.first_name is not None:
            table = sorted({v for v in self.values if isinstance(v, str)})
            ids = {c: i for i, c in enumerate(table)}
            return np.array([ids[v] if isinstance(v, str) else v for v in self.values], np.int64), table
        return np.asarray(self.values, np.int64).reshape(-1), self.classes


class Encoded(NamedTuple):
    """A compact record: JPEG bytes of an image at its converted geometry."""

    data: bytes
    height: int
    width: int


def _encode_chunk(pixels: list[np.ndarray | str], quality: int, chroma: str,
                  threads: int) -> list[Encoded | str]:
    """Re-encodes the decoded images of a chunk (libjpeg-turbo, C++ pool, GIL released);
    failures pass through."""
    out: list[Encoded | str] = list(pixels)  # type: ignore[arg-type]
    by_interval: dict[int, list[int]] = {}
    for i, img in enumerate(pixels):
        if not isinstance(img, str):
            by_interval.setdefault(_restart_mcus(img.shape[1], chroma), []).append(i)
    for interval, rows in by_interval.items():
        blobs = _core.encode_jpeg_batch([pixels[i] for i in rows], quality, chroma, threads,
                                        restart_mcus=interval)
        for i, blob in zip(rows, blobs):
            img = pixels[i]
            out[i] = Encoded(blob, int(img.shape[0]), int(img.shape[1]))  # type: ignore[union-attr]
    return out


def _restart_mcus(width: int, chroma: str) -> int:
    """The restart interval (in MCUs) of a compact record `width` pixels wide: COMPACT_RESTART_MCUS
    where it divides the MCUs of a row, else 1.

    >>> _restart_mcus(256, "420"), _restart_mcus(171, "420")
    (2, 1)
    """
    per_row = -(-width // _MCU_WIDTH[chroma])
    return COMPACT_RESTART_MCUS if per_row % COMPACT_RESTART_MCUS == 0 else 1


def _decode_chunk(chunk: list[_sources.Item], size: int, mode: str, threads: int,
                  pool: ThreadPoolExecutor, max_long: int = 0) -> list[np.ndarray | str]:
    """Decoded + resized pixels for each item, or the reason it failed."""
    out: list[np.ndarray | str | None] = [None] * len(chunk)
    for i, item in enumerate(chunk):
        if item.error is not None:
            out[i] = item.error
        elif item.data is None or (not isinstance(item.data, np.ndarray) and len(item.data) == 0):
            out[i] = "empty (zero-byte) image"
    jpeg_rows = [i for i, it in enumerate(chunk) if out[i] is None and _is_jpeg(it.data)]
    if jpeg_rows and mode in FIXED_SIZE_MODES:
        buf = np.empty((len(jpeg_rows), size, size, 3), np.uint8)
        errors = _core.decode_resize_into([chunk[i].data for i in jpeg_rows], buf, mode, threads)
        for k, (i, err) in enumerate(zip(jpeg_rows, errors)):
            out[i] = buf[k] if err is None else err
    rest = [i for i in range(len(chunk)) if out[i] is None]

    def one(i: int) -> np.ndarray | str:
        data = chunk[i].data
        try:
            if isinstance(data, np.ndarray):
                return _core.resize(_as_rgb(data), size, mode, max_long)
            if _is_jpeg(data):
                return _core.decode_resize(data, size, mode, max_long)
            return _core.resize(_pil_decode(data), size, mode, max_long)
        except (ValueError, _core.DecodeError) as e:
            return str(e)

    for i, r in zip(rest, pool.map(one, rest)):
        out[i] = r
    return out  # type: ignore[return-value]


def convert(
    sources: Any,
    dst: str | os.PathLike,
    *,
    image_size: int | None = None,
    resize: str = "center_crop",
    max_long_side: int | None = None,
    format: str = "raw",  # noqa: A002 - the natural name
    quality: int | None = None,
    chroma: str | None = None,
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
) -> ConvertSummary:
    """Decodes `sources` once into the TBL file `dst`.

    sources: WebDataset TAR shards (a path, a brace pattern such as 'train-{000..099}.tar' —
      expanded exactly as bash does —, or a list; or URLs read through fsspec, e.g.
      'gs://bucket/train-{0000..1023}.tar', s3://, https://, file://, memory://, with glob
      characters matched where the filesystem can list), an image folder with one subfolder per
      class, a list of image files, or images in memory: a uint8 (N, H, W, 3) or (N, H, W)
      array, a list of (H, W[, C]) arrays or (B, H, W, C) batches, a tuple (images, labels) or
      a dict {'image': images, 'label': labels}. A source named twice is an error.
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
    labels: integer ids or class names for arrays and file lists.
    classes: the class names, in id order: a list, or a text file of one name per line. Names
      met in the data (TAR `.cls`/`.json` holding e.g. 'n01440764', labels= names, subfolders)
      take their id from it. Without it, names get ids in sorted order and integer ids stay as
      they are (`Dataset.classes` is then None: no names are invented). A sharded conversion
      of TAR shards labelled by name needs it, so that every job gives a name the same id.
    label_ext: the TAR member that holds the label (e.g. 'txt'); default: the first of .cls,
      .cls2, .label, .json. Records whose label member cannot be read are written with label
      -1 and listed in `summary.label_errors` (strict=True stops on them).
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
    if format not in RECORD_FORMATS:
        raise ValueError(f"format must be one of {RECORD_FORMATS}, got {format!r}")
    tbl_paths = _tbl_paths(sources)
    if tbl_paths is not None:
        given = {"image_size": image_size, "max_long_side": max_long_side, "quality": quality,
                 "chroma": chroma, "labels": labels, "classes": classes, "label_ext": label_ext,
                 "shard": shard, "resize": None if resize == "center_crop" else resize}
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise ValueError(f"a TBL source is decoded record for record at its stored geometry: "
                             f"{', '.join(extra)} {'does' if len(extra) == 1 else 'do'} not apply to it")
        if format == "jpeg":
            raise ValueError("a TBL source converts to format='raw' or 'lz4'; to make JPEG records, "
                             "convert the original images")
    if shard is not None:
        shard = _sources.parse_shard(shard)
        dst = dst.replace("{shard}", f"{shard[0]:05d}-of-{shard[1]:05d}")
    if tbl_paths is None:
        chroma = _check_recipe(image_size, resize, max_long_side, format, quality, chroma)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer))
                                or not 1 <= threads <= 1024):
        raise ValueError(f"threads must be an integer in [1, 1024] or None (all CPUs), got {threads!r}")
    if progress not in (None, True, False):
        raise ValueError(f"progress must be None, True or False, got {progress!r}")
    if progress_interval is not None and (isinstance(progress_interval, bool) or not isinstance(
            progress_interval, (int, float)) or not progress_interval > 0):
        raise ValueError(f"progress_interval must be a positive number of seconds, got {progress_interval!r}")
    if label_ext is not None and (not isinstance(label_ext, str) or not label_ext or "/" in label_ext):
        raise ValueError(f"label_ext must be a member extension such as 'txt' or 'cls', got {label_ext!r}")
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst} already exists (pass overwrite=True to replace it)")
    out_dir = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(out_dir):
        raise FileNotFoundError(f"destination directory does not exist: {out_dir}")
    if tbl_paths is not None:
        return _convert_tbl(tbl_paths, dst, format, threads, overwrite, progress, progress_interval)
    retry = remote.Retry(retries, retry_backoff)
    table = _sources.load_classes(classes)
    src = _sources.resolve(sources, labels, table, label_ext.lower() if label_ext else None, retry)
    if shard is not None:
        src = src.select(*shard)
    size = int(image_size)
    nthreads = threads or _core.native_info()["default_threads"]
    bar = _Progress(0, _progress_mode(progress), progress_interval)
    total = src.count(bar.counting if src.count_is_slow else None)
    if total == 0:
        raise ConversionError(f"no record to write: the sources hold no images ({_describe(src)}); "
                              f"{dst} was not written")

    t0 = time.perf_counter()
    keys: list[str] = []
    label_table = _LabelTable(src.classes, sharded=shard is not None)
    label_errors: list[dict[str, str]] = []
    src_w: list[int] = []
    src_h: list[int] = []
    skipped: list[dict[str, str]] = []
    bar.start(total)
    seen = 0
    with Writer(dst, total, overwrite=overwrite) as w, ThreadPoolExecutor(nthreads) as pool, \
            ThreadPoolExecutor(1, thread_name_prefix="tbljax-convert-decode") as decoder:
        def decode(chunk: list[_sources.Item]) -> list[np.ndarray | Encoded | str]:
            pixels = _decode_chunk(chunk, size, resize, threads or 0, pool, max_long_side or 0)
            if quality is None:
                return pixels  # type: ignore[return-value]
            return _encode_chunk(pixels, quality, chroma, threads or 0)  # type: ignore[arg-type]

        for chunk, results in _decode_ahead(_prefetch(_chunks(src, CHUNK)), decode, decoder):
            bad = [{"key": it.key, "source": it.source, "reason": r}
                   for it, r in zip(chunk, results) if isinstance(r, str)]
            bad_labels = []
            for it, r in zip(chunk, results):
                if not isinstance(r, str):
                    problem = label_table.add(it.key, -1 if it.label_error else it.label)
                    if it.label_error or problem:
                        bad_labels.append({"key": it.key, "source": it.source,
                                           "reason": it.label_error or problem})
            if strict and (bad or bad_labels):
                skipped.extend(bad + [dict(b, reason=f"label unreadable: {b['reason']}") for b in bad_labels])
                first = skipped[0]
                raise ConversionError(
                    f"strict conversion stopped: {len(bad) + len(bad_labels)} bad item(s), first "
                    f"{first['key']} ({first['source']}): {first['reason']}; {dst} was not written", skipped)
            skipped.extend(bad)
            label_errors.extend(bad_labels)
            for it, r in zip(chunk, results):
                if isinstance(r, str):
                    continue
                width, height = _source_size(it.data)
                src_w.append(width)
                src_h.append(height)
                if isinstance(r, Encoded):
                    w.add_encoded(r.data, "JPEG", r.width, r.height)  # the stored geometry
                elif format == "jpeg" and _is_jpeg(it.data):
                    w.add_encoded(bytes(it.data), "JPEG", width, height)
                else:
                    w.add_raw(r, lz4=(format == "lz4"))
                keys.append(it.key)
            seen += len(chunk)
            bar.update(seen, len(skipped))
        if not keys:
            first = f"; first: {skipped[0]['key']} ({skipped[0]['source']}): {skipped[0]['reason']}" if skipped else ""
            raise ConversionError(f"no record written: all {seen} items were skipped{first}; "
                                  f"{dst} was not written", skipped)
        out_labels, out_classes = label_table.finish()
        recipe: dict[str, Any] = {"image_size": size, "resize": resize, "format": format}
        if resize == "shorter_side":
            recipe["max_long_side"] = max_long_side
        if format == "jpeg":  # compact records hold the converted geometry: served by a plain decode
            recipe.update(quality=quality, chroma=chroma, stored="resized" if quality else "original")
        w.set_metadata(
            labels=out_labels, keys=keys, classes=out_classes, skipped=skipped,
            recipe={
                **recipe,
                "idct": "islow", "resize_filter": _core.native_info().get("resize_filter", ""),
                "sources": src.describe(), "shard": list(shard) if shard else None,
                "label_errors": len(label_errors),
                "source_sizes": size_histogram(src_w, src_h), "tbljax": _core.native_info()["version"],
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            },
        )
    bar.update(seen, len(skipped), final=True)
    summary = ConvertSummary(dst=dst, written=len(keys), skipped=skipped,
                             seconds=time.perf_counter() - t0, bytes=os.path.getsize(dst),
                             label_errors=label_errors, classes=out_classes,
                             num_classes=_num_classes(out_labels, out_classes), labels_from=src.LABELS_FROM)
    return summary


def _num_classes(labels: np.ndarray, classes: list[str] | None) -> int:
    """The class count a summary shows: the names, else the distinct ids; 0 when unlabelled."""
    known = labels[labels >= 0]
    return 0 if not known.size else len(classes) if classes else int(np.unique(known).size)


def _describe(src: Any) -> str:
    d = src.describe()
    return ", ".join(d[:3]) + (f" and {len(d) - 3} more" if len(d) > 3 else "")


def _check_recipe(image_size: Any, resize: Any, max_long_side: Any, format: str,  # noqa: A002
                  quality: Any, chroma: Any) -> str | None:
    """Checks the recipe arguments of a conversion from images; returns the chroma to use."""
    if not contract.is_integer(image_size) or not 1 <= image_size <= contract.MAX_SIDE:
        raise ValueError(f"image_size must be an int in [1, {contract.MAX_SIDE}], got {image_size!r}")
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {RESIZE_MODES}, got {resize!r}")
    if max_long_side is not None:
        if resize != "shorter_side":
            raise ValueError(f"max_long_side caps resize='shorter_side' only; resize is {resize!r}")
        if not contract.is_integer(max_long_side) or not image_size <= max_long_side <= contract.MAX_SIDE:
            raise ValueError(f"max_long_side must be an int in [image_size, {contract.MAX_SIDE}] = "
                             f"[{image_size}, {contract.MAX_SIDE}], got {max_long_side!r}")
    if quality is not None:
        if format != "jpeg":
            raise ValueError(f"quality= re-encodes JPEG records: it needs format='jpeg', not {format!r}")
        if not contract.is_integer(quality) or not 1 <= quality <= 100:
            raise ValueError(f"quality must be an int in [1, 100] or None (the original bytes), got {quality!r}")
    elif chroma is not None:
        raise ValueError("chroma= applies to re-encoded JPEG records: pass quality= (e.g. 90) with format='jpeg'")
    elif format == "jpeg" and resize not in FIXED_SIZE_MODES:
        raise ValueError(f"format='jpeg' with the original bytes serves square batches: use resize="
                         f"'center_crop' or 'squash', or re-encode at the {resize!r} geometry with quality=90")
    if chroma is not None and chroma not in CHROMA:
        raise ValueError(f"chroma must be one of {CHROMA}, got {chroma!r}")
    return (chroma or "420") if quality is not None else None


def _tbl_paths(sources: Any) -> list[str] | None:
    """The files of a TBL source (paths ending in .tbl, brace patterns expanded), else None."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not isinstance(sources, (list, tuple)) or not sources \
            or not all(isinstance(s, (str, os.PathLike)) for s in sources):
        return None
    paths = [p for s in sources for p in expand_braces(os.fspath(s))]
    return paths if paths and all(p.lower().endswith(".tbl") for p in paths) else None


def _convert_tbl(paths: list[str], dst: str, format: str, threads: int | None,  # noqa: A002
                 overwrite: bool, progress: bool | None, progress_interval: float | None) -> ConvertSummary:
    """Decodes every record of a TBL dataset (`Dataset.read`: a plain decode for compact
    records) into a RAW (or lz4) file, record for record: labels, keys, classes, skipped list
    and geometry carry over. A record that fails its checksum or its decode stops the run with
    CorruptFileError/DecodeError naming the file and record, and nothing is written."""
    ds = _reader.open(paths)
    n = len(ds)
    if n == 0:
        raise ConversionError(f"no record to write: {', '.join(paths)} holds no record; {dst} was not written")
    recipe = ds.recipe  # parsed before the threads read records
    bar = _Progress(n, _progress_mode(progress), progress_interval)
    bar.start(n)
    t0 = time.perf_counter()
    nthreads = threads or _core.native_info()["default_threads"]
    with Writer(dst, n, overwrite=overwrite) as w, ThreadPoolExecutor(nthreads) as pool:
        for start in range(0, n, CHUNK):
            for img in pool.map(ds.read, range(start, min(n, start + CHUNK))):
                w.add_raw(img, lz4=(format == "lz4"))
            bar.update(min(n, start + CHUNK), 0)
        w.set_metadata(
            labels=ds.labels, keys=ds.keys, classes=ds.classes, skipped=ds.skipped,
            recipe={
                **{k: v for k, v in recipe.items() if k not in ("quality", "chroma", "stored")},
                "format": format, "decoded_from": {"fingerprint": ds.fingerprint, "format": ds.record_format,
                                                   **{k: recipe.get(k) for k in ("quality", "chroma")}},
                "sources": ds.paths, "tbljax": _core.native_info()["version"],
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            },
        )
    bar.update(n, 0, final=True)
    return ConvertSummary(dst=dst, written=n, skipped=[], seconds=time.perf_counter() - t0,
                          bytes=os.path.getsize(dst), classes=ds.classes,
                          num_classes=_num_classes(ds.labels, ds.classes), labels_from="the TBL source has none")

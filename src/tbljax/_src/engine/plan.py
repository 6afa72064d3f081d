"""tbljax.plan: how one step's host batch is built. `RecordSource` is the seam between the
reader and the kernel (a dataset's size, labels, image size, fingerprint, and how to write rows
of a batch); `Plan` holds what a pass needs and builds each step into a ring slot: the step's
rows (`tbljax.step`) → the fused kernel (GIL released) → a `HostBatch` of NumPy views.

Framework-free: what a framework makes of a HostBatch is the plan's ``finish`` function,
given by the loader layered on top (`tbljax.jax_loader`, the torch and MLX adapters).
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import weakref

import numpy as np

from tbljax._src.rules import augment as _augment
from tbljax._src.engine.ring import Slot
from tbljax._src.engine.rows import RowLayout
from tbljax._src.rules import order
from tbljax._src.rules.parts import Parts
from tbljax._src.engine import step as _step
from tbljax._src.rules.options import LoaderOptions

__all__ = ["HostBatch", "Plan", "RecordSource"]


class RecordSource:
    """The one place that knows the Dataset API: size, labels, stored image size, fingerprint,
    and how to write rows of a batch (RAW: the kernel gathers from the zero-copy views;
    compact JPEG: the kernel decodes each box's part of the record in the same pass;
    original-bytes JPEG/LZ4: the dataset decodes into a scratch buffer that the kernel reads).

    ``threads`` is for decoding non-RAW records (None or 0: the pool's default). The host
    loader fills its batches through `fill`; the resident dataset reads ``n``, ``labels``,
    ``shape`` and ``fingerprint`` from it. ``geometry`` (`tbljax.augment.RecordGeometry`) holds
    every record's stored size; ``shape`` is the one (H, W) of all, or None when they differ."""

    def __init__(self, ds, threads):
        self.n = len(ds)
        if self.n == 0:
            raise ValueError(f"{ds!r} holds no records")
        if self.n > np.iinfo(np.int32).max:
            raise ValueError(f"{ds!r} holds {self.n} records; the loader's int32 `index` "
                             f"supports up to {np.iinfo(np.int32).max}")
        self.labels = np.asarray(ds.labels, dtype=np.int64)
        self.fingerprint = str(ds.fingerprint)
        self.geometry = self._record_geometry(ds)
        # (H, W) of every record, or None: records of different sizes (`geometry` has each).
        self.shape = self.geometry.shape
        self._raw = ds.record_format == "raw"
        self._ds = ds
        self._jpeg = None  # compact JPEG records: their native source, decoded in the kernel
        self._offsets = None  # records not at a fixed stride: each one's offset and size
        if (ds.record_format == "jpeg" and getattr(ds, "recipe", {}).get("stored") == "resized"
                and hasattr(ds, "jpeg_records")):
            from tbljax._src.engine import kernels

            views, counts, self._offsets, self._sizes, heights, widths = ds.jpeg_records()
            self._jpeg = kernels.jpeg_source(views, counts, self._offsets, self._sizes, heights,
                                             widths)
        elif self._raw:
            from tbljax._src.engine import kernels

            if self.shape is not None:
                views = ds.shard_views()
                # Built once: the native view over the shards (the kernel takes it as is).
                self._src = kernels.raw_source(views)
                counts = np.array([len(v) for v in views], np.int64)
            else:  # records of different sizes: each where the index says, at its own size
                views, counts, self._offsets, heights, widths = ds.raw_records()
                self._src = kernels.variable_source(views, counts, self._offsets, heights, widths)
                self._sizes = heights.astype(np.int64) * widths * 3
        if self._raw or self._jpeg is not None:
            # Records the kernel reads from the files' mappings: read-ahead and residency.
            self._bases = [v.__array_interface__["data"][0] for v in views]
            self._starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            self._row_bytes = int(np.prod(self.shape)) * 3 if self.shape is not None else 0
            self._fds: dict[int, int] = {}  # file number -> fd for posix_fadvise, opened lazily
            weakref.finalize(self, _close_all, self._fds)
        elif self.shape is not None:
            self._scratch = np.empty((0, *self.shape, 3), np.uint8)
        else:
            self._packed = np.empty(0, np.uint8)  # decoded records of different sizes
        self._threads = threads or 0

    @property
    def reads_ahead(self) -> bool:
        """Whether `read_ahead` does anything: RAW or compact JPEG records of a dataset that
        says where they are (``index``, ``paths``), on an OS with posix_fadvise."""
        return ((self._raw or self._jpeg is not None) and hasattr(os, "posix_fadvise")
                and hasattr(self._ds, "index") and hasattr(self._ds, "paths"))

    def read_ahead(self, indices) -> None:
        """Asks the disk for records `indices` before `fill` reads them (`posix_fadvise`
        WILLNEED on each record's bytes; returns at once). A no-op unless `reads_ahead`."""
        if not self.reads_ahead or not len(indices):
            return
        idx = np.asarray(indices, np.int64)
        files = np.searchsorted(self._starts, idx, side="right") - 1
        index = self._ds.index
        offsets, sizes = index["offset"][idx].tolist(), index["size"][idx].tolist()
        for k, offset, size in zip(files.tolist(), offsets, sizes):
            fd = self._fd(k)
            if fd is not None:
                os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)

    def _fd(self, k):
        fd = self._fds.get(k)
        if fd is None:
            if len(self._fds) >= _MAX_FDS:  # many shards: close the oldest
                os.close(self._fds.pop(next(iter(self._fds))))
            try:
                # The path as opened by the dataset; if it was replaced since, the advice
                # goes to the new file: only the speed is affected, never the bytes served.
                fd = self._fds[k] = os.open(self._ds.paths[k], os.O_RDONLY)
            except OSError:
                return None
        return fd

    def resident(self, indices) -> bool:
        """True if every page of RAW records `indices` is in the page cache (False if unknown
        or not RAW)."""
        mincore = _mincore() if self.reads_ahead else None
        if mincore is None:
            return False
        page = mincore.page
        files = np.searchsorted(self._starts, indices, side="right") - 1
        if self._offsets is None:
            size = self._row_bytes
            starts = (indices - self._starts[files]) * size
            sizes = np.full(len(indices), size)
        else:  # offsets into the whole file's mapping
            starts, sizes = self._offsets[indices], self._sizes[indices]
        vec = ctypes.create_string_buffer(int(sizes.max()) // page + 2 if len(sizes) else 1)
        for k, rel, size in zip(files.tolist(), starts.tolist(), sizes.tolist()):
            start = self._bases[k] + rel
            first = start - start % page
            length = start + size - first
            # One byte a page, bit 0 set when resident (the other bits are 0 on Linux).
            if mincore(first, length, vec) != 0 or b"\0" in vec.raw[:-(-length // page)]:
                return False
        return True

    def _name_record(self, i) -> str:
        path, j = self._ds.locate(int(i))
        return f"{path}: record {j}"

    @staticmethod
    def _record_geometry(ds) -> _augment.RecordGeometry:
        if ds.image_shape is not None:
            return _augment.RecordGeometry(*(int(v) for v in ds.image_shape))
        # No single stored size (LZ4 files written without a recipe, records of different
        # sizes): the index has each record's (O(N) numpy, once, only for such files).
        index = getattr(ds, "index", None)
        if index is None:
            raise ValueError(f"{ds!r} has no single image size and no index of record sizes: "
                             "convert it with an image_size to serve it")
        try:
            return _augment.RecordGeometry(index["height"], index["width"])
        except ValueError as e:
            raise ValueError(f"{ds!r}: {e}") from None

    def row_shape(self, opts: LoaderOptions, epoch: int | None = None) -> tuple[int, int, int]:
        """One row of a batch of `epoch` under `opts` (`LoaderOptions.row_shape`); ValueError
        naming the dataset when its records differ in size and the augmentation does not fix
        the output size."""
        try:
            return opts.row_shape(self.shape, epoch)
        except ValueError as e:
            raise ValueError(f"{self._ds!r}: {e}") from None

    def fill(self, indices, out, *, layout, crop, flip, mean, std, jpeg_dct_scale=False):
        """Writes records `indices` into `out` (the kernel's arguments, `tbljax.kernels.gather`;
        `jpeg_dct_scale`: `tbljax.kernels.serve_jpeg`'s dct_scale, for compact records)."""
        from tbljax._src.engine import kernels

        kw = dict(layout=layout, crop=crop, flip=flip, mean=mean, std=std)
        if self._jpeg is not None:
            files = self._ds.files_of(indices)
            self._ds.check_unchanged(files)  # the kernel reads the mapping, as for RAW records
            kernels.serve_jpeg(self._jpeg, indices, out, **kw, dct_scale=jpeg_dct_scale,
                               threads=self._threads, where=self._name_record)
            self._ds.check_unchanged(files)
            return
        if self._raw:
            # The kernel reads the files' mappings directly: a file truncated or rewritten in
            # place since it was opened must fail the batch, not fill it with other bytes.
            # Checked before (no read past a truncated end) and after (no batch mixed from two
            # versions of a file). A truncation landing inside the gather itself is the one
            # case left: reading a page past the new end raises SIGBUS.
            check = getattr(self._ds, "check_unchanged", None)
            files_of = getattr(self._ds, "files_of", None)
            files = files_of(indices) if files_of is not None else None
            if check is not None:
                check(files)
            kernels.gather(self._src, indices, out, **kw)
            if check is not None:
                check(files)
            return
        b = len(indices)
        if self.shape is None:
            # Decoded records of different sizes, packed one after another in a buffer that
            # only grows, then gathered like RAW ones.
            images = [self._ds.read(int(i)) for i in indices]
            sizes = np.array([im.size for im in images], np.int64)
            offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            if len(self._packed) < sizes.sum():
                self._packed = np.empty(int(sizes.sum()), np.uint8)
            for im, o, n in zip(images, offsets.tolist(), sizes.tolist()):
                self._packed[o:o + n] = im.reshape(-1)
            src = kernels.variable_source([self._packed], [b], offsets,
                                          [im.shape[0] for im in images],
                                          [im.shape[1] for im in images])
            kernels.gather(src, np.arange(b, dtype=np.int64), out, **kw)
            return
        if len(self._scratch) < b:
            self._scratch = np.empty((b, *self.shape, 3), np.uint8)
        scratch = self._scratch[:b]
        self._ds.read_into(indices, scratch, self._threads)
        kernels.gather(scratch, np.arange(b, dtype=np.int64), out, **kw)


_SAMPLE = 4     # records of a step checked for residency before advising it
_MAX_SKIP = 16  # a warm file: steps between two checks, at most (a colder one is caught then)
_MAX_FDS = 64   # files kept open for posix_fadvise


def _close_all(fds):
    for fd in fds.values():
        os.close(fd)
    fds.clear()


_MINCORE = []


def _mincore():
    """libc's mincore(addr, length, vec) through ctypes, or None where there is none. Called
    with the GIL held (PyDLL): a quick system call, and each release would let another thread
    take the GIL for up to a switch interval (measured: 0.6 ms a step on a warm file)."""
    if not _MINCORE:
        fn = None
        try:
            import mmap

            fn = ctypes.PyDLL(None, use_errno=True).mincore
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            fn.restype = ctypes.c_int
            fn.page = mmap.PAGESIZE
        except (OSError, AttributeError):
            fn = None
        _MINCORE.append(fn)
    return _MINCORE[0]


@dataclasses.dataclass(frozen=True)
class HostBatch:
    """This process's rows of one step, in host memory, before any framework sees them.

    One entry per row range of the layout (`RowLayout.ranges`; a single range unless
    a JAX sharding puts this process's rows on several devices). ``images`` are views of a
    ring slot: the slot is not rewritten while any view of it (or an array built on it without
    a copy) is alive. ``labels`` and ``indices`` are int32, -1 on padding rows; ``valids`` is
    None with drop_remainder (no padding), else bool masks.

    >>> ld = tbljax.HostLoader(tbljax.open("train.tbl"), tbljax.LoaderOptions(batch_size=256))
    >>> hb = next(iter(ld))
    >>> hb.image.shape, hb.index[:4], (hb.epoch, hb.position)
    """

    epoch: int
    position: int  # position of the step's first row (host parts: in this process's part)
    ranges: tuple[tuple[int, int], ...]
    images: tuple[np.ndarray, ...]
    labels: tuple[np.ndarray, ...]
    indices: tuple[np.ndarray, ...]
    valids: tuple[np.ndarray, ...] | None

    def _one(self, name):
        parts = getattr(self, name)
        if parts is None:
            return None
        if len(parts) != 1:
            raise ValueError(f"this batch has {len(parts)} row ranges: use .{name}")
        return parts[0]

    @property
    def image(self) -> np.ndarray:
        return self._one("images")

    @property
    def label(self) -> np.ndarray:
        return self._one("labels")

    @property
    def index(self) -> np.ndarray:
        return self._one("indices")

    @property
    def valid(self) -> np.ndarray | None:
        return self._one("valids")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the producer needs to build any step: immutable, so it is safe to share."""

    source: RecordSource
    layout: RowLayout
    opts: LoaderOptions
    start: tuple[int, int]  # cursor (epoch, position) the iteration starts from
    end_epoch: int | None   # the pass stops before this epoch (None: never)
    # HostBatch -> (what the consumer receives, the objects in it that view the ring slot);
    # runs in a producer thread, so a transfer to a device overlaps the step. None: the
    # HostBatch itself. Must not refer to the loader (see tbljax.producer).
    finish: object = None
    # partition="host": every process's part (positions are then local to the source, which
    # holds this process's part); None: one part, the whole dataset.
    parts: Parts | None = None

    @property
    def part(self) -> Parts:
        """The parts the steps of an epoch are counted over (`tbljax.order.Parts`)."""
        return self.parts if self.parts is not None else Parts.whole(self.source.n)

    def steps(self):
        """(epoch, first position) of every step from the cursor to the end (or forever).

        When the source reads ahead, before yielding step s it asks the disk for the records
        of steps s..s+k not yet asked for (k = opts.read_ahead): never more than k steps
        ahead of the step about to be built."""
        k = self.opts.read_ahead if self.source.reads_ahead else 0
        if k == 0:
            yield from self._steps()
            return
        ahead, asked = self._steps(), 0
        every, skip = 1, 0  # a warm file is checked every 2, 4, ... _MAX_SKIP steps
        for s, step in enumerate(self._steps()):
            while asked <= s + k:
                nxt = next(ahead, None)
                if nxt is None:
                    break
                asked += 1
                if skip:
                    skip -= 1
                elif self.read_ahead(*nxt):
                    every = min(2 * every, _MAX_SKIP)
                    skip = every - 1
                else:
                    every = 1
            yield step

    def read_ahead(self, epoch, first) -> bool:
        """Asks the disk for this process's records of the step starting at `first`; True if
        they were resident already (nothing asked)."""
        src, opts = self.source, self.opts
        resident = True
        for a, b in self.layout.ranges:
            pos = np.arange(first + a, min(first + b, src.n), dtype=np.int64)
            if not len(pos):
                continue
            # A few records first: a warm file stops here (~20 us a step).
            if src.resident(order.permute(pos[:_SAMPLE], src.n, opts.seed, epoch,
                                          shuffle=opts.shuffle)):
                continue
            resident = False
            src.read_ahead(order.permute(pos, src.n, opts.seed, epoch, shuffle=opts.shuffle))
        return resident

    def _steps(self):
        part, g = self.part, self.layout.global_batch
        epoch, position = self.start
        while self.end_epoch is None or epoch < self.end_epoch:
            count = part.steps(g, drop_remainder=self.opts.drop_remainder, start=position)
            for s in range(count):
                yield epoch, position + s * g
            epoch, position = epoch + 1, 0

    def build_host(self, ring, epoch, first, stop=None) -> tuple[HostBatch, Slot]:
        """This process's rows of the step starting at position `first`, in a ring slot (the
        second item)."""
        src, opts = self.source, self.opts
        mean, std = opts.normalization
        first_index = self.part.start  # source record i is sample first_index + i
        slot = ring.acquire(stop)
        views = slot.views(src.row_shape(opts, epoch))  # a size schedule's size of `epoch`
        labels, indices, valid = [], [], []
        for (a, b), out in zip(self.layout.ranges, views):
            rows = b - a
            nvalid = int(np.clip(src.n - (first + a), 0, rows))
            idx, boxes, flip = _step.draw(
                np.arange(first + a, first + a + nvalid, dtype=np.int64), opts,
                num_records=src.n, image_hw=src.geometry, epoch=epoch, first_index=first_index)
            records = idx - first_index
            if nvalid:
                src.fill(records, out[:nvalid], layout=opts.layout, crop=boxes, flip=flip,
                         mean=mean, std=std, jpeg_dct_scale=opts.jpeg_dct_scale)
            out[nvalid:] = 0  # padding rows (only at the end of an epoch without drop_remainder)
            pad = rows - nvalid
            indices.append(np.concatenate([idx, np.full(pad, -1)]).astype(np.int32))
            labels.append(np.concatenate([src.labels[records], np.full(pad, -1)]).astype(np.int32))
            valid.append(np.arange(rows) < nvalid)
        return HostBatch(epoch, first, self.layout.ranges, tuple(views), tuple(labels),
                         tuple(indices), None if opts.drop_remainder else tuple(valid)), slot

    def finish_host(self, host: HostBatch, slot: Slot):
        """What the consumer receives for `host`; the slot learns what views it."""
        result, viewers = (host, host.images) if self.finish is None else self.finish(host)
        slot.watch(viewers)
        return result

"""tbljax.plan: how one step's host batch is built. `RecordSource` is the seam between the
reader and the kernel (a dataset's size, labels, image size, fingerprint, and how to write rows
of a batch); `Plan` holds what a pass needs and builds each step into a ring slot: the step's
rows (`tbljax.step`) → the fused kernel (GIL released) → a `HostBatch` of NumPy views.

Framework-free: what a framework makes of a HostBatch is the plan's ``finish`` function,
given by the loader layered on top (`tbljax.jax_loader`, the torch and MLX adapters).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from tbljax import batch as _batch
from tbljax import order
from tbljax import step as _step
from tbljax.options import LoaderOptions

__all__ = ["HostBatch", "Plan", "RecordSource"]


class RecordSource:
    """The one place that knows the Dataset API: size, labels, stored image size, fingerprint,
    and how to write rows of a batch (RAW: the kernel gathers from the zero-copy views;
    JPEG/LZ4: the dataset decodes into a scratch buffer that the kernel then reads).

    ``threads`` is for decoding non-RAW records (None or 0: the pool's default). The host
    loader fills its batches through `fill`; the resident dataset reads ``n``, ``labels``,
    ``shape`` and ``fingerprint`` from it."""

    def __init__(self, ds, threads):
        self.n = len(ds)
        if self.n == 0:
            raise ValueError(f"{ds!r} holds no records")
        if self.n > np.iinfo(np.int32).max:
            raise ValueError(f"{ds!r} holds {self.n} records; the loader's int32 `index` "
                             f"supports up to {np.iinfo(np.int32).max}")
        self.labels = np.asarray(ds.labels, dtype=np.int64)
        self.fingerprint = str(ds.fingerprint)
        self.shape = ds.image_shape or self._uniform_record_size(ds)
        if self.shape is None:
            raise ValueError(f"{ds!r} has no single image size (records of different sizes and "
                             "no resize recipe): convert it with an image_size to serve it")
        self.shape = tuple(int(v) for v in self.shape)
        self._raw = ds.record_format == "raw"
        self._ds = ds
        if self._raw:
            from tbljax import kernels  # imported on first use: `import tbljax` stays quick

            views = ds.shard_views()
            # Built once: the native view over the shards (the kernel takes it as is).
            self._src = kernels.raw_source(views)
        else:
            self._scratch = np.empty((0, *self.shape, 3), np.uint8)
        self._threads = threads or 0

    @staticmethod
    def _uniform_record_size(ds):
        # image_shape is None for LZ4 files written without a recipe even when every record
        # has one size; the index says so (O(N) numpy, once, only for such files).
        index = getattr(ds, "index", None)
        if index is None or not len(index):
            return None
        h, w = np.unique(index["height"]), np.unique(index["width"])
        return (int(h[0]), int(w[0])) if len(h) == 1 and len(w) == 1 else None

    def fill(self, indices, out, *, layout, crop, flip, mean, std):
        """Writes records `indices` into `out` (the kernel's arguments, `tbljax.kernels.gather`)."""
        from tbljax import kernels

        kw = dict(layout=layout, crop=crop, flip=flip, mean=mean, std=std)
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
        if len(self._scratch) < b:
            self._scratch = np.empty((b, *self.shape, 3), np.uint8)
        scratch = self._scratch[:b]
        self._ds.read_into(indices, scratch, self._threads)
        kernels.gather(scratch, np.arange(b, dtype=np.int64), out, **kw)


@dataclasses.dataclass(frozen=True)
class HostBatch:
    """This process's rows of one step, in host memory, before any framework sees them.

    One entry per row range of the layout (`tbljax.batch.Layout.ranges`; a single range unless
    a JAX sharding puts this process's rows on several devices). ``images`` are views of a
    ring slot: the slot is not rewritten while any view of it (or an array built on it without
    a copy) is alive. ``labels`` and ``indices`` are int32, -1 on padding rows; ``valids`` is
    None with drop_remainder (no padding), else bool masks.

    >>> ld = tbljax.HostLoader(tbljax.open("train.tbl"), tbljax.LoaderOptions(batch_size=256))
    >>> hb = next(iter(ld))
    >>> hb.image.shape, hb.index[:4], (hb.epoch, hb.position)
    """

    epoch: int
    position: int  # global position of the step's first row
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
    layout: _batch.Layout
    opts: LoaderOptions
    row_shape: tuple[int, ...]
    start: tuple[int, int]  # cursor (epoch, position) the iteration starts from
    end_epoch: int | None   # the pass stops before this epoch (None: never)
    # HostBatch -> (what the consumer receives, the objects in it that view the ring slot);
    # runs in a producer thread, so a transfer to a device overlaps the step. None: the
    # HostBatch itself. Must not refer to the loader (see tbljax.producer).
    finish: object = None

    def steps(self):
        """(epoch, first position) of every step from the cursor to the end (or forever)."""
        n, g = self.source.n, self.layout.global_batch
        epoch, position = self.start
        while self.end_epoch is None or epoch < self.end_epoch:
            count = order.steps_in_epoch(n, g, drop_remainder=self.opts.drop_remainder,
                                         start=position)
            for s in range(count):
                yield epoch, position + s * g
            epoch, position = epoch + 1, 0

    def build_host(self, ring, epoch, first, stop=None) -> tuple[HostBatch, _batch.Slot]:
        """This process's rows of the step starting at position `first`, in a ring slot (the
        second item)."""
        src, opts = self.source, self.opts
        mean, std = opts.normalization
        slot = ring.acquire(stop)
        views = slot.views()
        labels, indices, valid = [], [], []
        for (a, b), out in zip(self.layout.ranges, views):
            rows = b - a
            nvalid = int(np.clip(src.n - (first + a), 0, rows))
            idx, boxes, flip = _step.draw(
                np.arange(first + a, first + a + nvalid, dtype=np.int64), opts,
                num_records=src.n, image_hw=src.shape, epoch=epoch)
            if nvalid:
                src.fill(idx, out[:nvalid], layout=opts.layout, crop=boxes, flip=flip,
                         mean=mean, std=std)
            out[nvalid:] = 0  # padding rows (only in the last step without drop_remainder)
            pad = rows - nvalid
            indices.append(np.concatenate([idx, np.full(pad, -1)]).astype(np.int32))
            labels.append(np.concatenate([src.labels[idx], np.full(pad, -1)]).astype(np.int32))
            valid.append(np.arange(rows) < nvalid)
        return HostBatch(epoch, first, self.layout.ranges, tuple(views), tuple(labels),
                         tuple(indices), None if opts.drop_remainder else tuple(valid)), slot

    def finish_host(self, host: HostBatch, slot: _batch.Slot):
        """What the consumer receives for `host`; the slot learns what views it."""
        result, viewers = (host, host.images) if self.finish is None else self.finish(host)
        slot.watch(viewers)
        return result

"""The seam between a dataset and the kernel: `RecordSource` asks a dataset for what serving
needs through the dataset contract (`rules/dataset.py`: size, labels, served geometry,
fingerprint, where the records lie) and writes rows of a batch — RAW records gathered by the
kernel from the zero-copy views; compact JPEG records decoded box by box in the same pass;
original-bytes JPEG and LZ4 records decoded by the dataset into a scratch buffer the kernel
reads. It also reads ahead (posix_fadvise; a whole cold source at once when it fits in memory:
`engine/file_sweep.py`) and checks page-cache residency (mincore) for the records the kernel
reads from the files' mappings.
"""

from __future__ import annotations

import ctypes
import functools
import os
import weakref

import numpy as np

from tbljax._src.engine import file_sweep, kernels
from tbljax._src.engine import step as _step
from tbljax._src.rules import augment as _augment
from tbljax._src.rules import contract
from tbljax._src.rules.dataset import require
from tbljax._src.rules.mixing import draw_rows
from tbljax._src.rules.options import LoaderOptions

__all__ = ["MixtureSource", "RecordSource", "open_source"]


def open_source(dataset, opts: LoaderOptions):
    """The record source for `dataset` under `opts`: a `MixtureSource` for a dataset whose rows
    are drawn by weight (the contract's `draws_by_weight`: a `tbljax.mix` result), else a
    `RecordSource`."""
    if require(dataset, "the loader").draws_by_weight:
        return MixtureSource(dataset, opts)
    return RecordSource(dataset, opts.threads, opts.verify_records)


class RecordSource:
    """The one place that knows the Dataset API: size, labels, stored image size, fingerprint,
    and how to write rows of a batch (RAW: the kernel gathers from the zero-copy views;
    compact JPEG: the kernel decodes each box's part of the record in the same pass;
    original-bytes JPEG/LZ4: the dataset decodes into a scratch buffer that the kernel reads).

    ``threads`` is for decoding non-RAW records (None or 0: the pool's default). The host
    loader fills its batches through `fill`; the resident dataset reads ``n``, ``labels``,
    ``shape`` and ``fingerprint`` from it. ``geometry`` (`tbljax.augment.RecordGeometry`) holds
    every record's stored size; ``shape`` is the one (H, W) of all, or None when they differ.

    ``verify_records``: `fill` checks each record's CRC-16 before the kernel reads it, and
    raises CorruptFileError naming the file and record (`LoaderOptions.verify_records`). RAW
    and compact records need it (the kernel reads them straight from the mapping); LZ4 and
    original-bytes JPEG records are read through `Dataset.read`, which checks them anyway."""

    def __init__(self, ds, threads, verify_records: bool = False):
        ds = require(ds, "the loader")
        self.n = len(ds)
        if self.n == 0:
            raise ValueError(f"{ds!r} holds no records")
        contract.check_record_count(self.n, what=repr(ds))
        self.labels = contract.check_served_labels(ds.labels, repr(ds))
        self.fingerprint = str(ds.fingerprint)
        self.mixture = None  # a MixtureSource's description of its mixture (resume.make_state)
        self.geometry = ds.geometry
        # (H, W) of every record, or None: records of different sizes (`geometry` has each).
        self.shape = self.geometry.shape
        self._raw = ds.record_format == "raw"
        self._ds = ds
        self._jpeg = None  # compact JPEG records: their native source, decoded in the kernel
        self._offsets = None  # records not at a fixed stride: each one's offset and size
        if ds.compact:
            r = ds.jpeg_records()
            views, counts, self._offsets, self._sizes = r.views, r.counts, r.offsets, r.sizes
            self._jpeg = kernels.jpeg_source(*r)
        elif self._raw and self.shape is not None:
            views = ds.shard_views()
            # Built once: the native view over the shards (the kernel takes it as is).
            self._src = kernels.raw_source(views)
            counts = np.array([len(v) for v in views], np.int64)
        elif self._raw:  # records of different sizes: each where the index says, at its own size
            r = ds.raw_records()
            views, counts, self._offsets = r.views, r.counts, r.offsets
            self._src = kernels.variable_source(*r)
            self._sizes = r.heights.astype(np.int64) * r.widths * 3
        self._verify = None  # (file views, record offsets, sizes, stored CRC-16s) to check
        if verify_records and (self._raw or self._jpeg is not None):
            crc = ds.checksums()
            if crc is None:
                raise ValueError(
                    f"{ds!r}: its files were written without per-record checksums, "
                    "so verify_records=True has nothing to check records against"
                )
            if self._jpeg is None:  # where each RAW record lies in its whole file
                rr = ds.raw_records()
                self._verify = (rr.views, rr.offsets, rr.heights.astype(np.int64) * rr.widths * 3, crc)
            else:
                self._verify = (views, self._offsets, self._sizes, crc)
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

    def draw(self, positions, opts: LoaderOptions, epoch: int, first_index: int = 0, step=None, boxes_field=None):
        """(sample indices, crop boxes or None, flips or None, repeats or None) of `positions`
        of `epoch`: the epoch's permutation, then crops and flips keyed by the sample index
        (engine/step.py; `step` as it takes it). `boxes_field`: the field crop="bbox" reads
        each record's object boxes from."""
        objects = boxes_field and (lambda idx: self._ds.field_rows(boxes_field, np.asarray(idx) - first_index))
        kw = dict(num_records=self.n, image_hw=self.geometry, epoch=epoch, first_index=first_index, step=step)
        return _step.draw(positions, opts, objects=objects or None, **kw)

    def source_ids(self, records) -> None:
        """Which source each record comes from: None, one dataset is one source."""
        return None

    def local_records(self, indices, first_index: int = 0) -> np.ndarray:
        """This source's records of the sample `indices` `draw` returned."""
        return indices - first_index

    @property
    def mode(self) -> str:
        """How `fill` writes rows: ``"gather"`` (RAW records of one size, from the zero-copy
        views), ``"gather_variable"`` (RAW records of several sizes, in place),
        ``"jpeg_boxes"`` (compact records, each box's part decoded in the kernel) or
        ``"decode"`` (original JPEG bytes and LZ4: decoded by the dataset, then gathered)."""
        if self._jpeg is not None:
            return "jpeg_boxes"
        if self._raw:
            return "gather" if self.shape is not None else "gather_variable"
        return "decode"

    @property
    def reads_ahead(self) -> bool:
        """Whether `read_ahead` does anything: RAW or compact JPEG records (the kernel reads
        them from the files' mappings), on an OS with posix_fadvise."""
        return (self._raw or self._jpeg is not None) and hasattr(os, "posix_fadvise")

    def read_ahead(self, indices) -> None:
        """Asks the disk for records `indices` before `fill` reads them (`posix_fadvise`
        WILLNEED on each record's bytes; returns at once). A no-op unless `reads_ahead`."""
        if not self.reads_ahead or not len(indices):
            return
        files, offsets, sizes = self._ds.byte_ranges(indices)
        for k, offset, size in zip(files.tolist(), offsets.tolist(), sizes.tolist()):
            fd = self._fd(k)
            if fd is not None:
                os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)

    def sweep(self) -> file_sweep.FileSweep | None:
        """Starts asking the disk for every record of this source, front to back, in a thread
        of its own, if their bytes fit in the memory a sweep may fill (`engine/file_sweep.py`);
        None, and nothing started, unless it reads ahead where that memory is known."""
        budget = file_sweep.memory_for_sweeps() if self.reads_ahead else None
        if budget is None:
            return None
        return file_sweep.FileSweep(self._ds.paths, self._ds.byte_ranges, self.n, budget)

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
            if mincore(first, length, vec) != 0 or b"\0" in vec.raw[: -(-length // page)]:
                return False
        return True

    def row_shape(self, opts: LoaderOptions, epoch: int | None = None) -> tuple[int, int, int]:
        """One row of a batch of `epoch` under `opts` (`LoaderOptions.row_shape`); ValueError
        naming the dataset when its records differ in size and the augmentation does not fix
        the output size."""
        try:
            return opts.row_shape(self.shape, epoch)
        except ValueError as e:
            raise ValueError(f"{self._ds!r}: {e}") from None

    def fill(
        self, indices, out, *, layout, crop, flip, mean, std, jpeg_dct_scale=False, started=None, ops=None, patches=None
    ):
        """Writes records `indices` into `out` (the kernel's arguments, `tbljax.kernels.gather`;
        `jpeg_dct_scale`: `tbljax.kernels.serve_jpeg`'s dct_scale, for compact records).
        `started()`, if given, is called just before the first native call that releases the
        GIL for the batch (`Plan.build_host`): it wakes the next draw. `ops`: the rows' per-image
        ops (`step.RowOps`). `patches`: NaFlex rows, (p, sizes) (`tbljax.kernels.gather`)."""
        ops = None if ops is None else ops.program()
        kw = dict(layout=layout, crop=crop, flip=flip, mean=mean, std=std, ops=ops, patches=patches)
        started = started or _nothing
        serve = functools.partial(kernels.prepare_serve_jpeg, indices=indices, out=out, **kw, dct_scale=jpeg_dct_scale)
        if self.serve_compact(indices, serve, started):
            return
        if self._verify is not None:
            self._check_records(indices)
        if self._raw:
            # The kernel reads the files' mappings directly: a file truncated or rewritten in
            # place since it was opened must fail the batch, not fill it with other bytes.
            # Checked before (no read past a truncated end) and after (no batch mixed from two
            # versions of a file). A truncation landing inside the gather itself is the one
            # case left: reading a page past the new end raises SIGBUS.
            files = self._ds.files_of(indices)
            self._ds.check_unchanged(files)
            call = kernels.prepare_gather(self._src, indices, out, **kw)
            started()
            call()
            self._ds.check_unchanged(files)
            return
        b = len(indices)
        if self.shape is None:
            # Decoded records of different sizes, packed one after another in a buffer that
            # only grows, then gathered like RAW ones.
            started()
            images = [self._ds.read(int(i)) for i in indices]
            sizes = np.array([im.size for im in images], np.int64)
            offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            if len(self._packed) < sizes.sum():
                self._packed = np.empty(int(sizes.sum()), np.uint8)
            for im, o, n in zip(images, offsets.tolist(), sizes.tolist()):
                self._packed[o : o + n] = im.reshape(-1)
            src = kernels.variable_source(
                [self._packed], [b], offsets, [im.shape[0] for im in images], [im.shape[1] for im in images]
            )
            kernels.gather(src, np.arange(b, dtype=np.int64), out, **kw)
            return
        if len(self._scratch) < b:
            self._scratch = np.empty((b, *self.shape, 3), np.uint8)
        scratch = self._scratch[:b]
        started()
        self._ds.read_into(indices, scratch, self._threads)
        kernels.gather(scratch, np.arange(b, dtype=np.int64), out, **kw)

    def serve_compact(self, indices, prepare, started=None) -> bool:
        """Compact records `indices` through ``prepare(source, threads=, where=)``'s native call with
        `fill`'s checks, `started()` and the files unchanged around it; False for other records."""
        if self._jpeg is None:
            return False
        if self._verify is not None:
            self._check_records(indices)
        files = self._ds.files_of(indices)
        self._ds.check_unchanged(files)
        call = prepare(self._jpeg, threads=self._threads, where=self._ds.describe_record)
        (started or _nothing)()
        call()
        self._ds.check_unchanged(files)
        return True

    def _check_records(self, indices) -> None:
        """CorruptFileError for the first of records `indices` whose payload's CRC-16 is not
        the one its index entry holds (the check `verify` makes), before the kernel reads it."""
        views, offsets, sizes, crc = self._verify
        idx = np.unique(np.asarray(indices, np.int64))
        files = np.searchsorted(self._starts, idx, side="right") - 1
        for i, k, o, n in zip(idx.tolist(), files.tolist(), offsets[idx].tolist(), sizes[idx].tolist()):
            if kernels.record_crc16(views[k][o : o + n]) != crc[i]:
                also = "" if len(views) == 1 else f" (record {i} of {self._ds!r})"
                raise kernels.CorruptFileError(
                    f"{self._ds.describe_record(i)}: checksum mismatch (CRC-16 of the payload "
                    f"differs from the index; verify_records=True){also}"
                )


class MixtureSource:
    """A `tbljax.mix` mixture as the engine serves it: rows drawn from the sources by weight
    (`rules/mixing.py`), each source's rows written by that source's own `RecordSource` (its
    fast path: RAW gather, compact JPEG boxes, ...) and placed in the batch. ``n`` is the
    positions of an epoch (steps_per_epoch × the global batch); records are numbered in the
    mixture's numbering (`Mixture.offsets`).

    A mixture of host parts (`Mixture.open_part`): this process draws its L = G / P rows of
    each step from its parts, keyed by its process index (`rules/mixing.py`, step 5); ``n``
    is then steps_per_epoch × L, and `draw` returns the rows' indices in the whole mixture's
    numbering (`Mixture.global_index`), which `local_records` maps back to its parts."""

    reads_ahead = False  # each source's reads are scattered by the draw; not advised ahead

    def __init__(self, mixture, opts: LoaderOptions):
        if not opts.drop_remainder:
            raise ValueError(
                "a mixture has no last partial batch to pad: every step is full; "
                "serve it with drop_remainder=True (evaluate each source alone)"
            )
        if not opts.shuffle:
            raise ValueError("a mixture draws each step's rows by weight: shuffle=False does not apply to it")
        if opts.repeats != 1:
            raise ValueError(
                f"repeats={opts.repeats} is not supported with a mixture: its rows are drawn by "
                "weight, not an epoch of every record; serve a single dataset with repeats="
            )
        self._mix = mixture
        self._subs = [RecordSource(d, opts.threads, opts.verify_records) for d in mixture.datasets]
        self._process, processes = mixture.processes
        if opts.batch_size % processes:
            raise ValueError(
                f"global batch {opts.batch_size} does not split evenly over "
                f"{processes} processes: with partition='host' use a multiple "
                f"of {processes}"
            )
        self.batch = opts.batch_size // processes  # this process's rows of each step
        self.steps_per_epoch = mixture.steps_per_epoch(opts.batch_size)
        self.n = self.steps_per_epoch * self.batch
        contract.check_record_count(len(mixture), what=repr(mixture))
        self.labels = contract.check_served_labels(mixture.labels, repr(mixture))
        self.fingerprint = mixture.fingerprint
        self.mixture = mixture.description
        self.geometry = mixture.geometry
        self.shape = self.geometry.shape

    mode = "mixture"

    def row_shape(self, opts: LoaderOptions, epoch: int | None = None) -> tuple[int, int, int]:
        try:
            return opts.row_shape(self.shape, epoch)
        except ValueError as e:
            raise ValueError(f"{self._mix!r}: its sources' records differ in size; {e}") from None

    def draw(self, positions, opts: LoaderOptions, epoch: int, first_index: int = 0, step=None, boxes_field=None):
        positions = np.asarray(positions, np.int64)
        if not len(positions):
            return positions, None, None, None
        step, rows = np.divmod(positions, self.batch)
        source, record, passes = draw_rows(
            self._mix.spec,
            seed=opts.seed,
            rows=rows,
            global_step=epoch * self.steps_per_epoch + int(step[0]),
            batch=self.batch,
            process=self._process,
        )
        idx = self._mix.global_index(source, record)
        if opts.augment is None:
            return idx, None, None, None
        boxes = flips = None
        # Keyed by (seed, the pass over the record's source, its index in the whole mixture).
        for k, q in sorted(set(zip(source.tolist(), passes.tolist()))):
            m = (source == k) & (passes == q)
            b, f = _augment.sample(
                opts.augment, idx[m], geometry=self._mix.source_geometry(k), seed=opts.seed, epoch=int(q) % (1 << 32)
            )
            if b is not None:
                boxes = np.zeros((len(idx), 4), b.dtype) if boxes is None else boxes
                boxes[m] = b
            if f is not None:
                flips = np.zeros(len(idx), bool) if flips is None else flips
                flips[m] = f
        return idx, boxes, flips, None

    def source_ids(self, records) -> np.ndarray:
        return self._mix.split(records)[0].astype(np.int32)

    def local_records(self, indices, first_index: int = 0) -> np.ndarray:
        return self._mix.local_index(indices)

    def fill(self, indices, out, *, crop, flip, started=None, ops=None, patches=None, **pixels):
        """Each source's rows through its own record source, then into their rows of `out`
        (`pixels`: the rest of `RecordSource.fill`'s arguments, the same for every source)."""
        k, r = self._mix.split(indices)
        for s in np.unique(k).tolist():
            m = np.flatnonzero(k == s)
            part = out[m[0] : m[0] + 1] if len(m) == 1 else np.empty((len(m), *out.shape[1:]), out.dtype)
            self._subs[s].fill(
                r[m],
                part,
                crop=None if crop is None else np.asarray(crop)[m],
                flip=None if flip is None else np.asarray(flip)[m],
                started=started,
                ops=None if ops is None else ops.rows(m),
                patches=None if patches is None else (patches[0], np.asarray(patches[1])[m]),
                **pixels,
            )
            started = None
            if len(m) > 1:
                out[m] = part

    def read_ahead(self, indices) -> None:
        return None

    def resident(self, indices) -> bool:
        return False

    def sweep(self) -> None:
        return None


_MAX_FDS = 64  # files kept open for posix_fadvise


def _nothing():
    pass


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

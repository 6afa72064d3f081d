"""How one step's host batch is built: `Plan` holds what a pass needs and builds each step
into a ring slot — the step's rows (`engine/step.py`) → the record source's fill (the fused
kernel, GIL released; `engine/record_source.py`) → a `HostBatch` of NumPy views.

Framework-free: what a framework makes of a HostBatch is the plan's ``finish`` function,
given by the loader layered on top (`jax/loader.py`, the torch and MLX adapters).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from tbljax._src.engine import file_sweep, native_res
from tbljax._src.engine import step as _step
from tbljax._src.engine import views as _views
from tbljax._src.engine.batch_fields import FieldServing
from tbljax._src.engine.canvas import CanvasServing
from tbljax._src.engine.geometric_serving import GeometricServing
from tbljax._src.engine.naflex_lengths import LengthServing
from tbljax._src.engine.naflex_pack import PackServing
from tbljax._src.engine.record_source import MixtureSource, RecordSource
from tbljax._src.engine.ring import Slot
from tbljax._src.engine.rows import RowLayout
from tbljax._src.rules import contract
from tbljax._src.rules.options import LoaderOptions
from tbljax._src.rules.parts import Parts

__all__ = ["HostBatch", "Plan", "RowsDrawn"]


_SAMPLE = 4  # records of a step checked for residency before advising it
_MAX_SKIP = 16  # a warm file: steps between two checks, at most (a colder one is caught then)


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
    # Record fields (`engine/batch_fields.py`): arrays per row range (fixed fields, padded
    # ragged fields and their "_length", field_fn outputs; zeros on padding rows), and lists
    # of this process's rows for str/json fields ("" / None on padding rows).
    fields: dict = dataclasses.field(default_factory=dict)
    texts: dict = dataclasses.field(default_factory=dict)
    # A mixture (`tbljax.mix`): each row's source, an index into `Mixture.sources`; else None.
    sources: tuple[np.ndarray, ...] | None = None
    # repeats > 1: which repeat of its record each row is (int32, -1 on padding rows); else None.
    repeats: tuple[np.ndarray, ...] | None = None
    # views= (`engine/views.py`): {name: per row range (rows, count, *row) views of the slot};
    # ``images`` then holds the packed rows they view, which no framework layer hands out.
    views: dict = dataclasses.field(default_factory=dict)

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


class RowsDrawn(NamedTuple):
    """What a step holds for one row range of the layout, drawn before the kernel builds it."""

    indices: np.ndarray  # sample indices (global numbering)
    boxes: np.ndarray | None  # crop boxes, or None
    flips: np.ndarray | None  # flips, or None
    records: np.ndarray  # the source's own record numbers of the samples
    repeats: np.ndarray | None  # each row's repeat (repeats > 1), or None
    ops: object | None = None  # the per-image op columns (`step.RowOps`), or None
    extents: np.ndarray | None = None  # canvas rows (`engine/canvas.py`): each row's (rh, rw), or None
    placed: object | None = None  # packed sequences (`naflex_pack.Placed`): each record's row and offset


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the producer needs to build any step: immutable, so it is safe to share."""

    source: RecordSource | MixtureSource
    layout: RowLayout
    opts: LoaderOptions
    start: tuple[int, int]  # cursor (epoch, position) the iteration starts from
    end_epoch: int | None  # the pass stops before this epoch (None: never)
    # HostBatch -> (what the consumer receives, the objects in it that view the ring slot);
    # runs in a producer thread, so a transfer to a device overlaps the step. None: the
    # HostBatch itself. Must not refer to the loader (see engine/producer.py).
    finish: object = None
    # partition="host": every process's part (positions are then local to the source, which
    # holds this process's part); None: one part, the whole dataset.
    parts: Parts | None = None
    fields: FieldServing | None = None  # the record fields served beside the image
    # Buckets or patches (`engine/native_res.py`; a length schedule: `engine/naflex_lengths.py`,
    # packed sequences: `engine/naflex_pack.py`): what decides a step's rows and shapes; or None.
    native: native_res.BucketServing | native_res.PatchServing | LengthServing | PackServing | None = None

    @property
    def buckets(self) -> native_res.BucketServing | None:
        return self.native if isinstance(self.native, native_res.BucketServing) else None

    @property
    def lengths(self) -> LengthServing | None:
        return self.native if isinstance(self.native, LengthServing) else None

    @property
    def pack(self) -> PackServing | None:
        return self.native if isinstance(self.native, PackServing) else None

    @property
    def stepper(self) -> LengthServing | PackServing | None:
        """What decides the steps of an epoch when they are not G positions each."""
        return self.lengths or self.pack

    def ranges(self, epoch, first) -> tuple[tuple[int, int], ...]:
        """This process's row ranges of the step at `first` (a length schedule's change a step)."""
        return self.layout.ranges if self.lengths is None else self.lengths.ranges(epoch, first)

    def next_cursor(self, epoch, first) -> tuple[int, int]:
        """The cursor after the step at `first` of `epoch` (the next epoch's start after its last)."""
        if self.stepper is not None:
            return self.stepper.next_cursor(epoch, first)
        g = self.layout.global_batch
        return self.slots.advance(epoch, first + g, g, drop_remainder=self.opts.drop_remainder)

    geometric: GeometricServing | None = None  # masks, boxes, ... through the image's geometry
    # Canvas rows (Augment(scale_jitter=...), crop='longer_pad'): what fills them; or None.
    canvas: CanvasServing | None = None
    views: _views.ViewServing | None = None  # views= (multi-crop): each row's views instead of one image
    bbox_field: str | None = None  # Augment(crop="bbox"): the boxes field its crops keep

    @property
    def part(self) -> Parts:
        """The parts the steps of an epoch are counted over (`tbljax.order.Parts`)."""
        return self.parts if self.parts is not None else Parts.whole(self.source.n)

    @property
    def slots(self) -> Parts:
        """The positions of an epoch in every part: its records times `repeats` (buckets: the
        schedule's steps times the global batch)."""
        if self.buckets is not None:
            return Parts.whole(self.buckets.steps * self.layout.global_batch)
        return self.part.times(self.opts.repeats)

    def step_rows(self, epoch, first) -> tuple[int, int]:
        """(first position, real rows) of this process's step of `epoch` starting at `first`."""
        if self.lengths is not None:
            return first, self.lengths.step(epoch, first)[3]
        return first, min(self.layout.global_batch, self.slots.n - first)

    def steps(self):
        """(epoch, first position) of every step from the cursor to the end (or forever).

        When the source reads ahead, before yielding step s it asks the disk for the records
        of steps s..s+k not yet asked for (k = opts.read_ahead): never more than k steps
        ahead of the step about to be drawn (the producer's draw stage runs this, a step
        ahead of the build: engine/producer.py). At the first cold step, if this process
        reads every record, the whole source is asked for too, in the background
        (`RecordSource.sweep`); the sweep stops when this generator does."""
        k = self.opts.read_ahead if self.source.reads_ahead else 0
        if k == 0:
            yield from self.positions()
            return
        ahead, asked = self.positions(), 0
        every, skip = 1, 0  # a warm file is checked every 2, 4, ... _MAX_SKIP steps
        sweep, swept = None, False  # the whole source asked for at once: at most once a pass
        try:
            for s, step in enumerate(self.positions()):
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
                        if not swept and self.reads_every_record:
                            sweep, swept = self.source.sweep(), True
                yield step
        finally:
            if sweep is not None:
                # Joined, not only stopped: a sweep left running holds the dataset's files,
                # and a pass must leave no thread behind (engine/producer.py).
                sweep.stop()
                sweep.join(file_sweep.JOIN_S)

    @property
    def reads_every_record(self) -> bool:
        """Whether this process reads every record of its source in an epoch: its rows are the
        whole global batch, or its source is its host part. Only then is a cold source worth
        asking for whole (`RecordSource.sweep`)."""
        rows = sum(b - a for a, b in self.layout.ranges)
        return self.parts is not None or rows == self.layout.global_batch

    def read_ahead(self, epoch, first) -> bool:
        """Asks the disk for this process's records of the step starting at `first`; True if
        they were resident already (nothing asked)."""
        src, opts = self.source, self.opts
        resident = True
        end = sum(self.step_rows(epoch, first))
        for a, b in self.ranges(epoch, first):
            pos = np.arange(first + a, min(first + b, end), dtype=np.int64)
            if not len(pos):
                continue

            def records(p, a=a, b=b):
                if self.pack is not None:  # the records packed into this range's sequences
                    return _step.records(
                        self.pack.positions(epoch, first, a, b)[0], opts, num_records=src.n, epoch=epoch
                    )[0]
                if self.buckets is not None:  # the schedule's rows (p: a prefix of this range's)
                    return self.buckets.draw(epoch, first, a, a + len(p))[0]
                return _step.records(p, opts, num_records=src.n, epoch=epoch, step=self.step_rows(epoch, first))[0]

            # A few records first: a warm file stops here (~20 us a step).
            if src.resident(records(pos[:_SAMPLE])):
                continue
            resident = False
            src.read_ahead(records(pos))
        return resident

    def positions(self):
        """(epoch, first position) of every step, as `steps` yields them, with no read-ahead."""
        part, g = self.slots, self.layout.global_batch
        epoch, position = self.start
        while self.end_epoch is None or epoch < self.end_epoch:
            if self.stepper is not None:
                yield from ((epoch, s) for s in self.stepper.starts(epoch, position))
                epoch, position = epoch + 1, 0
                continue
            count = part.steps(g, drop_remainder=self.opts.drop_remainder, start=position)
            for s in range(count):
                yield epoch, position + s * g
            epoch, position = epoch + 1, 0

    def draw(self, epoch, first) -> tuple[RowsDrawn, ...]:
        """This process's rows of the step starting at position `first`, per row range of the
        layout (`RowsDrawn`). Pure (`engine/step.py`): the producer draws a step ahead, while the
        kernel builds the one before (engine/producer.py)."""
        src, opts = self.source, self.opts
        first_index = self.part.start  # source record i is sample first_index + i
        out_hw = None  # the ops' size; patches: each row's own, from the step's patch serving
        native = self.lengths.patches(epoch, first) if self.lengths is not None else self.native
        patches = isinstance(native, native_res.PatchServing)
        if _step.has_ops(opts.augment) and self.buckets is not None:  # the step's bucket
            out_hw = self.buckets.out_hw(epoch, first)
        elif _step.has_ops(opts.augment) and not patches and self.pack is None:
            row = src.row_shape(opts, epoch)
            out_hw = row[1:] if contract.channel_axis(opts.layout) == 1 else row[:2]
        drawn = []
        end = sum(self.step_rows(epoch, first))
        for a, b in self.ranges(epoch, first):
            if self.pack is not None:
                pos, placed = self.pack.positions(epoch, first, a, b)
                idx, boxes, flip, _ = src.draw(pos, opts, epoch, first_index, (first, len(pos)))
                hw = self.pack.image.row_sizes(idx, boxes) if _step.has_ops(opts.augment) else None
                ops = None if hw is None else _step.draw_ops(idx, opts, epoch=epoch, out_hw=hw)  # each image's size
                records = src.local_records(idx, first_index)
                drawn.append(RowsDrawn(idx, boxes, flip, records, None, ops, placed=placed))
                continue
            if self.buckets is not None:
                idx, boxes, flip = self.buckets.draw(epoch, first, a, b)
                ops = None if out_hw is None else _step.draw_ops(idx, opts, epoch=epoch, out_hw=out_hw)
                drawn.append(RowsDrawn(idx, boxes, flip, idx, None, ops))
                continue
            nvalid = int(np.clip(end - (first + a), 0, b - a))
            pos = np.arange(first + a, first + a + nvalid, dtype=np.int64)
            idx, boxes, flip, repeat = src.draw(
                pos, opts, epoch, first_index, self.step_rows(epoch, first), boxes_field=self.bbox_field
            )
            records = src.local_records(idx, first_index)  # (host parts, mixtures: the source's numbering)
            hw = native.row_sizes(records, boxes) if patches and _step.has_ops(opts.augment) else out_hw
            rep = 0 if repeat is None else repeat
            ops = None if hw is None else _step.draw_ops(idx, opts, epoch=epoch, out_hw=hw, repeat=rep)
            ext = _step.draw_extents(
                idx, opts, image_hw=src.geometry, epoch=epoch, first_index=first_index, repeat=repeat
            )
            drawn.append(RowsDrawn(idx, boxes, flip, records, repeat, ops, ext))
        return tuple(drawn)

    def build_host(self, ring, epoch, first, stop=None, drawn=None, started=None) -> tuple[HostBatch, Slot]:
        """This process's rows of the step starting at position `first`, in a ring slot (the
        second item). `drawn`: the step's `draw`, if made already. `started()`, if given, is
        called once, just before the kernel call that builds the step (or at the end, if none
        does): the GIL is released from there on."""
        src, opts = self.source, self.opts
        mean, std = opts.normalization
        drawn = self.draw(epoch, first) if drawn is None else drawn
        slot = ring.acquire(stop)
        ranges = self.ranges(epoch, first)
        # A size schedule's size of `epoch`; a length schedule's length and rows of the step.
        views = slot.views(self.row_shape(epoch, first), None if self.lengths is None else [b - a for a, b in ranges])
        labels, indices, valid, sources, served, repeats, hws = [], [], [], [], [], [], []
        view_blocks = {}
        native = self.lengths.patches(epoch, first) if self.lengths is not None else self.native
        patches = isinstance(native, native_res.PatchServing)
        pack_labels = []
        pixels = dict(mean=mean, std=std, jpeg_dct_scale=opts.jpeg_dct_scale)  # every fill's
        for (a, b), out, (idx, boxes, flip, records, repeat, ops, ext, placed) in zip(ranges, views, drawn):
            rows, nvalid = b - a, len(idx)
            if self.pack is not None:  # rows are sequences: the per-image keys are per segment
                hws.append(np.zeros((0, 2), np.int64))
                out[...] = 0
                if nvalid:
                    boxes = self.pack.image.boxes(idx, boxes)
                    hws[-1] = self.pack.fill(
                        src, records, out, placed, boxes=boxes, flip=flip, started=started, ops=ops, **pixels
                    )
                    started = None
                filled = int(placed.row.max()) + 1 if nvalid else 0  # sequences are filled as a prefix
                indices.append(np.full(rows, -1, np.int32))
                labels.append(np.full(rows, -1, np.int32))
                valid.append(np.arange(rows) < filled)
                pack_labels.append(src.labels[records].astype(np.int32))
                continue
            if patches:
                boxes = native.boxes(records, boxes)
                hws.append(np.zeros((0, 2), np.int64))
            if nvalid and patches:
                hws[-1] = native.fill(
                    src, records, out[:nvalid], boxes=boxes, flip=flip, started=started, ops=ops, **pixels
                )
                started = None
            elif nvalid and ext is not None:
                kw = dict(extents=ext, boxes=boxes, flip=flip, layout=opts.layout, started=started)
                self.canvas.fill(src, records, out[:nvalid], **kw, **pixels)
                started = None
            elif self.views is not None:  # each row's views, drawn here: they are cheap
                geometry = src.geometry.shifted(self.part.start)
                vd = self.views.draw(idx, geometry=geometry, epoch=epoch, repeat=repeat)
                got = self.views.fill(src, records, vd, out, jpeg_dct_scale=opts.jpeg_dct_scale, started=started)
                started = None
                for name, block in got.items():
                    view_blocks.setdefault(name, []).append(block)
            elif nvalid:
                src.fill(
                    records, out[:nvalid], layout=opts.layout, crop=boxes, flip=flip, started=started, ops=ops, **pixels
                )
                started = None
            if self.views is None:  # (views zero their own padding rows: their blocks are not out's rows)
                out[nvalid:] = 0  # padding rows (only at the end of an epoch without drop_remainder)
            pad = rows - nvalid
            indices.append(np.concatenate([idx, np.full(pad, -1)]).astype(np.int32))
            labels.append(np.concatenate([src.labels[records], np.full(pad, -1)]).astype(np.int32))
            valid.append(np.arange(rows) < nvalid)
            served.append(records)
            ids = src.source_ids(records)
            if ids is not None:
                sources.append(np.concatenate([ids, np.full(pad, -1)]).astype(np.int32))
            if opts.repeats > 1:
                repeats.append(np.concatenate([repeat, np.full(pad, -1)]).astype(np.int32))
        if started is not None:
            started()
        arrays, texts = {}, {}
        rows = [b - a for a, b in ranges]
        if self.fields and self.pack is not None:  # per segment: a row holds several records
            arrays, texts = self.pack.fields(self.fields, drawn, rows, epoch, first)
        elif self.fields:
            arrays, texts = self.fields.build(served, rows, epoch, first)
        if self.buckets is not None:
            arrays.update(self.buckets.arrays(epoch, first, drawn, rows))
        elif self.pack is not None:
            arrays.update(self.pack.arrays(drawn, hws, pack_labels, rows))
        elif native is not None:
            arrays.update(native.arrays(hws, rows))
        if self.canvas is not None or self.geometric:  # neither with buckets or patches (refused)
            row = src.row_shape(opts, epoch)
            out_hw = row[1:] if contract.channel_axis(opts.layout) == 1 else row[:2]
        if self.canvas is not None:
            arrays.update(self.canvas.arrays(drawn, rows, out_hw))
        if self.geometric:
            arrays.update(self.geometric.build(src.geometry, served, drawn, rows, out_hw))
        return HostBatch(
            epoch,
            first,
            ranges,
            tuple(views),
            tuple(labels),
            tuple(indices),
            None if opts.drop_remainder else tuple(valid),
            arrays,
            texts,
            tuple(sources) if sources else None,
            tuple(repeats) if repeats else None,
            {name: tuple(blocks) for name, blocks in view_blocks.items()},
        ), slot

    def row_shape(self, epoch, first) -> tuple[int, ...]:
        """One row of the step at `first` of `epoch`: its bucket's size under buckets, a
        sequence of patches under patches, else the size of `epoch`."""
        if self.buckets is not None:
            return contract.row_shape(self.opts.layout, *self.buckets.out_hw(epoch, first))
        if self.lengths is not None:
            return self.lengths.patches(epoch, first).row_shape
        if self.native is not None:  # patches, packed or not
            return self.native.row_shape
        if self.views is not None:
            return self.views.row_shape
        return self.source.row_shape(self.opts, epoch)

    def finish_host(self, host: HostBatch, slot: Slot):
        """What the consumer receives for `host`; the slot learns what views it."""
        result, viewers = (host, host.images) if self.finish is None else self.finish(host)
        slot.watch(viewers)
        return result

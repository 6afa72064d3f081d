"""`HostLoader`, the framework-free loader. It wires a dataset, the order,
the kernel and the host ring into passes (`producer.Pass`), and keeps what a training job
saves and watches: the cursor, the resumable state and the metrics.

Data flows one way: `order` says which sample each row holds → `augment` says its crop and flip
→ the kernel (GIL released) writes the rows into a ring slot → a layer on top makes the slot
its framework's arrays (no copy on CPU) → the consumer receives it from a queue. That layer is
a subclass: `tbljax.Loader` for JAX, and the torch and MLX adapters' loaders.
"""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np

from tbljax._src.engine import native_res, views
from tbljax._src.engine import step as _step
from tbljax._src.engine.batch_fields import FieldServing
from tbljax._src.engine.canvas import CANVAS_KEYS, CanvasServing
from tbljax._src.engine.geometric_serving import GeometricServing
from tbljax._src.engine.naflex_lengths import LengthServing
from tbljax._src.engine.naflex_pack import PACK_KEYS, PackServing
from tbljax._src.engine.plan import Plan
from tbljax._src.engine.producer import Metrics, Pass
from tbljax._src.engine.record_source import open_source
from tbljax._src.engine.ring import Ring, aligned_empty
from tbljax._src.engine.rows import RowLayout
from tbljax._src.rules import contract, resume, scale_jitter
from tbljax._src.rules.options import LoaderOptions
from tbljax._src.rules.parts import Parts

__all__ = ["HostLoader"]

# Slots beyond the prefetch queue: one being filled, one the consumer holds, one still read by
# a step in flight. A slot still viewed is waited for, then replaced (see `Ring`),
# never overwritten.
RING_EXTRA = 3


class HostLoader:
    """The framework-free loader: order, kernel, ring, producer thread, state and metrics.

    Yields `HostBatch`es (NumPy views of the ring) for the rows `rows` (a `tbljax.RowLayout`)
    gives this process.
    A layer on top (`tbljax.Loader` for JAX, the torch and MLX adapters) is a subclass that
    overrides the seams below: `finisher` (what the producer makes of a HostBatch),
    `pass_bounds` and `pass_ended` (where a pass starts and ends). By default iterating runs
    from the cursor (epoch, position) to the end of epoch ``num_epochs - 1`` (or forever); a
    pass that ran to its end makes the next one start over at epoch 0; a restored state that
    is at the end yields nothing.

    ``alloc`` and ``before_reuse`` go to the ring (`Ring`). ``parts`` (a
    `tbljax.order.Parts`) makes it serve one host part (partition="host"): `dataset` is then
    this process's part, `rows` its rows alone (``global_batch`` = its local batch), and
    the steps of an epoch and the state count over every process's part.

    >>> ld = tbljax.HostLoader(tbljax.open("train.tbl"),
    ...                        tbljax.LoaderOptions(batch_size=256, num_epochs=1),
    ...                        tbljax.RowLayout.for_rank(256, rank=0, world_size=1))
    >>> for hb in ld:
    ...     hb.image, hb.label       # (256, H, W, 3) float32 view of the ring, int32 labels
    """

    def __init__(
        self,
        dataset,
        opts: LoaderOptions,
        rows: RowLayout | None = None,
        *,
        alloc=aligned_empty,
        before_reuse=None,
        parts: Parts | None = None,
        layout: RowLayout | None = None,
    ):
        if layout is not None:  # the keyword's former name, kept for callers that use it
            if rows is not None:
                raise TypeError("pass rows or layout (its former name), not both")
            rows = layout
        _step.check_ops(opts)
        self.options = opts
        self._source = open_source(dataset, opts)
        self._fields = FieldServing(dataset, opts.fields, opts.field_fn, opts.pad, opts.batch_size)
        self.check_fields(dataset, [n for n in self._fields.names if n not in self._fields.fns])
        self._geometric = GeometricServing(dataset, self._fields.geometric, opts, opts.threads or 0)
        self._bbox_field = self._bbox_crop_field()
        if parts is not None and parts.n != self._source.n:
            raise ValueError(
                f"part {parts.index} should hold {parts.n} records, the dataset given holds {self._source.n}"
            )
        self._host_parts = parts  # None unless partition="host"
        # What the steps and the state count over: the host parts, or one part of every record
        # (each record `repeats` times: `Plan.slots`).
        self._record_parts = parts if parts is not None else Parts.whole(self._source.n)
        self._step_parts = self._record_parts.times(opts.repeats)
        self._rows = rows if rows is not None else RowLayout.for_rank(opts.batch_size, 0, 1)
        self._cursor = (0, 0)  # (epoch, position) of the next batch to hand out
        self._native = self._native_resolution(dataset, parts)
        self._canvas = self._canvas_serving()
        if isinstance(self._native, native_res.BucketServing):
            # Positions count G a step: an epoch is the schedule's steps, whole.
            self._step_parts = Parts.whole(self._native.steps * self._rows.global_batch)
        self._views = self._view_serving()
        if isinstance(self._native, LengthServing):  # (rows × this row holds every step)
            largest = self._native.ring_row
        elif self._native is not None:
            largest = self._native_row_shape(None)
        elif self._views is not None:
            largest = self._views.row_shape
        else:
            # One row shape per entry of a size schedule (one without); the ring is sized once for
            # the largest, and each batch views it at its epoch's size (`Slot.views` in ring.py).
            schedule = opts.augment.schedule if opts.augment is not None else ((0, None),)
            shapes = [self._source.row_shape(opts, epoch) for epoch, _ in schedule]
            largest = max(shapes, key=lambda s: int(np.prod(s)))
        if len(self) == 0:
            times = f" × repeats={opts.repeats}" if opts.repeats > 1 else ""
            what = (
                f"the dataset ({self._source.n} samples{times})"
                if parts is None
                else f"the smallest host part ({min(parts.counts)} samples{times})"
            )
            raise contract.ArgumentError(  # in the CLI's words too: `bench --batch-size`
                contract.Arg("batch_size"),
                f" {self._rows.global_batch} is larger than {what}: no step would run; use a smaller ",
                contract.Arg("batch_size"),
                ", or ",
                contract.Arg("drop_remainder", False),
                " to serve a padded last batch",
            )
        self._finished = False  # the last pass ran to its end: the next one starts over
        self._metrics = Metrics()
        self._active = None  # weakref to the live Pass
        # Kept across passes (one pass runs at a time), so its memory is reused, not
        # page-faulted in again for every evaluation pass.
        self._ring = Ring(
            self._rows, largest, opts.out_dtype, opts.prefetch + RING_EXTRA, alloc=alloc, before_reuse=before_reuse
        )

    def _bbox_crop_field(self) -> str | None:
        """The boxes field Augment(crop="bbox") keeps objects of, or None without it; refuses by
        name what it is not served with."""
        aug = self.options.augment
        if aug is None or aug.crop != "bbox":
            return None
        boxes = self._geometric.boxes
        if len(boxes) != 1:
            raise ValueError(
                "Augment(crop='bbox') crops around each record's boxes: it needs exactly one boxes field "
                f"(tbljax.Boxes) among the fields served, got {boxes}; name it in fields="
            )
        if self._source.mixture is not None:
            raise ValueError("Augment(crop='bbox') with a mixture (tbljax.mix): not served yet")
        return boxes[0]

    def _native_resolution(self, dataset, parts):
        """Buckets' or patches' serving (`engine/native_res.py`, over len(dataset) records: a
        mixture's positions, `MixtureSource.n`, are not its records), or None; refuses by name
        what they are not served with."""
        opts = self.options
        what = "buckets" if opts.buckets is not None else "patches" if opts.patches is not None else None
        if what is None:
            return None
        # A schedule over the records needs every record's size on every process, and a mixture
        # draws its rows by weight: one max_tokens alone is served over host parts and mixtures.
        schedule = native_res.schedule_name(opts)
        if schedule and parts is not None:
            raise ValueError(f"{schedule} with partition='host': not served yet (a schedule of the whole dataset)")
        if schedule and self._source.mixture is not None:
            raise ValueError(f"{schedule} with a mixture (tbljax.mix): not served yet (its rows are drawn by weight)")
        if self._geometric.names:
            raise ValueError(
                f"{what} with the geometric fields {self._geometric.names}: not served yet (they follow "
                "the augmentation's crop; pass fields= without them)"
            )
        native_res.check_names(self._fields.names)
        if opts.patches is not None and isinstance(opts.patches.max_tokens, tuple):
            return LengthServing(self._source.geometry, self._source.n, opts, self._rows)
        if opts.patches is not None and opts.patches.pack:
            clash = sorted(set(self._fields.names) & set(PACK_KEYS))
            if clash:
                raise ValueError(
                    f"the dataset's field(s) {clash} have the names of batch keys pack=True adds; "
                    "leave them out with fields=[...]"
                )
            return PackServing(self._source.geometry, self._source.n, opts, self._rows.global_batch)
        return native_res.serving(self._source.geometry, len(dataset), opts, self._rows.global_batch)

    def _canvas_serving(self) -> CanvasServing | None:
        """Canvas rows' serving (Augment(scale_jitter=...), crop='longer_pad'), or None;
        refuses by name what they are not served with (buckets and patches: `LoaderOptions`)."""
        aug = self.options.augment
        if not scale_jitter.on_canvas(aug):
            return None
        what = "Augment(scale_jitter=...)" if aug.scale_jitter is not None else "Augment(crop='longer_pad')"
        if self._source.mixture is not None:
            raise ValueError(f"{what} with a mixture (tbljax.mix): not served yet")
        clash = sorted(set(self._fields.names) & set(CANVAS_KEYS))
        if clash:
            raise ValueError(
                f"the dataset's field(s) {clash} have the name of the batch key {what} adds; "
                "leave them out with fields=[...]"
            )
        return CanvasServing()

    def _view_serving(self):
        """Multi-view serving (`engine/views.py`), or None; refuses by name what views are not
        served with."""
        opts = self.options
        if opts.views is None:
            return None
        if self._source.mixture is not None:
            raise ValueError("views with a mixture (tbljax.mix): not served yet")
        if self._geometric.names:
            raise ValueError(
                f"views with the geometric fields {self._geometric.names}: not served yet (pass fields= without them)"
            )
        serving = views.ViewServing(opts)
        clash = sorted(set(serving.names) & set(self._fields.names))
        if clash:
            raise ValueError(f"views {clash}: the dataset serves fields of these names; rename the views")
        return serving

    def _native_row_shape(self, cursor) -> tuple[int, ...]:
        """A row under buckets (the bucket of the step at `cursor`; None: the largest) or
        patches."""
        nr = self._native
        if isinstance(nr, LengthServing):  # the cursor's step's length (None: the longest)
            starts = [] if cursor is None else nr.starts(*cursor)
            return nr.patches(cursor[0], starts[0]).row_shape if starts else nr.row_shape
        if isinstance(nr, (native_res.PatchServing, PackServing)):
            return nr.row_shape
        if cursor is None:
            oh, ow = nr.largest
        else:
            oh, ow = nr.out_hw(*cursor)
        return contract.row_shape(self.options.layout, oh, ow)

    # ---- the seams a layer on top overrides ----
    def check_fields(self, dataset, names: list[str]) -> None:
        """Refuses at construction a field among `names` (served as stored, no field_fn) that
        the framework cannot hold as stored. Default: every field is fine."""

    def finisher(self):
        """A function HostBatch -> (what iteration yields, the objects in it that view the
        ring slot), run in the producer thread; it must not refer to `self` (the producer may
        not keep the loader alive). None: yield the HostBatch itself."""
        return None

    def pass_bounds(self) -> tuple[tuple[int, int], int | None]:
        """(cursor the next pass starts from, epoch it stops before). Default: from the
        cursor to the end of epoch ``num_epochs - 1`` (or forever), starting over at epoch 0
        after a pass that ran to its end."""
        if self._finished:
            self._cursor, self._finished = (0, 0), False
        return self._cursor, self.options.num_epochs

    def pass_ended(self) -> None:
        """Called when a pass ran to its end."""
        self._finished = True

    # ---- what the seams read ----
    @property
    def cursor(self) -> tuple[int, int]:
        """(epoch, position) of the next batch to hand out."""
        return self._cursor

    @property
    def rows(self) -> RowLayout:
        """Which rows of each global batch this process builds (not the pixel layout,
        ``options.layout``)."""
        return self._rows

    @property
    def layout(self) -> RowLayout:
        """The former name of `rows`, kept for callers that use it."""
        return self._rows

    @property
    def geometric_fields(self) -> list[str]:
        """The fields served through each row's crop and flip (masks, boxes, ...; issue 48)."""
        return list(self._geometric.names)

    @property
    def lengths(self) -> LengthServing | None:
        """The length schedule (`Patches(max_tokens=[...])`): each step's length and rows; else None."""
        return self._native if isinstance(self._native, LengthServing) else None

    @property
    def ring(self) -> Ring:
        """The ring of host buffers this loader builds batches in (kept across passes)."""
        return self._ring

    @property
    def row_shape(self) -> tuple[int, int, int]:
        """One row of the next batch: (OH, OW, 3) in NHWC, (3, OH, OW) in NCHW (the cursor's
        epoch's size under a size schedule, the cursor's step's bucket under buckets; a batch's
        own shape says what it holds)."""
        if isinstance(self._native, (LengthServing, PackServing)):
            return self._native_row_shape(self._cursor)
        if self._native is not None:
            epoch, position = self._cursor
            return self._native_row_shape((epoch, min(position, len(self) * self._rows.global_batch - 1)))
        return self.row_shape_at(self._cursor[0])

    def row_shape_at(self, epoch: int) -> tuple[int, int, int]:
        """One row of a batch of `epoch` (under buckets: of the largest bucket; under a length
        schedule: of the longest length)."""
        if self._native is not None:
            return self._native_row_shape(None)
        if self._views is not None:  # every view's row packed (`engine/views.py`)
            return self._views.row_shape
        return self._source.row_shape(self.options, epoch)

    # ---- the iterator protocol and the state ----
    def __len__(self) -> int:
        """Steps in one epoch."""
        if isinstance(self._native, (LengthServing, PackServing)):  # (packed: the cursor's epoch's)
            return self._native.steps(self._cursor[0])
        return self._step_parts.steps(self._rows.global_batch, drop_remainder=self.options.drop_remainder)

    @property
    def num_samples(self) -> int:
        """Samples in the dataset (all host parts together)."""
        return sum(self._record_parts.counts)

    def __iter__(self) -> Pass:
        self._close_active()
        start, end_epoch = self.pass_bounds()
        plan = Plan(
            self._source,
            self._rows,
            self.options,
            start,
            end_epoch,
            self.finisher(),
            parts=self._host_parts,
            fields=self._fields,
            native=self._native,
            geometric=self._geometric,
            canvas=self._canvas,
            views=self._views,
            bbox_field=self._bbox_field,
        )
        it = Pass(plan, self._ring, self._metrics, on_step=self._handed_out, on_end=self.pass_ended)
        self._active = weakref.ref(it)
        return it

    def _handed_out(self, cursor: tuple[int, int]) -> None:
        self._cursor = cursor

    def _close_active(self):
        it = self._active() if self._active is not None else None
        if it is not None:
            it.close()
        self._active = None

    def close(self) -> None:
        """Stops a running iteration (also done on break, error, del and interpreter exit)."""
        self._close_active()

    def set_epoch(self, epoch: int) -> None:
        """Moves the cursor to the start of `epoch`; the next iteration begins there."""
        if not contract.is_integer(epoch) or not 0 <= epoch < 1 << 32:
            raise ValueError(f"epoch must be an integer in [0, 2**32), got {epoch!r}")
        self._close_active()
        self._cursor, self._finished = (int(epoch), 0), False

    def state_dict(self) -> dict:
        """{version, seed, epoch, position, fingerprint}: position counts the samples of
        `epoch` already handed out. Restore with `load_state_dict`, with any batch size or
        process count: the stream continues with nothing repeated and nothing skipped.

        With host parts it also holds {partition: "host", processes: P}, and position counts
        the rows of each part handed out; it restores exactly at the same process count (any
        batch size), and at another process count only at an epoch boundary
        (`tbljax.order.check_state`)."""
        epoch, position = self._cursor
        processes = len(self._host_parts.counts) if self._host_parts is not None else None
        return resume.make_state(
            seed=self.options.seed,
            epoch=epoch,
            position=position,
            fingerprint=self._source.fingerprint,
            processes=processes,
            mixture=self._source.mixture,
            repeats=self.options.repeats,
            buckets=self._bucket_state(),
            packing=self._packing_state(),
        )

    def _bucket_state(self) -> dict | None:
        """What a bucketed state's positions depend on: the bucket sizes and the global batch."""
        nr = self._native
        if not isinstance(nr, native_res.BucketServing):
            return None
        return {"sizes": nr.sizes.tolist(), "global_batch": nr.g}

    def _packing_state(self) -> dict | None:
        """What a packed loader's positions (sequences) depend on."""
        if not isinstance(self._native, PackServing):
            return None
        p = self.options.patches
        return {"max_tokens": p.max_tokens, "image_tokens": p.image_tokens, "pack_window": p.pack_window}

    def load_state_dict(self, state: dict) -> None:
        """Restores a `state_dict`; the next iteration continues from it. Raises ValueError
        for another format version, another dataset, another seed, another partition, or
        (host parts) a mid-epoch state of another process count."""
        parts = self._host_parts
        epoch, position = resume.check_state(
            state,
            seed=self.options.seed,
            fingerprint=self._source.fingerprint,
            n=max(self._step_parts.counts),
            processes=len(parts.counts) if parts is not None else None,
            mixture=self._source.mixture,
            repeats=self.options.repeats,
            buckets=self._bucket_state(),
            packing=self._packing_state(),
        )
        self._close_active()
        self._finished = False  # a restored end state yields nothing, as the original run
        if isinstance(
            self._native, (LengthServing, PackServing)
        ):  # a step start (refused otherwise), or the epoch's end
            self._cursor = (epoch, position) if self._native.starts(epoch, position) else (epoch + 1, 0)
            return
        self._cursor = self._step_parts.advance(
            epoch, position, self._rows.global_batch, drop_remainder=self.options.drop_remainder
        )

    def metrics(self) -> dict:
        """Counters since creation: steps handed out, images built by this process and the
        producer's rate, consumer wait time (total and last step), producer wait time for
        ring slots still held by the consumer, and ring slots replaced."""
        m = self._metrics
        d = dataclasses.asdict(m)
        d["produced_img_per_s"] = m.images / m.produce_seconds if m.produce_seconds else 0.0
        return d

    def __repr__(self) -> str:
        o = self.options
        return (
            f"{type(self).__name__}({self.num_samples} samples, "
            f"batch_size={self._rows.global_batch}, steps/epoch={len(self)}, "
            f"dtype={o.dtype}, layout={o.layout}, augment={o.augment}, "
            f"cursor={self._cursor})"
        )

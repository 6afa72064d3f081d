"""What the torch and MLX adapters share: a `HostLoader` for one rank of a data-parallel job
that serves one epoch per pass (as a torch DataLoader does), the `TensorBatch` they yield, the
checks of their arguments, and ``mixup=`` (`rules/mixup.py` on each batch's NumPy arrays).
Framework-free: each adapter only adds how a `HostBatch` becomes its framework's arrays.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from tbljax._src.engine.host_loader import HostLoader
from tbljax._src.engine.rows import RowLayout
from tbljax._src.rules import contract
from tbljax._src.rules import mixup as mixing
from tbljax._src.rules.errors import shown
from tbljax._src.rules.options import LoaderOptions

__all__ = ["TensorBatch", "EpochLoader", "check_rank", "options", "global_step"]


class TensorBatch(tuple):
    """A step as the framework's arrays (torch tensors, mx.arrays): ``(images, labels)`` — so
    ``for x, y in loader`` works — with more on attributes:

    ``index``: the sample index of every row (-1 on padding rows); ``valid``: a bool mask of
    the real rows, or None with drop_remainder (no padding); ``epoch`` and ``position``: the
    step's epoch and the global position of its first row; ``source``: for a mixture
    (`tbljax.mix`), each row's source (an index into ``mixture.sources``), else None;
    ``repeat``: with repeats > 1, which repeat of its record each row is (-1 on padding rows),
    else None;
    ``fields``: the record fields served, by name (arrays of the framework for numeric fields,
    ragged ones padded with their ``name + "_length"``; Python lists for str/json fields).
    With ``views=``, ``images`` is a dict {view name: (B, count, ...) array}.
    """

    def __new__(cls, images, labels, *, index, valid, epoch: int, position: int, source=None, fields=None, repeat=None):
        self = super().__new__(cls, (images, labels))
        self.index, self.valid, self.epoch, self.position = index, valid, epoch, position
        self.source, self.fields, self.repeat = source, dict(fields or {}), repeat
        return self

    @property
    def images(self):
        return self[0]

    @property
    def labels(self):
        return self[1]


def check_rank(rank, world_size) -> tuple[int, int]:
    """Validated (rank, world_size); both None means a single process (0, 1)."""
    if rank is None and world_size is None:
        return 0, 1
    if rank is None or world_size is None:
        raise ValueError(f"give both rank and world_size, or neither; got rank={rank!r}, world_size={world_size!r}")
    if not contract.is_integer(world_size) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not contract.is_integer(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, {world_size}), got {rank!r}")
    return int(rank), int(world_size)


def options(batch_size, world_size: int, **kw) -> LoaderOptions:
    """LoaderOptions for a per-rank `batch_size`: the global batch is batch_size * world_size
    (the state's position and the order count global positions, as the JAX loader does)."""
    if not contract.is_integer(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size (per rank) must be an integer >= 1, got {batch_size!r}")
    return LoaderOptions(batch_size=int(batch_size) * world_size, **kw)


class EpochLoader(HostLoader):
    """A `HostLoader` for rank `rank` of `world_size`, one epoch per pass.

    Rank r holds rows [r*b, (r+1)*b) of every global batch of b*world_size rows: the rows the
    JAX loader gives process r, so a job can switch frameworks (or world sizes) and resume
    from the same state. Each pass (``for x, y in loader``) serves the rest of the cursor's
    epoch and leaves the cursor at the start of the next epoch, so the usual loop works with
    or without ``set_epoch``::

        for epoch in range(start_epoch, num_epochs):
            loader.set_epoch(epoch)
            for x, y in loader:
                ...
    """

    def __init__(
        self,
        dataset,
        opts: LoaderOptions,
        rank: int,
        world_size: int,
        *,
        parts=None,
        mixup: mixing.Mixup | None = None,
        **ring,
    ):
        if mixup is not None and not isinstance(mixup, mixing.Mixup):
            raise TypeError(
                f"mixup must be None or a tbljax.ops.Mixup, got {type(mixup).__name__}: {shown(repr(mixup))}"
            )
        if mixup is not None and opts.patches is not None:
            raise ValueError(
                "mixup= with patches=: not served (Mixup blends and CutMix boxes need images of one "
                "size; each row of a patch sequence batch has its own grid and padding)"
            )
        self.rank, self.world_size = rank, world_size
        rows = RowLayout.for_rank(opts.batch_size, rank, world_size)
        if parts is not None:  # host parts: this rank's rows are a batch of its own part
            rows = rows.process_local(world_size)
        super().__init__(dataset, opts, rows, parts=parts, **ring)
        self.mixup = mixup
        if mixup is not None and opts.views is not None:
            raise ValueError("mixup= with views=: not served yet (mixup mixes one image per row)")
        if mixup is not None:
            self._check_mixup(dataset)

    def _check_mixup(self, dataset) -> None:
        """Refuses here, not on a batch, what `mixup` cannot mix: a batch shape or dtype
        (`rules.mixup.check_batch`: an odd batch per rank, too many pixels), geometric fields
        (a mask does not blend), and a record
        without a class id in [0, num_classes) (it would read as a padding row)."""
        m, o, b = self.mixup, self.options, self.batch_size
        if self.geometric_fields:
            raise ValueError(
                f"mixup= with the geometric fields {self.geometric_fields}: Mixup/CutMix blends and pastes the "
                "pixels without them; leave the fields out with fields= or mixup= out"
            )
        a = o.augment
        if a is not None and (a.scale_jitter is not None or a.crop == "longer_pad"):
            what = "scale_jitter=" if a.scale_jitter is not None else "crop='longer_pad'"
            raise ValueError(
                f"mixup= with Augment({what}): Mixup/CutMix would blend the padding into the image, and "
                "image_valid would no longer say which pixels are real"
            )
        schedule = o.augment.schedule if o.augment is not None else ((0, None),)
        for epoch, _ in schedule:  # shapes and dtypes only: arrays of no memory
            shape = (b, *self.row_shape_at(epoch))
            try:
                mixing.check_batch(
                    m, np.broadcast_to(np.zeros((), o.out_dtype), shape), np.broadcast_to(np.int32(0), (b,)), o.layout
                )
            except ValueError as e:
                raise ValueError(
                    f"mixup= with batch_size={b} on this rank, dtype={o.dtype!r}, layout={o.layout!r}: {e}"
                ) from None
        labels = np.asarray(dataset.labels)
        bad = np.flatnonzero((labels < 0) | (labels >= m.num_classes))
        if bad.size:
            i = int(bad[0])
            what = (
                "has no label"
                if labels[i] < 0
                else f"has label {int(labels[i])}, not a class id in [0, {m.num_classes})"
            )
            raise ValueError(
                f"mixup=: {dataset.describe_record(i)} {what} ({bad.size} such records): "
                "Mixup's soft targets need every record's class id below "
                f"num_classes={m.num_classes}"
            )

    def to_arrays(self):
        """The framework's seam: a function HostBatch -> (TensorBatch, the objects in it that
        view the ring slot), as `finisher` (it must not refer to `self`)."""
        raise NotImplementedError

    def finisher(self):
        if self.mixup is None:
            return self.to_arrays()
        return functools.partial(
            _mixed,
            self.to_arrays(),
            self.mixup,
            seed=self.options.seed,
            layout=self.options.layout,
            steps=len(self),
            batch=self.rows.global_batch,
        )

    @property
    def batch_size(self) -> int:
        """Rows per batch on this rank (a torch DataLoader's ``batch_size``)."""
        return self.rows.local_rows

    @property
    def drop_last(self) -> bool:
        return self.options.drop_remainder

    def __repr__(self) -> str:
        o = self.options
        return (
            f"{type(self).__name__}({self.num_samples} samples, batch_size={self.batch_size}"
            f" on rank {self.rank} of {self.world_size}, steps/epoch={len(self)}, "
            f"dtype={o.dtype}, layout={o.layout}, augment={o.augment}, "
            f"cursor={self.cursor})"
        )

    def pass_bounds(self):
        return self.cursor, self.cursor[0] + 1

    def pass_ended(self) -> None:
        pass  # the last step already moved the cursor to (epoch + 1, 0)

    def set_epoch(self, epoch: int) -> None:
        """The next pass serves epoch `epoch`. If the cursor is already inside that epoch (a
        restored `state_dict`, or a pass left early) it continues from there, so a resumed
        run repeats and skips nothing; otherwise the epoch starts at its first step."""
        if contract.is_integer(epoch) and epoch == self.cursor[0]:
            self.close()  # continue inside this epoch
        else:
            super().set_epoch(epoch)


def global_step(epoch: int, position: int, steps: int, batch: int) -> int:
    """The step counted across epochs that `mixup=` is keyed by: epoch * steps per epoch + the
    step in the epoch (its first position // the batch the positions count; a run resumed
    from a state of another batch size counts from where its position falls)."""
    return epoch * steps + position // batch


def _mixed(to_arrays, m: mixing.Mixup, host, *, seed: int, layout: str, steps: int, batch: int):
    """`to_arrays` of `host` with its images mixed and its labels made float32 soft targets
    (`rules.mixup.mix`, one block: this rank's rows), keyed by (seed, global step)."""
    images, targets = mixing.mix(
        m, host.image, host.label, seed=seed, layout=layout, step=global_step(host.epoch, host.position, steps, batch)
    )
    result, _ = to_arrays(dataclasses.replace(host, images=(images,), labels=(targets,)))
    return result, []  # new arrays: nothing handed out views the ring slot

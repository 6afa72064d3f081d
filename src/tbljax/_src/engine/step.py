"""What the rows of a step hold, decided once for every path. Global positions →
sample indices and repeats (`tbljax.order`, the epoch's permutation) → crop boxes and flips
(`tbljax.augment`, keyed by sample index and repeat). The same function runs in NumPy for the host
loaders and in jax.numpy inside `jax.jit` for the resident dataset, so both serve the same
samples with the same augmentation.

>>> from tbljax import LoaderOptions
>>> idx, boxes, flips, repeat = draw(np.arange(4), LoaderOptions(batch_size=4, augment="flip"),
...                                  num_records=10, image_hw=(32, 32), epoch=0)
>>> idx.shape, boxes, flips.dtype, repeat
((4,), None, dtype('bool'), None)
"""

from __future__ import annotations

import numpy as np

from tbljax._src.rules import augment as _augment
from tbljax._src.rules import order
from tbljax._src.rules.options import LoaderOptions

__all__ = ["draw", "records"]


def records(positions, opts: LoaderOptions, *, num_records: int, epoch, step=None, xp=np):
    """(records in [0, num_records), repeats or None) of `positions` of epoch `epoch`: the
    epoch's permutation, or with ``opts.repeats`` > 1 `tbljax.order.repeated` (which needs
    `step`, (first position, rows) of the step the positions belong to)."""
    if opts.repeats == 1:
        return order.permute(positions, num_records, opts.seed, epoch, shuffle=opts.shuffle, xp=xp), None
    return order.repeated(
        positions, num_records, opts.seed, epoch, repeats=opts.repeats, step=step, shuffle=opts.shuffle, xp=xp
    )


def draw(positions, opts: LoaderOptions, *, num_records: int, image_hw, epoch, xp=np, first_index: int = 0, step=None):
    """(sample indices, crop boxes or None, flips or None, repeats or None) for `positions` of
    epoch `epoch` (`step`: as `records` takes it, with repeats).

    `image_hw`: (H, W) of every record, or a `tbljax.augment.RecordGeometry` (records of their
    own sizes, each sample's looked up by its index). `first_index`: the records are global
    indices [first_index, first_index + num_records) (a host part, `tbljax.order.Parts`);
    crops and flips are keyed by the global index and the repeat."""
    idx, repeat = records(positions, opts, num_records=num_records, epoch=epoch, step=step, xp=xp)
    idx = idx + first_index if first_index else idx
    if opts.augment is None:
        return idx, None, None, repeat
    geometry = _augment.RecordGeometry.of(image_hw).shifted(first_index)
    boxes, flips = _augment.sample(
        opts.augment, idx, geometry=geometry, seed=opts.seed, epoch=epoch, repeat=0 if repeat is None else repeat, xp=xp
    )
    return idx, boxes, flips, repeat

"""Multi-view serving (``views=``, issue 47, DINO's multi-crop): each row of a step served as
several crops, ``batch[name]`` (rows, count, *row) per view group. View v (numbered over the
groups in order) is drawn by `tbljax.augment.sample` keyed by (seed, epoch, index, repeat, v),
so view 0 is what the loader serves with ``augment=`` its Augment. A view's per-image ops and
erasing (``Augment(ops=, erasing=)``) are drawn the same way, keyed by (seed, epoch, index,
repeat, v) (`step.draw_ops`), and run in the same kernel pass as its crop.

A ring slot holds one row of all views packed (``row_shape``: one flat axis); each group is a
contiguous block of the slot's range, (rows, count, *row), its rows record-major (row i's views
at i*count ...). RAW records are gathered from the mapping per view; compact JPEG records are
read and decoded once for all of their views, every group in one kernel pass (the union of the
views' boxes at scale 1, so the bytes are those of a decode per view; with ``jpeg_dct_scale``
each view decodes its own box at its own scale); other records are decoded by the dataset once
per view.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tbljax._src.engine import kernels
from tbljax._src.engine import step as _step
from tbljax._src.rules import augment as _augment
from tbljax._src.rules import contract
from tbljax._src.rules.options import LoaderOptions

__all__ = ["ViewServing"]


class ViewServing:
    """The view groups of ``opts.views``: their row shapes, each step's boxes and flips, and
    their rows written into a slot's packed rows."""

    def __init__(self, opts: LoaderOptions):
        self.opts = opts
        self.groups = opts.views  # ((name, count, Augment), ...)
        self.rows_of = {n: contract.row_shape(opts.layout, *aug.size) for n, _, aug in self.groups}
        sizes = [c * int(np.prod(self.rows_of[n])) for n, c, _ in self.groups]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.row_shape = (int(self.offsets[-1]),)  # one packed row of every view

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _, _ in self.groups)

    def draw(self, indices, *, geometry, epoch: int, repeat=None):
        """Per group, (boxes (n, count, 4) or None, flips (n, count) or None, ops: a
        `step.RowOps` of the n * count rows record-major, or None) of sample `indices` (global;
        `geometry` indexed by them)."""
        opts, out, v = self.opts, [], 0
        rep = 0 if repeat is None else repeat
        for _, count, aug in self.groups:
            ops = [
                _step.draw_ops(indices, opts, epoch=epoch, out_hw=aug.size, repeat=rep, aug=aug, view=v + k)
                for k in range(count)
            ]
            drawn = [
                _augment.sample(
                    aug,
                    indices,
                    geometry=geometry,
                    seed=opts.seed,
                    epoch=epoch,
                    repeat=0 if repeat is None else repeat,
                    view=v + k,
                )
                for k in range(count)
            ]
            v += count
            boxes = None if drawn[0][0] is None else np.stack([b for b, _ in drawn], axis=1)
            flips = None if drawn[0][1] is None else np.stack([f for _, f in drawn], axis=1)
            out.append((boxes, flips, None if ops[0] is None else _record_major(ops)))
        return out

    def blocks(self, packed: np.ndarray) -> dict:
        """{name: (rows, count, *row)} contiguous blocks of a slot range's packed rows."""
        rows = packed.shape[0]
        flat = packed.reshape(-1)
        return {
            n: flat[rows * int(self.offsets[g]) : rows * int(self.offsets[g + 1])].reshape(rows, c, *self.rows_of[n])
            for g, (n, c, _) in enumerate(self.groups)
        }

    def fill(self, src, records, drawn, packed, *, jpeg_dct_scale=False, started=None) -> dict:
        """Writes the views of `records` (the source's, `drawn` their `draw`) into `packed`
        (rows, *row_shape), padding rows zero; {name: (rows, count, *row) view of it}. Compact
        records (without `jpeg_dct_scale`) are read and decoded once for all of their views,
        every group in one kernel pass (`kernels.prepare_serve_jpeg_views`: the same bytes)."""
        mean, std = self.opts.normalization
        n = len(records)
        out = self.blocks(packed)
        groups = []  # per group: (count, its rows, record-major: row i's views at i*count ..., crops, flips, ops)
        for (name, count, _), (boxes, flips, ops) in zip(self.groups, drawn):
            block = out[name]
            block[n:] = 0
            rows = block.reshape(-1, *block.shape[2:])[: n * count]
            crop = None if boxes is None else boxes.reshape(-1, 4)
            groups.append((count, rows, crop, None if flips is None else flips.reshape(-1), ops))
        pixels = dict(layout=self.opts.layout, mean=mean, std=std)

        def serve(source, **kw):  # compact records: every group in one pass
            jobs = [(c, np.repeat(records, c), o, b, f, p and p.program()) for c, o, b, f, p in groups]
            return kernels.prepare_serve_jpeg_views(source, jobs, **pixels, **kw)

        if n and not jpeg_dct_scale and src.serve_compact(records, serve, started):
            return out
        for count, rows, crop, flip, ops in groups if n else ():
            src.fill(
                np.repeat(records, count),
                rows,
                crop=crop,
                flip=flip,
                jpeg_dct_scale=jpeg_dct_scale,
                started=started,
                ops=ops,
                **pixels,
            )
            started = None
        if started is not None:
            started()
        return out


def _record_major(per_view):
    """One `step.RowOps` of n * count rows (row i's views at rows i*count ...) from count views'
    RowOps of n rows each."""

    def stack(arrays):
        return None if arrays[0] is None else np.stack(arrays, axis=1).reshape(-1, *arrays[0].shape[1:])

    return dataclasses.replace(
        per_view[0],
        ops=stack([r.ops for r in per_view]),
        op_args=stack([r.op_args for r in per_view]),
        erase=stack([r.erase for r in per_view]),
        erase_key=stack([r.erase_key for r in per_view]),
    )

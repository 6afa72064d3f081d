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

import dataclasses

import numpy as np

from tbljax._src.engine import kernels
from tbljax._src.rules import augment as _augment
from tbljax._src.rules import bbox_crop, erasing, order, randaug, scale_jitter
from tbljax._src.rules.options import LoaderOptions

__all__ = ["RowOps", "draw", "draw_extents", "draw_ops", "records"]

# The one refusal of the per-image ops in jit: records partitioned over devices are gathered
# as uint8 and normalized after a sum over devices, where erasing cannot run.
OPS_NOT_PARTITIONED = (
    "Augment(ops=..., erasing=...) in ResidentDataset.batch with records partitioned over devices: "
    "not yet (replicate the records, or use the host loaders)"
)

ERASE_NEEDS_FLOAT = (
    "Augment(erasing=...) sets normalized values (as timm's RandomErasing): it needs "
    "dtype='float32' or 'bfloat16', not uint8"
)

CANVAS_NOT_IN_JIT = (
    "Augment(scale_jitter=...) and Augment(crop='longer_pad') are served by the host loaders "
    "(tbljax.loader, HostLoader, tbljax.torch.loader, tbljax.mlx.loader); in jit (ResidentDataset, "
    "tbljax.ops.gather_normalize): not yet"
)


def records(positions, opts: LoaderOptions, *, num_records: int, epoch, step=None, xp=np):
    """(records in [0, num_records), repeats or None) of `positions` of epoch `epoch`: the
    epoch's permutation, or with ``opts.repeats`` > 1 `tbljax.order.repeated` (which needs
    `step`, (first position, rows) of the step the positions belong to)."""
    if opts.repeats == 1:
        return order.permute(positions, num_records, opts.seed, epoch, shuffle=opts.shuffle, xp=xp), None
    return order.repeated(
        positions, num_records, opts.seed, epoch, repeats=opts.repeats, step=step, shuffle=opts.shuffle, xp=xp
    )


def draw(
    positions,
    opts: LoaderOptions,
    *,
    num_records: int,
    image_hw,
    epoch,
    xp=np,
    first_index: int = 0,
    step=None,
    objects=None,
):
    """(sample indices, crop boxes or None, flips or None, repeats or None) for `positions` of
    epoch `epoch` (`step`: as `records` takes it, with repeats).

    `image_hw`: (H, W) of every record, or a `tbljax.augment.RecordGeometry` (records of their
    own sizes, each sample's looked up by its index). `first_index`: the records are global
    indices [first_index, first_index + num_records) (a host part, `tbljax.order.Parts`);
    crops and flips are keyed by the global index and the repeat. `objects`: crop="bbox" only,
    a function of global sample indices → each record's (n, 4) xyxy object boxes."""
    if xp is not np and scale_jitter.on_canvas(opts.augment):
        raise ValueError(CANVAS_NOT_IN_JIT)
    idx, repeat = records(positions, opts, num_records=num_records, epoch=epoch, step=step, xp=xp)
    idx = idx + first_index if first_index else idx
    if opts.augment is None:
        return idx, None, None, repeat
    geometry = _augment.RecordGeometry.of(image_hw).shifted(first_index)
    held = None
    if opts.augment.crop == "bbox" and objects is not None:
        held = bbox_crop.pad_boxes(objects(idx))
    boxes, flips = _augment.sample(
        opts.augment,
        idx,
        geometry=geometry,
        seed=opts.seed,
        epoch=epoch,
        repeat=0 if repeat is None else repeat,
        objects=held,
        xp=xp,
    )
    return idx, boxes, flips, repeat


def draw_extents(indices, opts: LoaderOptions, *, image_hw, epoch: int, first_index: int = 0, repeat=None):
    """The valid extents (B, 2) of sample `indices` (global) under a canvas augmentation
    (`scale_jitter.on_canvas`: scale_jitter, crop='longer_pad'), drawn with the boxes `draw` returned
    (`augment.canvas_boxes`); None for any other augmentation."""
    aug = opts.augment
    if not scale_jitter.on_canvas(aug):
        return None
    geometry = _augment.RecordGeometry.of(image_hw).shifted(first_index)
    return scale_jitter.canvas_boxes(
        aug, indices, geometry=geometry, seed=opts.seed, epoch=epoch, repeat=0 if repeat is None else repeat
    )[1]


def has_ops(aug) -> bool:
    """Whether augmentation `aug` (an `Augment` or None) has per-image ops or erasing."""
    return aug is not None and bool(aug.ops or aug.erasing is not None)


def check_ops(opts: LoaderOptions) -> None:
    """Refuses, by name, per-image ops the host loaders do not serve: erasing with uint8 output
    (timm erases the normalized values; there are none in uint8), also in a view's Augment. Every policy
    (`randaug.POLICIES`) is served: the C++ stage runs all of `pixel_ops.CODES`."""
    augs = [(opts.augment, "Augment")] + [(aug, f"views[{n!r}]: Augment") for n, _, aug in opts.views or ()]
    for aug, where in augs:
        if has_ops(aug) and aug.erasing is not None and opts.out_dtype == np.uint8:
            raise ValueError(where + ERASE_NEEDS_FLOAT[len("Augment") :])


@dataclasses.dataclass(frozen=True)
class RowOps:
    """The per-image op columns of a step's rows (docs/transforms-design.md): ``ops`` (B, K)
    uint8 and ``op_args`` (B, K) int32 (`randaug.decide`), ``erase`` (B, E, 4) int32 boxes and
    ``erase_key`` (B,) uint32 (`erasing.decide_erasing`; None without erasing). ``out_hw``: the
    rows' output size, or (B, 2) each row's own (NaFlex rows)."""

    aug: _augment.Augment
    out_hw: tuple[int, int] | np.ndarray
    ops: np.ndarray
    op_args: np.ndarray
    erase: np.ndarray | None
    erase_key: np.ndarray | None

    def rows(self, m) -> "RowOps":
        """The rows `m` (an index array) of these columns."""
        erase = None if self.erase is None else (self.erase[m], self.erase_key[m])
        hw = self.out_hw if isinstance(self.out_hw, tuple) else self.out_hw[m]
        return dataclasses.replace(
            self,
            out_hw=hw,
            ops=self.ops[m],
            op_args=self.op_args[m],
            erase=erase and erase[0],
            erase_key=erase and erase[1],
        )

    def program(self, build=kernels.pixel_program) -> kernels.PixelProgram:
        """The columns as the kernel takes them: `build` is `kernels.pixel_program` (host) or
        `tbljax.ops.pixel_program` (jit)."""
        er = self.aug.erasing
        return build(
            self.ops,
            self.op_args,
            self.out_hw,
            policies=self.aug.ops,
            erase_boxes=self.erase,
            erase_keys=self.erase_key,
            erase_mode=er.mode if er is not None else "pixel",
        )


def draw_ops(indices, opts: LoaderOptions, *, epoch, out_hw, repeat=0, aug=None, view: int = 0, xp=np) -> RowOps | None:
    """The per-image op columns of sample `indices` (global) under `aug` (default
    ``opts.augment``), keyed by (seed, epoch, index, repeat, view) like the crops
    (`randaug.decide`, `erasing.decide_erasing`), or None when the augmentation has none (the
    kernel then runs today's pass). `out_hw`: (h, w), or (B, 2) each row's own (NaFlex rows,
    host only). In NumPy for the host loaders, in jax.numpy inside `jax.jit` (ResidentDataset)."""
    aug = opts.augment if aug is None else aug
    if not has_ops(aug):
        return None
    idx = np.asarray(indices, np.int64) if xp is np else xp.asarray(indices)
    codes, args = randaug.decide(aug.ops, idx, seed=opts.seed, epoch=epoch, repeat=repeat, view=view, xp=xp)
    boxes = keys = None
    if aug.erasing is not None and np.ndim(out_hw) == 1:
        boxes, keys = erasing.decide_erasing(
            aug.erasing,
            idx,
            height=out_hw[0],
            width=out_hw[1],
            seed=opts.seed,
            epoch=epoch,
            repeat=repeat,
            view=view,
            xp=xp,
        )
    elif aug.erasing is not None:  # once per distinct size: a row's draw depends on its index, not its batch
        boxes = np.zeros((len(idx), aug.erasing.max_count, 4), np.int32)
        keys = np.zeros(len(idx), np.uint32)
        sizes, group = np.unique(np.asarray(out_hw, np.int64), axis=0, return_inverse=True)
        for g, (h, w) in enumerate(sizes.tolist()):
            m = np.flatnonzero(group.reshape(-1) == g)
            r = repeat if np.ndim(repeat) == 0 else np.asarray(repeat)[m]
            boxes[m], keys[m] = erasing.decide_erasing(
                aug.erasing, idx[m], height=h, width=w, seed=opts.seed, epoch=epoch, repeat=r
            )
    hw = (int(out_hw[0]), int(out_hw[1])) if np.ndim(out_hw) == 1 else np.asarray(out_hw, np.int64)
    return RowOps(aug, hw, codes, args, boxes, keys)

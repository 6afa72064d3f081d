"""Per-image ops and random erasing on NaFlex rows in a `ResidentDataset` batch, inside
`jax.jit`: each row's ops drawn by (seed, epoch, index, repeat) as the host loaders draw them
(`randaug.decide`), its erasing boxes at its own traced size (`erasing.decide_erasing_rows`, the
size's float32 side looked up in a host table of every grid of at most max_tokens patches), and
its affine matrices as size-free templates that the CPU FFI handler (or the twin,
`twin_patch_ops.finish_at_size`) finishes at the row's size
(`tbljax.ops.pixel_program` with per-row sizes): the bytes of `engine/native_res.PatchServing`."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from tbljax._src.engine import step as _step
from tbljax._src.jax import program as _program
from tbljax._src.rules import erasing, randaug

__all__ = ["program"]


@functools.lru_cache(maxsize=8)
def _sides(p: int, tokens: int):
    return erasing.side_table(p * p, tokens)  # row n: an output of n patches of p x p


def program(idx, opts, sizes, *, epoch, repeat):
    """The `tbljax.ops.pixel_program` of rows `idx` (traced) at their NaFlex `sizes` (B, 2)
    int32, or None when the augmentation has no per-image ops or erasing."""
    aug = opts.augment
    if not _step.has_ops(aug):
        return None
    codes, args = randaug.decide(aug.ops, idx, seed=opts.seed, epoch=epoch, repeat=repeat, xp=jnp)
    boxes = keys = None
    er = aug.erasing
    if er is not None:
        p, t = opts.patches.size, opts.patches.max_tokens
        units = (sizes[:, 0] // p) * (sizes[:, 1] // p)
        boxes, keys = erasing.decide_erasing_rows(
            er,
            idx,
            heights=sizes[:, 0],
            widths=sizes[:, 1],
            sides=jnp.asarray(_sides(p, t))[units],
            seed=opts.seed,
            epoch=epoch,
            repeat=repeat,
            xp=jnp,
        )
    mode = er.mode if er is not None else "pixel"
    return _program.pixel_program(
        codes, args, sizes, policies=aug.ops, erase_boxes=boxes, erase_keys=keys, erase_mode=mode
    )

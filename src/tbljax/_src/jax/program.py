"""The per-image ops inside `jax.jit`: `pixel_program` turns op codes and arguments (traced or
not) into the arrays `gather_normalize(ops=...)` takes -- engine/pixel_program's, with the
affine ops' float64 matrices looked up in a table built once on the host (they cannot be built
per row in the graph) and carried as their IEEE bit patterns, uint32 (B, K, 6, 2) [low word,
high word], since JAX has no float64 by default."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tbljax._src.engine import pixel_program as _program
from tbljax._src.rules import randaug

__all__ = ["JitPixelProgram", "drawable_codes", "float64_bits", "pixel_program"]


class JitPixelProgram(_program.PixelProgram):
    """A `PixelProgram` of JAX arrays that also says, statically, which op codes its policies
    can draw (``may_draw``): the twin compiles only those ops (and resamples, in float64, only
    when an affine op is among them)."""

    def __new__(cls, arrays, *, may_draw: tuple[int, ...], size_free: bool = False):
        self = super().__new__(cls, arrays)
        self.may_draw = may_draw
        self.size_free = size_free  # per-row sizes: the FFI handler or the twin finishes the matrices
        return self


@functools.lru_cache(maxsize=32)
def drawable_codes(slots: tuple) -> tuple[int, ...]:
    """The op codes (sorted, 0 left out) the columns' policies (`column_policies`) can draw."""
    codes = set()
    for p in set(slots):
        if isinstance(p, randaug.RandAugment):
            codes |= {randaug.op_arg(p, name, 0.0)[0] for name in p.ops}
        else:
            # The other policies draw from words whose top 16 bits pick each choice
            # (`image_ops.choice`) and apply with probability p when the top bits are small
            # (`image_ops.applied`): every top-16-bit value reaches every code they can draw.
            words = np.broadcast_to(
                (np.arange(1 << 16, dtype=np.uint32) << 16)[:, None, None], (1 << 16, p.num_slots, 4)
            )
            codes |= set(np.unique(p.draw(words, np)[0]).tolist())
    return tuple(sorted(codes - {0}))


def float64_bits(m) -> np.ndarray:
    """float64 array → uint32 of one more axis of 2: each value's bits, [low word, high word]."""
    bits = np.ascontiguousarray(m, np.float64).view(np.uint64)
    return np.stack([bits & 0xFFFFFFFF, bits >> 32], axis=-1).astype(np.uint32)


@functools.lru_cache(maxsize=32)
def _bits_table(slots: tuple, out_hw: tuple[int, int] | None) -> tuple:
    """`affine_table` (None: `size_free_table`) with each matrix as its bits (built once per
    policies and size)."""
    table = _program.size_free_table(slots) if out_hw is None else _program.affine_table(slots, out_hw)
    return tuple(tuple((c, a, float64_bits(m)) for c, a, m in col) for col in table)


def pixel_program(
    codes, args, out_hw, *, policies=(), erase_boxes=None, erase_keys=None, erase_mode: str = "pixel"
) -> _program.PixelProgram:
    """The rows' per-image ops for `gather_normalize(ops=...)`, inside or outside `jax.jit`:
    the same as `tbljax.kernels.pixel_program` (same arguments, same meaning) but the arrays
    are JAX arrays and ``codes`` / ``args`` / ``erase_boxes`` / ``erase_keys`` may be traced.

    The affine ops' arguments must be ones their policy draws (`randaug.decide`, e.g.
    ``tbljax.RandAugment``'s argument table): their matrices are looked up among those, built
    once on the host per (policies, out_hw). Concrete arguments are checked (ValueError).
    ``out_hw`` (B, 2), each row's own size (NaFlex rows; may be traced): the matrices are
    size-free templates that the CPU FFI handler (or the twin) finishes at the sizes of
    `gather_normalize`'s ``patches=(p, sizes)`` (pass those sizes here).

    Example::

        @jax.jit
        def step(data, idx, boxes, flips, codes, args):
            prog = ops.pixel_program(codes, args, (224, 224), policies=aug.ops)
            return ops.gather_normalize(data, idx, crop=boxes, flip=flips, out_size=(224, 224), ops=prog)
    """
    codes, args = jnp.asarray(codes), jnp.asarray(args)
    if codes.ndim != 2 or args.shape != codes.shape:
        raise ValueError(f"codes and args must both be (B, K), got {codes.shape} and {args.shape}")
    if not (jnp.issubdtype(codes.dtype, jnp.integer) and jnp.issubdtype(args.dtype, jnp.integer)):
        raise ValueError(f"codes and args must be integers, got {codes.dtype} and {args.dtype}")
    codes, args = codes.astype(jnp.uint8), args.astype(jnp.int32)
    b, k = codes.shape
    slots = tuple(_program.column_policies(tuple(policies), k))
    per_row = np.ndim(out_hw) == 2
    if per_row and tuple(np.shape(out_hw)) != (b, 2):
        raise ValueError(f"out_hw must be (h, w) or ({b}, 2), got shape {tuple(np.shape(out_hw))}")
    table = _bits_table(slots, None if per_row else tuple(int(v) for v in out_hw))
    if not any(isinstance(x, jax.core.Tracer) for x in (codes, args)):
        _program.check_drawable(np.asarray(codes), np.asarray(args), table)
    if k:
        matrices = _program.look_up_matrices(codes, args, table, zero=np.zeros((6, 2), np.uint32), xp=jnp)
    else:  # nothing to stack
        matrices = jnp.zeros((b, 0, 6, 2), jnp.uint32)
    fill, nearest = _program.slot_constants(slots)
    boxes, keys, mode, normal = _program.erase_args(b, erase_boxes, erase_keys, erase_mode, xp=jnp)
    return JitPixelProgram(
        (codes, args, matrices, jnp.asarray(fill), jnp.asarray(nearest), boxes, keys, mode, jnp.asarray(normal)),
        may_draw=drawable_codes(slots),
        size_free=per_row,
    )

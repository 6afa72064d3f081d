"""The gather as an XLA FFI custom call: the operands and attributes of ffi/xla/gather_call.h,
and the shard_map typing the call cannot state itself."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tbljax._src.jax.packed import PackedRecords
from tbljax._src.jax.registration import OPS_TARGET, PACKED_OPS_TARGET, PACKED_TARGET, TARGET
from tbljax._src.rules import contract

__all__ = ["ffi_gather"]

NORMAL_TABLE_SIZE = 4096  # kernel.h's kNormalTableSize (pixel_ops.normal_table)


def ffi_gather(
    data,
    indices,
    crop,
    flip,
    out,
    *,
    mean,
    std,
    layout,
    out_size,
    dtype,
    ops=None,
    erase_mode=0,
    patches=None,
    size_free=False,
):
    """The FFI custom call; `data` is an (N, H, W, 3) array or `PackedRecords`; `ops` None or
    the eight arrays of a `PixelProgram` (erase_mode apart), the ops targets' operands;
    `patches` None or (p, int32 sizes (B, 2)): NaFlex rows, `out_size` then (T, p·p·3);
    `size_free`: the matrices are templates the handler finishes at each row's size."""
    oh, ow = out_size
    b = indices.shape[0]  # per shard under shard_map
    result = jax.ShapeDtypeStruct((b, *contract.row_shape(layout, oh, ow)), dtype)
    p, sizes = (0, jnp.zeros((0, 2), jnp.int32)) if patches is None else patches
    if p:  # the kernel writes (B, T, p·p, 3): the same bytes; only the ops targets take sizes
        result = jax.ShapeDtypeStruct((b, oh, p * p, 3), dtype)
        ops = ops or _no_ops(b)
        out = None if out is None else out.reshape(result.shape)
    crop_op = jnp.zeros((0, 4), jnp.int32) if crop is None else crop.astype(jnp.int32)
    flip_op = jnp.zeros((0,), jnp.uint8) if flip is None else flip.astype(jnp.uint8)
    packed = isinstance(data, PackedRecords)
    records = [data.pages, data.table] if packed else [data]
    operands = [*records, indices, crop_op, flip_op, *((*ops, sizes.astype(jnp.int32)) if ops else ())]
    aliases = None
    if out is not None:  # write into the caller's (donated) buffer, not a fresh allocation
        aliases = {len(operands): 0}
        operands.append(out)
    target = (PACKED_OPS_TARGET if packed else OPS_TARGET) if ops else (PACKED_TARGET if packed else TARGET)
    call = jax.ffi.ffi_call(target, result, vmap_method="sequential", input_output_aliases=aliases)
    attrs = dict(erase_mode=np.int32(erase_mode), patch=np.int64(p), size_free=np.int32(size_free)) if ops else {}
    y = call(*operands, mean=np.asarray(mean, np.float64), std=np.asarray(std, np.float64), layout=layout, **attrs)
    y = y.reshape(b, oh, ow) if p else y
    # Under shard_map the rows vary over the batch axes as the indices do. ffi_call cannot say
    # so, and lax.platform_dependent needs the FFI and twin branches typed alike.
    axes = tuple(sorted(_varying(indices) - _varying(y)))
    if not axes:
        return y
    pcast = getattr(jax.lax, "pcast", None)
    return pcast(y, axes, to="varying") if pcast else jax.lax.pvary(y, axes)


def _no_ops(b: int) -> tuple:
    """An empty per-image program (no ops, no erasing) for b rows: the kernel runs no ops."""
    u8, i32, u32 = jnp.uint8, jnp.int32, jnp.uint32
    shapes = [((b, 0), u8), ((b, 0), i32), ((b, 0, 6, 2), u32), ((0, 3), u8), ((0,), u8), ((b, 0, 4), i32)]
    return (*(jnp.zeros(s, t) for s, t in shapes), jnp.zeros((b,), u32), jnp.zeros((NORMAL_TABLE_SIZE,), jnp.float32))


def _varying(x) -> frozenset:
    """The shard_map axes over which x varies (spelled `manual_axis_type.varying` in jax
    0.10, `vma` in the releases around it)."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
    return frozenset(vma or ())

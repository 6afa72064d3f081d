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


def ffi_gather(data, indices, crop, flip, out, *, mean, std, layout, out_size, dtype, ops=None, erase_mode=0):
    """The FFI custom call; `data` is an (N, H, W, 3) array or `PackedRecords`; `ops` None or
    the eight arrays of a `PixelProgram` (erase_mode apart), the ops targets' operands."""
    oh, ow = out_size
    b = indices.shape[0]  # per shard under shard_map
    result = jax.ShapeDtypeStruct((b, *contract.row_shape(layout, oh, ow)), dtype)
    crop_op = jnp.zeros((0, 4), jnp.int32) if crop is None else crop.astype(jnp.int32)
    flip_op = jnp.zeros((0,), jnp.uint8) if flip is None else flip.astype(jnp.uint8)
    packed = isinstance(data, PackedRecords)
    records = [data.pages, data.table] if packed else [data]
    operands = [*records, indices, crop_op, flip_op, *(ops or ())]
    aliases = None
    if out is not None:  # write into the caller's (donated) buffer, not a fresh allocation
        aliases = {len(operands): 0}
        operands.append(out)
    target = (PACKED_OPS_TARGET if packed else OPS_TARGET) if ops else (PACKED_TARGET if packed else TARGET)
    call = jax.ffi.ffi_call(target, result, vmap_method="sequential", input_output_aliases=aliases)
    attrs = dict(erase_mode=np.int32(erase_mode)) if ops else {}
    y = call(*operands, mean=np.asarray(mean, np.float64), std=np.asarray(std, np.float64), layout=layout, **attrs)
    # Under shard_map the rows vary over the batch axes as the indices do. ffi_call cannot say
    # so, and lax.platform_dependent needs the FFI and twin branches typed alike.
    axes = tuple(sorted(_varying(indices) - _varying(y)))
    if not axes:
        return y
    pcast = getattr(jax.lax, "pcast", None)
    return pcast(y, axes, to="varying") if pcast else jax.lax.pvary(y, axes)


def _varying(x) -> frozenset:
    """The shard_map axes over which x varies (spelled `manual_axis_type.varying` in jax
    0.10, `vma` in the releases around it)."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
    return frozenset(vma or ())

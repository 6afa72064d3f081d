"""The serve kernel inside `jax.jit`. `gather_normalize` gathers uint8 records by
index, optionally crop-resizes and flips them, normalizes and writes the batch in a dtype and
layout, all in the compiled program: as an XLA FFI custom call running the same C++ kernel as
the host loader (CPU; CUDA when built with it), or as a pure-JAX twin with bit-identical
results on every other platform (TPU).

This module checks the arguments and picks the body; the rooms beside it hold the rest, as
jax-finufft splits its op: `registration` (the handlers, registered once at import), `twin`
(the formulas of ffi/core/serve/kernel.h in jax.numpy), `ffi_call` (the custom call),
`partitioning` (the per-shard rule) and `packed` (records of different sizes).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from tbljax import ops
    >>> data = jnp.zeros((100, 32, 32, 3), jnp.uint8)          # e.g. a ResidentDataset's array
    >>> step = jax.jit(lambda d, i: ops.gather_normalize(d, i, mean=(0.5,) * 3, std=(0.25,) * 3))
    >>> step(data, jnp.arange(8)).shape
    (8, 32, 32, 3)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tbljax import _core
from tbljax._src.engine import step as _step
from tbljax._src.engine.pixel_program import PixelProgram
from tbljax._src.jax import twin_ops, twin_patch_ops
from tbljax._src.jax.ffi_call import ffi_gather
from tbljax._src.jax.packed import PackedRecords, check_packed
from tbljax._src.jax.partitioning import batch_spec, follow_indices, shard_map_rows
from tbljax._src.jax.program import float64_bits
from tbljax._src.jax.registration import handler_platforms, ops_platforms
from tbljax._src.jax.twin import lookup, normalization_table, out_dtype, twin_gather, twin_patches
from tbljax._src.rules import contract, pixel_ops

__all__ = ["BACKENDS", "gather_normalize"]

BACKENDS = ("auto", "ffi", "twin")


def _is_concrete(x) -> bool:
    if x is None or isinstance(x, jax.core.Tracer):
        return False
    return not isinstance(x, jax.Array) or x.is_fully_addressable


def gather_normalize(
    data,
    indices,
    *,
    mean=None,
    std=None,
    dtype=jnp.float32,
    layout: str = "NHWC",
    crop=None,
    flip=None,
    out_size=None,
    backend: str = "auto",
    sharding=None,
    out=None,
    ops=None,
    patches=None,
    max_taps=None,
):
    """``data[indices]`` → optional crop-resize → optional flip → normalize, inside `jax.jit`.

    The same fused pass as `tbljax.kernels.gather` (and the loader), as a traceable JAX
    operation: for each b take record ``indices[b]``; if ``crop`` is given resize the box
    ``crop[b] = (y0, x0, h, w)`` to ``out_size`` with the exact integer triangle filter of
    ffi/core/serve/kernel.h (bilinear, antialiased when shrinking); mirror it left-right if
    ``flip[b]``; write uint8 pixels, or float32 / bfloat16 values nearest to
    ``(x/255 - mean[c]) / std[c]``.

    Args:
      data: ``(N, H, W, 3)`` uint8, on device (e.g. ``ResidentDataset.data``), or
        `PackedRecords` (records of different sizes; ``crop`` and ``out_size`` are then
        required and each box lies in its own record). It is passed to the handler as an
        operand, so one compiled program serves any dataset of that shape.
      indices: ``(B,)`` integers in ``[0, N)``. Concrete indices are checked here (IndexError);
        inside jit the CPU handler fails the computation with an error naming the bad index
        (CUDA and the twin cannot raise from the device: out-of-range rows are unspecified).
      mean, std: 3 numbers each (float outputs; default 0 and 1, i.e. ``x/255``).
      dtype: uint8, float32 or bfloat16 (``jnp.bfloat16`` / ``ml_dtypes.bfloat16``).
      layout: ``"NHWC"`` → ``(B, OH, OW, 3)``; ``"NCHW"`` → ``(B, 3, OH, OW)``.
      crop: ``(B, 4)`` int boxes inside the image, or None (then the output is ``(H, W)``).
      flip: ``(B,)`` booleans, or None.
      out_size: ``(OH, OW)`` of the crop-resize; default ``(H, W)``.
      backend: ``"auto"`` (the FFI handler on platforms that registered one, the twin
        elsewhere, decided when the program is lowered), ``"ffi"`` or ``"twin"``.
      sharding: None, or a `Mesh` / `NamedSharding` partitioning the batch: each device then
        gathers its own rows from its own copy of ``data`` (`jax.shard_map`; nothing is
        all-gathered). ``data`` should be replicated over those devices. With None the op
        follows the mesh of its operands inside `jax.jit`: when ``indices`` arrive split over
        mesh axes, the batch axis of the result (and of ``crop``, ``flip``, ``out``) is split
        the same way and each device runs the kernel on its own rows (a
        `jax.experimental.custom_partitioning` rule; under a mesh with explicit axes,
        `jax.shard_map` over the axes in the indices' type). ``data`` is used whole on every
        device: records that arrive sharded are all-gathered once. Replicated indices, or
        axes that do not divide the batch, run the whole batch on every device.
      out: optionally an array of the result's shape and dtype to write into (FFI path). Donate
        it to the enclosing jit (``donate_argnums``) so XLA reuses its memory instead of
        allocating (and page-faulting) a fresh batch each step.
      ops: the rows' per-image ops, a `tbljax.ops.pixel_program(...)` (or a
        `tbljax.kernels.pixel_program(...)` built on the host): after the crop-resize and
        flip, row b's uint8 pixels go through its op program, then are normalized, then its
        erasing boxes are set, exactly as `tbljax.kernels.gather(ops=...)` and the loader do.
        Served by the CPU FFI handler (``"auto"`` or ``"ffi"`` on CPU) and by the twin
        (``"twin"``, and ``"auto"`` on platforms whose handler has no ops: CUDA, TPU), with
        the same bytes. The twin's affine ops (Rotate, Shear, Translate) resample in float64:
        they need ``jax_enable_x64`` (refused by name without it).
      patches: NaFlex rows, ``(p, sizes)`` as `tbljax.kernels.gather` takes them: row b's box
        ``crop[b]`` (required) is resized to its own ``sizes[b] = (h, w)`` ((B, 2) integers,
        may be traced; multiples of p, a grid of at most T patches), flipped where ``flip[b]``,
        and written as its (h/p)·(w/p) patches: the result is ``(B, T, p·p·3)`` with
        ``out_size=(T, p·p·3)`` (required), patch (gy, gx) at row gy·(w/p) + gx, its pixels
        (py, px, c) in that order, zeros past the grid; NHWC only. The CPU FFI handler and the
        twin write the same bytes as `tbljax.kernels.gather(patches=...)`. With ``ops=``: a
        `tbljax.ops.pixel_program` built with ``out_hw=sizes`` (each row's own), run at each
        row's size by the CPU FFI handler or the twin (in token space, `twin_patch_ops`); a
        program of one output size is refused by name.
      max_taps: patches only: a bound on every row's resize taps per axis (kernel.h's
        ``2·max(box side, size side) // size side + 1``), or None (any shrink of the largest
        record side to one patch). The twin sizes its tap weights by it (`naflex.max_taps`: ~33
        instead of 501 at 4000-px records, p 16, T 256). Checked when crop and sizes are
        concrete; rows past it are unspecified in jit (the FFI handler does not use it).

    Returns:
      The batch as a `jax.Array`.

    Example::

        @jax.jit
        def step(data, idx, boxes, flips):
            x = ops.gather_normalize(data, idx, crop=boxes, flip=flips, out_size=(160, 160),
                                     mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=jnp.bfloat16)
            return model(x)
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    contract.check_layout(layout)
    out_dt = out_dtype(dtype)
    data, n, hw = _checked_records(data, crop, out_size)
    host_idx = contract.host_indices(indices, n) if _is_concrete(indices) else None
    if host_idx is not None:
        _core.check_indices(host_idx, n)
    indices = _device_indices(indices)
    batch = int(indices.shape[0])

    contract.check_unnormalized(out_dt.name, mean, std)
    mean_v, std_v = contract.normalization(mean, std)
    packed = isinstance(data, PackedRecords)
    p, sizes = 0, None
    if patches is not None:  # NaFlex rows: (B, T, p·p·3), each row's resize checked by its size
        p, sizes = _checked_patches(patches, batch, layout, crop, ops, out_size)
        oh, ow = out_size
    else:
        oh, ow = contract.output_size(hw if not packed else out_size, out_size, cropped=crop is not None)
    crop = _checked_crop(crop, batch, data, hw, host_idx, (0, 0) if p else (oh, ow))
    max_taps = _checked_taps(max_taps, p, sizes, crop)
    if flip is not None:
        flip = jnp.asarray(flip)
        contract.check_flip(flip.dtype, flip.shape, batch)
        flip = flip != 0 if flip.dtype != jnp.bool_ else flip

    shape = (batch, oh, ow) if p else (batch, *contract.row_shape(layout, oh, ow))
    if out is not None and (tuple(out.shape) != shape or out.dtype != out_dt):
        raise ValueError(f"out must be {out_dt} of shape {shape}, got {out.dtype} of shape {tuple(out.shape)}")
    program, program_kw = (None,) * 8, {}
    if ops is not None:
        program, program_kw = _checked_ops(ops, batch, out_dt, backend)
        _check_size_free(ops, p)
    if p and backend == "ffi" and jax.default_backend() not in ops_platforms():
        raise ValueError(
            f"backend='ffi' with patches=...: NaFlex rows run in the FFI handler on {ops_platforms()}, "
            f"not on {jax.default_backend()!r}: use backend='auto' or 'twin'"
        )
    if batch == 0:
        return jnp.zeros(shape, out_dt)

    # The twin takes the table as an operand, not a closed-over constant, so that one traced
    # body serves every placement (custom_partitioning traces it without constants).
    table = None
    if out_dt != np.uint8 and backend != "ffi":
        table = jnp.asarray(normalization_table(mean_v, std_v, out_dt))
    normalization = dict(mean=mean_v, std=std_v, dtype=out_dt)
    max_side = data.max_side if packed else None
    body = _body(backend, max_side, (oh, ow), layout, normalization, patch=p, taps=max_taps, **program_kw)
    args = ((data.pages, data.table) if packed else (data, None)) + (indices, crop, flip, out, table, *program, sizes)
    if sharding is not None:
        mesh, spec = batch_spec(sharding)
        return shard_map_rows(body, args, mesh, spec)
    return follow_indices(body, args, layout)


def _checked_records(data, crop, out_size):
    """(data as an array or PackedRecords, record count, (H, W) or (None, None) when packed)."""
    if isinstance(data, PackedRecords):
        check_packed(data)
        if crop is None or out_size is None:
            raise ValueError(
                "the records differ in size: the output size is fixed only by crop "
                "boxes and out_size (e.g. augment=tbljax.Augment(size=(224, 224)))"
            )
        return data, len(data), (None, None)
    if not hasattr(data, "shape") or not hasattr(data, "dtype"):
        data = jnp.asarray(data)
    if data.dtype != np.uint8 or data.ndim != 4 or data.shape[3] != 3 or 0 in data.shape[:3]:
        raise ValueError(
            f"data must be a non-empty uint8 array of shape (N, H, W, 3) or "
            f"PackedRecords, got {data.dtype} of shape {tuple(data.shape)}"
        )
    n, h, w, _ = (int(v) for v in data.shape)
    return data, n, (h, w)


def _checked_patches(patches, batch, layout, crop, ops, out_size):
    """(p, int32 sizes (B, 2)) of ``patches=(p, sizes)``, checked (concrete sizes: each row a
    grid of at most T patches); refuses by name what NaFlex rows are not served with."""
    try:
        p, sizes = patches
    except (TypeError, ValueError):
        raise ValueError(f"patches must be (p, sizes), got {type(patches).__name__}") from None
    if not contract.is_integer(p) or not 1 <= p <= contract.MAX_OUT_SIDE:
        raise ValueError(f"patches: the patch size must be an integer in [1, {contract.MAX_OUT_SIDE}], got {p!r}")
    p = int(p)
    if layout != "NHWC":
        raise ValueError(f"patches are written in layout NHWC, got layout={layout!r}")
    if ops is not None and not getattr(ops, "size_free", False):
        raise ValueError(
            "patches with ops=...: the program's affine ops were built at one output size and each "
            "NaFlex row has its own: build it with tbljax.ops.pixel_program(codes, args, sizes, ...), "
            "the rows' (B, 2) sizes"
        )
    if crop is None:
        raise ValueError("patches need a crop box per row (crop=...; the whole record is (0, 0, h, w))")
    if out_size is None or len(out_size) != 2 or not contract.is_integer(out_size[0]) or out_size[0] < 1:
        raise ValueError(f"patches of {p}x{p} need out_size=(T, {p * p * 3}), T >= 1 tokens, got {out_size!r}")
    if out_size[1] != p * p * 3:
        raise ValueError(f"patches of {p}x{p} need out_size=(T, {p * p * 3}), got {tuple(out_size)!r}")
    t = int(out_size[0])
    sizes = jnp.asarray(sizes)
    if sizes.shape != (batch, 2) or not jnp.issubdtype(sizes.dtype, jnp.integer):
        raise ValueError(f"patches: sizes must be ({batch}, 2) integers, got {sizes.dtype} of shape {sizes.shape}")
    if _is_concrete(sizes):
        s = np.asarray(sizes, np.int64)
        bad = (s < p).any(1) | (s % p != 0).any(1) | ((s[:, 0] // p) * (s[:, 1] // p) > t)
        if bad.any():
            b = int(np.argmax(bad))
            raise ValueError(
                f"patches: sizes[{b}] = ({s[b, 0]}, {s[b, 1]}) is not a grid of at most {t} patches of {p}x{p}"
            )
    return p, sizes.astype(jnp.int32)


def _checked_taps(max_taps, p, sizes, crop):
    """`max_taps` as an int (or None), refused by name when it is not one, without patches, or
    (concrete crop and sizes) below a row's taps."""
    if max_taps is None:
        return None
    if not p:
        raise ValueError("max_taps bounds the resize of NaFlex rows: it needs patches=(p, sizes)")
    if not contract.is_integer(max_taps) or max_taps < 3:
        raise ValueError(f"max_taps must be an integer >= 3 (a resize reads at least 3 taps), got {max_taps!r}")
    if _is_concrete(sizes) and _is_concrete(crop):
        box, s = np.asarray(crop, np.int64)[:, 2:], np.maximum(np.asarray(sizes, np.int64), p)
        taps = (2 * np.maximum(box, s) // s + 1).max(1)
        if (taps > max_taps).any():
            b = int(np.argmax(taps > max_taps))
            raise ValueError(
                f"max_taps={max_taps}: row {b}'s box {tuple(box[b].tolist())} resized to {tuple(s[b].tolist())} reads "
                f"{taps[b]} taps per axis"
            )
    return int(max_taps)


def _device_indices(indices):
    """Indices as the custom call takes them: int64 stays int64 (x64 mode); everything else
    becomes int32, which JAX always has."""
    indices = jnp.asarray(indices)
    contract.check_index_array(indices.dtype, indices.shape)
    return indices if indices.dtype == jnp.int64 else indices.astype(jnp.int32)


def _checked_crop(crop, batch, data, hw, host_idx, out_hw):
    """The crop boxes as int32 (batch, 4), each checked inside its record where they and the
    records are concrete (inside jit the CPU handler checks them)."""
    if crop is None:
        return None
    oh, ow = out_hw
    if _is_concrete(crop) and not isinstance(data, PackedRecords):
        _core.check_crops(contract.crop_boxes(crop, batch), *hw, oh, ow)
    elif _is_concrete(crop) and host_idx is not None and _is_concrete(data.table):
        dims = np.asarray(data.table)[host_idx]
        _core.check_crops_per_record(
            contract.crop_boxes(crop, batch), np.ascontiguousarray(dims[:, 1]), np.ascontiguousarray(dims[:, 2]), oh, ow
        )
    crop = jnp.asarray(crop)
    if crop.shape != (batch, 4) or not jnp.issubdtype(crop.dtype, jnp.integer):
        raise ValueError(f"crop must be ({batch}, 4) integers, got {crop.dtype} of shape {tuple(crop.shape)}")
    return crop.astype(jnp.int32)


def _body(
    backend,
    max_side,
    out_size,
    layout,
    normalization,
    *,
    erase_mode=None,
    affine=False,
    may_draw=None,
    patch=0,
    size_free=False,
    taps=None,
):
    """The per-device body over the operands (data, table of packed records, indices, crop,
    flip, out, normalization table, the eight arrays of the per-image ops or Nones, then the
    NaFlex rows' sizes or None; `patch` > 0: NaFlex rows, `out_size` (T, p·p·3), `taps` their
    resize's bound or None): the
    twin, the FFI call, or (auto) the FFI call on the platforms with a handler (with ops: one
    that runs them) and the twin elsewhere, decided when the program is lowered. `erase_mode`
    (an index of ERASE_MODES) is None without ops; `affine`: whether the ops may be affine;
    `may_draw`: the op codes the rows may hold (None: any), the twin's ops to compile;
    `size_free`: the matrices are templates the FFI handler finishes at each NaFlex row's size."""

    def records(d, r):
        return d if r is None else PackedRecords(d, r, max_side)

    def twin(d, r, i, c, f, o, t, *ops):
        del o
        ops, s = ops[:8], ops[8]
        if patch:  # with ops: written as uint8, then run where they lie (twin_patch_ops)
            tt = t if erase_mode is None else None
            pix = twin_patches(records(d, r), i, c, f, s, patch=patch, tokens=out_size[0], table=tt, taps=taps)
            if erase_mode is None:
                return pix
            mode = twin_ops.ERASE_MODES[erase_mode]
            return twin_patch_ops.serve(
                pix, s, ops, patch=patch, table=t, erase_mode=mode, affine=affine, may_draw=may_draw
            )
        if erase_mode is None:
            return twin_gather(records(d, r), i, crop=c, flip=f, out_size=out_size, table=t, layout=layout)
        codes, args, matrices, fill, nearest, boxes, keys, normal = ops
        pix = twin_gather(records(d, r), i, crop=c, flip=f, out_size=out_size)  # uint8 NHWC
        pix = twin_ops.apply_program(pix, codes, args, matrices, fill, nearest, affine=affine, may_draw=may_draw)
        out = pix if t is None else lookup(pix, t, channel_axis=-1)
        if boxes.shape[1]:
            # The kernel writes float32 noise rounded to the output dtype (bfloat16: to nearest
            # even, as astype): erasing a NaN canvas says where, and with what.
            noise = jnp.full(pix.shape, jnp.nan, jnp.float32)
            noise = twin_ops.erase(noise, boxes, keys, twin_ops.ERASE_MODES[erase_mode], normal)
            out = jnp.where(jnp.isnan(noise), out, noise.astype(out.dtype))
        return out.transpose(0, 3, 1, 2) if layout == "NCHW" else out

    def ffi(d, r, i, c, f, o, t, *ops):
        del t
        ops, s = ops[:8], ops[8]
        ops = None if ops[0] is None else ops
        kw = {} if erase_mode is None else dict(erase_mode=erase_mode)
        kw |= dict(patches=(patch, s), size_free=size_free) if patch else {}
        return ffi_gather(records(d, r), i, c, f, o, layout=layout, out_size=out_size, ops=ops, **normalization, **kw)

    # Under jit the twin's tables (twin_ops' look-ups) are constants of its own program, so
    # custom_partitioning, which traces the body without constants, accepts it.
    twin = jax.jit(twin)
    if backend == "twin":
        return twin
    if backend == "ffi":
        return ffi
    platforms = handler_platforms() if erase_mode is None and not patch else ops_platforms()
    if erase_mode is not None and affine and not jax.config.jax_enable_x64:
        # The twin's affine ops cannot be traced without x64: pick the body here, where
        # platform_dependent would trace both (the twin then raises its named error).
        return ffi if jax.default_backend() in platforms else twin

    def auto(*args):
        return jax.lax.platform_dependent(*args, default=twin, **{p: ffi for p in platforms})

    return auto


def _check_size_free(ops, p):
    """Refuses by name a program of per-row sizes (its matrices size-free) without NaFlex rows."""
    if getattr(ops, "size_free", False) and not p:
        raise ValueError("ops: a pixel_program of per-row sizes (out_hw (B, 2)) is for NaFlex rows: pass patches=")


def _checked_ops(ops, batch, out_dt, backend):
    """(the eight operands of a `PixelProgram` as the ops targets take them, the body's
    keywords: erase mode and whether an op may be affine); refuses by name backend='ffi' on
    platforms whose handler has no ops."""
    if not isinstance(ops, PixelProgram):
        raise TypeError(f"ops must be a tbljax.ops.pixel_program(...) or None, got {type(ops).__name__}")
    platform = jax.default_backend()
    if backend == "ffi" and platform not in ops_platforms():
        raise ValueError(
            f"backend='ffi' with ops=...: the per-image ops run in the FFI handler on {ops_platforms()}, "
            f"not on {platform!r} (the CUDA handler does not run them yet): use backend='auto' or 'twin'"
        )
    codes, args, matrices, fill, nearest, boxes, keys, mode, normal = ops
    if getattr(matrices, "dtype", None) == np.float64:  # a host program: its matrices as bits
        matrices = float64_bits(np.asarray(matrices))
    want = {
        "codes": (codes, jnp.uint8, 2),
        "args": (args, jnp.int32, 2),
        "matrices": (matrices, jnp.uint32, 4),
        "fill": (fill, jnp.uint8, 2),
        "nearest": (nearest, jnp.uint8, 1),
        "erase_boxes": (boxes, jnp.int32, 3),
        "erase_keys": (keys, jnp.uint32, 1),
        "normal_table": (normal, jnp.float32, 1),
    }
    arrays = []
    for name, (a, dt, ndim) in want.items():
        a = jnp.asarray(a)
        if a.dtype != dt or a.ndim != ndim:
            raise ValueError(f"ops: {name} must be {ndim}-D {jnp.dtype(dt).name}, got {a.ndim}-D {a.dtype}")
        arrays.append(a)
    k = arrays[0].shape[1]
    shapes = [(batch, k), (batch, k), (batch, k, 6, 2), (k, 3), (k,), (batch, arrays[5].shape[1], 4), (batch,)]
    for name, a, shape in zip(want, arrays, shapes):
        if a.shape != shape:
            raise ValueError(f"ops: {name} must be of shape {shape} for {batch} rows, got {a.shape}")
    if arrays[5].shape[1] and out_dt == np.uint8:
        raise ValueError(_step.ERASE_NEEDS_FLOAT)
    kw = dict(erase_mode=int(mode), affine=_may_be_affine(ops), may_draw=_may_draw(ops))
    return tuple(arrays), kw | dict(size_free=bool(getattr(ops, "size_free", False)))


def _may_draw(ops) -> tuple[int, ...] | None:
    """The op codes the rows of `ops` may hold (static): its concrete codes (refused where one is
    not an op code), else what its policies can draw (`tbljax.ops.pixel_program` records it),
    else None (any)."""
    codes = ops[0]
    if _is_concrete(codes):
        twin_ops.check_codes(codes)
        return tuple(np.unique(np.asarray(codes)).tolist())
    return getattr(ops, "may_draw", None)


def _may_be_affine(ops) -> bool:
    """Whether a row of `ops` may run an affine op (static), by `_may_draw`."""
    may = _may_draw(ops)
    return may is None or not (pixel_ops.AFFINE | pixel_ops.TV_AFFINE).isdisjoint(may)

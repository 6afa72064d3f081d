"""tbljax.ops: the serve kernel inside `jax.jit`. `gather_normalize` gathers uint8 records by
index, optionally crop-resizes and flips them, normalizes and writes the batch in a dtype and
layout, all in the compiled program: as an XLA FFI custom call running the same C++ kernel as
the host loader (CPU; CUDA when built with it), or as a pure-JAX twin with bit-identical
results on every other platform (TPU).

The handlers are registered once, when this module is imported. The arithmetic (the integer
crop-resize formula, the normalization contract) is documented in ffi/core/kernel.h; the twin
below spells the same formulas in jax.numpy, so all paths agree bit for bit.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from tbljax import ops
    >>> data = jnp.zeros((100, 32, 32, 3), jnp.uint8)          # e.g. a ResidentDataset's array
    >>> step = jax.jit(lambda d, i: ops.gather_normalize(d, i, mean=(0.5,) * 3, std=(0.25,) * 3))
    >>> step(data, jnp.arange(8)).shape
    (8, 32, 32, 3)
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from tbljax import _core
from tbljax._src.rules import contract
from tbljax._src.engine import kernels as _kernels
from tbljax._src.rules import sharding as _sharding

__all__ = ["TARGET", "PACKED_TARGET", "BACKENDS", "PAGE_BYTES", "PackedRecords", "gather_normalize",
           "normalize", "pack_layout", "registered_platforms", "twin_gather"]

TARGET = "tbljax_gather_normalize"
PACKED_TARGET = "tbljax_gather_normalize_packed"
# Packed records start at multiples of this many bytes (so a record's place is an int32 page
# number whatever the total size; padding averages half a page a record).
PAGE_BYTES = 4096
BACKENDS = ("auto", "ffi", "twin")
_ONE_BITS = contract.RESIZE_WEIGHT_BITS
_ROUND_SHIFT = 2 * _ONE_BITS  # acc carries weights of 2^11 on each axis


# ---------------------------------------------------------------------------------------------
# Registration: once, at import. {platform as lax.platform_dependent spells it: why not}
# ---------------------------------------------------------------------------------------------

def _register() -> tuple[dict[str, str], dict[str, str]]:
    registered, missing = {}, {}
    from tbljax import _core

    # The CPU handlers live in _core itself (one thread pool, one SIMD target with the loader);
    # a build without XLA's FFI headers leaves them out, and the twin serves CPU too.
    cpu_registrations = getattr(_core, "xla_registrations", None)
    if cpu_registrations is None:
        missing["cpu"] = ("tbljax._core was built without the XLA CPU handlers (no XLA FFI "
                          "headers: jax.ffi.include_dir() was not available to the build)")
    else:
        for name, capsule in cpu_registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform="cpu")
        registered["cpu"] = "tbljax._core"
    try:
        from tbljax import _ffi_cuda
    except ImportError as e:  # the common case: a build without -DTBLJAX_CUDA=ON
        missing["cuda"] = f"tbljax._ffi_cuda is not built ({e})"
    else:
        try:
            for name, capsule in _ffi_cuda.registrations().items():
                jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
            registered["cuda"] = "tbljax._ffi_cuda"
        except Exception as e:  # noqa: BLE001 - jaxlib without a CUDA plugin: not fatal on CPU
            missing["cuda"] = f"tbljax._ffi_cuda could not be registered ({e})"
    return registered, missing


_REGISTERED, _MISSING = _register()


def registered_platforms() -> dict[str, str]:
    """{platform: reason}: where the FFI handler runs ("registered by ...") and, for cpu and
    cuda, why it does not. Platforms without a handler (e.g. tpu) use the pure-JAX twin.

    >>> "cpu" in registered_platforms()
    True
    """
    out = {p: f"registered by {m}" for p, m in _REGISTERED.items()}
    out.update({p: f"not registered: {why}" for p, why in _MISSING.items()})
    return out


# ---------------------------------------------------------------------------------------------
# The pure-JAX twin: the formulas of ffi/core/kernel.h in jax.numpy (int32 throughout)
# ---------------------------------------------------------------------------------------------

@jax.tree_util.register_pytree_node_class
class PackedRecords:
    """RAW records of different sizes for `gather_normalize`, in two arrays: ``pages``, uint8
    ``(P, PAGE_BYTES)``, and ``table``, int32 ``(N, 3)``: record i is ``table[i, 1] x
    table[i, 2] x 3`` bytes (HWC) starting at ``pages[table[i, 0], 0]``. ``max_side`` (the
    longest side of any record) is static: it bounds how many filter taps a crop can need.
    `pack_layout` computes the table; `tbljax.ResidentDataset` of a file of records of
    different sizes holds one."""

    def __init__(self, pages, table, max_side: int):
        self.pages, self.table, self.max_side = pages, table, int(max_side)

    def tree_flatten(self):
        return (self.pages, self.table), self.max_side

    @classmethod
    def tree_unflatten(cls, max_side, children):
        return cls(*children, max_side)

    def __len__(self) -> int:
        return int(self.table.shape[0])

    def __repr__(self) -> str:
        return (f"PackedRecords({len(self)} records, {self.pages.shape[0]} pages of "
                f"{PAGE_BYTES} bytes, max_side={self.max_side})")


def pack_layout(heights, widths) -> tuple[np.ndarray, int]:
    """(int32 (N, 3) table of (first page, height, width), number of pages) for records of
    these sizes packed one after another, each from a page start."""
    h = np.asarray(heights, np.int64)
    w = np.asarray(widths, np.int64)
    pages = -(-(h * w * 3) // PAGE_BYTES)
    first = np.concatenate([[0], np.cumsum(pages)[:-1]]) if len(pages) else pages
    total = int(pages.sum())
    if total > np.iinfo(np.int32).max or (len(h) and (h * w * 3).max() > np.iinfo(np.int32).max):
        raise ValueError(f"{len(h)} records of {total * PAGE_BYTES} bytes do not fit the packed "
                         "layout (int32 page numbers, records under 2 GiB)")
    return np.stack([first, h, w], axis=1).astype(np.int32), total


def _max_taps(length: int, out_len: int) -> int:
    """kernel.h: an output coordinate reads at most 2*max(len, out)/out + 1 box pixels."""
    return 2 * max(length, out_len) // out_len + 1


def _axis_weights(o, length, out_len: int, taps: int):
    """kernel.h's taps of output coordinates `o` (..., O) for box lengths `length` (..., 1):
    the first box pixel (..., O) and `taps` weights each (..., O, taps), zero past the run.
    int32 throughout; exact (kernel.h bounds every intermediate below 2^31)."""
    m2 = 2 * jnp.maximum(length, out_len)
    c = (2 * o + 1) * length - out_len
    lo = jnp.maximum((c - m2) // (2 * out_len) + 1, 0)           # floor division, as kernel.h
    j = lo[..., None] + jnp.arange(taps, dtype=jnp.int32)
    length = length[..., None]
    d = jnp.abs((2 * j + 1) * out_len - (2 * o[..., None] + 1) * length)
    u = jnp.where(j < length, jnp.maximum(m2[..., None] - d, 0), 0)
    total = jnp.sum(u, axis=-1, keepdims=True)
    n = u * (1 << _ONE_BITS)
    q, r = n // total, n % total
    w = q + (r >= total - r).astype(jnp.int32) * (u > 0)
    rest = (1 << _ONE_BITS) - jnp.sum(w, axis=-1, keepdims=True)
    big = jnp.argmax(w, axis=-1)[..., None]                        # the first largest
    w = w + jnp.where(jnp.arange(taps, dtype=jnp.int32) == big, rest, 0)
    return lo, w


def twin_gather(data, indices, *, crop=None, flip=None, out_size=None, table=None,
                layout: str = "NHWC"):
    """The kernel's semantics in jax.numpy, with arguments already checked by
    `gather_normalize`: ``data`` uint8 (N, H, W, 3) or `PackedRecords`, int ``indices`` (B,),
    int32 ``crop`` (B, 4) or None (uniform data only), bool ``flip`` (B,) or None,
    ``out_size`` (OH, OW), ``table`` a (3, 256) float32/bfloat16 normalization table or None
    for uint8 output. Bit-exact with the C++ kernel by construction: exact int32 arithmetic
    (kernel.h's double sum over the filter taps), then one table look-up per value."""
    packed = isinstance(data, PackedRecords)
    if packed:
        rec = data.table[indices]                                      # (B, 3)
        first, rec_w = rec[:, 0, None, None], rec[:, 2, None, None]
        max_h = max_w = data.max_side

        def at(sy, sx):  # (B, OH, OW, 3) int32: pixel triplets of each sample's record
            o = (sy[:, :, None] * rec_w + sx[:, None, :]) * 3
            o = o[..., None] + jnp.arange(3, dtype=jnp.int32)
            return data.pages[first[..., None] + o // PAGE_BYTES, o % PAGE_BYTES].astype(jnp.int32)
    else:
        _, max_h, max_w, _ = data.shape
        idx = indices[:, None, None]

        def at(sy, sx):
            return data[idx, sy[:, :, None], sx[:, None, :]].astype(jnp.int32)
    oh, ow = out_size if out_size is not None else (max_h, max_w)
    # Flip mirrors output columns, so it folds into which column each output reads.
    ox = jnp.arange(ow, dtype=jnp.int32)[None, :]
    if flip is not None:
        ox = jnp.where(flip[:, None], ow - 1 - ox, ox)
    if crop is None:
        rows = jnp.arange(max_h, dtype=jnp.int32)[None, :, None]
        pix = data[idx, rows, ox[:, None, :]] if flip is not None else data[indices]
    else:
        crop = crop.astype(jnp.int32)
        oy = jnp.broadcast_to(jnp.arange(oh, dtype=jnp.int32)[None, :], (crop.shape[0], oh))
        ky, kx = _max_taps(max_h, oh), _max_taps(max_w, ow)
        ly, wy = _axis_weights(oy, crop[:, 2:3], oh, ky)                 # (B, OH), (B, OH, ky)
        lx, wx = _axis_weights(ox, crop[:, 3:4], ow, kx)                 # (B, OW), (B, OW, kx)
        sy0, sx0 = crop[:, :1] + ly, crop[:, 1:2] + lx
        y_last, x_last = crop[:, :1] + crop[:, 2:3] - 1, crop[:, 1:2] + crop[:, 3:4] - 1
        acc = jnp.zeros((crop.shape[0], oh, ow, 3), jnp.int32)
        for a in range(ky):  # sum over taps; a zero weight's pixel is clamped into the box
            sy = jnp.minimum(sy0 + a, y_last)
            row = jnp.zeros_like(acc)
            for b in range(kx):
                sx = jnp.minimum(sx0 + b, x_last)
                row = row + wx[:, None, :, b, None] * at(sy, sx)
            acc = acc + wy[:, :, a, None, None] * row
        pix = ((acc + (1 << (_ROUND_SHIFT - 1))) >> _ROUND_SHIFT).astype(jnp.uint8)
    out = pix if table is None else _lookup(pix, table, channel_axis=-1)
    return out.transpose(0, 3, 1, 2) if layout == "NCHW" else out


def _lookup(pix, table, channel_axis: int):
    """table[c, x] for every uint8 value x of channel c: the normalization contract, exactly."""
    flat = jnp.asarray(table).reshape(-1)                              # c * 256 + x
    shape = [1] * pix.ndim
    shape[channel_axis] = 3
    offset = (jnp.arange(3, dtype=jnp.int32) * 256).reshape(shape)
    return flat[pix.astype(jnp.int32) + offset]


def normalize(pixels, *, mean=None, std=None, dtype=jnp.float32, layout: str = "NHWC"):
    """uint8 pixels → the float32 / bfloat16 nearest to ``(x/255 - mean[c]) / std[c]``
    (computed in float64): the normalization contract of every tbljax path, bit-exact, as a
    table look-up that runs anywhere (use it on batches served as uint8, which move 4x fewer
    bytes). ``layout`` says where the channel axis is: last ("NHWC") or second ("NCHW").

    >>> normalize(jnp.full((1, 2, 2, 3), 255, jnp.uint8), mean=(0.5,) * 3, std=(0.5,) * 3)[0, 0, 0]
    Array([1., 1., 1.], dtype=float32)
    """
    out_dt = _out_dtype(dtype)
    if out_dt == np.uint8:
        raise TypeError("normalize writes float32 or bfloat16, got dtype uint8")
    contract.check_layout(layout)
    pixels = jnp.asarray(pixels)
    axis = -1 if layout == "NHWC" else 1
    if pixels.dtype != jnp.uint8 or pixels.ndim < 2 or pixels.shape[axis] != 3:
        raise ValueError(f"pixels must be uint8 with 3 channels on the {layout} channel axis, got "
                         f"{pixels.dtype} of shape {tuple(pixels.shape)}")
    table = _table(*contract.normalization(mean, std), out_dt)
    return _lookup(pixels, table, axis)


# ---------------------------------------------------------------------------------------------
# The FFI call
# ---------------------------------------------------------------------------------------------

def _ffi_gather(data, indices, crop, flip, out, *, mean, std, layout, out_size, dtype):
    """The FFI custom call; `data` is an (N, H, W, 3) array or `PackedRecords`."""
    oh, ow = out_size
    b = indices.shape[0]  # per shard under shard_map
    result = jax.ShapeDtypeStruct((b, *contract.row_shape(layout, oh, ow)), dtype)
    crop_op = jnp.zeros((0, 4), jnp.int32) if crop is None else crop.astype(jnp.int32)
    flip_op = jnp.zeros((0,), jnp.uint8) if flip is None else flip.astype(jnp.uint8)
    packed = isinstance(data, PackedRecords)
    records = [data.pages, data.table] if packed else [data]
    operands = [*records, indices, crop_op, flip_op]
    aliases = None
    if out is not None:  # write into the caller's (donated) buffer, not a fresh allocation
        aliases = {len(operands): 0}
        operands.append(out)
    call = jax.ffi.ffi_call(PACKED_TARGET if packed else TARGET, result, vmap_method="sequential",
                            input_output_aliases=aliases)
    y = call(*operands, mean=np.asarray(mean, np.float64), std=np.asarray(std, np.float64),
             layout=layout)
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


# ---------------------------------------------------------------------------------------------
# The public entry point
# ---------------------------------------------------------------------------------------------

def _is_concrete(x) -> bool:
    if x is None or isinstance(x, jax.core.Tracer):
        return False
    return not isinstance(x, jax.Array) or x.is_fully_addressable


def _out_dtype(dtype) -> np.dtype:
    return contract.np_dtype(contract.dtype_name(dtype))


def _batch_spec(sharding):
    """A Mesh or NamedSharding of the batch → (mesh, PartitionSpec of the batch axis)."""
    s = _sharding.batch_sharding(sharding)
    mesh = getattr(s, "mesh", None)
    if mesh is None:
        raise TypeError(f"sharding must be a Mesh or NamedSharding, got {type(sharding).__name__}")
    return mesh, PartitionSpec(s.spec[0] if len(s.spec) else None)


def gather_normalize(data, indices, *, mean=None, std=None, dtype=jnp.float32,
                     layout: str = "NHWC", crop=None, flip=None, out_size=None,
                     backend: str = "auto", sharding=None, out=None):
    """``data[indices]`` → optional crop-resize → optional flip → normalize, inside `jax.jit`.

    The same fused pass as `tbljax.kernels.gather` (and the loader), as a traceable JAX
    operation: for each b take record ``indices[b]``; if ``crop`` is given resize the box
    ``crop[b] = (y0, x0, h, w)`` to ``out_size`` with the exact integer triangle filter of
    ffi/core/kernel.h (bilinear, antialiased when shrinking); mirror it left-right if
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
    out_dt = _out_dtype(dtype)
    packed = isinstance(data, PackedRecords)
    if packed:
        n, h, w = len(data), None, None
        if data.pages.dtype != np.uint8 or data.pages.ndim != 2 or data.pages.shape[1] != PAGE_BYTES:
            raise ValueError(f"PackedRecords.pages must be uint8 (P, {PAGE_BYTES}), got "
                             f"{data.pages.dtype} of shape {tuple(data.pages.shape)}")
        if data.table.dtype != np.int32 or data.table.ndim != 2 or data.table.shape[1] != 3 or n < 1:
            raise ValueError(f"PackedRecords.table must be int32 (N, 3) with N >= 1, got "
                             f"{data.table.dtype} of shape {tuple(data.table.shape)}")
        if crop is None or out_size is None:
            raise ValueError("the records differ in size: the output size is fixed only by crop "
                             "boxes and out_size (e.g. augment=tbljax.Augment(size=(224, 224)))")
    else:
        if not hasattr(data, "shape") or not hasattr(data, "dtype"):
            data = jnp.asarray(data)
        if data.dtype != np.uint8 or data.ndim != 4 or data.shape[3] != 3 or 0 in data.shape[:3]:
            raise ValueError(f"data must be a non-empty uint8 array of shape (N, H, W, 3) or "
                             f"PackedRecords, got {data.dtype} of shape {tuple(data.shape)}")
        n, h, w, _ = (int(v) for v in data.shape)

    concrete_idx = _is_concrete(indices)
    if concrete_idx:
        host_idx = np.asarray(indices)
        if host_idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {host_idx.dtype}")
        if host_idx.ndim != 1:
            raise ValueError(f"indices must be 1-D (B,), got shape {host_idx.shape}")
        _core.check_indices(np.ascontiguousarray(host_idx, np.int64), n)
    indices = jnp.asarray(indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer) or indices.ndim != 1:
        raise ValueError(f"indices must be a 1-D integer array, got {indices.dtype} of shape "
                         f"{tuple(indices.shape)}")
    # int64 stays int64 (x64 mode); everything else becomes int32, which JAX always has.
    if indices.dtype != jnp.int64:
        indices = indices.astype(jnp.int32)
    batch = int(indices.shape[0])

    if out_dt == np.uint8:
        if mean is not None or std is not None:
            raise ValueError("uint8 output is not normalized: mean and std must be None")
    mean_v, std_v = contract.normalization(mean, std)
    oh, ow = contract.output_size((h, w) if not packed else out_size, out_size,
                                  cropped=crop is not None)
    if crop is not None:
        if _is_concrete(crop) and not packed:
            _core.check_crops(contract.crop_boxes(crop, batch), h, w, oh, ow)
        elif _is_concrete(crop) and concrete_idx and _is_concrete(data.table):
            dims = np.asarray(data.table)[np.asarray(host_idx, np.int64)]
            _core.check_crops_per_record(contract.crop_boxes(crop, batch),
                                         np.ascontiguousarray(dims[:, 1]),
                                         np.ascontiguousarray(dims[:, 2]), oh, ow)
        crop = jnp.asarray(crop)
        if crop.shape != (batch, 4) or not jnp.issubdtype(crop.dtype, jnp.integer):
            raise ValueError(f"crop must be ({batch}, 4) integers, got {crop.dtype} of shape "
                             f"{tuple(crop.shape)}")
        crop = crop.astype(jnp.int32)
    if flip is not None:
        flip = jnp.asarray(flip)
        if flip.shape != (batch,):
            raise ValueError(f"flip must have shape ({batch},), got {tuple(flip.shape)}")
        flip = flip != 0 if flip.dtype != jnp.bool_ else flip

    shape = (batch, *contract.row_shape(layout, oh, ow))
    if out is not None and (tuple(out.shape) != shape or out.dtype != out_dt):
        raise ValueError(f"out must be {out_dt} of shape {shape}, got {out.dtype} of shape "
                         f"{tuple(out.shape)}")
    if batch == 0:
        return jnp.zeros(shape, out_dt)

    # The twin takes the table as an operand, not a closed-over constant, so that one traced
    # body serves every placement (custom_partitioning traces it without constants).
    table = None
    if out_dt != np.uint8 and backend != "ffi":
        table = jnp.asarray(_table(mean_v, std_v, out_dt))

    max_side = data.max_side if packed else None

    def records(d, r):
        return d if r is None else PackedRecords(d, r, max_side)

    def twin(d, r, i, c, f, o, t):
        del o
        return twin_gather(records(d, r), i, crop=c, flip=f, out_size=(oh, ow), table=t,
                           layout=layout)

    def ffi(d, r, i, c, f, o, t):
        del t
        return _ffi_gather(records(d, r), i, c, f, o, mean=mean_v, std=std_v, layout=layout,
                           out_size=(oh, ow), dtype=out_dt)

    if backend == "twin":
        body = twin
    elif backend == "ffi":
        body = ffi
    else:
        def body(*args):
            # Resolved when the program is lowered: the handler where one is registered.
            return jax.lax.platform_dependent(*args, default=twin,
                                              **{p: ffi for p in _REGISTERED})

    args = ((data.pages, data.table) if packed else (data, None)) + (indices, crop, flip, out, table)
    if sharding is not None:
        mesh, spec = _batch_spec(sharding)
        return _shard_map(body, args, mesh, spec)
    return _follow_indices(body, args, layout)


# ---------------------------------------------------------------------------------------------
# Per shard: with `sharding=`, or following the indices' sharding
# ---------------------------------------------------------------------------------------------

# The op's operands, in order: data (records, or the pages of packed records), the packed
# records' table (None for records of one size), indices, crop, flip, out, the normalization
# table. Their axes as factors of a Shardy sharding rule: the batch b is the one factor
# operands and result share.
_FACTORS = ("n h w d", "r s", "b", "b k", "b", None, "t v")
_INDICES, _OUT = 2, 5
_BATCHED = (2, 3, 4, 5)  # split like the batch; records and tables are whole on every device


def _present(body, args):
    """body over all seven operands → (fn over the operands that are not None, their slots)."""
    slots = tuple(k for k, a in enumerate(args) if a is not None)

    def fn(*local):
        full = [None] * len(args)
        for k, a in zip(slots, local):
            full[k] = a
        return body(*full)

    return fn, slots


def _shard_map(body, args, mesh, spec):
    """body under `jax.shard_map`: each device gets its rows of the batched operands."""
    fn, slots = _present(body, args)
    rep = PartitionSpec()
    in_specs = tuple(spec if k in _BATCHED else rep for k in slots)
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs,
                         out_specs=spec)(*(args[k] for k in slots))


def _follow_indices(body, args, layout):
    """body as one op that XLA partitions like the indices (no `sharding=`, inside jit).

    A `custom_partitioning` rule: the batch axis of the result and of crop, flip and out is
    split as the indices' axis is; data and table are replicated (gathered first if they
    arrive sharded); each device runs body on its own rows. Indices that are replicated, or
    split over axes that do not divide the batch, run whole on every device. On one device,
    and inside a `shard_map` over every mesh axis, XLA inlines body as it is. Under a mesh
    with explicit axes the indices' type names their sharding, and `shard_map` splits the
    batch the same way (custom_partitioning there would type the result replicated).
    """
    fn, slots = _present(body, args)
    operands = [args[k] for k in slots]
    batch = int(args[_INDICES].shape[0])
    context = jax.sharding.get_abstract_mesh()
    if context.axis_names and set(context.manual_axes) == set(context.axis_names):
        return fn(*operands)  # inside shard_map over every axis: already one device's rows
    typed = getattr(jax.typeof(args[_INDICES]), "sharding", None)
    explicit = _explicit_entry(typed, batch)
    if explicit is not None:
        return _shard_map(body, args, typed.mesh, PartitionSpec(explicit))
    if not any(isinstance(x, jax.core.Tracer) for x in operands):
        return fn(*operands)  # eager: nothing is partitioned outside a compiled program

    from jax.experimental.custom_partitioning import custom_partitioning

    def placement(mesh, arg_shapes):
        entry = _split_entry(arg_shapes[slots.index(_INDICES)].sharding, batch)  # indices decide
        rows = NamedSharding(mesh, PartitionSpec(entry))
        rep = NamedSharding(mesh, PartitionSpec())
        return rows, tuple(rows if k in _BATCHED else rep for k in slots)

    def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
        del result_shape
        return placement(mesh, arg_shapes)[0]

    def partition(mesh, arg_shapes, result_shape):
        del result_shape
        rows, in_shardings = placement(mesh, arg_shapes)
        return mesh, fn, rows, in_shardings

    result = "b y x c" if layout == "NHWC" else "b c y x"
    data_factors = "n h w d" if args[0].ndim == 4 else "p q"
    factors = [result if k == _OUT else data_factors if k == 0 else _FACTORS[k] for k in slots]
    op = custom_partitioning(fn)
    op.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                     sharding_rule=f"{', '.join(factors)} -> {result}")

    # custom_partitioning has no batching rule: under vmap, body is batched as it is.
    @jax.custom_batching.custom_vmap
    def call(*xs):
        return op(*xs)

    @call.def_vmap
    def _(axis_size, in_batched, *xs):
        del axis_size
        return jax.vmap(fn, in_axes=tuple(0 if b else None for b in in_batched))(*xs), True

    return call(*operands)


def _split_entry(sharding, batch: int):
    """The PartitionSpec entry splitting a 1-D array's axis, if it divides `batch`, else None."""
    if getattr(sharding, "mesh", None) is None or getattr(sharding, "spec", None) is None:
        return None
    entry = sharding.spec[0] if len(sharding.spec) else None
    return entry if entry is not None and batch % _sharding.parts(sharding) == 0 else None


def _explicit_entry(sharding, batch: int):
    """`_split_entry` for an array typed with a sharding over explicit mesh axes, else None."""
    entry = _split_entry(sharding, batch)
    if entry is None:
        return None
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    types = dict(zip(sharding.mesh.axis_names, getattr(sharding.mesh, "axis_types", ())))
    axes = entry if isinstance(entry, tuple) else (entry,)
    return entry if explicit is not None and all(types.get(a) == explicit for a in axes) else None


@functools.lru_cache(maxsize=64)
def _table(mean, std, dtype) -> np.ndarray:
    """The (3, 256) normalization table of the contract (float32 or bfloat16), read-only."""
    t = _kernels.normalize_table(mean, std, dtype)
    t.setflags(write=False)
    return t


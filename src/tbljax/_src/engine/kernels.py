"""The serve kernel from Python: gather uint8 RGB records by index, optionally crop-resize and
flip them, normalize, and write a batch into a buffer the caller owns (one fused native pass).

The exact arithmetic (crop-resize formula, normalization contract) is documented in
ffi/core/serve/kernel.h; ``normalize_table`` gives the normalization contract as NumPy tables.
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable, Sequence

import numpy as np

from tbljax import _core
from tbljax._src.engine.pixel_program import ops_arg, pixel_program
from tbljax._src.rules import contract

__all__ = [
    "build_info",
    "gather",
    "jpeg_source",
    "kernel_target",
    "normalize_table",
    "pixel_program",
    "prepare_gather",
    "prepare_serve_jpeg",
    "raw_source",
    "record_crc16",
    "serve_jpeg",
    "prepare_serve_jpeg_views",
    "variable_source",
]

CorruptFileError = _core.CorruptFileError


def record_crc16(payload: np.ndarray) -> int:
    """The per-record checksum of TBL v2 (CRC-16/MODBUS) of a 1-D uint8 payload: the core's
    own function, the one `verify` and `read` check records with."""
    return _core.crc16_modbus(payload)


def kernel_target() -> str:
    """The SIMD target the kernel (and the decoder's resize) runs on this machine: ``scalar``,
    ``avx2`` or ``avx512``.

    Set ``TBLJAX_SIMD=scalar`` (or ``avx2``) before the first gather to cap it.
    """
    return _core.kernel_target()


def _check_shard(a, where: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{where} must be a numpy.ndarray of shape (N, H, W, 3) uint8, got {type(a).__name__}")
    if a.dtype != np.uint8:
        raise TypeError(f"{where} must hold uint8 RGB pixels, got dtype {a.dtype}")
    if a.ndim != 4 or a.shape[3] != 3:
        raise ValueError(f"{where} must have shape (N, H, W, 3), got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(
            f"{where} must be C-contiguous (a strided view would be copied on "
            f"every batch); pass np.ascontiguousarray(...) once"
        )
    return a


def raw_source(source) -> _core.RawSource:
    """A reusable native view of ``source``: an ``(N, H, W, 3)`` uint8 array, a list of such
    shard arrays (same H and W, read as one sequence), or an existing ``RawSource``.

    Building one is cheap, but a loader that serves many batches should build it once.
    """
    if isinstance(source, _core.RawSource):
        return source
    if isinstance(source, np.ndarray):
        return _core.RawSource([_check_shard(source, "source")])
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("source is an empty list: give at least one (N, H, W, 3) uint8 array")
        shards = [_check_shard(a, f"source[{k}]") for k, a in enumerate(source)]
        hw = shards[0].shape[1:3]
        for k, a in enumerate(shards):
            if a.shape[1:3] != hw:
                raise ValueError(
                    f"source[{k}] holds {a.shape[1]}x{a.shape[2]} records but "
                    f"source[0] holds {hw[0]}x{hw[1]}: all shards must match"
                )
        return _core.RawSource(shards)
    raise TypeError(
        "source must be an (N, H, W, 3) uint8 numpy array, a list of them, or a "
        f"tbljax._core.RawSource, got {type(source).__name__}"
    )


def _checked_shards(shards) -> list:
    shards = list(shards)
    for k, a in enumerate(shards):
        if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or not a.flags.c_contiguous:
            raise TypeError(f"shards[{k}] must be a C-contiguous uint8 numpy array")
    return shards


def variable_source(shards, counts, offsets, heights, widths) -> _core.RawSource:
    """A native view of RAW records of different sizes: ``shards[k]`` (C-contiguous uint8
    arrays, e.g. `Dataset.raw_records` of a file) holds ``counts[k]`` records; record i is
    ``heights[i] x widths[i] x 3`` bytes at byte ``offsets[i]`` of its shard. Every record is
    checked to lie inside its shard. `gather` from it needs crop boxes (they fix the output
    size)."""
    shards = _checked_shards(shards)
    return _core.RawSource.variable(
        shards,
        _int_array(counts, np.int64, "counts"),
        _int_array(offsets, np.int64, "offsets"),
        _int_array(heights, np.int32, "heights"),
        _int_array(widths, np.int32, "widths"),
    )


def _int_array(a, dtype, name) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be a 1-D integer array, got {a.dtype} of shape {a.shape}")
    return np.ascontiguousarray(a, dtype=dtype)


def gather(
    source,
    indices,
    out: np.ndarray,
    *,
    layout: str = "NHWC",
    crop=None,
    flip=None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    ops=None,
    patches=None,
) -> np.ndarray:
    """Gathers ``source[indices]`` into ``out`` in one fused, parallel pass (GIL released).

    For each sample b: take record ``indices[b]``; if ``crop`` is given, cut the box
    ``crop[b] = (y0, x0, h, w)`` and resize it to the output size with the exact integer
    triangle filter of ffi/core/serve/kernel.h (bilinear, antialiased when shrinking; uint8 pixels,
    rounded to nearest); mirror it left-right if
    ``flip[b]``; then write it as ``out.dtype``:

    * uint8: the pixels as they are (``mean`` and ``std`` must be None);
    * float32 / bfloat16: the value nearest to ``(x/255 - mean[c]) / std[c]`` computed in
      float64 (``normalize_table``); mean defaults to 0 and std to 1, i.e. ``x/255``.

    Args:
      source: an ``(N, H, W, 3)`` uint8 C-contiguous array, a list of such shard arrays read
        as one sequence, or a ``RawSource`` from ``raw_source`` or ``variable_source``
        (records of different sizes: ``crop`` is then required, each box inside its own
        record).
      indices: ``(B,)`` integers in ``[0, N)``.
      out: ``(B, OH, OW, 3)`` for NHWC or ``(B, 3, OH, OW)`` for NCHW; uint8, float32 or
        ``ml_dtypes.bfloat16``; C-contiguous and writable. Never reallocated or converted.
      layout: ``"NHWC"`` or ``"NCHW"``.
      crop: ``(B, 4)`` integer boxes ``(y0, x0, h, w)`` inside the image, or None; without
        crop boxes ``(OH, OW)`` must equal ``(H, W)``.
      flip: ``(B,)`` booleans, or None.
      mean, std: 3 numbers each (float outputs only).
      ops: the rows' per-image ops (`pixel_program`), or None.
      patches: NaFlex rows, ``(p, sizes)``: row b is resized to its own ``sizes[b] = (h, w)``
        (multiples of p; ``crop`` required) and written as its (h/p) x (w/p) patches into ``out``
        of shape ``(B, T, p*p*3)``, NHWC: patch (gy, gx) at token ``gy * (w/p) + gx``, its
        pixels (py, px, c) in order (`rules/naflex.patchify`'s layout); tokens past the grid are
        zeros. None: one output size.

    Returns:
      ``out``.

    Example::

        images = np.zeros((5000, 176, 176, 3), np.uint8)           # or a TBL file's view
        batch = np.empty((256, 160, 160, 3), np.float32)           # reuse it every step
        gather(images, idx, batch, crop=boxes, flip=flips,
               mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    """
    kw = dict(layout=layout, crop=crop, flip=flip, mean=mean, std=std, ops=ops, patches=patches)
    prepare_gather(source, indices, out, **kw)()
    return out


def prepare_gather(
    source,
    indices,
    out: np.ndarray,
    *,
    layout: str = "NHWC",
    crop=None,
    flip=None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    ops=None,
    patches=None,
) -> Callable[[], None]:
    """`gather`'s checks, then the native call to make (it releases the GIL): the loader's
    producer wakes its next step's draw between the two (engine/record_source.py)."""
    src = raw_source(source)
    out, patch = _patch_args(out, patches, layout)
    args = _batch_args(src.num_records, indices, out, layout, crop, flip, mean, std)
    return functools.partial(_core.gather, src, *args, ops_arg(ops), *patch)


def _patch_args(out, patches, layout) -> tuple:
    """(out as the kernel takes it, (p, sizes (B, 2) int32)); (out, ()) without patches."""
    if patches is None:
        return out, ()
    p, sizes = patches
    if not contract.is_integer(p) or p < 1:
        raise ValueError(f"patches: the patch size must be a positive integer, got {p!r}")
    if layout != "NHWC":
        raise ValueError(f"patches are written in layout NHWC, got layout={layout!r}")
    if not isinstance(out, np.ndarray) or out.ndim != 3 or out.shape[2] != p * p * 3:
        raise ValueError(f"patches of {p}x{p} need out of shape (B, T, {p * p * 3}), got {getattr(out, 'shape', out)}")
    sizes = np.asarray(sizes)
    if sizes.ndim != 2 or sizes.shape[1] != 2 or sizes.dtype.kind not in "iu":
        raise ValueError(f"patches: sizes must be (B, 2) integers, got {sizes.dtype} of shape {sizes.shape}")
    return out.reshape(*out.shape[:2], p * p, 3), (int(p), np.ascontiguousarray(sizes, np.int32))


def _batch_args(num_records, indices, out, layout, crop, flip, mean, std) -> tuple:
    """The checked arguments every batch entry of the core takes after its source: (indices,
    out buffer, layout, dtype name, mean, std, crop boxes, flips)."""
    contract.check_layout(layout)

    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    name = out.dtype.name
    if name not in contract.OUT_DTYPES:
        raise TypeError(f"out.dtype must be uint8, float32 or bfloat16, got {out.dtype}")
    want = f"(B, {', '.join(map(str, contract.row_shape(layout, 'OH', 'OW')))})"
    if out.ndim != 4 or out.shape[contract.channel_axis(layout)] != 3:
        raise ValueError(f"out must have shape {want} for layout {layout}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous (the kernel writes it in place)")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    if not out.flags.aligned:
        raise ValueError(f"out must be aligned to its element size ({out.dtype.itemsize} bytes)")

    idx = contract.host_indices(indices, num_records)
    batch = idx.shape[0]
    if out.shape[0] != batch:
        raise ValueError(f"out has batch size {out.shape[0]} but indices has {batch} entries")

    contract.check_unnormalized(name, mean, std)
    m, s = contract.normalization(mean, std)

    crop_arr = None
    if crop is not None:
        crop_arr = contract.crop_boxes(crop, batch)

    flip_arr = None
    if flip is not None:
        f = np.asarray(flip)
        contract.check_flip(f.dtype, f.shape, batch)
        flip_arr = np.ascontiguousarray(f != 0).view(np.uint8)

    buf = out.view(np.uint16) if name == "bfloat16" else out
    return idx, buf, layout, name, m, s, crop_arr, flip_arr


def normalize_table(mean: Sequence[float], std: Sequence[float], dtype=np.float32) -> np.ndarray:
    """The normalization contract as a ``(3, 256)`` table: ``table[c, x]`` is the float32 or
    bfloat16 nearest to ``(x/255 - mean[c]) / std[c]`` computed in float64. It is the table
    the C++ kernel builds and normalizes with; every other path (XLA handlers, pure-JAX
    twin, adapters) looks values up in it too.

    Example::

        t = normalize_table((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), ml_dtypes.bfloat16)
        images_bf16 = t[np.arange(3), images_u8]        # (..., 3) uint8 -> bfloat16
    """
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in ("float32", "bfloat16"):
        raise TypeError(f"dtype must be float32 or bfloat16, got {name or repr(dtype)}")
    m, s = contract.normalization(mean, std)
    table = np.asarray(_core.normalize_table(m, s, name))
    return table.view(contract.np_dtype(name)) if name == "bfloat16" else table


def jpeg_source(shards, counts, offsets, sizes, heights, widths, stored_raw=None) -> _core.JpegSource:
    """A native view of JPEG records (compact records: JPEG bytes at the stored geometry):
    ``shards[k]`` (C-contiguous uint8 arrays, e.g. `Dataset.jpeg_records` of a file) holds
    ``counts[k]`` records; record i is ``sizes[i]`` bytes at byte ``offsets[i]`` of its shard
    and decodes to ``heights[i] x widths[i]`` pixels, or, where ``stored_raw[i]`` is nonzero
    (a compact file converted with ``raw_budget=``), is those pixels stored RAW and is served
    as it lies. Every record is checked to lie inside its shard, and a RAW record to hold
    exactly its pixels (CorruptFileError)."""
    shards = _checked_shards(shards)
    raw = None if stored_raw is None else np.ascontiguousarray(stored_raw, np.uint8)
    return _core.JpegSource.create(
        shards,
        _int_array(counts, np.int64, "counts"),
        _int_array(offsets, np.int64, "offsets"),
        _int_array(sizes, np.int64, "sizes"),
        _int_array(heights, np.int32, "heights"),
        _int_array(widths, np.int32, "widths"),
        raw,
    )


def serve_jpeg(
    source: _core.JpegSource,
    indices,
    out: np.ndarray,
    *,
    layout: str = "NHWC",
    crop=None,
    flip=None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    dct_scale: bool = False,
    threads: int = 0,
    where=None,
    ops=None,
    patches=None,
) -> np.ndarray:
    """`gather` from JPEG records: each sample's record is decoded in the C++ pool, only the
    part its box needs (with restart markers dividing the rows, as in compact records: only
    the restart segments covering the box; else columns cropped, rows above skipped, decoding
    stopped after the box), and that part goes at once through the same crop/resize, flip and
    normalize as RAW records. With ``dct_scale=False`` the pixels are exactly those of `gather`
    over the decoded records; damage in data the box does not need (below it; with restart
    segments, also beside or above it) goes unnoticed (`verify` checks every record's
    checksum), but restart markers out of sequence or of the wrong count fail any box.

    Args:
      source: a `jpeg_source`.
      indices, out, layout, crop, flip, mean, std: as `gather` (crop None: each record must
        have the output size).
      dct_scale: decode at 1/2, 1/4 or 1/8 (libjpeg's scaled IDCT) where the box at that
        scale still covers the output twice over on both axes, then resize from there:
        faster for boxes much larger than the output, not bit-identical.
      threads: None or 0 for the default pool, else a pool of that many threads
        (`contract.check_threads`).
      where: ``where(i) -> str`` names record i in the error of a record that fails
        (DecodeError, or CorruptFileError when it does not decode to its index's size).
      ops, patches: as `gather`.

    Example::

        src = jpeg_source(*ds.jpeg_records())
        serve_jpeg(src, idx, batch, crop=boxes, flip=flips, mean=mean, std=std)
    """
    prepare_serve_jpeg(
        source,
        indices,
        out,
        layout=layout,
        crop=crop,
        flip=flip,
        mean=mean,
        std=std,
        dct_scale=dct_scale,
        threads=threads,
        where=where,
        ops=ops,
        patches=patches,
    )()
    return out


def prepare_serve_jpeg(
    source: _core.JpegSource,
    indices,
    out: np.ndarray,
    *,
    layout: str = "NHWC",
    crop=None,
    flip=None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    dct_scale: bool = False,
    threads: int = 0,
    where=None,
    ops=None,
    patches=None,
) -> Callable[[], None]:
    """`serve_jpeg`'s checks, then the native call to make (as `prepare_gather`)."""
    if not isinstance(source, _core.JpegSource):
        raise TypeError(f"source must be a tbljax.kernels.jpeg_source, got {type(source).__name__}")
    if not isinstance(dct_scale, bool):
        raise TypeError(f"dct_scale must be True or False, got {dct_scale!r}")
    out, patch = _patch_args(out, patches, layout)
    args = _batch_args(source.num_records, indices, out, layout, crop, flip, mean, std)
    return functools.partial(
        _core.serve_jpeg, source, *args, dct_scale, contract.check_threads(threads), where, ops_arg(ops), *patch
    )


def prepare_serve_jpeg_views(
    source: _core.JpegSource,
    groups,
    *,
    layout: str = "NHWC",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    threads: int = 0,
    where=None,
) -> Callable[[], None]:
    """`serve_jpeg`'s checks for several view groups over the same records (``views=``), then
    the native call: each record decoded once for all of its views (the union of their boxes,
    at scale 1), each view cut from it -- the bytes `serve_jpeg` (``dct_scale=False``) writes.

    `groups`: ``(count, indices, out, crop, flip, ops)`` per group, its rows record-major (row
    ``i * count + k`` is the i-th record's view k: indices are the records each repeated
    ``count`` times, the same records in every group)."""
    if not isinstance(source, _core.JpegSource):
        raise TypeError(f"source must be a tbljax.kernels.jpeg_source, got {type(source).__name__}")
    parsed, dtype = [], None
    for count, indices, out, crop, flip, ops in groups:
        idx, buf, lay, name, m, s, crop_arr, flip_arr = _batch_args(
            source.num_records, indices, out, layout, crop, flip, mean, std
        )
        dtype = name
        parsed.append((int(count), idx, buf, crop_arr, flip_arr, ops_arg(ops)))
    return functools.partial(
        _core.serve_jpeg_views, source, parsed, layout, dtype, m, s, contract.check_threads(threads), where
    )


def build_info() -> dict:
    """What this build was compiled with and what runs, for both native front ends.

    Keys include ``version``, ``compiler``, ``libjpeg_turbo``, ``lz4``; ``simd`` (the one SIMD
    target of the kernel, the resize and the CRC), ``simd_targets`` and ``cpu_features``;
    ``threads`` (the size of the one thread pool) and ``pool_started``; ``xla_cpu`` (whether
    the XLA CPU handlers are compiled into ``tbljax._core``) and ``xla_ffi_api``; ``xla_cuda``
    (whether ``tbljax._ffi_cuda`` imports) and, when it does not, ``xla_cuda_error``.

    >>> tbljax.build_info()["simd"] in tbljax.build_info()["simd_targets"]
    True
    """
    info = dict(_core.native_info())
    try:
        importlib.import_module("tbljax._ffi_cuda")  # imports no framework
    except ImportError as e:
        info["xla_cuda"], info["xla_cuda_error"] = False, str(e)
    else:
        info["xla_cuda"] = True
    return info

"""The rules every serving path shares, each written once. Output dtype and
layout names and the shape a layout gives, per-channel mean/std, the side limit of a record,
the record count a loader indexes, the resize mode names, and the rule that ties the output
size to the crop. The host loader, the kernel, the in-jit op, the resident dataset and
the torch and MLX adapters all validate through these functions, so they accept and refuse the
same things with the same words.

The numbers come from the C++ core (`tbljax._core`), which is where the kernel enforces them.

>>> dtype_name("float32"), np_dtype("bfloat16").name
('float32', 'bfloat16')
>>> normalization(None, (0.5, 0.5, 0.5))
((0.0, 0.0, 0.0), (0.5, 0.5, 0.5))
"""

from __future__ import annotations

import numpy as np

from tbljax import _core
from tbljax._src.rules.errors import Arg, ArgumentError, worded  # re-exported: every room's import

__all__ = [
    "Arg",
    "ArgumentError",
    "DEFAULT_RESIZE",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LAYOUTS",
    "MAX_OUT_SIDE",
    "MAX_RECORDS",
    "MAX_SIDE",
    "MAX_THREADS",
    "OUT_DTYPES",
    "RESIZE_MODES",
    "RESIZE_WEIGHT_BITS",
    "SQUARE_RESIZE_MODES",
    "channel_axis",
    "check_flip",
    "check_index_array",
    "check_layout",
    "check_record_count",
    "check_served_labels",
    "check_threads",
    "check_unnormalized",
    "crop_boxes",
    "dtype_name",
    "host_indices",
    "is_integer",
    "is_real",
    "normalization",
    "np_dtype",
    "output_size",
    "record_numbers",
    "row_shape",
    "worded",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

LAYOUTS: tuple[str, ...] = tuple(_core.LAYOUTS)  # ("NHWC", "NCHW")
OUT_DTYPES: tuple[str, ...] = tuple(_core.OUT_DTYPES)  # ("uint8", "float32", "bfloat16")
MAX_SIDE: int = _core.MAX_SIDE  # TBL stores sides as u16
RESIZE_WEIGHT_BITS: int = _core.RESIZE_WEIGHT_BITS  # kernel.h: fixed-point resize weights
MAX_THREADS: int = _core.MAX_THREADS  # the largest pool a call may ask for
# Output sides of a crop-resize: kernel.h's integer sums stay exact in int32, the in-jit twin's
# arithmetic, for output sides up to 32767.
MAX_OUT_SIDE = 32767
# How convert resizes (resize.h): every mode's name, those whose every output is S x S, and the
# mode a recipe without a "resize" key was made with.
RESIZE_MODES: tuple[str, ...] = tuple(_core.RESIZE_MODES)  # center_crop, squash, max_side, shorter_side
SQUARE_RESIZE_MODES: tuple[str, ...] = tuple(_core.SQUARE_RESIZE_MODES)  # center_crop, squash
DEFAULT_RESIZE: str = _core.DEFAULT_RESIZE_MODE  # center_crop
# Records a loader serves at most: its `index` output is int32.
MAX_RECORDS = int(np.iinfo(np.int32).max)


def check_record_count(n: int, what: str) -> None:
    """ValueError naming `what` when `n` records are more than a loader serves (`MAX_RECORDS`)."""
    if n > MAX_RECORDS:
        raise ValueError(f"{what} holds {n} records; the loader's int32 `index` supports up to {MAX_RECORDS}")


def is_integer(v) -> bool:
    """A Python or NumPy integer, not a bool: the one home of the rule every argument check uses."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def is_real(v) -> bool:
    """A Python or NumPy integer or float, not a bool (NaN and infinities included: callers
    bound the value)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def record_numbers(indices, n: int, what: str = "a dataset") -> np.ndarray:
    """`rules/dataset.record_number` for an array: int64 indices in [0, n) (negative ones count
    from the end); IndexError naming `what` and the first index past either end."""
    idx = np.asarray(indices)
    idx = host_indices(idx, n) if idx.size else np.zeros(0, np.int64)  # [] is float64 to NumPy
    if not idx.size or (idx.min() >= 0 and idx.max() < n):  # the common case: two reductions, no copy
        return idx
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise IndexError(f"record {int(idx[bad][0])} out of range for {what} of {n} records")
    return np.where(idx < 0, idx + n, idx)


def check_served_labels(labels: np.ndarray, what: str) -> np.ndarray:
    """`labels` as int64, ValueError naming `what` when one does not fit the int32 ``label`` a
    loader serves (it would wrap)."""
    labels = np.asarray(labels, np.int64)
    info = np.iinfo(np.int32)
    if labels.size and (labels.min() < info.min or labels.max() > info.max):
        bad = labels[(labels < info.min) | (labels > info.max)][0]
        raise ValueError(
            f"{what} has label {int(bad)}, which does not fit the int32 'label' a loader "
            f"serves ([{info.min}, {info.max}])"
        )
    return labels


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype of an output dtype name (bfloat16 is ml_dtypes')."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def dtype_name(dtype, framework=None, prefix: str = "") -> str:
    """'uint8' | 'float32' | 'bfloat16' from a name, a NumPy / ml_dtypes / jax.numpy dtype, or
    (with `framework`, e.g. the torch or mlx.core module) that framework's dtype object;
    ValueError naming the accepted spellings otherwise."""
    if framework is not None and not isinstance(dtype, str):
        names = {getattr(framework, n): n for n in OUT_DTYPES}
        if dtype in names:
            return names[dtype]
        spelled = ", ".join(f"{prefix}.{n}" for n in OUT_DTYPES)
        raise ValueError(f"dtype must be one of {spelled} (or their names), got {dtype!r}")
    try:
        name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in OUT_DTYPES:
        raise ValueError(f"dtype must be one of {list(OUT_DTYPES)}, got {dtype!r}")
    return name


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def row_shape(layout: str, oh, ow) -> tuple:
    """One row of a batch in `layout`: (OH, OW, 3) in NHWC, (3, OH, OW) in NCHW; a batch is
    (B, *row_shape(...))."""
    return (oh, ow, 3) if check_layout(layout) == "NHWC" else (3, oh, ow)


def channel_axis(layout: str) -> int:
    """The axis of a batch (B, *row_shape) that holds the 3 channels: 3 in NHWC, 1 in NCHW."""
    return 1 + row_shape(layout, "OH", "OW").index(3)


def _three(value, name: str, default: float) -> list[float]:
    if value is None:
        return [float(default)] * 3
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of 3 numbers (one per RGB channel), got {value!r}")
    try:
        vals = [float(v) for v in value]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of 3 numbers (one per RGB channel), got {value!r}") from None
    if len(vals) != 3:
        raise ValueError(f"{name} must have 3 values (one per RGB channel), got {len(vals)}: {value!r}")
    return vals


def normalization(mean, std) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Per-channel ``mean`` and ``std`` as two triples (None: 0 and 1, i.e. ``x/255``). The rule,
    ``mean`` finite and ``std`` finite and > 0, is the C++ kernel's own check
    (`_core.check_normalization`), so every path refuses the same values with the same words."""
    m, s = _three(mean, "mean", 0.0), _three(std, "std", 1.0)
    _core.check_normalization(m, s)
    return tuple(m), tuple(s)


def crop_boxes(crop, batch: int) -> np.ndarray:
    """Concrete crop boxes → a C-contiguous int32 (batch, 4) array of (y0, x0, h, w), checked
    for dtype, shape and the int32 range (whether each box lies inside its record is the
    kernel's check, `_core.check_crops`)."""
    c = np.asarray(crop)
    if c.dtype.kind not in "iu":
        raise TypeError(f"crop must hold integers (y0, x0, h, w), got dtype {c.dtype}")
    if c.shape != (batch, 4):
        raise ValueError(f"crop must have shape ({batch}, 4) as (y0, x0, h, w) per sample, got {c.shape}")
    info = np.iinfo(np.int32)
    if c.size and (c.min() < info.min or c.max() > info.max):
        raise ValueError(f"crop values must fit in int32, got range [{c.min()}, {c.max()}]")
    return np.ascontiguousarray(c, dtype=np.int32)


def output_size(image_hw: tuple[int, int], out_hw, *, cropped: bool) -> tuple[int, int]:
    """The (OH, OW) a batch is written at: `out_hw` when given, else the records' own size.
    Only a crop-resize changes the size: without crop boxes the two must agree."""
    h, w = (int(v) for v in image_hw)
    if out_hw is None:
        return h, w
    try:
        oh, ow = (int(v) for v in out_hw)
    except (TypeError, ValueError):
        raise ValueError(f"out_size must be (height, width), got {out_hw!r}") from None
    if not (1 <= oh <= MAX_OUT_SIDE and 1 <= ow <= MAX_OUT_SIDE):
        raise ValueError(f"out_size sides must be in [1, {MAX_OUT_SIDE}], got {out_hw!r}")
    if not cropped and (oh, ow) != (h, w):
        raise ValueError(
            f"out_size={out_hw!r} differs from the records' {h}x{w}: resizing "
            "needs crop boxes (pass crop=[(0, 0, H, W)] * B for a plain resize)"
        )
    return oh, ow


def check_threads(threads) -> int:
    """The one threads rule of every entry point (convert, the loaders, verify, the kernels):
    None or 0 for the pool's default, else an integer in [1, MAX_THREADS] (the bound keeps a
    typo from starting a million threads). Returns the count the core takes (0: default)."""
    if threads is None:
        return 0
    if not is_integer(threads) or not 0 <= threads <= MAX_THREADS:
        raise ArgumentError(
            Arg("threads"),
            f" must be None or 0 (the pool's default) or an integer in [1, {MAX_THREADS}], got {threads!r}",
        )
    return int(threads)


def check_index_array(dtype, shape) -> None:
    """Indices are a 1-D (B,) integer array (host or traced; their range is checked against
    the records by the kernel, `_core.check_indices`)."""
    if np.dtype(dtype).kind not in "iu":
        raise TypeError(f"indices must be integers, got dtype {dtype}")
    if len(shape) != 1:
        raise ValueError(f"indices must be 1-D (B,), got shape {tuple(shape)}")


def host_indices(indices, num_records: int) -> np.ndarray:
    """Concrete indices → a C-contiguous int64 (B,) array, checked by `check_index_array`; a
    uint64 index past int64 is out of range for any source (IndexError)."""
    idx = np.asarray(indices)
    check_index_array(idx.dtype, idx.shape)
    if idx.dtype == np.uint64 and idx.size and idx.max() > np.iinfo(np.int64).max:
        raise IndexError(
            f"indices holds {idx.max()}, out of range for a source of "
            f"{num_records} records (allowed 0..{num_records - 1})"
        )
    return np.ascontiguousarray(idx, dtype=np.int64)


def check_flip(dtype, shape, batch: int) -> None:
    """Flips are (batch,) booleans (or integers, nonzero = flip)."""
    if np.dtype(dtype).kind not in "biu":
        raise TypeError(f"flip must hold booleans, got dtype {dtype}")
    if tuple(shape) != (batch,):
        raise ValueError(f"flip must have shape ({batch},), got {tuple(shape)}")


def check_unnormalized(dtype: str, mean, std) -> None:
    """uint8 output (``dtype`` a name of OUT_DTYPES) takes no mean and std."""
    if dtype == "uint8" and (mean is not None or std is not None):
        raise ValueError(
            "uint8 output is not normalized: mean and std must be None "
            "(normalize on device, or ask for float32 / bfloat16 output)"
        )

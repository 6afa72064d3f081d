"""Decoded reads of a TBL file's records: one record's pixels by its format and its file's
recipe (`read_record`), and a batch of records decoded into an array, JPEGs in parallel in the
C++ pool (`check_batch`, `read_batch`). `Dataset.read` and `Dataset.read_into` (`datasets/reader.py`)
call them with the dataset's files; a file's recipe is asked for only when a JPEG needs it, so
reading RAW records never parses the metadata block."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tbljax import _core
from tbljax._src.file.format import FORMAT_NAMES, FORMATS, INDEX_DTYPE, is_compact
from tbljax._src.rules.contract import DEFAULT_RESIZE

__all__ = ["check_batch", "read_batch", "read_record"]


def read_record(f: Any, j: int, recipe: Callable[[], dict[str, Any]]) -> np.ndarray:
    """Decoded pixels of record j of the open file `f` (a `_core.TblFile`) as (H, W, 3) uint8;
    `recipe()` gives the file's recipe. The rules are `Dataset.read`'s."""
    f.check_unchanged()
    e = f.index_bytes()[j].view(INDEX_DTYPE)[0]
    fmt = int(e["format"])
    if fmt == FORMATS["RAW_U8"]:
        if f.uniform_raw:
            return f.raw_view()[j]
        data = f.read_payload(j)
        f.check_unchanged()
        return np.frombuffer(data, np.uint8).reshape(int(e["height"]), int(e["width"]), 3)
    if fmt == FORMATS["JPEG"]:
        data = f.read_payload(j)
        f.check_unchanged()
        rec = recipe()
        img = _decode_encoded(f, rec, data, j)
        resized = is_compact(rec)  # compact records
        if resized and img.shape[:2] != (int(e["height"]), int(e["width"])):
            raise _core.CorruptFileError(
                f"{f.path}: record {j}: the JPEG is {img.shape[1]}x{img.shape[0]}, "
                f"the index says {int(e['width'])}x{int(e['height'])}"
            )
        return img
    raise NotImplementedError(
        f"{f.path}: record {j} has format {FORMAT_NAMES.get(fmt, fmt)}, "
        "which tbljax does not decode (RAW_U8 and JPEG are served)"
    )


def _decode_encoded(f: Any, recipe: dict[str, Any], data: bytes, j: int) -> np.ndarray:
    size, mode = recipe.get("image_size"), recipe.get("resize", DEFAULT_RESIZE)
    try:
        if size and not is_compact(recipe):
            return _core.decode_resize(data, int(size), mode)
        return _core.decode_jpeg(data)
    except _core.DecodeError as e:
        raise _core.DecodeError(f"{f.path}: record {j}: {e}") from None


def check_batch(indices: Any, out: Any) -> np.ndarray:
    """`read_into`'s arguments checked: the indices as int64, `out` a writable uint8
    (B, H, W, 3) array with a row for each."""
    indices = np.asarray(indices)
    if indices.dtype.kind not in "iu" or indices.ndim != 1:
        raise TypeError(f"indices must be a 1-D array of integers, got {indices.dtype} of shape {indices.shape}")
    indices = indices.astype(np.int64)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != np.uint8 or out.ndim != 4 or out.shape[0] != len(indices) or out.shape[3] != 3:
        raise ValueError(f"out must be uint8 (B, H, W, 3) with B={len(indices)}, got {out.dtype} {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    return indices


def read_batch(
    files: Sequence[Any],
    locate: Callable[[int], tuple[int, int]],
    read: Callable[[int], np.ndarray],
    recipe: Callable[[], dict[str, Any]],
    indices: np.ndarray,
    out: np.ndarray,
    threads: int,
) -> None:
    """Decodes records `indices` (checked by `check_batch`) into `out`: `locate(i)` gives
    (file number in `files`, record in that file), `read(i)` a record that is not a JPEG, and
    `recipe()` the dataset's recipe, whose resize mode the JPEGs are decoded with, in parallel."""
    jpeg_rows, payloads = [], []
    for row, i in enumerate(indices.tolist()):
        k, j = locate(i)
        f = files[k]
        e = f.index_bytes()[j].view(INDEX_DTYPE)[0]
        if int(e["format"]) == FORMATS["JPEG"]:
            jpeg_rows.append(row)
            payloads.append(f.read_payload(j))
        else:
            img = read(i)
            if img.shape != out.shape[1:]:
                raise ValueError(f"{f.path}: record {j} is {img.shape}, batch rows are {out.shape[1:]}")
            out[row] = img
    if payloads:
        mode = recipe().get("resize", DEFAULT_RESIZE)
        if out.shape[1] != out.shape[2]:
            raise ValueError(f"JPEG records decode to square images; out rows are {out.shape[1:3]}")
        tmp = out if len(jpeg_rows) == len(indices) else np.empty((len(payloads),) + out.shape[1:], np.uint8)
        errors = _core.decode_resize_into(payloads, tmp, mode, threads)
        for row, err in zip(jpeg_rows, errors):
            if err is not None:
                k, j = locate(int(indices[row]))
                raise _core.DecodeError(f"{files[k].path}: record {j}: {err}")
        if tmp is not out:
            out[jpeg_rows] = tmp

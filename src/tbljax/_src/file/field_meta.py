"""A field's metadata as a file holds it: checked against what `ColumnWriter.write` gives, a
geometric field's role included (`check_field_meta`; the JSON comes from the file, so anything
else is a `CorruptFileError` naming the field), and read as a `FieldInfo` (`info_of`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from tbljax import _core
from tbljax._src.file.fields import ENCODINGS, GEOMETRIC_ROLES, check_name
from tbljax._src.rules import contract
from tbljax._src.rules.dataset import FIELD_KINDS, FieldInfo
from tbljax._src.rules.errors import shown
from tbljax._src.rules.geometry import INTERPOLATIONS

__all__ = ["check_field_meta", "info_of"]


def info_of(meta: dict[str, Any]) -> FieldInfo:
    dtype = np.dtype(meta["dtype"]) if meta.get("dtype") else None
    return FieldInfo(meta["kind"], dtype, tuple(meta["shape"]), dict(meta["role"]) if "role" in meta else None)


def check_field_meta(name: Any, meta: Any, path: str) -> None:
    """CorruptFileError naming the field when its metadata is not what `ColumnWriter.write`
    gives (the JSON comes from the file)."""

    def bad(want: str) -> None:
        raise _core.CorruptFileError(
            f"{path}: field {name!r} metadata must be {want}, got {shown(json.dumps(meta), 120)}"
        )

    try:
        check_name(name)
    except ValueError as e:  # a name the batch or the record already uses would replace it
        raise _core.CorruptFileError(f"{path}: {e}") from None
    if not isinstance(meta, dict) or meta.get("kind") not in FIELD_KINDS:
        bad(f"an object whose kind is one of {list(FIELD_KINDS)}")
    shape = meta.get("shape")
    if (
        not isinstance(shape, list)
        or not all(s is None or (contract.is_integer(s) and 0 <= s < 1 << 40) for s in shape)
        or None in shape[1:]
        or len(shape) > 32
    ):
        bad("an object whose shape is a list of at most 32 sizes below 2**40 (None only first)")
    if meta["kind"] == "ndarray":
        dt = None
        if isinstance(meta.get("dtype"), str):
            try:
                dt = np.dtype(meta["dtype"])
            except TypeError:
                pass
        if dt is None or dt.kind not in "biuf" or dt.itemsize > 8:
            bad("an object whose dtype is a numeric NumPy dtype string (bool, int, uint, float)")
        row = [s for s in shape if s is not None]
        if np.prod(row, dtype=np.float64) * dt.itemsize >= 1 << 62:  # sizes multiply past int64
            bad("an object whose shape holds fewer than 2**62 bytes")
    elif shape or meta.get("dtype") is not None:
        bad("an object whose str/json field has dtype null and shape []")
    blocks = ["values"] + ([] if meta["kind"] == "ndarray" and shape[:1] != [None] else ["offsets"])
    if "encoding" in meta:  # compress= (fields.py): a reader must know it or refuse the field
        if meta["encoding"] not in ENCODINGS:
            raise _core.CorruptFileError(
                f"{path}: field {name!r} is stored with encoding {shown(json.dumps(meta['encoding']), 40)}, "
                f"which this tbljax does not read (it reads {list(ENCODINGS)}): written by a newer tbljax?"
            )
        if meta["kind"] != "ndarray":
            bad("an ndarray field when it has an encoding")
        blocks.append("blocks")
    for b in blocks:
        blk = meta.get(b)
        if not (
            isinstance(blk, dict)
            and all(isinstance(blk.get(k), int) and blk[k] >= 0 for k in ("offset", "bytes", "crc32"))
        ):
            bad(f"an object whose {b!r} is {{'offset', 'bytes', 'crc32'}} integers")
    if "role" in meta:
        _check_role(meta, bad)


def _check_role(meta: dict[str, Any], bad: Any) -> None:
    """A geometric field's role (`Mask.role()` and the others, or the boxes' labels) agrees
    with its kind, dtype and shape."""
    role, shape = meta["role"], meta["shape"]
    name = role.get("role") if isinstance(role, dict) else None
    if name not in (*GEOMETRIC_ROLES, "box_labels") or meta["kind"] != "ndarray":
        bad(f"an ndarray field whose role is one of {[*GEOMETRIC_ROLES, 'box_labels']}")
    perm = role.get("flip_permutation")
    ok = {
        "mask": lambda: (
            contract.is_integer(role.get("ignore")) and np.dtype(meta["dtype"]).kind in "biu" and len(shape) in (1, 2)
        ),
        "dense": lambda: role.get("interpolation") in INTERPOLATIONS and len(shape) in (1, 2, 3),
        "boxes": lambda: (
            role.get("format") == "xyxy"
            and shape[1:] == [4]
            and (role.get("labels") is None or isinstance(role.get("labels"), str))
        ),
        "keypoints": lambda: (
            isinstance(perm, list) and sorted(perm) == list(range(len(perm))) and shape[1:] == [len(perm), 3]
        ),
        "box_labels": lambda: isinstance(role.get("of"), str) and len(shape) == 1,
    }[name]
    if not ok():
        bad(f"a {name} field as a conversion writes it (see docs/reference.md, 'Geometric fields')")

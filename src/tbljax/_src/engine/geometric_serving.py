"""Geometric fields served through the image's geometry (issue 48): each step's crop boxes and
flips, the ones the kernel resizes the image with, applied to every mask and dense map (the
nearest rule, in C++: `_core.serve_nearest`; a linear dense map: `_core.serve_linear`), to
boxes (C++ too, `_core.serve_boxes`) and to keypoints (NumPy); `rules/geometry.py` states every
rule and is the reference the C++ is held to.

Batch keys: a mask or dense field `name` → (rows, out_h, out_w[, C]) of its stored dtype,
`ignore` / `invalid` (0 when None) on padding rows; a boxes field `name` → (rows, max_boxes, 4)
float32 xyxy in output pixels, ``name + "_valid"`` (rows, max_boxes) bool, ``name + "_count"``
(rows,) int32 (the record's boxes before any cut) and its labels field (rows, max_boxes) int32
(-1 past the kept boxes); a keypoints field → (rows, max_boxes, K, 3) float32 (x, y, visibility).
"""

from __future__ import annotations

import numpy as np

from tbljax import _core
from tbljax._src.rules import geometry
from tbljax._src.rules.dataset import FieldInfo
from tbljax._src.rules.options import LoaderOptions

__all__ = ["GEOMETRIC", "GeometricServing", "check_options", "geometric_names"]

GEOMETRIC = ("mask", "dense", "boxes", "keypoints")


def geometric_names(infos: dict[str, FieldInfo], names) -> list[str]:
    """The fields among `names` that follow the image: a geometric role, or the labels of a
    boxes field among them (carried with its boxes)."""
    names = list(names)
    out = []
    for n in names:
        role = infos[n].role or {}
        if role.get("role") in GEOMETRIC or (role.get("role") == "box_labels" and role.get("of") in names):
            out.append(n)
    return out


def check_options(names: list[str], opts: LoaderOptions) -> None:
    """Refuses, by name, the options geometric fields `names` are not served with."""
    if names and opts.augment is not None and opts.augment.ops:
        raise ValueError(
            f"geometric fields {names} with Augment(ops=...): RandAugment's ops move the pixels "
            "without the mask or boxes; leave the fields out with fields= or the ops out of augment="
        )


def _role(info: FieldInfo) -> dict:
    return info.role or {}


class GeometricServing:
    """The geometric fields `names` of `dataset` one loader serves, checked at construction:
    what the loader does not serve is refused by name."""

    def __init__(self, dataset, names: list[str], opts: LoaderOptions, threads: int = 0):
        infos = dataset.fields
        self.dataset, self.opts, self.threads = dataset, opts, threads
        self.infos = {n: infos[n] for n in names}
        self.maps = [n for n in names if _role(infos[n]).get("role") in ("mask", "dense")]
        self.labels = {n: _role(infos[n])["of"] for n in names if _role(infos[n]).get("role") == "box_labels"}
        self.boxes = [n for n in names if _role(infos[n]).get("role") == "boxes"]
        self.keypoints = [n for n in names if _role(infos[n]).get("role") == "keypoints"]
        self.names = list(names)
        check_options(self.names, opts)

    def __bool__(self) -> bool:
        return bool(self.names)

    def fill_value(self, name: str):
        role = _role(self.infos[name])
        v = role.get("ignore") if role.get("role") == "mask" else role.get("invalid")
        return 0 if v is None else v

    def build(self, geometry, records, drawn, rows: list[int], out_hw: tuple[int, int]) -> dict[str, tuple]:
        """One step's geometric fields per row range: `records[r]` the valid records of range
        r (of `rows[r]` rows), `drawn[r]` its `RowsDrawn` (crop boxes and flips), `geometry`
        the source's `RecordGeometry`, out_hw the image rows' size. Canvas rows (`d.extents`,
        `engine/canvas.py`): each row's fields go to its extent at the top-left, maps padded
        with their fill value, boxes clipped to the extent, keypoints outside it invisible."""
        out: dict[str, list] = {}
        for recs, d, nrows in zip(records, drawn, rows):
            hw = _record_hw(geometry, recs)
            for n in self.maps:
                if d.extents is None:
                    m = self._map(n, recs, hw, d.boxes, d.flips, nrows, out_hw)
                else:
                    m = self._canvas_map(n, recs, hw, d.boxes, d.flips, d.extents, nrows, out_hw)
                out.setdefault(n, []).append(m)
            crops = _crops_of(d.boxes, hw)
            row_hw = out_hw if d.extents is None else d.extents
            for n in self.boxes:
                for k, v in self._boxes(n, recs, crops, d.flips, nrows, row_hw).items():
                    out.setdefault(k, []).append(v)
            for n in self.keypoints:
                for k, v in self._keypoints(n, recs, crops, d.flips, nrows, row_hw).items():
                    out.setdefault(k, []).append(v)
        return {n: tuple(v) for n, v in out.items()}

    def _map(self, name, recs, hw, crops, flips, nrows, out_hw) -> np.ndarray:
        info = self.infos[name]
        square = not _role(info).get("flat")
        trail = info.shape[2:] if square else info.shape[1:]
        out = np.empty((nrows, *out_hw, *trail), info.dtype)
        k = len(recs)
        out[k:] = self.fill_value(name)  # padding rows: no source pixel
        if not k:
            return out
        vals = self.dataset.field_rows(name, recs)
        per = int(np.prod(trail, dtype=np.int64))
        sizes = np.array([np.size(v) for v in vals], np.int64)
        want = hw[:, 0].astype(np.int64) * hw[:, 1] * per
        if (sizes != want).any():
            j = int(np.argmax(sizes != want))
            raise ValueError(
                f"{self.dataset!r}: record {int(recs[j])}: field {name!r} holds {sizes[j]} values where its "
                f"{hw[j, 0]}x{hw[j, 1]} image needs {want[j]}"
            )
        role = _role(info)
        if role.get("interpolation") == "linear" and info.dtype != np.float32:
            out[:k] = _linear(vals, hw, trail, crops, flips, out_hw, role.get("invalid"))
            return out
        args = (
            [np.ascontiguousarray(v) for v in vals],
            np.ascontiguousarray(hw[:, 0]),
            np.ascontiguousarray(hw[:, 1]),
            None if crops is None else np.ascontiguousarray(crops, np.int32),
            None if flips is None else np.ascontiguousarray(flips, np.uint8),
            out[:k],
        )
        if role.get("interpolation") == "linear":  # float32 (as conversion stores it): in C++
            invalid = role.get("invalid")
            _core.serve_linear(*args, None if invalid is None else float(invalid), self.threads)
        else:
            _core.serve_nearest(*args, self.threads)
        return out

    def _canvas_map(self, name, recs, hw, crops, flips, extents, nrows, out_hw) -> np.ndarray:
        """`_map` onto each row's extent (rows of one extent at a time), at the top-left of
        rows of the fill value."""
        info = self.infos[name]
        trail = info.shape[2:] if not _role(info).get("flat") else info.shape[1:]
        out = np.full((nrows, *out_hw, *trail), self.fill_value(name), info.dtype)
        keys, group = np.unique(np.asarray(extents), axis=0, return_inverse=True)
        group = group.reshape(-1)
        for g, (h, w) in enumerate(keys.tolist()):
            m = np.flatnonzero(group == g)
            part = self._map(name, recs[m], hw[m], crops[m], None if flips is None else flips[m], len(m), (h, w))
            out[m, :h, :w] = part
        return out

    def _ragged(self, name, recs, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
        """Records' values of a ragged field zero-padded to the longest: (k, n, ...), counts. A
        fixed field (every record the same count) is read as one array, no per-record copy."""
        info = self.infos[name]
        if info.fixed:
            vals = np.asarray(self.dataset.field_rows(name, recs), dtype)
            return vals, np.full(len(vals), info.shape[0], np.int64)
        vals = self.dataset.field_rows(name, recs)
        counts = np.array([len(v) for v in vals], np.int64)
        pad = np.zeros((len(vals), int(counts.max(initial=0)), *info.shape[1:]), dtype)
        for r, v in enumerate(vals):
            pad[r, : len(v)] = v
        return pad, counts

    def _boxes(self, name, recs, crops, flips, nrows, out_hw) -> dict[str, np.ndarray]:
        """`geometry.serve_boxes_batch`'s rule (the reference) in one C++ pass over the rows'
        boxes (`_core.serve_boxes`, the same float64 arithmetic): the NumPy rule cost a tenth
        of the image kernel per batch."""
        o, k = self.opts, len(recs)
        xyxy, counts = self._ragged(name, recs)
        lab_name = _role(self.infos[name]).get("labels")
        lab_name = lab_name if lab_name in self.labels else None
        labels = self._ragged(lab_name, recs, np.int64)[0] if lab_name else None
        m = o.max_boxes
        boxes, valid = np.zeros((nrows, m, 4), np.float32), np.zeros((nrows, m), bool)
        lab = np.full((nrows, m), -1, np.int32)
        sides = np.empty((k, 2), np.float64)
        sides[:] = out_hw  # one (h, w) for every row, or each canvas row's extent
        count = np.zeros(nrows, np.int32)
        count[:k] = counts
        _core.serve_boxes(
            xyxy,
            counts,
            labels,
            crops.astype(np.float64),
            sides,
            None if flips is None else np.ascontiguousarray(flips, np.uint8),
            o.min_size,
            o.min_area,
            o.min_visibility,
            boxes[:k],
            valid[:k],
            lab[:k],
        )
        res = {name: boxes, name + "_valid": valid, name + "_count": count}
        if lab_name:
            res[lab_name] = lab
        return res

    def _keypoints(self, name, recs, crops, flips, nrows, out_hw) -> dict[str, np.ndarray]:
        perm = _role(self.infos[name])["flip_permutation"]
        kpts, counts = self._ragged(name, recs)
        served = geometry.serve_keypoints_batch(kpts, crops, out_hw, flips, perm)
        served[np.arange(served.shape[1]) >= counts[:, None]] = 0  # past a record's instances
        m = self.opts.max_boxes
        out = np.zeros((nrows, m, len(perm), 3), np.float32)
        out[: len(served), : min(served.shape[1], m)] = served[:, :m]
        return {name: out, name + "_count": _rows(counts.astype(np.int32), nrows, 0)}


def _linear(vals, hw, trail, crops, flips, out_hw, invalid) -> np.ndarray:
    """Dense maps declared interpolation="linear" but not float32 (the C++ path's dtype), row
    by row (each record its own size): `geometry.serve_linear_batch`, the reference."""
    crops = _crops_of(crops, hw)
    rows = []
    for r, v in enumerate(vals):
        a = np.asarray(v).reshape(int(hw[r, 0]), int(hw[r, 1]), *trail)
        flip = None if flips is None else flips[r : r + 1]
        rows.append(
            geometry.serve_linear_batch(lambda ys, xs, a=a: a[ys, xs], crops[r : r + 1], out_hw, flip, invalid)[0]
        )
    return np.stack(rows)


def _rows(a: np.ndarray, nrows: int, fill) -> np.ndarray:
    """`a`'s rows followed by padding rows of `fill`, nrows in all."""
    out = np.full((nrows, *a.shape[1:]), fill, a.dtype)
    out[: len(a)] = a
    return out


def _crops_of(crops, hw: np.ndarray) -> np.ndarray:
    """(k, 4) crop boxes: the drawn ones, or each record whole when the step crops nothing."""
    if crops is not None:
        return np.asarray(crops, np.int64)
    return np.concatenate([np.zeros_like(hw, np.int64), hw.astype(np.int64)], axis=1)


def _record_hw(geometry, recs) -> np.ndarray:
    """(len(recs), 2) int32: each record's stored (height, width)."""
    recs = np.asarray(recs, np.int64)
    h, w = geometry.heights, geometry.widths
    if len(h) == 1:
        return np.tile(np.array([[h[0], w[0]]], np.int32), (len(recs), 1))
    return np.stack([h[recs], w[recs]], axis=1).astype(np.int32)

"""Geometric fields at conversion (issue 48): a mask, dense map, boxes or keypoints read with
their photo is checked against it (a mask the photo's size, boxes inside it, the declared
keypoint count) and stored at the record's geometry: the same `rules/geometry.resize_plan`
the image was resized with, masks by the nearest rule, boxes and keypoints as coordinates.
A record whose field fails is skipped, the reason naming the field."""

from __future__ import annotations

from typing import Any

import numpy as np

from tbljax._src.file.fields import Boxes, DenseMap, Mask
from tbljax._src.rules import geometry
from tbljax._src.rules.contract import SQUARE_RESIZE_MODES

__all__ = ["GeometricFields"]


class GeometricFields:
    """The geometric fields of one conversion: `kinds` and `roles` for the columns (a Boxes'
    labels field included), `apply` for each record."""

    def __init__(self, specs: dict[str, Any], size: int, mode: str, max_long: int):
        self.specs, self.size, self.mode, self.max_long = dict(specs), size, mode, max_long
        # A square mode gives every record S x S: masks are (S, S) rows; else flat (H * W,),
        # reshaped by the record's own image shape.
        self.flat = mode not in SQUARE_RESIZE_MODES
        self.roles: dict[str, dict[str, Any]] = {}
        self.kinds: dict[str, str] = {}
        # A map field's storage (Columns' encodings): compress="lz4" or raw.
        self.encodings = {n: s.compress for n, s in self.specs.items() if getattr(s, "compress", None)}
        for name, spec in self.specs.items():
            self.roles[name] = {
                **spec.role(),
                **({"flat": True} if self.flat and isinstance(spec, (Mask, DenseMap)) else {}),
            }
            if not isinstance(spec, Boxes):  # whatever holds it (.png, .npy bytes, an array)
                self.kinds[name] = "ndarray"
            if isinstance(spec, Boxes) and spec.labels:
                self.kinds[spec.labels] = "ndarray"
                self.roles[spec.labels] = {"role": "box_labels", "of": name}

    def apply(
        self, values: dict[str, Any], src_hw: tuple[int, int], out_hw: tuple[int, int], orientation: int = 1
    ) -> dict[str, Any] | str:
        """`values` with each geometric field at the record's geometry, or why one fails;
        src_hw is the photo as displayed (EXIF `orientation` applied)."""
        plan = geometry.resize_plan(*src_hw, self.size, self.mode, self.max_long)
        if (plan.out_h, plan.out_w) != tuple(out_hw):  # the plan is the core's; a mismatch is ours
            raise AssertionError(f"resize plan {plan} disagrees with the record's {out_hw}")
        out = dict(values)
        for name, spec in self.specs.items():
            try:
                out.update(self._one(name, spec, values[name], src_hw, plan))
            except ValueError as e:
                shape = values[name].shape[:2] if isinstance(values[name], np.ndarray) else None
                stored = (
                    f" (the photo's stored frame: its EXIF orientation {orientation} turns it; fields are "
                    "read in the displayed frame)"
                    if orientation >= 5 and shape == src_hw[::-1]
                    else ""
                )
                return f"field {name!r}: {e}{stored}"
        return out

    def _one(self, name: str, spec: Any, v: Any, src_hw: tuple[int, int], plan: geometry.ResizePlan) -> dict[str, Any]:
        h, w = src_hw
        if isinstance(spec, (Mask, DenseMap)):
            a = np.asarray(v)
            if a.shape[:2] != (h, w) or a.ndim > (2 if isinstance(spec, Mask) else 3):
                raise ValueError(f"{'x'.join(map(str, a.shape))} where the image is {h}x{w}")
            if isinstance(spec, Mask):
                if a.dtype.kind not in "biu":
                    raise ValueError(f"a mask holds integer labels, got {a.dtype}")
                r = geometry.resize_nearest(a, plan.int_box, (plan.out_h, plan.out_w))
            else:
                r = geometry.resize_dense(a, plan, spec.interpolation, spec.invalid)
            r = np.ascontiguousarray(r)
            return {name: r.reshape(-1, *r.shape[2:]) if self.flat else r}
        if isinstance(spec, Boxes):
            boxes, labels = (v.get("boxes"), v.get("labels")) if isinstance(v, dict) else (v, None)
            try:
                b = np.asarray(boxes if boxes is not None else [], np.float64).reshape(-1, 4)
            except (TypeError, ValueError):
                raise ValueError(f"boxes must be (n, 4) numbers in {spec.format}, got {str(boxes)[:60]}") from None
            xyxy = geometry.boxes_to_xyxy(b, spec.format)
            if spec.normalized:  # fractions of the photo's width and height (TFDS)
                xyxy = xyxy * np.array([w, h, w, h], np.float64)
            out_of = ~(
                (xyxy[:, 0] >= 0)
                & (xyxy[:, 1] >= 0)
                & (xyxy[:, 2] <= w)
                & (xyxy[:, 3] <= h)
                & (xyxy[:, 0] <= xyxy[:, 2])
                & (xyxy[:, 1] <= xyxy[:, 3])
            )
            if out_of.any():
                k = int(np.argmax(out_of))
                raise ValueError(f"box {k} {xyxy[k].tolist()} (xyxy) is not inside the {h}x{w} image")
            stored, keep = geometry.stored_boxes(xyxy, plan)
            got = {name: stored.astype(np.float32)}
            if spec.labels:
                lab = np.asarray(labels if labels is not None else [], np.float64).reshape(-1)
                if lab.size != len(b) or (lab != np.round(lab)).any():
                    raise ValueError(
                        f"{len(b)} boxes need as many integer labels ({{'boxes': ..., 'labels': ...}}), "
                        f"got {str(labels)[:60]}"
                    )
                got[spec.labels] = lab[keep].astype(np.int64)
            return got
        k = np.asarray(v, np.float64)
        want = len(spec.flip_permutation)
        if k.ndim == 2:
            k = k[None]
        if k.ndim != 3 or k.shape[1] != want or k.shape[2] not in (2, 3):
            raise ValueError(f"keypoints of shape {np.shape(v)} where {want} points (K, 2|3) are declared")
        if k.shape[2] == 2:
            k = np.concatenate([k, np.full(k.shape[:2] + (1,), 2.0)], axis=2)  # given: visible
        return {name: geometry.stored_keypoints(k, plan)}

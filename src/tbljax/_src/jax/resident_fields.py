"""Geometric fields in a resident dataset (issue 48): masks, dense maps, boxes and keypoints
held as device arrays and taken through each step's crop, flip and output size inside
`jax.jit`, by the rules `rules/geometry.py` states once (its functions run here under
jax.numpy): bytes equal to what `tbljax.loader` serves (`engine/geometric_serving.py`) for
the same steps. Boxes and keypoints are float64 arithmetic there, so they are computed inside
``jax.enable_x64`` and cast back to 32 bits.

Held: a mask or dense map as (N, H·W, *C) of its stored dtype (records of one size) or its
records' values one after another (T, *C) with each record's first offset (records of
different sizes); boxes as (N, n, 4) float32 zero-padded to the most boxes of a record, with
their counts and labels; keypoints as (N, n, K, 3) float32 with their counts.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from tbljax._src.engine.geometric_serving import GeometricServing, check_options
from tbljax._src.jax import sharding as _sharding
from tbljax._src.rules import geometry
from tbljax._src.rules.options import LoaderOptions

__all__ = ["GeometricColumns", "Held", "hold", "output_keys", "owned_rows", "serve"]

_INT32_MAX = np.iinfo(np.int32).max


class _Spec(NamedTuple):
    """What one geometric field is (static: part of the pytree's aux data)."""

    name: str
    role: str  # mask, dense, boxes, keypoints
    fill: object = 0  # a map's padding value (unused in jit: no padding rows)
    linear: bool = False  # a dense map declared interpolation="linear"
    invalid: object = None
    labels: str | None = None  # a boxes field's labels field, when served
    perm: tuple = ()  # a keypoints field's flip_permutation


class GeometricColumns:
    """The host columns of the geometric fields `names` of `ds` (`geometric_names`: a boxes
    field's labels ride with it) and their static specs; refuses what `batch` does not serve."""

    def __init__(self, ds, names: list[str]):
        self.specs: tuple[_Spec, ...] = ()
        self.columns: dict[str, np.ndarray] = {}
        if not names:
            return
        # The host loader's view of the fields (Augment(ops=) is refused per batch: check_options).
        serving = GeometricServing(ds, names, LoaderOptions(batch_size=1))
        geo = ds.geometry
        uniform = len(geo.heights) == 1
        n = len(ds)
        hw = np.stack([np.broadcast_to(geo.heights, (n,)), np.broadcast_to(geo.widths, (n,))], 1).astype(np.int64)
        specs = []
        for name in serving.maps:
            info = serving.infos[name]
            role = info.role
            trail = info.shape[1:] if role.get("flat") else info.shape[2:]
            vals = ds.field_rows(name, np.arange(n, dtype=np.int64))
            sizes = np.array([np.size(v) for v in vals], np.int64)
            want = hw[:, 0] * hw[:, 1] * int(np.prod(trail, dtype=np.int64))
            if (sizes != want).any():
                j = int(np.argmax(sizes != want))
                raise ValueError(
                    f"{ds!r}: record {j}: field {name!r} holds {sizes[j]} values where its "
                    f"{hw[j, 0]}x{hw[j, 1]} image needs {want[j]}"
                )
            if uniform:
                self.columns[name] = np.ascontiguousarray(np.asarray(vals).reshape(n, -1, *trail))
            else:
                flat = np.concatenate([np.asarray(v).reshape(-1, *trail) for v in vals])
                if len(flat) > _INT32_MAX:
                    raise ValueError(
                        f"ResidentDataset: field {name!r} holds {len(flat)} pixels over records of different "
                        "sizes, more than a 32-bit index reaches; serve it with tbljax.loader, or leave it out "
                        "with fields="
                    )
                self.columns[name] = flat
                self.columns[name + "_offset"] = np.concatenate([[0], np.cumsum(hw[:-1, 0] * hw[:-1, 1])]).astype(
                    np.int32
                )
            linear = role.get("role") == "dense" and role.get("interpolation") == "linear"
            specs.append(_Spec(name, role["role"], serving.fill_value(name), linear, role.get("invalid")))
        for name in serving.boxes:
            lab = serving.infos[name].role.get("labels")
            lab = lab if lab in serving.labels else None
            self.columns[name], self.columns[name + "_count"] = _padded(ds, name, np.float32)
            if lab:
                self.columns[lab] = _padded(ds, lab, np.int32)[0]
            specs.append(_Spec(name, "boxes", labels=lab))
        for name in serving.keypoints:
            self.columns[name], self.columns[name + "_count"] = _padded(ds, name, np.float32)
            specs.append(_Spec(name, "keypoints", perm=tuple(serving.infos[name].role["flip_permutation"])))
        self.specs = tuple(specs)


def _padded(ds, name: str, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A ragged field's records zero-padded to the longest (at least 1 row), and their counts."""
    n = len(ds)
    idx = np.arange(n, dtype=np.int64)
    counts = np.array([len(v) for v in ds.field_rows(name, idx)], np.int32)
    col = np.zeros((n, max(1, int(counts.max(initial=0))), *ds.fields[name].shape[1:]), dtype)
    ds.field_padded(name, idx, col.shape[1], col, np.zeros(n, np.int32))
    return col, counts


@jax.tree_util.register_pytree_node_class
class Held:
    """The geometric fields a resident dataset holds: `specs` (static) and `arrays` ({name:
    device array}, the pytree's leaves)."""

    def __init__(self, specs: tuple, arrays: dict):
        self.specs, self.arrays = specs, arrays

    def tree_flatten(self):
        return (self.arrays,), self.specs

    @classmethod
    def tree_unflatten(cls, specs, children):
        return cls(specs, children[0])


def hold(ds, names: list[str], sharding) -> Held:
    """The geometric fields `names` of `ds` as device arrays, whole on every device of
    `sharding`'s mesh; refused by name when `sharding` partitions the records."""
    if names and _sharding.parts(sharding) != 1:
        raise ValueError(
            f"ResidentDataset: the geometric fields {names} are held whole on every device: "
            f"sharding {sharding} partitions the records (leave them out with fields=)"
        )
    geo = GeometricColumns(ds, names)
    rep = NamedSharding(sharding.mesh, PartitionSpec())
    return Held(geo.specs, {n: jax.device_put(v, rep) for n, v in geo.columns.items()})


def output_keys(held: Held) -> list[str]:
    """The batch keys `serve` returns for `held`."""
    keys = []
    for s in held.specs:
        keys.append(s.name)
        if s.role == "boxes":
            keys += [s.name + "_valid", s.name + "_count"] + ([s.labels] if s.labels else [])
        elif s.role == "keypoints":
            keys.append(s.name + "_count")
    return keys


def serve(held: Held, idx, crops, flips, out_hw, opts, record_geometry) -> dict:
    """One step's geometric fields `held` inside jit: records `idx` (B,) through `crops` (B, 4)
    (y0, x0, h, w; None: each record whole) and `flips` (B,) (None: none) onto out_hw;
    `record_geometry` the records' `RecordGeometry`. Keys and dtypes as `tbljax.loader` serves them;
    the options they are not served with refused by name."""
    specs, cols = held.specs, held.arrays
    if not specs:
        return {}
    check_options([s.name for s in specs], opts)
    sides = (record_geometry.heights, record_geometry.widths)  # one size: each of length 1
    h, w = (jnp.asarray(v)[idx % len(v)] for v in sides)
    record_hw = jnp.stack([h, w], axis=1)
    if crops is None:
        crops = jnp.concatenate([jnp.zeros_like(record_hw), record_hw], axis=1)
    crops = crops.astype(jnp.int32)
    out = {}
    for s in specs:
        if s.role in ("mask", "dense"):
            take = _taker(cols, s.name, idx, record_hw[:, 1])
            if s.linear:
                with jax.enable_x64(True):
                    out[s.name] = geometry.serve_linear_batch(take, crops, out_hw, flips, s.invalid, xp=jnp)
                continue
            rows = geometry.nearest_rows(crops[:, 0], crops[:, 2], out_hw[0], xp=jnp)
            cols_ = geometry.nearest_rows(crops[:, 1], crops[:, 3], out_hw[1], xp=jnp)
            if flips is not None:
                cols_ = jnp.where(flips[:, None], cols_[:, ::-1], cols_)
            out[s.name] = take(rows[:, :, None], cols_[:, None, :])
        elif s.role == "boxes":
            lab = cols[s.labels][idx] if s.labels else jnp.zeros(cols[s.name][idx].shape[:2], jnp.int32)
            with jax.enable_x64(True):
                got = geometry.serve_boxes_batch(
                    cols[s.name][idx],
                    cols[s.name + "_count"][idx],
                    lab,
                    crops,
                    out_hw,
                    flips,
                    max_boxes=opts.max_boxes,
                    min_size=opts.min_size,
                    min_area=opts.min_area,
                    min_visibility=opts.min_visibility,
                    xp=jnp,
                )
                out[s.name] = got["boxes"]
                out[s.name + "_valid"] = got["boxes_valid"]
                out[s.name + "_count"] = got["boxes_count"].astype(jnp.int32)
                if s.labels:
                    out[s.labels] = got["box_labels"].astype(jnp.int32)
        else:
            counts = cols[s.name + "_count"][idx]
            with jax.enable_x64(True):
                k = geometry.serve_keypoints_batch(cols[s.name][idx], crops, out_hw, flips, s.perm, xp=jnp)
            # Past a record's instances: zeros; then cut or zero-padded to max_boxes (as the loader).
            k = jnp.where((jnp.arange(k.shape[1]) < counts[:, None])[:, :, None, None], k, 0)
            m = opts.max_boxes
            k = k[:, :m] if k.shape[1] >= m else jnp.pad(k, ((0, 0), (0, m - k.shape[1]), (0, 0), (0, 0)))
            out[s.name], out[s.name + "_count"] = k, counts
    return out


def _taker(cols, name, idx, widths):
    """take(ys, xs) of a map's records `idx`: its values at row ys, column xs of each record."""
    col, w = cols[name], widths[:, None, None]
    if name + "_offset" in cols:  # records of different sizes, one after another
        at = cols[name + "_offset"][idx][:, None, None]
        return lambda ys, xs: col[at + ys * w + xs]
    return lambda ys, xs: col[idx[:, None, None], ys * w + xs]


def owned_rows(column, local, own, data_axes):
    """Rows `local` of a field partitioned over `data_axes`: each device's own rows, the
    others zero, summed over those axes (exact: one term is not zero)."""
    rows = column[local]
    mask = own.reshape(own.shape + (1,) * (rows.ndim - 1))
    if rows.dtype == jnp.bool_:
        return jax.lax.psum(jnp.where(mask, rows, False).astype(jnp.uint8), data_axes).astype(jnp.bool_)
    return jax.lax.psum(jnp.where(mask, rows, jnp.zeros((), rows.dtype)), data_axes)

"""NaFlex patch sequences (issue 49) in a `ResidentDataset` batch, inside `jax.jit`: each row's
box (the step's drawn crop, or the whole record) sized by big_vision's rule
(`naflex.sequence_size` under jax.numpy), resized and written as its patches by
`tbljax.ops.gather_normalize(patches=...)`, beside the ``patch_yx`` / ``patch_valid`` the host
loaders serve (`engine/native_res.py`'s `PatchServing`: the same rules, so the same bytes)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tbljax._src.engine import native_res
from tbljax._src.jax import ops as _ops
from tbljax._src.jax import resident_patch_ops
from tbljax._src.rules import naflex

__all__ = ["check", "keys", "serve"]


def check(opts, data_axes, fields, geometric) -> None:
    """Refuses by name, when `opts` has patches, what a resident batch does not serve with them:
    a length schedule or packing, records partitioned over
    `data_axes`, `geometric` fields, `fields` named like a key patches add."""
    if opts.patches is None:
        return
    name = native_res.schedule_name(opts)
    if name is not None:
        raise ValueError(
            f"ResidentDataset.batch with {name}: a jitted step has one static shape and its rows "
            "by (seed, epoch, step), but this schedule sets each step's shape or rows from the whole "
            "epoch's records: serve it with tbljax.loader / HostLoader, or give one max_tokens"
            + (
                " (a length schedule in jit: ds.length_plan(...), batch(plan=, max_tokens=))"
                if "length" in name
                else ""
            )
        )
    if data_axes:
        raise ValueError(f"ResidentDataset.batch with patches: the records are partitioned over {data_axes}")
    if geometric:
        raise ValueError(
            f"ResidentDataset.batch with patches: the geometric fields {list(geometric)} are not "
            "served with patch sequences: leave them out with fields=[...]"
        )
    native_res.check_names(fields)


def keys(opts) -> tuple[str, ...]:
    """The batch keys patches add (none without patches)."""
    return native_res.PATCH_KEYS if opts.patches is not None else ()


def serve(data, idx, boxes, flips, opts, geometry, *, backend, epoch=0, repeat=0):
    """(image (B, T, p·p·3), {"patch_yx": (B, T, 2) int32, "patch_valid": (B, T) bool}) of
    samples `idx` (traced) with the drawn `boxes` (None: each record whole) and `flips`; the
    per-image ops and erasing of (epoch, repeat) at each row's size (resident_patch_ops.py)."""
    p, t = opts.patches.size, opts.patches.max_tokens
    if boxes is None:
        at = idx if len(geometry.heights) > 1 else jnp.zeros_like(idx)  # one size: one entry
        h, w = (jnp.asarray(a, jnp.int32)[at] for a in (geometry.heights, geometry.widths))
        z = jnp.zeros_like(h)
        boxes = jnp.stack([z, z, h, w], -1)
    boxes = boxes.astype(jnp.int32)
    th, tw = naflex.sequence_size(boxes[:, 2], boxes[:, 3], p, t, xp=jnp)
    mean, std = opts.normalization
    sizes = jnp.stack([th, tw], -1)
    ops = resident_patch_ops.program(idx, opts, sizes, epoch=epoch, repeat=repeat)
    side = int(max(np.max(geometry.heights), np.max(geometry.widths)))  # boxes lie in the records
    image = _ops.gather_normalize(
        data,
        idx,
        crop=boxes,
        flip=flips,
        patches=(p, sizes),
        out_size=(t, p * p * 3),
        mean=mean,
        std=std,
        dtype=opts.out_dtype,
        backend=backend,
        ops=ops,
        max_taps=naflex.max_taps(side, p, t),  # NaFlex sizes: the twin's weights stay small
    )
    yx, valid = naflex.patch_coords(th // p, tw // p, t, xp=jnp)
    return image, {"patch_yx": yx, "patch_valid": valid}

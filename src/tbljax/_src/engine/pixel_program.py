"""The per-image ops of a batch's rows as the C++ kernel takes them (`pixel_program`): the
decisions of `rules/randaug.py` and `rules/erasing.py` turned into the kernel's arrays (op codes,
integer arguments, the affine ops' float64 matrices, fills, erasing boxes and keys)."""

from __future__ import annotations

import functools

import numpy as np

from tbljax._src.rules import erasing, image_ops, pixel_ops, randaug

__all__ = [
    "FUSED_MAX_CODE",
    "PixelProgram",
    "affine_table",
    "size_free_table",
    "check_drawable",
    "column_policies",
    "look_up_matrices",
    "slot_constants",
    "ops_arg",
    "pixel_program",
]


class PixelProgram(tuple):
    """The per-image ops of a batch's rows as the kernel takes them (`pixel_program`)."""


def ops_arg(ops):
    """`ops=` of the kernels: a `pixel_program(...)` or None; TypeError otherwise."""
    if ops is None or isinstance(ops, PixelProgram):
        return ops
    raise TypeError(f"ops must be a tbljax.kernels.pixel_program(...) or None, got {type(ops).__name__}")


# The largest op code the C++ pixel program runs: every one of pixel_ops.CODES.
FUSED_MAX_CODE = max(pixel_ops.CODES.values())


@functools.lru_cache(maxsize=4096)
def _matrix(code: int, arg: int, height: int, width: int, translate_const: float, translate_pct: float):
    return pixel_ops.op_matrix(code, arg, height, width, translate_const, translate_pct)


def _translate(policy) -> tuple[float, float]:
    """A policy's (translate_const, translate_pct): `RandAugment`'s defaults when it has none."""
    return getattr(policy, "translate_const", 100.0), getattr(policy, "translate_pct", 0.45)


def _slots(policy):
    """A policy's K columns: its num_ops (RandAugment) or num_slots slots."""
    return policy.num_ops if isinstance(policy, randaug.RandAugment) else policy.num_slots


def column_policies(policies, k: int) -> list:
    """The policy of each of the K columns: each policy's slots in order; () takes
    `RandAugment`'s defaults for every column."""
    slots = [p for p in policies for _ in range(_slots(p))] or [randaug.RandAugment()] * k
    if len(slots) != k:
        raise ValueError(f"the policies have {len(slots)} op slots but codes has {k} columns")
    return slots


def slot_constants(slots) -> tuple[np.ndarray, np.ndarray]:
    """(fill (K, 3) uint8, nearest (K,) uint8) of the columns' policies (`column_policies`)."""
    k = len(slots)
    # Policies without affine ops or Cutout (ColorJitter, ThreeAugment, ...) have no fill to use.
    fill = np.array([getattr(p, "fill", (0, 0, 0)) for p in slots], np.uint8).reshape(k, 3)
    nearest = np.array([getattr(p, "interpolation", "bilinear") == "nearest" for p in slots], np.uint8).reshape(k)
    return fill, nearest


def pixel_program(
    codes, args, out_hw, *, policies=(), erase_boxes=None, erase_keys=None, erase_mode: str = "pixel"
) -> PixelProgram:
    """The rows' per-image ops for `gather` / `serve_jpeg` (``ops=``): after the resize and
    flip, row b's uint8 pixels go through its pixel program -- ``codes[b]`` (`pixel_ops.CODES`,
    0 none) with ``args[b]`` in order, `pixel_ops.apply`'s rules byte for byte -- then are
    normalized and written; then ``erase_boxes[b]`` ((E, 4) y0, x0, h, w in the output; h 0:
    none) are set as `pixel_ops.erase` sets them (``erase_mode``, noise keyed by
    ``erase_keys[b]``) on the written float32 values (bfloat16: those values rounded to
    nearest even). Erasing needs a float32 or bfloat16 output.

    `policies`: the policies (`RandAugment`'s ``num_ops`` slots, the others' ``num_slots``)
    whose slots the K columns are, in order (each slot's fill, interpolation and translation
    constants); () takes `RandAugment`'s defaults for every slot. `out_hw`: the output
    (height, width), which the affine ops' matrices (built here, in float64, by
    `pixel_ops.op_matrix`) depend on; or (B, 2), each row's own (NaFlex rows, `gather`'s
    ``patches=``).
    """
    codes = np.ascontiguousarray(codes, np.uint8)
    args = np.ascontiguousarray(args, np.int32)
    if codes.ndim != 2 or args.shape != codes.shape:
        raise ValueError(f"codes and args must both be (B, K), got {codes.shape} and {args.shape}")
    b, k = codes.shape
    slots = column_policies(policies, k)
    hw = np.broadcast_to(np.asarray(out_hw, np.int64), (b, 2))  # each row's output size
    matrices = np.zeros((b, k, 6), np.float64)
    for i, j in zip(*np.nonzero(np.isin(codes, sorted(pixel_ops.AFFINE | pixel_ops.TV_AFFINE)))):
        matrices[i, j] = _matrix(int(codes[i, j]), int(args[i, j]), int(hw[i, 0]), int(hw[i, 1]), *_translate(slots[j]))
    fill, nearest = slot_constants(slots)
    boxes, keys, mode, table = erase_args(b, erase_boxes, erase_keys, erase_mode)
    boxes, keys = np.ascontiguousarray(boxes), np.ascontiguousarray(keys)
    return PixelProgram((codes, args, matrices, fill, nearest, boxes, keys, mode, table))


def erase_args(b: int, erase_boxes, erase_keys, erase_mode: str, xp=np) -> tuple:
    """A program's erasing arguments for `b` rows, checked: (boxes (b, E, 4) int32, keys (b,)
    uint32, the mode's index, the normal table); no boxes: E = 0. NumPy or jax.numpy arrays."""
    if erase_boxes is None:
        boxes, keys = xp.zeros((b, 0, 4), xp.int32), xp.zeros(b, xp.uint32)
    else:
        boxes, keys = xp.asarray(erase_boxes).astype(xp.int32), xp.asarray(erase_keys).astype(xp.uint32)
        if boxes.ndim != 3 or boxes.shape[0] != b or boxes.shape[2] != 4 or keys.shape != (b,):
            raise ValueError(
                f"erase_boxes must be ({b}, E, 4) and erase_keys ({b},), got {boxes.shape} and {keys.shape}"
            )
    if erase_mode not in erasing.ERASE_MODES:
        raise ValueError(f"erase_mode must be one of {erasing.ERASE_MODES}, got {erase_mode!r}")
    table = pixel_ops.normal_table() if boxes.shape[1] else np.zeros(4096, np.float32)
    return boxes, keys, erasing.ERASE_MODES.index(erase_mode), table


def _affine_args(policy) -> dict[int, np.ndarray]:
    """{affine op code: the sorted distinct int32 arguments `policy` can draw for it}: its
    argument table's rows (`randaug.arg_table`, `TrivialAugment.arg_table`); {} for the
    policies without affine ops."""
    if isinstance(policy, randaug.RandAugment):
        codes = [randaug.op_arg(policy, n, 0.0)[0] for n in policy.ops]  # each op name's code
        table = randaug.arg_table(policy)
    elif isinstance(policy, image_ops.TrivialAugment):
        codes, table = [s[1] for s in image_ops.TA_SPACE], policy.arg_table()
    else:
        return {}
    found: dict[int, list] = {}
    for code, row in zip(codes, table):
        if code in pixel_ops.AFFINE | pixel_ops.TV_AFFINE:
            found.setdefault(code, []).append(row.ravel())
    return {c: np.unique(np.concatenate(rows)).astype(np.int32) for c, rows in sorted(found.items())}


@functools.lru_cache(maxsize=32)
def _affine_entries(policy, h: int, w: int) -> tuple:
    return tuple(
        (c, a, np.array([_matrix(c, int(v), h, w, *_translate(policy)) for v in a.tolist()], np.float64))
        for c, a in _affine_args(policy).items()
    )


def affine_table(slots, out_hw) -> tuple:
    """Every affine matrix the columns' policies (`column_policies`) can draw at output size
    `out_hw`, built on the host (`pixel_ops.op_matrix`, once per policy and size) for look-up
    where the matrices cannot be built per row (in jit): per column, ((code, sorted args (L,)
    int32, matrices (L, 6) float64), ...)."""
    h, w = (int(v) for v in out_hw)
    return tuple(_affine_entries(p, h, w) for p in slots)


# The affine ops whose matrices depend on the output size, and what their size-free templates
# hold where the size enters (the FFI handler finishes them per row: gather_cpu.cpp's FinishAtSize).
_C = pixel_ops.CODES
_ROTATIONS = (_C["Rotate"], _C["TvRotate"])  # 2 and 5: 0 (the centre's terms come from the size)
_TV_SHIFTS = {_C["TvTranslateX"]: 0, _C["TvTranslateY"]: 1}  # 2, 5: (tx, ty) whole pixels


@functools.lru_cache(maxsize=4096)
def _template(code: int, arg: int, translate_const: float, translate_pct: float) -> tuple[float, ...]:
    """The matrix of an affine op with its size-dependent entries replaced by what they are
    built from: the entries that do not depend on the size are those of any size (1 x 1 here);
    TranslateX/YRel's level * width (height) at 1 x 1 is the level itself."""
    m = list(_matrix(code, arg, 1, 1, translate_const, translate_pct))
    if code in _ROTATIONS:
        m[2] = m[5] = 0.0
    elif code in _TV_SHIFTS:
        m[2], m[5] = 0.0, 0.0
        m[2 + 3 * _TV_SHIFTS[code]] = float(arg)
    return tuple(m)


@functools.lru_cache(maxsize=32)
def _free_entries(policy) -> tuple:
    return tuple(
        (c, a, np.array([_template(c, int(v), *_translate(policy)) for v in a.tolist()], np.float64))
        for c, a in _affine_args(policy).items()
    )


def size_free_table(slots) -> tuple:
    """`affine_table` with size-free templates for NaFlex rows (each row its own size): the
    matrices with the size-dependent entries (Rotate's and TvRotate's centre terms,
    TranslateX/YRel's level, TvTranslateX/Y's shift) left for the CPU FFI handler to finish at
    each row's size, in `pixel_ops.affine_matrix`'s float64 operations."""
    return tuple(_free_entries(p) for p in slots)


def look_up_matrices(codes, args, table, *, zero, xp=np):
    """The (B, K, 6, ...) matrices of ops (codes, args) looked up in `table` (`affine_table`'s
    form, its matrices (L, 6, ...) in any representation, e.g. float64 or their bits), `zero`
    (6, ...) where the op is not affine; in NumPy or jax.numpy. An argument the policy cannot
    draw finds a neighbour's matrix: `check_drawable` refuses those where they are concrete."""
    columns = []
    for j, entries in enumerate(table):
        c, a = codes[:, j], args[:, j]
        column = xp.broadcast_to(xp.asarray(zero), (c.shape[0], *zero.shape))
        for code, sorted_args, matrices in entries:
            pos = xp.clip(xp.searchsorted(xp.asarray(sorted_args), a), 0, len(sorted_args) - 1)
            hit = (c == code).reshape(c.shape + (1,) * zero.ndim)
            column = xp.where(hit, xp.asarray(matrices)[pos], column)
        columns.append(column)
    return xp.stack(columns, axis=1)


def check_drawable(codes, args, table) -> None:
    """ValueError naming the row and column of an affine op whose argument its policy cannot
    draw (`look_up_matrices` has no matrix for it)."""
    codes, args = np.asarray(codes), np.asarray(args)
    for k, entries in enumerate(table):
        for code, sorted_args, _ in entries:
            (rows,) = np.nonzero((codes[:, k] == code) & ~np.isin(args[:, k], sorted_args))
            if rows.size:
                b = int(rows[0])
                raise ValueError(
                    f"ops: row {b} column {k}: op code {code} with argument {int(args[b, k])} is not one "
                    f"its policy can draw (the affine matrices in jit are looked up among those)"
                )

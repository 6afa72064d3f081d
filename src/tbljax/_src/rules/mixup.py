"""Batch-level Mixup and CutMix with timm's ``Mixup`` semantics, as one piece of array code that
runs unchanged under NumPy (the host path of the torch and MLX loaders) and jax.numpy (inside
``jax.jit``), giving the same bits.

**Semantics** (timm 1.0 ``timm.data.mixup.Mixup``, ``correct_lam=True``, no ``cutmix_minmax``):
row i of a block of b rows mixes with its partner b-1-i (the block reversed). Per draw: apply
with probability ``prob``; if both alphas are > 0, CutMix with probability ``switch_prob``,
else the one whose alpha is > 0; λ ~ Beta(α, α) of the chosen kind. Mixup: ``x*λ + x'*(1-λ)``
in float32. CutMix: timm's ``rand_bbox`` (``cut = int(side * sqrt(1-λ))``, a centre uniform
over the image, clipped) is copied from the partner and λ becomes ``1 - box area / (H*W)``.
Targets: one-hot with label smoothing (off = s/C, on = 1 - s + off) mixed with the partner's
by λ. ``mode="batch"``: one draw for the block; ``"elem"``: one per row; ``"pair"``: one per
pair (row i and b-1-i share it).

**Keying.** The random words are ``order.hash32([unit, 0, counter], iv=key)`` with
``key = hash32([TAG_MIXUP, seed_lo, seed_hi, step])``: unit 0 for ``"batch"``, the row in the
block for ``"elem"``, the pair's first row for ``"pair"``; counters 0 apply, 1 switch,
2 λ, 3 and 4 the box centre. So a draw depends on (seed, step, row in the block) only, never
on the device or the process: a resumed run mixes the same pairs, and every block (device)
of a step draws the same.

**Exactly reproducible in jax.numpy**, as `augment.py`: no transcendental at batch time.
Probabilities compare the top 24 bits of a word with ``round(p * 2**24)`` (quantised to
2**-24). λ is a look-up in a float32 table of 4096 Beta(α, α) quantiles computed once on the
host in float64, ``lam[k] = F⁻¹((k + 0.5) / 4096)`` (``scipy.special.betaincinv``; scipy comes
with jax), indexed by the word's top 12 bits: its CDF is within 1/8192 of Beta's. The cut
sides ``int(H * sqrt(1 - lam[k]))`` are a host table per image size, in float64 as timm
computes them from that λ. The centre is ``((w >> 16) * H) >> 16`` (uniform to within H/65536).
The corrected λ is a host table over box areas, ``float32(1 - area / (H*W))`` in float64 as
timm computes it (H*W + 1 entries: 196 KiB at 224²; images of more than 2**24 pixels are
refused).

**Images.** float32 mixes in float32 as above (with timm's op order: ``x*λ``, ``x'*(1-λ)``,
then their sum); bfloat16 the same in float32, rounded back to bfloat16; uint8 the same, then
rounded half to even (timm's ``FastCollateMixup``). CutMix copies pixels exactly.

**Padding rows** (label -1, a loader's ``valid == False``): their soft label is all zeros, so a
row mixed with one keeps only its own λ share and the padding adds nothing.

Example:
    >>> import numpy as np
    >>> m = Mixup(num_classes=4, mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.0)
    >>> x, y = mix(m, np.ones((2, 4, 4, 3), np.float32), np.array([0, 1]), seed=0, step=0)
    >>> x.shape, y.shape, bool(np.allclose(y.sum(1), 1))
    ((2, 4, 4, 3), (2, 4), True)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import numpy as np

from tbljax._src.rules import contract, order

__all__ = [
    "DTYPES",
    "MODES",
    "TAG_MIXUP",
    "Draws",
    "Mixup",
    "block_params",
    "check_batch",
    "check_labels",
    "check_seed",
    "check_step",
    "mix",
    "mix_block",
    "mixup_cutmix_host",
]

MODES = ("batch", "pair", "elem")
DTYPES = ("uint8", "float32", "bfloat16")  # the loader's output dtypes
TAG_MIXUP = 0x4D495830  # "MIX0": keys unrelated to the shuffle's and the augmentation's
_TABLE_BITS = 12
_PROB_BITS = 24
_MAX_AREA = 1 << 24  # pixels: the corrected-λ table holds one float32 per area
_APPLY, _SWITCH, _LAM, _CY, _CX = range(5)


def _number(name, v, lo, hi, hi_open=False):
    if not contract.is_real(v) or not (lo <= v < hi if hi_open else lo <= v <= hi):
        raise ValueError(f"{name} must be a number in [{lo}, {hi}{')' if hi_open else ']'}, got {v!r}")
    return float(v)


@dataclasses.dataclass(frozen=True)
class Mixup:
    """What a batch's Mixup/CutMix draws from (timm's ``Mixup`` arguments; hashable, so jit can
    take it as a static argument). Checked here: a combination timm does not support is refused.

    >>> Mixup(num_classes=10).mode
    'batch'
    """

    num_classes: int
    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    prob: float = 1.0
    switch_prob: float = 0.5
    label_smoothing: float = 0.1
    mode: str = "batch"

    def __post_init__(self):
        if not contract.is_integer(self.num_classes) or self.num_classes < 1:
            raise ValueError(f"num_classes must be an integer >= 1, got {self.num_classes!r}")
        object.__setattr__(self, "num_classes", int(self.num_classes))
        for name in ("mixup_alpha", "cutmix_alpha"):
            object.__setattr__(self, name, _number(name, getattr(self, name), 0, math.inf, hi_open=True))
        if not (self.mixup_alpha > 0 or self.cutmix_alpha > 0):
            raise ValueError("mixup_alpha=0 and cutmix_alpha=0 mix nothing: give one of them > 0 (or leave mixing out)")
        for name in ("prob", "switch_prob"):
            object.__setattr__(self, name, _number(name, getattr(self, name), 0, 1))
        object.__setattr__(
            self, "label_smoothing", _number("label_smoothing", self.label_smoothing, 0, 1, hi_open=True)
        )
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")


def check_seed(seed) -> int:
    """A seed as an int in [0, 2**64)."""
    return order.check_seed_epoch(seed, 0)[0]


def check_step(step) -> int:
    """A concrete step as an int in [0, 2**32) (the word hashed)."""
    if not contract.is_integer(step) or not 0 <= step < 1 << 32:
        raise ValueError(f"step must be an integer in [0, 2**32), got {step!r}")
    return int(step)


@functools.lru_cache(maxsize=16)
def _lam_table(alpha: float) -> np.ndarray:
    """float32 (4096,): Beta(alpha, alpha) quantiles at (k + 0.5) / 4096, in float64."""
    from scipy.special import betaincinv

    p = (np.arange(1 << _TABLE_BITS, dtype=np.float64) + 0.5) / (1 << _TABLE_BITS)
    t = betaincinv(alpha, alpha, p).astype(np.float32)
    t.setflags(write=False)
    return t


@functools.lru_cache(maxsize=32)
def _cut_table(alpha: float, side: int) -> np.ndarray:
    """int32 (4096,): timm's cut side ``int(side * sqrt(1 - lam))`` for each λ of the table."""
    t = (side * np.sqrt(1.0 - _lam_table(alpha).astype(np.float64))).astype(np.int32)
    t.setflags(write=False)
    return t


@functools.lru_cache(maxsize=8)
def _corrected_lam_table(height: int, width: int) -> np.ndarray:
    """float32 (H*W + 1,): timm's corrected λ ``1 - area / (H*W)`` (float64) for every box area.
    A table, not a float32 division: XLA turns a division by a constant into a multiply by its
    reciprocal (one bit off), and TPUs do not round division correctly."""
    t = (1.0 - np.arange(height * width + 1, dtype=np.float64) / float(height * width)).astype(np.float32)
    t.setflags(write=False)
    return t


def _threshold(p: float, xp):
    return xp.uint32(round(p * (1 << _PROB_BITS)))


class Draws(NamedTuple):
    """A block's draws, per row: what was drawn (timm's ``_params_per_*`` and ``rand_bbox``'s
    centre) and what it makes (``lam``: the target's λ, corrected for CutMix; ``mixes``: Mixup
    applies; ``box`` (yl, yh, xl, xh): copied from the partner, empty where CutMix does not
    apply)."""

    applied: object  # bool (rows,): mixing applies (probability `prob`)
    cutmix: object  # bool (rows,): CutMix, not Mixup
    drawn: object  # float32 (rows,): λ ~ Beta(α, α) of the chosen kind
    cy: object  # int32 (rows,): the box centre, uniform in [0, H)
    cx: object  # int32 (rows,): uniform in [0, W)
    lam: object
    mixes: object
    box: object


def block_params(m: Mixup, rows: int, height: int, width: int, *, seed: int, step, xp=np) -> Draws:
    """The `Draws` of a block of `rows` rows of H×W images. `step` may be a traced jax integer."""
    seed = check_seed(seed)
    step_word = xp.asarray(step).astype(xp.uint32) if xp is not np else check_step(step)
    # (1,)-shaped words: NumPy warns when uint32 scalars wrap, arrays wrap silently.
    words = [xp.full((1,), w, dtype=xp.uint32) for w in (TAG_MIXUP, seed & 0xFFFFFFFF, seed >> 32)]
    key = order.hash32([*words, xp.reshape(xp.asarray(step_word, dtype=xp.uint32), (1,))], xp=xp)
    r = xp.arange(rows, dtype=xp.uint32)
    units = {"batch": r * xp.uint32(0), "elem": r, "pair": xp.minimum(r, xp.uint32(rows - 1) - r)}[m.mode]
    w = order.hash32([units[:, None], 0, xp.arange(5, dtype=xp.uint32)[None, :]], iv=key, xp=xp)
    top = w >> xp.uint32(32 - _PROB_BITS)
    applied = top[:, _APPLY] < _threshold(m.prob, xp)
    if m.mixup_alpha > 0 and m.cutmix_alpha > 0:
        cut = top[:, _SWITCH] < _threshold(m.switch_prob, xp)
    else:
        cut = xp.full((rows,), m.cutmix_alpha > 0)
    k = w[:, _LAM] >> xp.uint32(32 - _TABLE_BITS)
    cut_alpha = m.cutmix_alpha or m.mixup_alpha  # an alpha of 0 is never drawn from
    mix_alpha = m.mixup_alpha or m.cutmix_alpha
    drawn = xp.where(cut, xp.asarray(_lam_table(cut_alpha))[k], xp.asarray(_lam_table(mix_alpha))[k])
    cut_h = xp.asarray(_cut_table(cut_alpha, height))[k]
    cut_w = xp.asarray(_cut_table(cut_alpha, width))[k]
    # Box centres: uint32 products stay below 2**32 for sides <= 65535.
    cy = (((w[:, _CY] >> 16) * xp.uint32(height)) >> 16).astype(xp.int32)
    cx = (((w[:, _CX] >> 16) * xp.uint32(width)) >> 16).astype(xp.int32)
    yl, yh = xp.clip(cy - cut_h // 2, 0, height), xp.clip(cy + (cut_h + 1) // 2, 0, height)
    xl, xh = xp.clip(cx - cut_w // 2, 0, width), xp.clip(cx + (cut_w + 1) // 2, 0, width)
    lam_cut = xp.asarray(_corrected_lam_table(height, width))[(yh - yl) * (xh - xl)]
    cutting = applied & cut
    lam = xp.where(applied, xp.where(cut, lam_cut, drawn), xp.float32(1)).astype(xp.float32)
    box = xp.where(cutting[:, None], xp.stack([yl, yh, xl, xh], axis=-1), 0).astype(xp.int32)
    return Draws(applied, cut, drawn, cy, cx, lam, applied & ~cut, box)


def _rounded(v, zero, xp):
    """`v`, with each float32 product rounded on its own in jax.numpy too: XLA's CPU and GPU
    backends contract ``a*b + c*d`` into a fused multiply-add (one rounding fewer than NumPy and
    timm). OR-ing the bits with `zero`, a value XLA cannot see is 0, keeps the product apart."""
    if xp is np:
        return v
    return (v.view(xp.uint32) | zero).view(xp.float32)  # a bitcast in jax.numpy


def mix_block(m: Mixup, images, labels, *, seed: int, step, layout: str = "NHWC", xp=np):
    """One block's (images mixed, soft labels float32 (b, num_classes)): rows mix with the
    block reversed. `images` (b, H, W, C) or (b, C, H, W) of a `DTYPES` dtype, `labels` (b,)
    integers (-1: a padding row); checked by the caller (`mix`, the jax op)."""
    b = images.shape[0]
    h_axis = 1 if layout == "NHWC" else 2
    height, width = images.shape[h_axis], images.shape[h_axis + 1]
    d = block_params(m, b, height, width, seed=seed, step=step, xp=xp)
    lam, mixes, box = d.lam, d.mixes, d.box

    # Targets: timm's mixup_target, with all-zero rows for padding.
    off = np.float32(m.label_smoothing / m.num_classes)
    on = np.float32(1.0 - m.label_smoothing + m.label_smoothing / m.num_classes)
    labels = xp.asarray(labels).astype(xp.int32)
    hot = labels[:, None] == xp.arange(m.num_classes, dtype=xp.int32)[None, :]
    y = xp.where(hot, on, xp.where((labels >= 0)[:, None], off, xp.float32(0)))
    lam_col = lam[:, None]
    one_minus = xp.float32(1) - lam_col
    zero = (lam > 2).astype(xp.uint32)  # 0, only known at run time (`_rounded`)
    targets = _rounded(y * lam_col, zero[:, None], xp) + _rounded(y[::-1] * one_minus, zero[:, None], xp)

    # Images: per row, the partner inside the box, else the float32 mix where Mixup applies.
    ys = xp.arange(height)[None, :, None]
    xs = xp.arange(width)[None, None, :]
    inside = (
        (ys >= box[:, 0, None, None])
        & (ys < box[:, 1, None, None])
        & (xs >= box[:, 2, None, None])
        & (xs < box[:, 3, None, None])
    )  # (b, H, W)
    inside = inside[..., None] if layout == "NHWC" else inside[:, None]
    shape = (b, 1, 1, 1)
    x = images
    xf = x[::-1]
    zero = zero.reshape(shape)
    mixed = _rounded(x.astype(xp.float32) * lam.reshape(shape), zero, xp) + _rounded(
        xf.astype(xp.float32) * one_minus.reshape(shape), zero, xp
    )
    if x.dtype == np.uint8:
        mixed = xp.rint(mixed)
    mixed = mixed.astype(x.dtype)
    out = xp.where(inside, xf, xp.where(mixes.reshape(shape), mixed, x))
    return out, targets


def check_batch(m: Mixup, images, labels, layout: str, blocks: int = 1) -> None:
    """Refuses, by name, a batch `mix_block` cannot take (shapes and dtypes only: no values)."""
    contract.check_layout(layout)
    shape, dtype = tuple(images.shape), np.dtype(images.dtype)
    if len(shape) != 4:
        # A (B, tokens, p·p·3) batch is patches='s: no image to blend or cut a box from.
        seq = " (a patch sequence batch, as patches= serves, is not mixed)" if len(shape) == 3 else ""
        raise ValueError(f"images must be a batch (B, H, W, C) or (B, C, H, W), got shape {shape}{seq}")
    if dtype.name not in DTYPES:
        raise ValueError(f"images must be one of {DTYPES}, got {dtype}")
    lshape = tuple(labels.shape)
    if lshape != (shape[0],) or np.dtype(labels.dtype).kind not in "iu":
        raise ValueError(
            f"labels must be ({shape[0]},) integers (class ids, -1 for padding rows), "
            f"got {np.dtype(labels.dtype)} of shape {lshape}"
        )
    h_axis = 1 if layout == "NHWC" else 2
    if shape[h_axis] * shape[h_axis + 1] > _MAX_AREA:
        raise ValueError(
            f"images of {shape[h_axis]}x{shape[h_axis + 1]} pixels are over the 2**24 that "
            "CutMix's table of corrected λ per box area covers"
        )
    if shape[0] % blocks or (shape[0] // blocks) % 2:
        raise ValueError(
            f"each block of rows mixed together must have an even number of rows "
            f"(timm pairs row i with b-1-i); got {shape[0]} rows in {blocks} block(s)"
        )


def check_labels(m: Mixup, labels) -> None:
    """Concrete labels: each a class id in [0, num_classes) or -1 (a padding row)."""
    labels = np.asarray(labels)
    bad = np.flatnonzero((labels < -1) | (labels >= m.num_classes))
    if bad.size:
        k = int(bad[0])
        raise ValueError(
            f"labels row {k}: {int(labels[k])} is neither a class id in [0, {m.num_classes}) nor -1 (a padding row)"
        )


def mix(m: Mixup, images, labels, *, seed: int, step: int, layout: str = "NHWC", blocks: int = 1):
    """The host path (NumPy): (images mixed, soft labels float32 (B, num_classes)) for a batch
    made of `blocks` equal per-device blocks, each mixed on its own as the jax op mixes each
    device's rows. Equal, bit for bit, to `tbljax.ops.mixup_cutmix` on those blocks."""
    images, labels = np.asarray(images), np.asarray(labels)
    if not contract.is_integer(blocks) or blocks < 1:
        raise ValueError(f"blocks must be an integer >= 1, got {blocks!r}")
    check_batch(m, images, labels, layout, blocks)
    check_labels(m, labels)
    check_step(step)
    parts = [
        mix_block(m, x, y, seed=seed, step=step, layout=layout)
        for x, y in zip(np.split(images, blocks), np.split(labels, blocks))
    ]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def mixup_cutmix_host(
    images,
    labels,
    *,
    seed: int,
    step: int,
    num_classes: int,
    mixup_alpha: float = 0.8,
    cutmix_alpha: float = 1.0,
    prob: float = 1.0,
    switch_prob: float = 0.5,
    label_smoothing: float = 0.1,
    mode: str = "batch",
    layout: str = "NHWC",
    blocks: int = 1,
):
    """`tbljax.ops.mixup_cutmix` on the host, in NumPy (the torch and MLX path): the same
    arguments, and `blocks`, the number of equal per-device blocks the batch is made of (1: one
    device). Returns NumPy arrays equal, bit for bit, to the jax op's.

    >>> x, y = mixup_cutmix_host(np.zeros((4, 8, 8, 3), np.uint8), np.array([0, 1, 2, -1]),
    ...                          seed=0, step=3, num_classes=3)
    >>> x.dtype, y.shape
    (dtype('uint8'), (4, 3))
    """
    m = Mixup(
        num_classes=num_classes,
        mixup_alpha=mixup_alpha,
        cutmix_alpha=cutmix_alpha,
        prob=prob,
        switch_prob=switch_prob,
        label_smoothing=label_smoothing,
        mode=mode,
    )
    return mix(m, images, labels, seed=seed, step=step, layout=layout, blocks=blocks)

"""Aspect-ratio buckets: which bucket each record goes to, the cover-then-crop box that fits it
there, and the epoch's schedule of one-bucket global batches. Pure decision functions; the
kernel and the loader (a later round) consume their tables.

**The tables** (what the kernel will consume). Per record i: its bucket ``b[i]`` (the output
size ``sizes[b[i]]``), the source box ``(y0, x0, h, w)`` in stored pixels, resized to the
bucket's size, and its flip (`augment.flips`, counter 40, as without buckets). Per step s: the
bucket of the step and the global batch's record indices, -1 for padding. ``orig_hw`` is the
record's stored (H, W), ``crop_yx`` the box's (y0, x0), ``bucket`` the step's bucket: the
conditioning SDXL trains with.

**Sizes.** Explicit ``[(h, w), ...]``, or ``"auto"``: the 41 (h, w) pairs SDXL trained its
multi-aspect stage on (Podell et al. 2023, appendix: 512×2048 … 1024×1024 … 2048×512, every side a
multiple of 64, each ≈ 1024² pixels), scaled by sqrt(pixels / 1024²) to the loader's pixel
budget and each side rounded to the nearest multiple of ``multiple`` (at least one multiple);
pairs that coincide after rounding are kept once. SDXL's set because it is the published one
the models people fine-tune were trained on. Two buckets may not share an aspect ratio (a
record could go to either).

**Assignment** is nearest aspect ratio in log space: with the buckets sorted by w/h, a record
of aspect r = W/H lies between neighbours a_k < a_k+1 and goes to k when
log r - log a_k < log a_k+1 - log r, i.e. r² < a_k·a_k+1. No logarithm is taken: both sides
are correctly rounded float64 quotients of exact integers, ``W²/H²`` and
``(w_k·w_k+1)/(h_k·h_k+1)`` (IEEE division is correctly rounded on every machine, where
``log`` is not), so every host assigns every record alike. A tie goes to the narrower bucket k.

**The box** covers the bucket and is cropped to it: the largest box of the bucket's aspect
inside the record, ``(H, round(H·w/h))`` when the record is wider than the bucket, else
``(round(W·h/w), W)`` (integer rounding half up, at least 1 pixel). ``crop="center"`` centres
it; ``crop="random"`` places it at ``((u >> 16) · (span + 1)) >> 16`` along each axis, u the
record's `order.random_bits` (counters 48 for y, 49 for x) keyed by (seed, epoch, index):
the same placement on every host and after a resume. `cover` is that arithmetic alone, in
uint32 under NumPy or jax.numpy (a resident dataset's step draws its boxes in the graph).

**The schedule** of epoch e (`epoch_schedule`): the records in the epoch's order
(`order.permute` keyed (seed, e)), grouped by bucket keeping that order; each bucket cut into
global batches of G (its last batch padded with -1, or dropped with ``drop_remainder``); the
batches of all buckets shuffled by a second keyed permutation (`order.permute` over the batch
count, keyed (seed ^ TAG_BATCHES << 32, e)). Every record appears once per epoch (or not at
all when its bucket's remainder is dropped); every step is one bucket, so a job compiles one
program per bucket. It is computed on the host, vectorised (1.28 M records in well under a
second), identical on every host since it depends on (seed, epoch, the bucket table) only; a
resume position is a step number. The resident (in-jit) path takes it as a host-computed
array (`ResidentDataset.bucket_plan`); no jax.numpy version is needed. Every process computes
it over the whole dataset's bucket table: host parts (``partition="host"``, each process reading only its part) need a
per-part schedule and are not covered by this rule.

Example:
    >>> import numpy as np
    >>> from tbljax._src.rules import buckets
    >>> sizes = buckets.bucket_sizes(buckets.Buckets(sizes=[(64, 128), (96, 96), (128, 64)]))
    >>> buckets.assign(np.array([100, 300]), np.array([210, 290]), sizes).tolist()
    [2, 1]
"""

from __future__ import annotations

import dataclasses
import fractions
import typing

import numpy as np

from tbljax._src.rules import contract, order

__all__ = [
    "CROPS",
    "SDXL_SIZES",
    "BucketSchedule",
    "Buckets",
    "assign",
    "auto_sizes",
    "bucket_sizes",
    "cover",
    "cover_boxes",
    "epoch_schedule",
]

CROPS = ("center", "random")
# SDXL's multi-aspect buckets (h, w) at 1024² pixels (Podell et al. 2023, appendix).
SDXL_SIZES: tuple[tuple[int, int], ...] = (
    (512, 2048),
    (512, 1984),
    (512, 1920),
    (512, 1856),
    (576, 1792),
    (576, 1728),
    (576, 1664),
    (640, 1600),
    (640, 1536),
    (704, 1472),
    (704, 1408),
    (704, 1344),
    (768, 1344),
    (768, 1280),
    (832, 1216),
    (832, 1152),
    (896, 1152),
    (896, 1088),
    (960, 1088),
    (960, 1024),
    (1024, 1024),
    (1024, 960),
    (1088, 960),
    (1088, 896),
    (1152, 896),
    (1152, 832),
    (1216, 832),
    (1280, 768),
    (1344, 768),
    (1344, 704),
    (1408, 704),
    (1472, 704),
    (1536, 640),
    (1600, 640),
    (1664, 576),
    (1728, 576),
    (1792, 576),
    (1856, 512),
    (1920, 512),
    (1984, 512),
    (2048, 512),
)
_SDXL_PIXELS = 1024 * 1024
_COUNTER_Y, _COUNTER_X = 48, 49  # augment uses counters 0..40
TAG_BATCHES = 0x424B5442  # "BKTB": the batch order's seed, unrelated to the record order's


def _side(v) -> bool:
    return contract.is_integer(v) and 1 <= v <= contract.MAX_OUT_SIDE


def _by_aspect(sizes) -> tuple[tuple[int, int], ...]:
    """`sizes` sorted by aspect w/h (exact rationals), refusing two of one aspect."""
    keyed = sorted((fractions.Fraction(w, h), (h, w)) for h, w in sizes)
    for (a, s), (b, t) in zip(keyed, keyed[1:]):
        if a == b:
            raise ValueError(
                f"buckets {s} and {t} have the same aspect ratio {a}: a record could go to either; keep one"
            )
    return tuple(s for _, s in keyed)


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Aspect-ratio buckets: each record goes to the bucket nearest its aspect ratio, is resized
    to cover it and cropped to it; every global batch is one bucket.

    Attributes:
      sizes: ``[(h, w), ...]`` (no two of one aspect ratio), or ``"auto"``: SDXL's buckets at the
        loader's pixel budget (`auto_sizes`).
      crop: ``"center"`` or ``"random"`` (placed by (seed, epoch, index)).
      multiple: ``"auto"`` rounds every side to a multiple of it.
      pixels: ``"auto"``'s pixel budget h·w (e.g. ``512 * 512``); SDXL's own is ``1024 * 1024``.

    >>> Buckets(sizes=[(256, 512), (512, 256)]).sizes
    ((256, 512), (512, 256))
    """

    sizes: typing.Any = "auto"
    crop: str = "center"
    multiple: int = 64
    pixels: int | None = None

    def __post_init__(self):
        if not (isinstance(self.crop, str) and self.crop in CROPS):
            raise ValueError(f"crop must be one of {CROPS}, got {self.crop!r}")
        if not _side(self.multiple):
            raise ValueError(f"multiple must be an integer in [1, {contract.MAX_OUT_SIDE}], got {self.multiple!r}")
        object.__setattr__(self, "multiple", int(self.multiple))
        if self.pixels is not None and (not contract.is_integer(self.pixels) or self.pixels < 1):
            raise ValueError(
                f"pixels (the pixel budget h*w of sizes='auto') must be an integer >= 1, got {self.pixels!r}"
            )
        if isinstance(self.sizes, str) and self.sizes == "auto":
            return
        if self.pixels is not None:
            raise ValueError(f"pixels={self.pixels!r} applies to sizes='auto' only; explicit sizes are served as given")
        bad = (
            f"sizes must be 'auto' or a non-empty list of (height, width) with each in "
            f"[1, {contract.MAX_OUT_SIDE}], got {self.sizes!r}"
        )
        if isinstance(self.sizes, (str, bytes)):
            raise ValueError(bad)
        try:
            pairs = [tuple(s) for s in self.sizes]
        except TypeError:
            raise ValueError(bad) from None
        if not pairs or not all(len(p) == 2 and _side(p[0]) and _side(p[1]) for p in pairs):
            raise ValueError(bad)
        pairs = tuple((int(h), int(w)) for h, w in pairs)
        _by_aspect(pairs)
        object.__setattr__(self, "sizes", pairs)


def auto_sizes(pixels: int, multiple: int = 64) -> tuple[tuple[int, int], ...]:
    """SDXL's buckets scaled to `pixels` per image, sides rounded to the nearest multiple of
    `multiple` (at least one), duplicates kept once, sorted by aspect ratio.

    >>> auto_sizes(1024 * 1024)[20]
    (1024, 1024)
    >>> auto_sizes(512 * 512)[:2]
    ((1024, 256), (960, 256))
    """
    if not contract.is_integer(pixels) or pixels < 1:
        raise ValueError(f"pixels (the loader's pixel budget, h*w) must be an integer >= 1, got {pixels!r}")
    scale = (pixels / _SDXL_PIXELS) ** 0.5  # host float64, once

    def rounded(v):
        return max(multiple, int(np.floor(v * scale / multiple + 0.5)) * multiple)

    out = []
    for h, w in SDXL_SIZES:
        s = (rounded(h), rounded(w))
        # Rounding may give two pairs one aspect: keep the first (closest to SDXL's order).
        if all(fractions.Fraction(s[1], s[0]) != fractions.Fraction(t[1], t[0]) for t in out):
            out.append(s)
    return _by_aspect(out)


def bucket_sizes(buckets: Buckets, pixels: int | None = None) -> np.ndarray:
    """int32 (K, 2) bucket sizes (h, w) sorted by aspect ratio w/h: the bucket ids the other
    functions use. `pixels` (the loader's budget; default ``buckets.pixels``) is needed for
    ``sizes="auto"`` only."""
    if buckets.sizes == "auto":
        pixels = buckets.pixels if pixels is None else pixels
        if pixels is None:
            raise ValueError("Buckets(sizes='auto') needs the loader's pixel budget: Buckets(pixels=h*w)")
        sizes = auto_sizes(pixels, buckets.multiple)
    else:
        sizes = _by_aspect(buckets.sizes)
    out = np.array(sizes, np.int32).reshape(-1, 2)
    out.setflags(write=False)
    return out


def _check_records(heights, widths):
    h, w = np.asarray(heights), np.asarray(widths)
    if h.ndim != 1 or h.shape != w.shape or h.dtype.kind not in "iu" or w.dtype.kind not in "iu":
        raise ValueError(
            f"heights and widths must be 1-D integer arrays of one length, got "
            f"{h.dtype} {h.shape} and {w.dtype} {w.shape}"
        )
    for name, a in (("height", h), ("width", w)):
        bad = (a < 1) | (a > contract.MAX_SIDE)
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"record {k}: {name} must be an integer in [1, {contract.MAX_SIDE}], got {int(a[k])}")
    return h.astype(np.int64), w.astype(np.int64)


def assign(heights, widths, sizes) -> np.ndarray:
    """int8/int16 (N,) bucket of each record (`sizes` from `bucket_sizes`): nearest aspect ratio
    in log space, ties to the narrower bucket. Vectorised, exact on every host."""
    h, w = _check_records(heights, widths)
    sizes = np.asarray(sizes, np.int64)
    # r² < a_k·a_{k+1} as correctly rounded quotients of exact integers (all below 2^53).
    bounds = (sizes[:-1, 1] * sizes[1:, 1]).astype(np.float64) / (sizes[:-1, 0] * sizes[1:, 0])
    r2 = (w * w).astype(np.float64) / (h * h)
    dtype = np.int8 if len(sizes) <= 127 else np.int16
    return np.searchsorted(bounds, r2, side="left").astype(dtype)


def cover_boxes(indices, heights, widths, bucket, sizes, *, crop: str, seed: int, epoch: int) -> np.ndarray:
    """int32 (B, 4) source boxes (y0, x0, h, w) of records `indices`, whose stored sizes are
    `heights`/`widths` and buckets `bucket` (per record, indexed by `indices`): the largest box
    of the bucket's aspect inside the record, centred or placed by (seed, epoch, index).

    >>> cover_boxes(np.array([0]), np.array([300]), np.array([600]), np.array([0]),
    ...             np.array([[100, 100]]), crop="center", seed=0, epoch=0).tolist()
    [[0, 150, 300, 300]]
    """
    idx = np.asarray(indices, np.int64)
    h, w = _check_records(heights, widths)
    bh, bw = (np.asarray(sizes, np.int64)[np.asarray(bucket)[idx]]).T
    return cover(idx, h[idx], w[idx], (bh, bw), crop=crop, seed=seed, epoch=epoch)


def cover(indices, heights, widths, size, *, crop: str, seed: int, epoch, xp=np):
    """`cover_boxes`' arithmetic for rows already gathered: records `indices` (the random
    placement's key) of stored sizes `heights`/`widths` (B,) in buckets of size ``size = (bh,
    bw)`` (ints or (B,) each). Under NumPy or jax.numpy (`epoch` may be traced): exact uint32
    integer math, since sides <= 65535 and bucket sides <= 32767 keep every product below 2^32.

    >>> cover(np.array([0]), np.array([300]), np.array([600]), (100, 100), crop="center", seed=0, epoch=0).tolist()
    [[0, 150, 300, 300]]
    """
    if crop not in CROPS:
        raise ValueError(f"crop must be one of {CROPS}, got {crop!r}")
    u32 = xp.uint32
    H, W = xp.asarray(heights).astype(u32), xp.asarray(widths).astype(u32)
    bh, bw = (xp.asarray(v).astype(u32) for v in size)
    wider = W * bh > H * bw  # the record is wider than its bucket
    box_w = xp.where(wider, xp.clip((2 * H * bw + bh) // (2 * bh), 1, W), W)
    box_h = xp.where(wider, H, xp.clip((2 * W * bh + bw) // (2 * bw), 1, H))
    span_y, span_x = H - box_h, W - box_w
    if crop == "center":
        y0, x0 = span_y // 2, span_x // 2
    else:
        counters = xp.asarray([_COUNTER_Y, _COUNTER_X], dtype=u32)
        u = order.random_bits(xp.asarray(indices)[:, None], counters, seed, epoch, xp=xp)
        y0 = ((u[:, 0] >> 16) * (span_y + 1)) >> 16
        x0 = ((u[:, 1] >> 16) * (span_x + 1)) >> 16
    return xp.stack([y0, x0, box_h, box_w], axis=-1).astype(xp.int32)


class BucketSchedule(typing.NamedTuple):
    """An epoch's steps from `start`: ``bucket[s]`` the bucket of step start + s, ``indices[s]``
    its G global record indices (-1: padding, ``valid = indices >= 0``)."""

    bucket: np.ndarray  # int32 (S,)
    indices: np.ndarray  # int64 (S, G)


def epoch_schedule(
    bucket, global_batch: int, *, seed: int, epoch: int, drop_remainder: bool, shuffle: bool = True, start: int = 0
) -> BucketSchedule:
    """The steps of epoch `epoch` from step `start` (a resume position) for records whose
    buckets are `bucket` (N,): each step one bucket, every record once (see the module
    docstring). The same on every host.

    >>> s = epoch_schedule(np.array([0, 1, 0, 0, 1]), 2, seed=0, epoch=0, drop_remainder=False)
    >>> s.indices.shape, sorted(s.indices[s.indices >= 0].tolist())
    ((3, 2), [0, 1, 2, 3, 4])
    """
    seed, epoch = order.check_seed_epoch(seed, epoch)
    bucket = np.asarray(bucket)
    if bucket.ndim != 1 or not len(bucket) or bucket.dtype.kind not in "iu" or bucket.min() < 0:
        raise ValueError(f"bucket must be a non-empty 1-D array of bucket ids >= 0, got {bucket.dtype} {bucket.shape}")
    if not contract.is_integer(global_batch) or global_batch < 1:
        raise ValueError(f"global batch must be an integer >= 1, got {global_batch!r}")
    n, g = len(bucket), int(global_batch)
    records = order.permute(np.arange(n), n, seed, epoch, shuffle=shuffle)
    # Group by bucket, keeping the epoch's order within each (a stable radix sort of small ints).
    records = records[np.argsort(bucket[records], kind="stable")]
    counts = np.bincount(bucket, minlength=int(bucket.max()) + 1)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    per_bucket = counts // g if drop_remainder else -(-counts // g)
    batch_bucket = np.repeat(np.arange(len(counts), dtype=np.int32), per_bucket)
    batch_start = first[batch_bucket] + g * (
        np.arange(len(batch_bucket)) - np.repeat(np.cumsum(per_bucket) - per_bucket, per_bucket)
    )
    total = len(batch_bucket)
    if not contract.is_integer(start) or not 0 <= start <= total:
        raise ValueError(f"start (a step of the epoch) must be an integer in [0, {total}], got {start!r}")
    if total and shuffle:
        batch_seed = seed ^ (TAG_BATCHES << 32)
        which = order.permute(np.arange(start, total), total, batch_seed, epoch)
    else:
        which = np.arange(start, total)
    pos = batch_start[which][:, None] + np.arange(g)
    end = (first + counts)[batch_bucket[which]][:, None]
    indices = np.where(pos < end, records[np.minimum(pos, n - 1)], -1)
    return BucketSchedule(batch_bucket[which], indices)

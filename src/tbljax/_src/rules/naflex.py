"""NaFlex patch sequences: the size each record is resized to, the patch layout of a row, the
sequence-length schedule and the packing of several images per sequence. Pure decision
functions; the loader consumes their tables (`engine/native_res.py`, `engine/naflex_lengths.py`,
`engine/naflex_pack.py`).

**Size** (`sequence_size`): big_vision's ``resize_to_sequence`` (SigLIP 2's
``pp/proj/image_text/ops_naflex.py``), integer for integer: a bisection on the scale ratio in
float32 between 1e-6 and 100 until the interval is under 1e-5; a ratio is feasible when
``ceil(H·r / p)·ceil(W·r / p) <= max_tokens`` (each side at least one patch), and the size is
``p·ceil(side·r / p)`` at the last feasible ratio. The aspect is kept up to that rounding to whole
patches. Only float32 multiplies, divides, ``ceil`` and comparisons, which IEEE rounds exactly, so
NumPy and jax.numpy (with or without x64) give the same sizes; the patch count is compared as
``gw <= max_tokens // gh``, which cannot overflow int32. big_vision asserts the ratio stays in
(1e-5, 100); for sides in [1, MAX_SIDE] it always does (65535 pixels into one 1-pixel patch
needs 1/65535 > 1e-5, and the bisection's lower end never reaches its upper one), so the
check is on the sides: a side outside [1, MAX_SIDE] is refused, naming the record.

**Layout** (`patchify`/`unpatchify`, the reference the kernel must match byte for byte): a
resized image of gh×gw patches of p×p pixels gives row k = gy·gw + gx (patches in raster order)
holding its pixels (py, px, c) in that order (channel fastest: big_vision's
``tf.image.extract_patches`` and timm's channels-last ``Patchify``), so a row is
``(max_tokens, p·p·3)``; rows past gh·gw are zero. ``patch_yx[k] = (gy, gx)`` and
``patch_valid[k] = k < gh·gw`` (zeros past it).

**Sequence-length schedule** (`length_schedule`, a list of ``max_tokens``): timm's NaFlex loader
(``timm/data/naflex_dataset.py``). A canonical schedule drawn from the seed alone: batch j's
length ``L[(u_j · len(L)) >> 32]`` (u_j `order.random_bits` of (seed, epoch 0, j, counter 64)),
its batch size timm's ``calculate_naflex_batch_size``: ``max(1, tokens_per_batch // (L·d) · d)``
for divisor d (``tokens_per_batch // L`` when d is 1), batches drawn until they cover the N
records (the last clipped to the records left). Each epoch permutes the canonical batches'
order (`order.permute` keyed (seed ^ TAG_LENGTHS << 32, epoch)) and fills them front to back
from the epoch's record order (`order.permute` keyed (seed, epoch)). So a step's length is a
function of (seed, epoch, step), its tokens stay at most ``tokens_per_batch``, every record is
served once an epoch, a resume position is a step, and a job compiles one program per length.
The last, clipped batch is padded with -1 to its length's batch size, or dropped with
``drop_remainder`` (its records skipped this epoch).

**Packing** (`pack`, ``Patches(pack=True)``): each record resized by the rule above to at most
``image_tokens``, then first-fit-decreasing into sequences of ``max_tokens``, in windows of
``pack_window`` records of the epoch's order: within a window the records are sorted by tokens,
largest first (ties by position), and each goes to the first open sequence with room. Windows
are independent, so the packing of an epoch is vectorised across windows and a pure function of
the records' token counts in epoch order. ``segment_ids`` is 1, 2, … for the images of a sequence
in the order they were placed and 0 for padding. Padding measured (tests/test_naflex.py) at
patch 16, max_tokens 1024, image_tokens 256, window 256 (the defaults): on the Kodak and
Caltech-101 photos and on an ImageNet-like distribution (mean ≈ 400×350: area log-normal around
400·350, aspect w/h log-normal around 1.14 between 1/2 and 2; an assumption, not ImageNet's
measured list): 1.44% on 20,000 ImageNet-like sizes, 2.09% on the 1,322 Kodak and Caltech-101
photos (the tests assert <= 5% and print the fraction).

Example:
    >>> import numpy as np
    >>> from tbljax._src.rules import naflex
    >>> naflex.sequence_size(np.array([63]), np.array([241]), 16, 16)
    (array([32], dtype=int32), array([128], dtype=int32))
"""

from __future__ import annotations

import dataclasses
import typing

import numpy as np

from tbljax._src.rules import contract, order

__all__ = [
    "LengthSchedule",
    "Packing",
    "Patches",
    "length_batch_size",
    "length_schedule",
    "max_taps",
    "pack",
    "patch_coords",
    "patchify",
    "segment_ids",
    "sequence_size",
    "step_indices",
    "unpatchify",
]

# big_vision's bisection: bounds and stopping width, as float32 (its tf.constant's dtype).
_LO, _HI, _EPS = np.float32(1e-5 / 10.0), np.float32(100.0), np.float32(1e-5)
_COUNTER_LENGTH = 64  # augment uses counters 0..40, buckets 48 and 49
TAG_LENGTHS = 0x4C454E53  # "LENS": the batch order's seed, unrelated to the record order's


def _positive(name, v, hi=None) -> int:
    if not contract.is_integer(v) or v < 1 or (hi is not None and v > hi):
        rng = f"[1, {hi}]" if hi is not None else ">= 1"
        raise ValueError(f"{name} must be an integer {rng}, got {v!r}")
    return int(v)


@dataclasses.dataclass(frozen=True)
class Patches:
    """NaFlex patch sequences: each record resized keeping its aspect to the largest size whose
    patch grid fits ``max_tokens`` and served as a sequence of patches.

    Attributes:
      size: the patch side p (a row holds p·p·3 values).
      max_tokens: the sequence length, or a list of them: a schedule of lengths drawn per step,
        the batch size scaled to ``tokens_per_batch`` (timm's NaFlex loader).
      tokens_per_batch: the token budget of a step (a list of ``max_tokens`` only).
      batch_divisor: a scheduled batch size is a multiple of it (timm's ``batch_divisor``).
      pack: several images per sequence (one ``max_tokens`` only).
      image_tokens: with ``pack``, each image's token cap (default max_tokens // 4).
      pack_window: with ``pack``, the records packed together (first-fit-decreasing).

    >>> Patches(size=16, max_tokens=[1024, 256, 576], tokens_per_batch=16384).max_tokens
    (256, 576, 1024)
    """

    size: int = 16
    max_tokens: typing.Any = 256
    tokens_per_batch: int | None = None
    batch_divisor: int = 8
    pack: bool = False
    image_tokens: int | None = None
    pack_window: int = 256

    def __post_init__(self):
        _positive("size", self.size, contract.MAX_OUT_SIDE)
        object.__setattr__(self, "size", int(self.size))
        lengths = self.max_tokens
        if contract.is_integer(lengths):
            lengths = _positive("max_tokens", lengths)
        else:
            bad = f"max_tokens must be an integer >= 1 or a non-empty list of them, got {lengths!r}"
            try:
                lengths = tuple(sorted({_positive("max_tokens", v) for v in lengths}))
            except TypeError:
                raise ValueError(bad) from None
            if not lengths:
                raise ValueError(bad)
        object.__setattr__(self, "max_tokens", lengths)
        scheduled = isinstance(lengths, tuple)
        if scheduled and self.tokens_per_batch is None:
            raise ValueError(
                f"max_tokens={lengths!r} (a schedule of lengths) needs tokens_per_batch, the token budget of a step"
            )
        if not scheduled and self.tokens_per_batch is not None:
            raise ValueError(
                f"tokens_per_batch={self.tokens_per_batch!r} applies to a list of max_tokens "
                f"only; with one length the loader's batch_size sets the batch"
            )
        if scheduled:
            _positive("tokens_per_batch", self.tokens_per_batch)
        _positive("batch_divisor", self.batch_divisor)
        if not isinstance(self.pack, (bool, np.bool_)):
            raise ValueError(f"pack must be True or False, got {self.pack!r}")
        object.__setattr__(self, "pack", bool(self.pack))
        if self.pack and scheduled:
            raise ValueError(
                f"pack=True with max_tokens={lengths!r}: packing fills one sequence length; give one max_tokens"
            )
        if not self.pack and self.image_tokens is not None:
            raise ValueError(f"image_tokens={self.image_tokens!r} applies to pack=True only")
        if self.pack:
            cap = self.image_tokens if self.image_tokens is not None else max(1, lengths // 4)
            object.__setattr__(self, "image_tokens", _positive("image_tokens", cap, lengths))
        _positive("pack_window", self.pack_window)


def _bisect_state(h, w, patch, max_tokens, xp):
    """big_vision's prepare_target_hw and is_feasible over float32 arrays."""
    p = xp.float32(patch)

    def target(ratio):
        th = xp.maximum(p * xp.ceil(h * ratio / p), p).astype(xp.int32)
        tw = xp.maximum(p * xp.ceil(w * ratio / p), p).astype(xp.int32)
        return th, tw

    def feasible(ratio):
        th, tw = target(ratio)
        gh, gw = th // patch, tw // patch
        return gw <= max_tokens // gh  # gh·gw <= max_tokens, without the product

    def step(lb, rb):
        mid = (lb + rb) / xp.float32(2)
        ok = feasible(mid)
        live = (rb - lb) >= _EPS
        return xp.where(live & ok, mid, lb), xp.where(live & ~ok, mid, rb)

    return target, step


def sequence_size(heights, widths, patch: int, max_tokens: int, *, xp=np):
    """(heights', widths') int32: big_vision's ``resize_to_sequence`` size of each h×w input
    for patch side `patch` and at most `max_tokens` patches. Vectorised; NumPy refuses, naming
    it, a side outside [1, MAX_SIDE].

    >>> sequence_size(np.array([48, 256]), np.array([48, 64]), 3, 121)[0].tolist()
    [33, 60]
    """
    patch = _positive("patch", patch, contract.MAX_OUT_SIDE)
    max_tokens = _positive("max_tokens", max_tokens)
    if xp is np:
        for name, a in (("height", np.asarray(heights)), ("width", np.asarray(widths))):
            bad = (a < 1) | (a > contract.MAX_SIDE)
            if a.dtype.kind not in "iu" or bad.any():
                k = int(np.argmax(bad)) if a.dtype.kind in "iu" else 0
                raise ValueError(
                    f"record {k}: {name} must be an integer in [1, {contract.MAX_SIDE}], got {a.reshape(-1)[k]}"
                )
    h = xp.asarray(heights).astype(xp.float32)
    w = xp.asarray(widths).astype(xp.float32)
    target, step = _bisect_state(h, w, patch, max_tokens, xp)
    # From h, not xp.full: inside jax.shard_map the loop's carry must vary over the axes h does.
    lb = h * np.float32(0) + _LO
    rb = h * np.float32(0) + _HI
    if xp is np:
        while ((rb - lb) >= _EPS).any():
            lb, rb = step(lb, rb)
    else:
        loop = order.while_loop(xp)
        lb, rb = loop(lambda s: xp.any((s[1] - s[0]) >= _EPS), lambda s: step(*s), (lb, rb))
    return target(lb)


def max_taps(max_side: int, patch: int, max_tokens: int) -> int:
    """A bound on the resize taps per axis (kernel.h: ``2·max(s, n) // n + 1`` for a box side s
    resized to n) of every box of sides at most `max_side` resized to its `sequence_size` at
    (`patch`, `max_tokens`): what the pure-JAX twin sizes its weights by for NaFlex rows, instead
    of the ``2·max_side // patch + 1`` any shrink to one patch needs.

    Why it holds: with q = floor(sqrt(max_tokens)), every ratio r <= r_f = p·(q - 1/2) / max_side
    is feasible (each side's ceil(side·r / p) <= q, float32's rounding far inside the half, so
    q·q <= max_tokens patches), and feasibility grows with r, so the bisection's upper end stays
    above min(r_f, 100) and its last feasible ratio lb above that less 2·1e-5 (and >= 1e-6). A side
    s goes to n >= s·lb (up to float32's rounding), so 2·s / n <= 2 / lb, and 3 taps when n >= s.
    tests/test_naflex_taps.py sweeps sizes against it.

    >>> max_taps(4000, 16, 256), 2 * 4000 // 16 + 1
    (33, 501)
    """
    p, side = _positive("patch", patch, contract.MAX_OUT_SIDE), _positive("max_side", max_side)
    q = int(np.sqrt(_positive("max_tokens", max_tokens)))
    while (q + 1) * (q + 1) <= max_tokens:  # floor(sqrt) exactly, whatever the float rounding
        q += 1
    while q * q > max_tokens:
        q -= 1
    lb = max(min(p * (q - 0.5) / side, float(_HI)) - 2 * float(_EPS), float(_LO))
    bound = max(3, int(2 / (lb * (1 - 1e-6))) + 1)
    return min(bound, 2 * max(side, p) // p + 1)


def patch_coords(grid_h, grid_w, max_tokens: int, *, xp=np):
    """(patch_yx int32 (..., T, 2), patch_valid bool (..., T)) of rows of gh×gw patch grids
    (integer arrays of one shape) in sequences of T = `max_tokens`: row k is patch
    (k // gw, k % gw) while k < gh·gw, zeros after.

    >>> yx, valid = patch_coords(np.array(2), np.array(3), 8)
    >>> yx[:, 0].tolist(), yx[:, 1].tolist(), valid.tolist()
    ([0, 0, 0, 1, 1, 1, 0, 0], [0, 1, 2, 0, 1, 2, 0, 0], [True, True, True, True, True, True, False, False])
    """
    gh = xp.asarray(grid_h, xp.int32)[..., None]
    gw = xp.asarray(grid_w, xp.int32)[..., None]
    k = xp.arange(max_tokens, dtype=xp.int32)
    valid = k < gh * gw
    yx = xp.stack([xp.where(valid, k // gw, 0), xp.where(valid, k % gw, 0)], axis=-1)
    return yx.astype(xp.int32), valid


def patchify(image: np.ndarray, patch: int, max_tokens: int) -> np.ndarray:
    """The row of a resized (H, W, C) image, H and W multiples of `patch`: (max_tokens,
    patch·patch·C), patch (gy, gx) at row gy·gw + gx, its pixels (py, px, c) in that order,
    zeros past gh·gw. The layout the kernel must match byte for byte."""
    image = np.asarray(image)
    hh, ww, c = image.shape
    if hh % patch or ww % patch:
        raise ValueError(f"image {hh}x{ww} is not whole {patch}x{patch} patches")
    gh, gw = hh // patch, ww // patch
    if gh * gw > max_tokens:
        raise ValueError(f"image {hh}x{ww} has {gh * gw} patches of {patch}, more than max_tokens {max_tokens}")
    row = np.zeros((max_tokens, patch * patch * c), image.dtype)
    row[: gh * gw] = image.reshape(gh, patch, gw, patch, c).swapaxes(1, 2).reshape(gh * gw, -1)
    return row


def unpatchify(row: np.ndarray, height: int, width: int, patch: int) -> np.ndarray:
    """The (height, width, C) image whose `patchify` is `row` (its first gh·gw rows)."""
    row = np.asarray(row)
    gh, gw = height // patch, width // patch
    c = row.shape[-1] // (patch * patch)
    return row[: gh * gw].reshape(gh, gw, patch, patch, c).swapaxes(1, 2).reshape(height, width, c)


def length_batch_size(tokens_per_batch: int, seq_len, divisor: int = 1):
    """timm's ``calculate_naflex_batch_size`` (floor rounding) in integers: the batch size of a
    step of length `seq_len` (an int or an integer array)."""
    seq_len = np.asarray(seq_len, np.int64)
    size = tokens_per_batch // (seq_len * divisor) * divisor if divisor > 1 else tokens_per_batch // seq_len
    return np.maximum(size, 1)


class LengthSchedule(typing.NamedTuple):
    """An epoch's steps from `start`: step s has length ``seq_len[s]``, a batch of
    ``batch_size[s]`` rows (the shape), its first ``count[s]`` rows the records at positions
    ``first[s]`` … of the epoch's order (`step_indices`), the rest padding."""

    seq_len: np.ndarray  # int32 (S,)
    batch_size: np.ndarray  # int32 (S,)
    first: np.ndarray  # int64 (S,)
    count: np.ndarray  # int32 (S,)


def length_schedule(
    n: int, patches: Patches, *, seed: int, epoch: int, drop_remainder: bool, shuffle: bool = True, start: int = 0
) -> LengthSchedule:
    """The steps of epoch `epoch` of n records from step `start` under a schedule of lengths
    (``patches.max_tokens`` a list): timm's rule, keyed by (seed, epoch, step).

    >>> p = Patches(max_tokens=[256, 1024], tokens_per_batch=4096, batch_divisor=1)
    >>> s = length_schedule(100, p, seed=0, epoch=0, drop_remainder=False)
    >>> int(s.count.sum()), bool((s.seq_len * s.batch_size <= 4096).all())
    (100, True)
    """
    if not isinstance(patches.max_tokens, tuple):
        raise ValueError(f"length_schedule needs a list of max_tokens, got {patches.max_tokens!r}")
    seed, epoch = order.check_seed_epoch(seed, epoch)
    n = _positive("n (the number of records)", n)
    lengths = np.array(patches.max_tokens, np.int64)
    sizes = length_batch_size(patches.tokens_per_batch, lengths, patches.batch_divisor)
    # Enough draws to cover n at the smallest batch, then cut where they first cover it.
    draws = -(-n // int(sizes.min()))
    u = order.random_bits(np.arange(draws), np.uint32(_COUNTER_LENGTH), seed, 0)
    choice = (u.astype(np.uint64) * np.uint64(len(lengths))) >> np.uint64(32)
    full = sizes[choice]
    ends = np.cumsum(full)
    total = int(np.searchsorted(ends, n)) + 1  # batches until they cover n
    choice, full = choice[:total], full[:total]
    count = full.copy()
    count[-1] = n - (ends[total - 2] if total > 1 else 0)
    if drop_remainder and count[-1] < full[-1]:
        choice, full, count, total = choice[:-1], full[:-1], count[:-1], total - 1
    if not contract.is_integer(start) or not 0 <= start <= total:
        raise ValueError(f"start (a step of the epoch) must be an integer in [0, {total}], got {start!r}")
    if total and shuffle:
        # Steps are the canonical batches in an epoch's order, filled front to back.
        perm = order.permute(np.arange(total), total, seed ^ (TAG_LENGTHS << 32), epoch)
    else:
        perm = np.arange(total)
    first = np.cumsum(count[perm]) - count[perm]
    w = perm[start:]
    return LengthSchedule(
        lengths[choice[w]].astype(np.int32),
        full[w].astype(np.int32),
        first[start:].astype(np.int64),
        count[w].astype(np.int32),
    )


def step_indices(
    schedule: LengthSchedule, s: int, n: int, *, seed: int, epoch: int, shuffle: bool = True
) -> np.ndarray:
    """int64 (batch_size[s],) record indices of step s of `schedule`, -1 for padding."""
    pos = schedule.first[s] + np.arange(schedule.batch_size[s])
    valid = pos < schedule.first[s] + schedule.count[s]
    rec = order.permute(np.where(valid, pos, 0), n, seed, epoch, shuffle=shuffle)
    return np.where(valid, rec, -1)


class Packing(typing.NamedTuple):
    """Where each record of a stream sits: sequence ``seq[i]`` (numbered over the stream) from
    token ``offset[i]``; ``sequences`` in all."""

    seq: np.ndarray  # int64 (N,)
    offset: np.ndarray  # int32 (N,)
    sequences: int


def pack(tokens, max_tokens: int, window: int) -> Packing:
    """First-fit-decreasing of records of `tokens` patches (in stream order, each <= max_tokens)
    into sequences of `max_tokens`, in independent windows of `window` records.

    >>> pk = pack(np.array([3, 5, 2, 4]), 8, window=4)
    >>> pk.seq.tolist(), pk.offset.tolist(), pk.sequences
    ([0, 0, 1, 1], [5, 0, 4, 0], 2)
    """
    t = np.asarray(tokens, np.int64)
    if t.ndim != 1 or not len(t) or t.min() < 1 or t.max() > max_tokens:
        bad = int(np.argmax((t < 1) | (t > max_tokens))) if t.ndim == 1 and len(t) else None
        raise ValueError(
            f"tokens must be a non-empty 1-D array of counts in [1, {max_tokens}]"
            + (f"; record {bad} has {int(t[bad])}" if bad is not None else "")
        )
    n, window = len(t), _positive("window", window)
    nw = -(-n // window)
    padded = np.zeros(nw * window, np.int64)  # 0: no record (the last window's tail)
    padded[:n] = t
    padded = padded.reshape(nw, window)
    # Largest first; ties by position (a stable sort of the negated counts).
    rank = np.argsort(-padded, axis=1, kind="stable")
    room = np.full((nw, 1), max_tokens, np.int64)  # bins used so far + one empty
    seq = np.zeros((nw, window), np.int64)
    offset = np.zeros((nw, window), np.int64)
    rows = np.arange(nw)
    for i in range(window):
        col = rank[:, i]
        need = padded[rows, col]
        fits = room >= need[:, None]
        j = np.argmax(fits, axis=1)  # the first bin with room (the empty one fits)
        offset[rows, col] = max_tokens - room[rows, j]
        seq[rows, col] = j
        room[rows, j] -= need
        if (room[:, -1] < max_tokens).any():  # the spare bin was opened: add another
            room = np.concatenate([room, np.full((nw, 1), max_tokens, np.int64)], axis=1)
    used = (room < max_tokens).sum(axis=1)  # bins are used as a prefix
    first_seq = np.cumsum(used) - used
    seq = (seq + first_seq[:, None]).reshape(-1)[:n]
    return Packing(seq, offset.reshape(-1)[:n].astype(np.int32), int(used.sum()))


def segment_ids(packing: Packing, tokens, max_tokens: int) -> np.ndarray:
    """int32 (sequences, max_tokens): 1, 2, … for the images of each sequence in the order of
    their offsets, 0 for padding."""
    t = np.asarray(tokens, np.int64)
    seq, off = packing.seq, packing.offset.astype(np.int64)
    order_in_seq = np.lexsort((off, seq))
    starts = np.searchsorted(seq[order_in_seq], seq[order_in_seq], side="left")
    number = np.empty(len(t), np.int32)
    number[order_in_seq] = np.arange(len(t)) - starts + 1
    out = np.zeros((packing.sequences, max_tokens), np.int32)
    cells = np.repeat(seq * max_tokens + off, t) + (np.arange(t.sum()) - np.repeat(np.cumsum(t) - t, t))
    out.reshape(-1)[cells] = np.repeat(number, t)
    return out

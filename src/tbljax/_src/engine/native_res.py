"""Native-resolution serving (issue 49) as the host loaders run it: aspect-ratio buckets
(`rules/buckets.py`: each global step one bucket, records covered and cropped to it) and NaFlex
patch sequences (`rules/naflex.py`: each record resized to its own patch grid, written as a
sequence of patches). The rules decide; this module turns their tables into the kernel's
arguments (boxes, flips, an output size per step or per group of rows) and the conditioning
arrays of a batch.

>>> nr = serving(ds.geometry, len(ds), LoaderOptions(batch_size=8, buckets=Buckets(...)), 8)
>>> nr.steps, nr.out_hw(0, 3 * 8)   # steps an epoch; the size of step 3 of epoch 0
"""

from __future__ import annotations

import functools

import numpy as np

from tbljax._src.rules import augment as _augment
from tbljax._src.rules import buckets as _buckets
from tbljax._src.rules import naflex
from tbljax._src.rules.options import LoaderOptions

__all__ = [
    "CONDITIONING",
    "PATCH_KEYS",
    "BucketServing",
    "PatchServing",
    "Scratch",
    "fill_by_size",
    "schedule_name",
    "serving",
]

CONDITIONING = ("orig_hw", "crop_yx", "bucket")  # the batch keys buckets add
PATCH_KEYS = ("patch_yx", "patch_valid")  # the batch keys patches add


def _sizes_of(geometry, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every record's stored (heights, widths), int64 (n,)."""
    h, w = (np.broadcast_to(np.asarray(a, np.int64), (n,)) for a in (geometry.heights, geometry.widths))
    return h, w


def _flips(opts: LoaderOptions, idx, epoch: int):
    """The flips of samples `idx` (the augmentation's, counter 40, as without buckets) or None."""
    aug = opts.augment
    if aug is None or not aug.flip:
        return None
    return _augment.sample(_augment.Augment(crop=False), idx, height=1, width=1, seed=opts.seed, epoch=epoch)[1]


class BucketServing:
    """The bucket schedule of a loader: every record's bucket (fixed: its stored size), the
    steps of an epoch (the same every epoch: each bucket's batch count), each step's bucket and
    rows (`buckets.epoch_schedule`, one epoch kept at a time)."""

    def __init__(self, geometry, n: int, opts: LoaderOptions, global_batch: int):
        self.opts, self.g = opts, int(global_batch)
        b = opts.buckets
        self.sizes = _buckets.bucket_sizes(b)
        self.heights, self.widths = _sizes_of(geometry, n)
        self.bucket = _buckets.assign(self.heights, self.widths, self.sizes)
        counts = np.bincount(self.bucket, minlength=len(self.sizes))
        per = counts // self.g if opts.drop_remainder else -(-counts // self.g)
        self.steps = int(per.sum())
        self._schedule = functools.lru_cache(maxsize=2)(self._epoch)

    def _epoch(self, epoch: int) -> _buckets.BucketSchedule:
        o = self.opts
        return _buckets.epoch_schedule(
            self.bucket, self.g, seed=o.seed, epoch=epoch, drop_remainder=o.drop_remainder, shuffle=o.shuffle
        )

    @property
    def largest(self) -> tuple[int, int]:
        """The bucket of most pixels: what a ring slot must hold."""
        k = int(np.argmax(self.sizes[:, 0].astype(np.int64) * self.sizes[:, 1]))
        return int(self.sizes[k, 0]), int(self.sizes[k, 1])

    def step_of(self, epoch: int, first: int) -> tuple[int, np.ndarray]:
        """(bucket, G global record indices, -1 padding) of the step at position `first`
        (positions count G a step)."""
        s = self._schedule(int(epoch))
        k = first // self.g
        return int(s.bucket[k]), s.indices[k]

    def out_hw(self, epoch: int, first: int) -> tuple[int, int]:
        h, w = self.sizes[self.step_of(epoch, first)[0]]
        return int(h), int(w)

    def draw(self, epoch: int, first: int, a: int, b: int):
        """(indices, boxes, flips) of rows [a, b) of the step at `first`: the valid rows only
        (padding rows are a suffix of the global batch, so of each range)."""
        idx = self.step_of(epoch, first)[1][a:b]
        idx = idx[idx >= 0]
        o = self.opts
        boxes = _buckets.cover_boxes(
            idx, self.heights, self.widths, self.bucket, self.sizes, crop=o.buckets.crop, seed=o.seed, epoch=epoch
        )
        return idx, boxes, _flips(o, idx, epoch)

    def arrays(self, epoch: int, first: int, drawn, rows) -> dict:
        """The conditioning of the step: ``orig_hw`` (B, 2) and ``crop_yx`` (B, 2) int32 (zeros
        on padding rows), ``bucket`` (B,) int32 (the step's bucket on every row), per range."""
        k = self.step_of(epoch, first)[0]
        out = {name: [] for name in CONDITIONING}
        for d, r in zip(drawn, rows):
            n = len(d.indices)
            hw = np.zeros((r, 2), np.int32)
            hw[:n] = np.stack([self.heights[d.indices], self.widths[d.indices]], -1)
            yx = np.zeros((r, 2), np.int32)
            yx[:n] = d.boxes[:, :2]
            out["orig_hw"].append(hw)
            out["crop_yx"].append(yx)
            out["bucket"].append(np.full(r, k, np.int32))
        return out


class PatchServing:
    """NaFlex rows: each sample's box (the augmentation's crop, or the whole record) resized to
    big_vision's sequence size (`naflex.sequence_size`) and written as a (max_tokens, p·p·3)
    sequence of patches (`naflex.patchify`'s layout)."""

    def __init__(self, geometry, n: int, opts: LoaderOptions):
        self.opts = opts
        self.patches = opts.patches
        self.heights, self.widths = _sizes_of(geometry, n)
        p = self.patches
        self.row_shape = (p.max_tokens, p.size * p.size * 3)

    def boxes(self, idx, boxes):
        """The drawn boxes, or each record whole."""
        if boxes is not None:
            return np.asarray(boxes, np.int32)
        idx = np.asarray(idx, np.int64)
        z = np.zeros(len(idx), np.int64)
        return np.stack([z, z, self.heights[idx], self.widths[idx]], -1).astype(np.int32)

    def sizes(self, boxes) -> tuple[np.ndarray, np.ndarray]:
        p = self.patches
        return naflex.sequence_size(boxes[:, 2], boxes[:, 3], p.size, p.max_tokens)

    def row_sizes(self, idx, boxes) -> np.ndarray:
        """Each row's (h, w) at its sequence size, (rows, 2): the size its ops are drawn at."""
        return np.stack(self.sizes(self.boxes(idx, boxes)), -1)

    def fill(self, src, records, out, *, boxes, flip, mean, std, **kw):
        """Writes records `records` (boxes `boxes`) as patch rows into `out` (rows, T, p·p·3):
        one kernel call, each row resized to its own size and written straight into its
        patches (`tbljax.kernels.gather`'s patches=)."""
        th, tw = self.sizes(boxes)
        hw = np.stack([th, tw], -1)
        patches = (self.patches.size, hw.astype(np.int32))
        src.fill(records, out, layout="NHWC", crop=boxes, flip=flip, mean=mean, std=std, patches=patches, **kw)
        return hw

    def arrays(self, hws, rows) -> dict:
        """``patch_yx`` (B, T, 2) int32 and ``patch_valid`` (B, T) bool per range (zeros and
        False on padding rows)."""
        p, t = self.patches.size, self.patches.max_tokens
        out = {name: [] for name in PATCH_KEYS}
        for hw, r in zip(hws, rows):
            gh = np.zeros(r, np.int32)
            gw = np.ones(r, np.int32)
            gh[: len(hw)], gw[: len(hw)] = hw[:, 0] // p, hw[:, 1] // p
            yx, valid = naflex.patch_coords(gh, gw, t)
            out["patch_yx"].append(yx)
            out["patch_valid"].append(valid)
        return out


class Scratch:
    """A flat buffer reused across steps (only the loader's build thread fills it): fresh
    memory each call costs its first-touch page faults, about as much as the kernel."""

    def __init__(self):
        self._buf = np.empty(0, np.uint8)

    def __call__(self, size: int, dtype) -> np.ndarray:
        """`size` values of `dtype` (the previous call's are overwritten)."""
        if self._buf.dtype != dtype or self._buf.size < size:
            self._buf = np.empty(size, dtype)
        return self._buf[:size]


def fill_by_size(src, records, hw, scratch: Scratch, *, boxes, flip, dtype, **kw):
    """Rows whose output sizes differ: for each distinct (h, w) of `hw` (rows, 2), the kernel
    once (`src.fill`, NHWC) on its rows' `boxes` and `flip` into a `scratch` image of `dtype`;
    yields (the rows, an index array; their (len, h, w, 3) images, valid until the next item).
    `kw`: the rest of `src.fill`'s arguments (``started`` is called before the first kernel
    call only)."""
    keys, group = np.unique(np.asarray(hw), axis=0, return_inverse=True)
    group = group.reshape(-1)
    for g, (h, w) in enumerate(keys.tolist()):
        m = np.flatnonzero(group == g)
        img = scratch(len(m) * h * w * 3, dtype).reshape(len(m), h, w, 3)
        src.fill(records[m], img, layout="NHWC", crop=boxes[m], flip=None if flip is None else flip[m], **kw)
        kw.pop("started", None)  # called once, before the first kernel call
        yield m, img


def serving(geometry, n: int, opts: LoaderOptions, global_batch: int):
    """The loader's native-resolution serving (`BucketServing`, `PatchServing`), or None."""
    if opts.buckets is not None:
        return BucketServing(geometry, n, opts, global_batch)
    if opts.patches is not None:
        return PatchServing(geometry, n, opts)
    return None


def schedule_name(opts: LoaderOptions) -> str | None:
    """The name of the schedule of records `opts` serves by (buckets, a length schedule, packing),
    or None (one max_tokens, or neither: each row its own record's, whatever the order)."""
    p = opts.patches
    if opts.buckets is not None:
        return "buckets"
    if p is not None and p.pack:
        return "patches with pack=True"
    if p is not None and isinstance(p.max_tokens, tuple):
        return "patches with a length schedule"
    return None


def check_names(names) -> None:
    """Refuses a served field whose name is a key buckets or patches add to the batch."""
    clash = sorted(set(names) & set(CONDITIONING + PATCH_KEYS))
    if clash:
        raise ValueError(
            f"the dataset's field(s) {clash} have the names of batch keys buckets/patches add; "
            "leave them out with fields=[...]"
        )

"""Issue 49 through the real host loader: aspect-ratio buckets (every record once an epoch,
one bucket per step, pixels the NumPy oracle's cover-crop of each record, the conditioning
keys, resume equal to the tail) and NaFlex patch sequences (un-patchifying a row gives the
oracle's resize of the record to big_vision's sequence size, bit for bit); and the
combinations refused by name."""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tbljax
from tbljax._src.engine import naflex_pack, native_res
from tbljax._src.rules import augment as _augment
from tbljax._src.rules import buckets as _buckets
from tbljax._src.rules import erasing, naflex, order, pixel_ops, randaug

import oracle
from _loader_testing import two_host_parts

SIZES = [(20, 14), (9, 30), (33, 33), (5, 7), (40, 12), (17, 23), (64, 48), (12, 61), (26, 19), (48, 64), (8, 8)]
BUCKETS = tbljax.Buckets(sizes=[(8, 16), (12, 12), (16, 8)], crop="random")
SEED = 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(7)
    imgs = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]
    path = str(tmp_path_factory.mktemp("native_res") / "mixed.tbl")
    with tbljax.Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(labels=np.arange(len(imgs)) * 2)
    return imgs, path


def _bucket_loader(path, **kw):
    kw = dict(buckets=BUCKETS, seed=SEED, dtype="uint8", augment="flip", drop_remainder=False) | kw
    return tbljax.loader(path, 3, **kw)


def _flips(idx, epoch):
    # The flip rule without buckets: counter 40 of (seed, epoch, index).
    return _augment.sample(_augment.Augment(crop=False), idx, height=1, width=1, seed=SEED, epoch=epoch)[1]


def test_buckets_serve_every_record_once_at_its_bucket_as_the_oracle_crops_it(data):
    imgs, path = data
    h = np.array([s[0] for s in SIZES])
    w = np.array([s[1] for s in SIZES])
    # The bucket each record belongs to, by aspect ratio in plain float (no tie in these sizes).
    aspects = np.array([16 / 8, 12 / 12, 8 / 16])
    want_size = [(8, 16), (12, 12), (16, 8)]
    for epoch in (0, 1):
        ld = _bucket_loader(path, num_epochs=epoch + 1)
        ld.set_epoch(epoch)
        seen = []
        for b in ld:
            valid = np.asarray(b["valid"])
            idx = np.asarray(b["index"])[valid]
            image = np.asarray(b["image"])
            seen += idx.tolist()
            assert valid[: valid.sum()].all()  # padding only at the end
            k = int(np.asarray(b["bucket"])[0])
            assert (np.asarray(b["bucket"]) == k).all()
            sizes = {want_size[int(np.argmin(np.abs(np.log(w[i] / h[i]) - np.log(aspects))))] for i in idx}
            assert len(sizes) == 1 and image.shape[1:3] == sizes.pop()  # one shape, the bucket's
            oh, ow = image.shape[1:3]
            np.testing.assert_array_equal(np.asarray(b["orig_hw"])[valid], np.stack([h[idx], w[idx]], -1))
            yx = np.asarray(b["crop_yx"])[valid]
            for r, (i, flip) in enumerate(zip(idx, _flips(idx, epoch))):
                # The box: the largest of the bucket's aspect inside the record, at crop_yx.
                bh, bw = (h[i], round(h[i] * ow / oh)) if w[i] * oh > h[i] * ow else (round(w[i] * oh / ow), w[i])
                y0, x0 = yx[r]
                assert 0 <= y0 <= h[i] - bh and 0 <= x0 <= w[i] - bw
                want = oracle.crop_resize(imgs[i], (y0, x0, bh, bw), oh, ow)
                np.testing.assert_array_equal(image[r], want[:, ::-1] if flip else want)
            assert not image[~valid].any()
        assert sorted(seen) == list(range(len(SIZES)))  # every record once


def test_buckets_run_the_ops_and_erasing_at_the_buckets_size_as_pixel_ops_does(data):
    # The per-image ops stage at each step's bucket: each row is the oracle's cover-crop (at
    # crop_yx, the bucket rule the test above holds) and flip, then pixel_ops' program of the
    # row's decided ops, the contract's normalization and pixel_ops' erasing at the bucket's size.
    imgs, path = data
    ra = tbljax.RandAugment(num_ops=2, magnitude=9, prob=1.0)
    aug = tbljax.Augment(crop=False, size=None, ops=[ra], erasing=tbljax.RandomErasing(p=1.0, mode="pixel"))
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    ld = _bucket_loader(path, augment=aug, dtype="float32", mean=mean, std=std, num_epochs=1)
    slot = {k: getattr(ra, k) for k in ("fill", "interpolation", "translate_const", "translate_pct")}
    h, w = np.array([s[0] for s in SIZES]), np.array([s[1] for s in SIZES])
    rows = 0
    for b in ld:
        valid = np.asarray(b["valid"])
        idx, image, yx = np.asarray(b["index"])[valid], np.asarray(b["image"]), np.asarray(b["crop_yx"])[valid]
        oh, ow = image.shape[1:3]
        codes, args = randaug.decide((ra,), idx.astype(np.int64), seed=SEED, epoch=0)
        eb, keys = erasing.decide_erasing(aug.erasing, idx.astype(np.int64), height=oh, width=ow, seed=SEED, epoch=0)
        for r, (i, flip) in enumerate(zip(idx, _flips(idx, 0))):
            bh, bw = (h[i], round(h[i] * ow / oh)) if w[i] * oh > h[i] * ow else (round(w[i] * oh / ow), w[i])
            px = oracle.crop_resize(imgs[i], (*yx[r], bh, bw), oh, ow)
            px = np.ascontiguousarray(px[:, ::-1] if flip else px)
            px = pixel_ops.apply_all(px, codes[r], args[r], **slot)
            norm = oracle.normalize(px[None], mean, std, np.float32)[0]
            want = pixel_ops.erase(norm.transpose(2, 0, 1), eb[r], keys[r], "pixel").transpose(1, 2, 0)
            np.testing.assert_array_equal(image[r], want)
            rows += 1
    assert rows == len(SIZES)


def test_buckets_resume_equals_the_tail_and_refuse_other_buckets_mid_epoch(data):
    _, path = data
    full = [{k: np.asarray(v) for k, v in b.items()} for b in _bucket_loader(path, num_epochs=2)]
    ld = _bucket_loader(path, num_epochs=2)
    it = iter(ld)
    for _ in range(3):
        next(it)
    state = ld.state_dict()
    ld.close()
    again = _bucket_loader(path, num_epochs=2)
    again.load_state_dict(state)
    tail = [{k: np.asarray(v) for k, v in b.items()} for b in again]
    assert len(tail) == len(full) - 3
    for a, b in zip(tail, full[3:]):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    other = _bucket_loader(path, num_epochs=2, buckets=tbljax.Buckets(sizes=[(10, 10), (10, 20)]))
    with pytest.raises(ValueError, match="mid-epoch .* buckets"):
        other.load_state_dict(state)


def test_patches_rows_unpatchify_to_the_oracle_resize_at_the_sequence_size(data):
    imgs, path = data
    p, t = 4, 20
    ld = tbljax.loader(
        path,
        4,
        patches=tbljax.Patches(size=p, max_tokens=t),
        seed=SEED,
        dtype="uint8",
        num_epochs=1,
        augment="flip",
        drop_remainder=False,
    )
    seen = []
    for b in ld:
        image, yx, pv = (np.asarray(b[k]) for k in ("image", "patch_yx", "patch_valid"))
        assert image.shape[1:] == (t, p * p * 3)
        valid = np.asarray(b["valid"])
        for r, i in enumerate(np.asarray(b["index"])[valid]):
            seen.append(int(i))
            hh, ww = (int(v[0]) for v in naflex.sequence_size(np.array([SIZES[i][0]]), np.array([SIZES[i][1]]), p, t))
            gh, gw = hh // p, ww // p
            want = oracle.crop_resize(imgs[i], (0, 0, *SIZES[i]), hh, ww)
            if _flips(np.array([i]), 0)[0]:
                want = want[:, ::-1]
            np.testing.assert_array_equal(naflex.unpatchify(image[r], hh, ww, p), want)
            assert not image[r, gh * gw :].any() and pv[r].sum() == gh * gw and not pv[r, gh * gw :].any()
            np.testing.assert_array_equal(yx[r, : gh * gw], np.stack(np.divmod(np.arange(gh * gw), gw), -1))
        assert not image[~valid].any() and not pv[~valid].any()
    assert sorted(seen) == list(range(len(SIZES)))


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_patches_run_the_ops_at_each_rows_own_size_as_pixel_ops_does(data, dtype):
    # The per-image ops stage at each row's sequence size: the oracle's resize of the random
    # crop to that size, its flip, pixel_ops' program of the row's decided ops (the affine ops'
    # matrices at the row's own size), the contract's normalization and (float32) pixel_ops'
    # erasing at the row's own size, patchified in NumPy.
    imgs, path = data
    p, t = 4, 20
    ra = tbljax.RandAugment(num_ops=2, magnitude=9, prob=1.0)
    er = tbljax.RandomErasing(p=1.0, mode="pixel", max_count=2) if dtype == "float32" else None
    aug = tbljax.Augment(size=None, ops=[ra], erasing=er)
    mean, std = ((0.5, 0.4, 0.3), (0.2, 0.25, 0.3)) if dtype == "float32" else (None, None)
    opts = dict(patches=tbljax.Patches(size=p, max_tokens=t), seed=SEED, num_epochs=1, drop_remainder=False)
    ld = tbljax.loader(path, 4, augment=aug, dtype=dtype, mean=mean, std=std, **opts)
    slot = {k: getattr(ra, k) for k in ("fill", "interpolation", "translate_const", "translate_pct")}
    geometry = tbljax.augment.RecordGeometry(*np.array(SIZES).T)
    rows, affine, erased = 0, 0, 0
    for b in ld:
        valid = np.asarray(b["valid"])
        idx, image = np.asarray(b["index"])[valid].astype(np.int64), np.asarray(b["image"])
        boxes, flips = tbljax.augment.sample(aug, idx, geometry=geometry, seed=SEED, epoch=0)
        codes, args = randaug.decide((ra,), idx, seed=SEED, epoch=0)
        th, tw = naflex.sequence_size(boxes[:, 2], boxes[:, 3], p, t)
        affine += int(np.isin(codes, sorted(pixel_ops.AFFINE)).sum())
        for r, i in enumerate(idx):
            px = oracle.crop_resize(imgs[i], boxes[r], int(th[r]), int(tw[r]))
            px = pixel_ops.apply_all(np.ascontiguousarray(px[:, ::-1] if flips[r] else px), codes[r], args[r], **slot)
            if er is not None:
                eb, keys = erasing.decide_erasing(
                    er, idx[r : r + 1], height=int(th[r]), width=int(tw[r]), seed=SEED, epoch=0
                )
                px = oracle.normalize(px[None], mean, std, np.float32)[0].transpose(2, 0, 1)
                px = pixel_ops.erase(px, eb[0], keys[0], "pixel").transpose(1, 2, 0)
                erased += int((eb[0, :, 2] > 0).sum())
            np.testing.assert_array_equal(image[r], _patch_row(px, p, t))
            rows += 1
    assert rows == len(SIZES) and affine > 0  # some rows' matrices are their own size's
    assert er is None or erased > 0


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(buckets=BUCKETS, augment="rrc_flip"), "buckets with an Augment crop"),
        (dict(buckets=BUCKETS, patches=tbljax.Patches()), "buckets and patches together"),
        (dict(buckets=BUCKETS, repeats=2), "buckets with repeats=2"),
        (dict(patches=tbljax.Patches(), layout="NCHW"), "patches with layout='NCHW'"),
        (dict(patches=tbljax.Patches(), augment=tbljax.Augment(size=(8, 8))), "patches with an Augment size"),
        (dict(buckets=(8, 8)), "buckets must be None or a tbljax.Buckets"),
    ],
)
def test_unserved_combinations_are_refused_by_name(kw, words):
    with pytest.raises((ValueError, TypeError), match=words):
        tbljax.LoaderOptions(batch_size=2, **kw)


def test_auto_buckets_need_a_pixel_budget_and_take_it_from_buckets(data):
    _, path = data
    with pytest.raises(ValueError, match="pixel budget"):
        _bucket_loader(path, buckets=tbljax.Buckets())
    ld = _bucket_loader(path, buckets=tbljax.Buckets(pixels=16 * 16, multiple=8), num_epochs=1)
    sizes = {tuple(int(v) for v in s) for s in _buckets.auto_sizes(16 * 16, 8)}
    assert all(tuple(np.asarray(b["image"]).shape[1:3]) in sizes for b in ld)


def _adapter(name):
    """tbljax.torch or tbljax.mlx, and its arrays as NumPy (skipped where not installed)."""
    if name == "torch":
        pytest.importorskip("torch")
        import tbljax.torch

        return tbljax.torch, lambda a: a.numpy()
    pytest.importorskip("mlx.core")
    import tbljax.mlx

    return tbljax.mlx, np.array


def _patch_rows(path, epoch=0, **kw):
    """{record: (image, patch_yx, patch_valid)} of epoch `epoch` of the single-file loader at
    max_tokens=20: the reference a host part's or a mixture's row of the same record must equal."""
    opts = tbljax.LoaderOptions(
        batch_size=len(SIZES), patches=tbljax.Patches(size=4, max_tokens=20), seed=SEED, dtype="uint8", **kw
    )
    ld = tbljax.HostLoader(tbljax.open(path), dataclasses.replace(opts, num_epochs=epoch + 1))
    ld.set_epoch(epoch)
    hb = next(iter(ld))
    return {int(i): (hb.image[r], *(hb.fields[k][0][r] for k in native_res.PATCH_KEYS)) for r, i in enumerate(hb.index)}


def _check_patch_row(got, want, what):
    for a, b, k in zip(got, want, ("image",) + native_res.PATCH_KEYS):
        np.testing.assert_array_equal(a, b, err_msg=f"{what}: {k}")


def _rows_of(hb, r):
    return (hb.image[r], *(hb.fields[k][0][r] for k in native_res.PATCH_KEYS))


def test_patches_over_host_parts_serve_each_record_as_the_single_file_loader(data):
    """partition="host" at two ranks, each reading its part of the file: each rank's rows are
    the single-file loader's rows for the same records (flipped by the same (seed, epoch,
    index)), every record once an epoch over the ranks."""
    _, path = data
    want = {epoch: _patch_rows(path, epoch, augment="flip") for epoch in (0, 1)}
    opts = tbljax.LoaderOptions(
        batch_size=4,
        patches=tbljax.Patches(size=4, max_tokens=20),
        seed=SEED,
        dtype="uint8",
        augment="flip",
        drop_remainder=False,
        num_epochs=2,
    )
    seen = {0: [], 1: []}
    for rank, batches in enumerate(two_host_parts(path, opts)):
        for hb in batches:
            for r, i in enumerate(hb.index.tolist()):
                if i < 0:
                    assert not hb.image[r].any() and not hb.fields["patch_valid"][0][r].any()
                    continue
                _check_patch_row(_rows_of(hb, r), want[hb.epoch][i], f"rank {rank}, epoch {hb.epoch}, record {i}")
                seen[hb.epoch].append(i)
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(len(SIZES)))


def test_patches_over_a_mixture_serve_each_record_as_the_single_file_loader(data):
    """tbljax.loader over tbljax.mix of the file twice (weights 1:2), and that mixture's host
    parts at two ranks: each row is the single-file loader's row of its source's record,
    `source` and `index` saying which."""
    _, path = data
    want = _patch_rows(path)
    mixture = tbljax.mix({"a": path, "b": path}, weights={"a": 1, "b": 2}, steps_per_epoch=3)
    kw = dict(patches=tbljax.Patches(size=4, max_tokens=20), seed=SEED, dtype="uint8", num_epochs=2)
    served = 0
    for b in tbljax.loader(mixture, 6, **kw):
        assert b["image"].shape == (6, 20, 48)
        source, index = np.asarray(b["source"]), np.asarray(b["index"])
        for r in range(6):
            record = int(index[r]) - int(mixture.offsets[source[r]])
            row = (np.asarray(b["image"][r]), *(np.asarray(b[k][r]) for k in native_res.PATCH_KEYS))
            _check_patch_row(row, want[record], f"row {r}: source {source[r]}, record {record}")
            served += 1
    assert served == 36
    served = 0
    for rank, batches in enumerate(two_host_parts(mixture, tbljax.LoaderOptions(batch_size=6, **kw))):
        for hb in batches:
            assert hb.image.shape == (3, 20, 48)
            for r, (k, i) in enumerate(zip(hb.sources[0].tolist(), hb.index.tolist())):
                record = i - int(mixture.offsets[k])
                _check_patch_row(_rows_of(hb, r), want[record], f"rank {rank}: source {k}, record {record}")
                served += 1
    assert served == 36


@pytest.mark.parametrize(
    "native, words",
    [
        (dict(buckets=BUCKETS), "buckets with"),
        (
            dict(patches=tbljax.Patches(size=4, max_tokens=[16, 36], tokens_per_batch=256, batch_divisor=2)),
            "patches with a length schedule with",
        ),
        (dict(patches=tbljax.Patches(size=4, max_tokens=16, pack=True)), "patches with pack=True with"),
    ],
)
def test_schedules_over_host_parts_or_mixtures_are_refused_by_name(data, native, words):
    _, path = data
    mixture = tbljax.mix({"a": path, "b": path}, weights={"a": 1, "b": 2}, steps_per_epoch=3)
    with pytest.raises(ValueError, match=f"{words} a mixture \\(tbljax.mix\\): not served yet"):
        tbljax.loader(mixture, 16, dtype="uint8", **native)
    with pytest.raises(ValueError, match=f"{words} partition='host': not served yet"):
        tbljax.loader(path, 16, dtype="uint8", partition="host", **native)


# Packing (issue 49): images of at most 16 patches of 4² first-fit-decreasing into sequences of
# 64, in windows of 8 records of the epoch's order.
PACK = tbljax.Patches(size=4, max_tokens=64, pack=True, image_tokens=16, pack_window=8)

NATIVE = {
    "buckets": dict(buckets=BUCKETS),
    "patches": dict(patches=tbljax.Patches(size=4, max_tokens=20)),
    # Ten sequences an epoch (one holds two images): three steps of four.
    "pack": dict(patches=tbljax.Patches(size=4, max_tokens=16, pack=True, image_tokens=10, pack_window=4)),
}
KEYS = {"buckets": native_res.CONDITIONING, "patches": native_res.PATCH_KEYS, "pack": naflex_pack.PACK_KEYS}


@pytest.mark.parametrize("framework", ["torch", "mlx"])
@pytest.mark.parametrize("native", sorted(NATIVE))
def test_torch_and_mlx_serve_what_the_jax_loader_serves(data, framework, native):
    """Each rank of two gets its rows of the jax loader's batches, two epochs (set_epoch):
    order, pixels, labels, valid and every conditioning/patch key; a state saved mid-epoch
    resumes the same tail."""
    _, path = data
    mod, arr = _adapter(framework)
    kw = dict(seed=SEED, dtype="uint8", augment="flip", drop_remainder=False, layout="NHWC", **NATIVE[native])
    want = [{k: np.asarray(v) for k, v in b.items()} for b in tbljax.loader(path, 4, num_epochs=2, **kw)]
    keys = KEYS[native]
    for rank in (0, 1):
        ld = mod.loader(path, 2, rank=rank, world_size=2, **kw)
        got = []
        for epoch in (0, 1):
            ld.set_epoch(epoch)
            got += list(ld)
        assert len(got) == len(want) == 2 * len(ld)
        rows = slice(2 * rank, 2 * rank + 2)
        for batch, w in zip(got, want):
            assert sorted(batch.fields) == sorted(keys)
            np.testing.assert_array_equal(arr(batch.images), w["image"][rows])
            np.testing.assert_array_equal(arr(batch.index), w["index"][rows])
            np.testing.assert_array_equal(arr(batch.labels), w["label"][rows])
            np.testing.assert_array_equal(arr(batch.valid), w["valid"][rows])
            for k in keys:
                np.testing.assert_array_equal(arr(batch.fields[k]), w[k][rows])
    ld = mod.loader(path, 2, rank=1, world_size=2, **kw)
    it = iter(ld)
    next(it), next(it)
    state = ld.state_dict()
    ld.close()
    again = mod.loader(path, 2, rank=1, world_size=2, **kw)
    again.load_state_dict(state)
    tail = list(again)
    assert len(tail) == len(ld) - 2
    for batch, w in zip(tail, want[2:]):
        np.testing.assert_array_equal(arr(batch.images), w["image"][2:4])
        np.testing.assert_array_equal(arr(batch.index), w["index"][2:4])


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_mixup_with_patches_is_refused_by_name_and_with_buckets_mixes_each_bucket(data, framework):
    _, path = data
    mod, arr = _adapter(framework)
    m = tbljax.ops.Mixup(num_classes=32)
    kw = dict(seed=SEED, dtype="uint8", augment="flip", drop_remainder=False, layout="NHWC")
    with pytest.raises(ValueError, match="mixup= with patches=: not served"):
        mod.loader(path, 4, mixup=m, patches=tbljax.Patches(size=4, max_tokens=20), **kw)
    # Buckets: each step (one bucket's size) mixed as ops.mixup_cutmix mixes the jax loader's
    # batch in jit, keyed by the step.
    want = list(tbljax.loader(path, 4, num_epochs=1, buckets=BUCKETS, **kw))
    got = list(mod.loader(path, 4, mixup=m, buckets=BUCKETS, **kw))
    assert len(got) == len(want)
    for step, (batch, w) in enumerate(zip(got, want)):
        x, t = tbljax.ops.mixup_cutmix(w["image"], w["label"], seed=SEED, step=step, num_classes=32)
        np.testing.assert_array_equal(arr(batch.images), np.asarray(x))
        np.testing.assert_array_equal(arr(batch.labels), np.asarray(t))


def test_mixup_cutmix_refuses_a_patch_sequence_batch_by_name(data):
    _, path = data
    b = next(iter(tbljax.loader(path, 4, patches=tbljax.Patches(size=4, max_tokens=20), dtype="uint8")))
    with pytest.raises(ValueError, match="patch sequence batch"):
        tbljax.ops.mixup_cutmix(b["image"], b["label"], seed=0, step=0, num_classes=32)
    with pytest.raises(ValueError, match="pass layout='NHWC'"):  # torch's default layout
        _adapter("torch")[0].loader(path, 4, patches=tbljax.Patches(size=4, max_tokens=20))


def _patch_row(image: np.ndarray, p: int, t: int) -> np.ndarray:
    # The NaFlex layout in plain NumPy: patch (gy, gx) at token gy·gw + gx, pixels (py, px, c).
    hh, ww, c = image.shape
    gh, gw = hh // p, ww // p
    row = np.zeros((t, p * p * c), image.dtype)
    for gy in range(gh):
        for gx in range(gw):
            row[gy * gw + gx] = image[gy * p : (gy + 1) * p, gx * p : (gx + 1) * p].reshape(-1)
    return row


@pytest.fixture
def simd_targets():
    from tbljax import _core

    yield _core.supported_kernel_targets()
    _core.set_kernel_target("auto")


@pytest.mark.parametrize("dtype", ["uint8", "float32", "bfloat16"])
def test_kernel_writes_each_row_at_its_own_size_straight_into_its_patches(simd_targets, dtype):
    # One call, each row its own size (up- and downscaled, flipped or not, grids of 1..T
    # patches, p = 16 so a patch row is one AVX-512 vector of float32 and p = 5 so it is none):
    # the oracle's resize, normalized by the contract's table, patchified in NumPy, zeros past
    # each grid; RAW records, and JPEG records (serve_jpeg) against Pillow's decode of them;
    # every SIMD target.
    from tbljax import _core
    from tbljax import kernels as K

    rng = np.random.default_rng(11)
    imgs = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(70, 50), (20, 90), (33, 33), (48, 112)]]
    raw_imgs = list(imgs)
    heights, widths = np.array([im.shape[0] for im in imgs]), np.array([im.shape[1] for im in imgs])
    offsets = np.concatenate([[0], np.cumsum(heights * widths * 3)[:-1]])
    raw = K.variable_source([np.concatenate([im.reshape(-1) for im in imgs])], [4], offsets, heights, widths)
    blobs = []
    for k, im in enumerate(imgs):
        f = io.BytesIO()
        Image.fromarray(im).save(f, "JPEG", quality=90)
        blobs.append(f.getvalue())
        with Image.open(f) as j:  # Pillow's decode: libjpeg-turbo, as the kernel's
            imgs[k] = np.asarray(j.convert("RGB"))
    lens = np.array([len(b) for b in blobs])
    buf = np.frombuffer(b"".join(blobs), np.uint8).copy()
    jpeg = K.jpeg_source([buf], [4], np.concatenate([[0], np.cumsum(lens)[:-1]]), lens, heights, widths)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    kw = {} if dtype == "uint8" else dict(mean=mean, std=std)
    np_dtype = oracle.to_bfloat16(np.zeros(1)).dtype if dtype == "bfloat16" else np.dtype(dtype)
    for p, t, sizes in [
        (16, 12, [(32, 48), (16, 16), (48, 64), (16, 112)]),
        (5, 9, [(15, 15), (5, 40), (10, 20), (25, 5)]),
    ]:
        idx = np.array([0, 1, 2, 3, 2, 0])
        boxes = np.array(
            [[3, 2, 60, 41], [0, 0, 20, 90], [1, 4, 30, 25], [0, 0, 48, 112], [0, 0, 33, 33], [9, 9, 5, 7]]
        )
        hw = np.array(sizes + sizes[:2], np.int32)
        flips = np.array([1, 0, 0, 1, 1, 0], bool)
        for name, serve in [("raw", functools.partial(K.gather, raw)), ("jpeg", functools.partial(K.serve_jpeg, jpeg))]:
            source = raw_imgs if name == "raw" else imgs
            want = np.zeros((6, t, p * p * 3), np_dtype)
            for r, (i, box, (hh, ww), f) in enumerate(zip(idx, boxes, hw, flips)):
                px = oracle.crop_resize(source[i], box, hh, ww)
                px = px[:, ::-1] if f else px
                px = px if dtype == "uint8" else oracle.normalize(px[None], mean, std, np_dtype)[0]
                want[r] = _patch_row(px, p, t)
            for target in simd_targets:
                _core.set_kernel_target(target)
                out = np.full((6, t, p * p * 3), 7, np_dtype)  # stale values: every token is written
                serve(idx, out, crop=boxes, flip=flips, patches=(p, hw), **kw)
                np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8), err_msg=f"{name} {target} {p}")


def test_kernel_refuses_sizes_that_are_not_a_grid_of_at_most_max_tokens_patches():
    from tbljax import kernels as K

    src = np.zeros((2, 20, 20, 3), np.uint8)
    out = np.zeros((2, 4, 48), np.uint8)
    box = [[0, 0, 20, 20]] * 2
    for hw, words in [
        ([[8, 8], [4, 6]], r"sizes\[1\] = \(4, 6\) is not a grid of at most 4 patches of 4x4"),
        ([[8, 12], [4, 4]], r"sizes\[0\] = \(8, 12\) is not a grid of at most 4"),
    ]:
        with pytest.raises(ValueError, match=words):
            K.gather(src, [0, 1], out, crop=box, patches=(4, hw))
    with pytest.raises(ValueError, match=r"need out of shape \(B, T, 48\)"):
        K.gather(src, [0, 1], np.zeros((2, 4, 16, 3), np.uint8), crop=box, patches=(4, [[4, 4]] * 2))
    with pytest.raises(ValueError, match="patches need an output size and a crop box per sample"):
        K.gather(src, [0, 1], out, patches=(4, [[4, 4]] * 2))


def test_kernel_refuses_an_erasing_box_outside_its_rows_own_size():
    # Row 1 is 4x4: a box inside the batch's largest size (8x8) but not inside row 1's is refused.
    from tbljax._src.engine import kernels as K

    src = np.zeros((2, 20, 20, 3), np.uint8)
    out = np.zeros((2, 4, 48), np.float32)
    hw = np.array([[8, 8], [4, 4]])
    boxes = np.array([[[0, 0, 2, 2]], [[3, 3, 2, 2]]], np.int32)
    ops = K.pixel_program(np.zeros((2, 1)), np.zeros((2, 1)), hw, erase_boxes=boxes, erase_keys=np.zeros(2))
    with pytest.raises(ValueError, match=r"sizes\[1\] = \(4, 4\): erasing: row 0, box 0 \(3, 3, 2, 2\) does not lie"):
        K.gather(src, [0, 1], out, crop=[[0, 0, 20, 20]] * 2, patches=(4, hw), ops=ops)


# A length schedule (issue 49): 16, 36 or 64 patches of 4², 256 tokens a step (at most).
SCHEDULE = tbljax.Patches(size=4, max_tokens=[36, 64, 16], tokens_per_batch=256, batch_divisor=2)


def _schedule_reference(n, seed, epoch, drop_remainder):
    """The documented rule in plain Python: canonical batch j draws its length from the
    random word of (seed, epoch 0, j, counter 64), its batch timm's floor(256 / (L·2))·2 (at
    least 1); batches until they cover n; the epoch permutes them (keyed seed ^ "LENS" << 32)
    and fills them front to back from the epoch's record order. [(length, records, rows)]."""
    lengths = [16, 36, 64]
    batches, covered, j = [], 0, 0
    while covered < n:
        u = int(order.random_bits(np.array([j]), np.uint32(64), seed, 0)[0])
        length = lengths[u * 3 >> 32]
        rows = max(1, 256 // (length * 2) * 2)
        batches.append((length, rows, min(rows, n - covered)))
        covered, j = covered + rows, j + 1
    if drop_remainder and batches[-1][2] < batches[-1][1]:
        batches.pop()
    perm = order.permute(np.arange(len(batches)), len(batches), seed ^ (0x4C454E53 << 32), epoch)
    out, pos = [], 0
    for k in perm:
        length, rows, count = batches[k]
        out.append((length, order.permute(np.arange(pos, pos + count), n, seed, epoch).tolist(), rows))
        pos += count
    return out


def _schedule_loader(path, **kw):
    kw = dict(patches=SCHEDULE, seed=SEED, dtype="uint8", augment="flip", drop_remainder=False) | kw
    opts = tbljax.LoaderOptions(batch_size=kw.pop("batch_size", 16), **kw)
    return tbljax.HostLoader(tbljax.open(path), opts)


# The per-image ops with a length schedule or packing: RandAugment and erasing at each row's
# (each packed image's) own size; float32, where erasing's pixel mode writes its noise.
OPS_AUG = tbljax.Augment(
    size=None,
    ops=[tbljax.RandAugment(num_ops=2, magnitude=9, prob=1.0)],
    erasing=tbljax.RandomErasing(p=1.0, mode="pixel", max_count=2),
)


def _ops_drawn(aug, idx, epoch, sizes):
    """How many affine ops and erasing boxes the rules decide for samples `idx` at (h, w) `sizes`."""
    codes, _ = randaug.decide(tuple(aug.ops), idx, seed=SEED, epoch=epoch)
    boxes = [
        erasing.decide_erasing(aug.erasing, np.array([i]), height=int(h), width=int(w), seed=SEED, epoch=epoch)[0]
        for i, (h, w) in zip(idx.tolist(), sizes)
    ]
    return int(np.isin(codes, sorted(pixel_ops.AFFINE)).sum()), sum(int((b[0, :, 2] > 0).sum()) for b in boxes)


@pytest.mark.parametrize("drop_remainder, ops", [(False, False), (True, False), (False, True)])
def test_length_schedule_steps_follow_timms_rule_and_each_row_is_the_fixed_length_loaders(data, drop_remainder, ops):
    """Each step's length, batch size and records are the documented rule's; a row at length L
    is, bit for bit with its patch keys, the row of a loader at fixed max_tokens=L for the same
    record (with `ops`: both running RandAugment and erasing, at the row's own size); every
    record once an epoch (the dropped remainder's records skipped)."""
    _, path = data
    n = len(SIZES)
    kw = dict(augment=OPS_AUG, dtype="float32") if ops else dict(augment="flip", dtype="uint8")
    fixed = {}  # (length, epoch, record) -> its row and patch keys under a fixed max_tokens
    for length in (16, 36, 64):
        for epoch in (0, 1):
            one = tbljax.HostLoader(
                tbljax.open(path),
                tbljax.LoaderOptions(
                    batch_size=n,
                    patches=tbljax.Patches(size=4, max_tokens=length),
                    seed=SEED,
                    num_epochs=epoch + 1,
                    **kw,
                ),
            )
            one.set_epoch(epoch)
            hb = next(iter(one))
            for r, i in enumerate(hb.index):
                fixed[length, epoch, int(i)] = [hb.image[r]] + [hb.fields[k][0][r] for k in native_res.PATCH_KEYS]
    ld = _schedule_loader(path, num_epochs=2, drop_remainder=drop_remainder, **kw)
    got = list(ld)
    if ops:  # some rows' affine matrices and erasing boxes are their own length's
        geometry = tbljax.augment.RecordGeometry(*np.array(SIZES).T)
        drawn = np.zeros(2, int)
        for hb in got:
            idx = hb.index[hb.index >= 0].astype(np.int64)
            boxes, _ = tbljax.augment.sample(OPS_AUG, idx, geometry=geometry, seed=SEED, epoch=hb.epoch)
            sizes = zip(*naflex.sequence_size(boxes[:, 2], boxes[:, 3], 4, hb.image.shape[1]))
            drawn += _ops_drawn(OPS_AUG, idx, hb.epoch, list(sizes))
        assert (drawn > 0).all(), drawn
    want = _schedule_reference(n, SEED, 0, drop_remainder) + _schedule_reference(n, SEED, 1, drop_remainder)
    assert len(got) == len(want) == 2 * len(ld)
    for hb, (length, records, rows) in zip(got, want):
        assert hb.image.shape == (rows, length, 48) and rows * length <= 256
        assert hb.image.dtype == np.dtype(kw["dtype"])
        assert hb.index.tolist() == records + [-1] * (rows - len(records))
        for r, i in enumerate(records):
            row = [hb.image[r]] + [hb.fields[k][0][r] for k in native_res.PATCH_KEYS]
            for a, b in zip(row, fixed[length, hb.epoch, i]):
                np.testing.assert_array_equal(a, b)
        assert not hb.image[len(records) :].any() and not hb.fields["patch_valid"][0][len(records) :].any()
    for epoch in (0, 1):
        seen = sorted(i for hb in got if hb.epoch == epoch for i in hb.index.tolist() if i >= 0)
        assert seen == sorted(i for _, rec, _ in _schedule_reference(n, SEED, epoch, drop_remainder) for i in rec)
        assert drop_remainder or seen == list(range(n))


def test_length_schedule_resumes_exactly_and_refuses_a_position_off_its_steps(data):
    _, path = data
    full = list(_schedule_loader(path, num_epochs=2))
    ld = _schedule_loader(path, num_epochs=2)
    it = iter(ld)
    for _ in range(3):
        next(it)
    state = ld.state_dict()
    ld.close()
    again = _schedule_loader(path, num_epochs=2)
    again.load_state_dict(state)
    assert again.row_shape == full[3].image.shape[1:] and again.row_shape_at(0) == (64, 48)  # the cursor's; the longest
    tail = list(again)
    assert len(tail) == len(full) - 3
    for a, b in zip(tail, full[3:]):
        assert (a.epoch, a.position) == (b.epoch, b.position)
        np.testing.assert_array_equal(a.image, b.image)
        np.testing.assert_array_equal(a.index, b.index)
    starts = {hb.position for hb in full if hb.epoch == 0}
    off = next(p for p in range(1, len(SIZES)) if p not in starts)
    with pytest.raises(ValueError, match=f"position {off} of epoch 0 is not the start of a step"):
        again.load_state_dict(dict(state, epoch=0, position=off))


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_length_schedule_on_torch_and_mlx_splits_each_step_over_the_ranks(data, framework):
    _, path = data
    mod, arr = _adapter(framework)
    kw = dict(seed=SEED, dtype="uint8", augment="flip", drop_remainder=False, layout="NHWC", patches=SCHEDULE)
    want = list(_schedule_loader(path, num_epochs=1))
    for rank in (0, 1):
        got = list(mod.loader(path, 8, rank=rank, world_size=2, **kw))
        assert len(got) == len(want)
        for batch, w in zip(got, want):
            b = len(w.index) // 2
            rows = slice(rank * b, rank * b + b)
            np.testing.assert_array_equal(arr(batch.images), w.image[rows])
            np.testing.assert_array_equal(arr(batch.index), w.index[rows])
            for k in native_res.PATCH_KEYS:
                np.testing.assert_array_equal(arr(batch.fields[k]), w.fields[k][0][rows])


# tbljax.loader with a length schedule over 2 CPU devices, against HostLoader (in the parent).
JAX_LENGTHS_CHILD = r"""
import sys
import numpy as np, jax
import tbljax
assert len(jax.devices()) == 2
path, out = sys.argv[1], sys.argv[2]
sched = tbljax.Patches(size=4, max_tokens=[36, 64, 16], tokens_per_batch=256, batch_divisor=2)
kw = dict(patches=sched, seed=5, dtype="uint8", augment="flip", drop_remainder=False, num_epochs=2)
keys = ["image", "index", "label", "valid", "patch_yx", "patch_valid"]
got = {}
for s, b in enumerate(tbljax.loader(path, 16, **kw)):
    assert b["image"].sharding.spec[0] == "batch" and len(b["image"].addressable_shards) == 2
    assert {x.data.shape[0] for x in b["image"].addressable_shards} == {b["image"].shape[0] // 2}
    got.update({f"{s}|{k}": np.asarray(b[k]) for k in keys})
ld = tbljax.loader(path, 16, **kw)
it = iter(ld)
next(it), next(it), next(it)
state = ld.state_dict()
ld.close()
again = tbljax.loader(path, 16, **kw)
again.load_state_dict(state)
got.update({f"tail{s}|{k}": np.asarray(b[k]) for s, b in enumerate(again) for k in keys})
odd = tbljax.Patches(size=4, max_tokens=[16, 36], tokens_per_batch=256, batch_divisor=1)
try:
    tbljax.loader(path, 16, patches=odd)
except ValueError as e:
    got["refused"] = np.array(str(e))
np.savez(out, **got)
"""


def test_length_schedule_on_the_jax_loader_is_hostloaders_steps_sharded_over_devices(data, tmp_path):
    """tbljax.loader over 2 CPU devices: each step a global array of that step's rows, split
    over the devices, equal step for step to HostLoader's (shapes, pixels, patch keys, index);
    a state saved mid-epoch resumes the same tail; a schedule whose batches do not split over
    the devices is refused by name."""
    _, path = data
    out = tmp_path / "got.npz"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    p = subprocess.run(
        [sys.executable, "-c", JAX_LENGTHS_CHILD, path, str(out)], env=env, capture_output=True, text=True, timeout=180
    )
    assert p.returncode == 0, p.stdout + p.stderr
    got = dict(np.load(out))
    want = list(_schedule_loader(path, num_epochs=2, seed=5))  # (seed 5 draws all three lengths)
    assert len({w.image.shape for w in want}) == 3  # every length of the schedule is served

    def check(prefix, ws):
        assert not any(k.startswith(f"{prefix}{len(ws)}|") for k in got)
        for s, w in enumerate(ws):
            row = {"image": w.image, "index": w.index, "label": w.label, "valid": w.valid}
            row |= {k: w.fields[k][0] for k in native_res.PATCH_KEYS}
            for k, v in row.items():
                assert got[f"{prefix}{s}|{k}"].shape == v.shape, (prefix, s, k)
                np.testing.assert_array_equal(got[f"{prefix}{s}|{k}"], v, err_msg=f"{prefix}{s}|{k}")

    check("", want)
    check("tail", want[3:])
    assert "(36, 7)] do not split over the 2 batch shards of the sharding" in str(got["refused"])


def test_length_schedule_on_the_jax_loader_in_two_processes_splits_each_step_over_them(data, tmp_path):
    """Two real JAX processes on localhost: each step a global batch of that step's rows, each
    process holding its half, which is HostLoader's rows of that half (pixels, patch keys,
    index)."""
    pytest.importorskip("torch")  # the workers join a gloo group too (`_two_jobs.join`)
    import _two_jobs

    _, path = data
    outs = _two_jobs.run(Path(__file__).with_name("_lengths_worker.py"), Path(path), tmp_path)
    want = list(_schedule_loader(path, num_epochs=1, seed=5))
    for rank, got in enumerate(outs):
        assert not any(k.startswith(f"{len(want)}|") for k in got)
        for s, w in enumerate(want):
            assert tuple(got[f"{s}|shape"]) == w.image.shape
            b = len(w.index) // 2
            rows = slice(rank * b, rank * b + b)
            row = {"image": w.image, "index": w.index, "label": w.label, "valid": w.valid}
            row |= {k: w.fields[k][0] for k in native_res.PATCH_KEYS}
            for k, v in row.items():
                np.testing.assert_array_equal(got[f"{s}|{k}"], v[rows], err_msg=f"rank {rank}, step {s}: {k}")


def test_length_schedule_refuses_what_it_cannot_serve_by_name(data):
    _, path = data
    with pytest.raises(ValueError, match="batch_size must be the schedule's largest step, 16 rows"):
        _schedule_loader(path, batch_size=8)
    odd = tbljax.Patches(size=4, max_tokens=[16, 36], tokens_per_batch=256, batch_divisor=1)
    with pytest.raises(ValueError, match=r"\(36, 7\)\] do not split over 2 ranks"):
        _adapter("torch")[0].loader(path, 8, rank=0, world_size=2, patches=odd, layout="NHWC")


def _pack_reference(tokens, n, seed, epoch):
    """First-fit-decreasing in plain Python, as the reference writes it: each window of 8
    records of the epoch's order sorted by tokens, largest first (ties by position), each to
    the first sequence of its window with room. [[(record, offset), ...] per sequence]."""
    rec = order.permute(np.arange(n), n, seed, epoch).tolist()
    sequences = []
    for w0 in range(0, n, 8):
        window = sorted(range(w0, min(w0 + 8, n)), key=lambda q: (-tokens[rec[q]], q))
        bins = []  # [(room, [(record, offset)])]
        for q in window:
            t = tokens[rec[q]]
            k = next((k for k, b in enumerate(bins) if b[0] >= t), None)
            if k is None:
                bins.append([64, []])
                k = len(bins) - 1
            bins[k][1].append((rec[q], 64 - bins[k][0]))
            bins[k][0] -= t
        sequences += [sorted(b[1], key=lambda ro: ro[1]) for b in bins]
    return sequences


def _pack_loader(path, **kw):
    kw = dict(patches=PACK, seed=SEED, dtype="uint8", augment="flip", drop_remainder=False) | kw
    return tbljax.loader(path, kw.pop("batch_size", 2), **kw)


@pytest.mark.parametrize("ops", [False, True])
def test_packed_segments_unpack_to_the_unpacked_loaders_rows_as_first_fit_decreasing_places_them(data, ops):
    """Every sequence holds the reference's records at its offsets; each segment's tokens (its
    segment_ids) are, bit for bit, the row and patch_yx a loader at max_tokens=image_tokens
    serves for that record (with `ops`: both running RandAugment and erasing, each image at its
    own resized size); segment_index/segment_label name it; every record once an epoch."""
    _, path = data
    n = len(SIZES)
    hw = naflex.sequence_size(*np.array(SIZES).T, 4, 16)
    tokens = [int(h // 4 * (w // 4)) for h, w in zip(*hw)]
    kw = dict(augment=dataclasses.replace(OPS_AUG, crop=False), dtype="float32") if ops else {}
    if ops:  # some images' affine matrices and erasing boxes are their own size's
        drawn = [_ops_drawn(kw["augment"], np.arange(n), epoch, list(zip(*hw))) for epoch in (0, 1)]
        assert all(a > 0 and e > 0 for a, e in drawn), drawn
    for epoch in (0, 1):
        one = _pack_loader(
            path, batch_size=n, patches=tbljax.Patches(size=4, max_tokens=16), num_epochs=epoch + 1, **kw
        )
        one.set_epoch(epoch)
        b = next(iter(one))
        fixed = {int(i): (np.asarray(b["image"])[r], np.asarray(b["patch_yx"])[r]) for r, i in enumerate(b["index"])}
        ld = _pack_loader(path, num_epochs=epoch + 1, **kw)
        ld.set_epoch(epoch)
        rows = [{k: np.asarray(v)[r] for k, v in b.items()} for b in ld for r in range(2)]
        want = _pack_reference(tokens, n, SEED, epoch)
        assert len(rows) == -(-len(want) // 2) * 2  # the last step padded with empty sequences
        for row, seq in zip(rows, want + [[]]):
            assert row["valid"] == bool(seq) and row["index"] == -1 and row["label"] == -1
            ids = row["segment_ids"]
            assert (ids > 0).sum() == sum(tokens[i] for i, _ in seq) and (row["patch_valid"] == (ids > 0)).all()
            assert not row["image"][ids == 0].any() and not row["patch_yx"][ids == 0].any()
            for k, (i, offset) in enumerate(seq):
                cells = np.flatnonzero(ids == k + 1)
                assert cells.tolist() == list(range(offset, offset + tokens[i]))
                image, yx = fixed[i]
                np.testing.assert_array_equal(row["image"][cells], image[: tokens[i]])
                np.testing.assert_array_equal(row["patch_yx"][cells], yx[: tokens[i]])
            assert row["segment_index"].tolist() == [i for i, _ in seq] + [-1] * (len(row["segment_index"]) - len(seq))
            assert row["segment_label"].tolist() == [2 * i for i, _ in seq] + [-1] * (
                len(row["segment_label"]) - len(seq)
            )
        assert sorted(i for row in rows for i in row["segment_index"].tolist() if i >= 0) == list(range(n))


def test_packed_sequences_resume_exactly(data):
    _, path = data
    full = [{k: np.asarray(v) for k, v in b.items()} for b in _pack_loader(path, num_epochs=2)]
    ld = _pack_loader(path, num_epochs=2)
    it = iter(ld)
    for _ in range(3):
        next(it)
    state = ld.state_dict()
    ld.close()
    again = _pack_loader(path, num_epochs=2)
    again.load_state_dict(state)
    tail = [{k: np.asarray(v) for k, v in b.items()} for b in again]
    assert len(tail) == len(full) - 3
    for a, b in zip(tail, full[3:]):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    # Positions count this packing's sequences: another packing, or none, is refused mid-epoch.
    for other in (
        dict(patches=tbljax.Patches(size=4, max_tokens=64, pack=True, image_tokens=16)),
        dict(patches=None, augment=tbljax.Augment(size=(8, 8))),
    ):
        with pytest.raises(ValueError, match="mid-epoch .* with packing"):
            _pack_loader(path, num_epochs=2, **other).load_state_dict(state)
    plain = _pack_loader(path, num_epochs=2, patches=None, augment=tbljax.Augment(size=(8, 8)))
    next(iter(plain))
    with pytest.raises(ValueError, match="mid-epoch .* with packing None"):
        _pack_loader(path, num_epochs=2).load_state_dict(plain.state_dict())


def imagenet_like_sizes(count, rng):
    """The size distribution the padding bound is measured on (a model, not ImageNet's list):
    ImageNet's training photos are mostly 500 px on the longer side — 500×375 (h×w 375×500,
    landscape 4:3) the most common, then 500×375 portrait, 500×333 (3:2) both ways — with a
    tail of larger and smaller photos. Here: 45% 375×500, 15% 500×375, 12% 333×500, 5% 500×333,
    and 23% a tail of area log-normal around 400·350 (σ 0.6) and aspect w/h log-uniform in
    [1/2, 2]."""
    common = np.array([(375, 500), (500, 375), (333, 500), (500, 333)])
    kind = rng.choice(5, count, p=[0.45, 0.15, 0.12, 0.05, 0.23])
    area = np.exp(rng.normal(np.log(400 * 350), 0.6, count))
    aspect = np.exp(rng.uniform(np.log(0.5), np.log(2.0), count))
    tail = np.stack([np.sqrt(area / aspect), np.sqrt(area * aspect)], -1).round().clip(16, 4000).astype(np.int64)
    hw = np.where((kind < 4)[:, None], common[np.minimum(kind, 3)], tail)
    return hw[:, 0], hw[:, 1]


def test_packing_pads_at_most_5_percent_of_tokens_on_imagenet_like_sizes():
    """The loader's packing at the defaults (patch 16, max_tokens 1024, image_tokens 256,
    window 256) on 20,000 sizes of `imagenet_like_sizes`: padding <= 5% of the tokens of the
    sequences served (measured 2.04% here)."""
    h, w = imagenet_like_sizes(20_000, np.random.default_rng(0))
    geometry = types.SimpleNamespace(heights=h, widths=w)
    opts = tbljax.LoaderOptions(batch_size=64, patches=tbljax.Patches(size=16, max_tokens=1024, pack=True))
    serving = naflex_pack.PackServing(geometry, len(h), opts, 64)
    th, tw = naflex.sequence_size(h, w, 16, 256)
    tokens = int((th // 16 * (tw // 16)).sum())
    for epoch in (0, 1):
        pk = serving.packing(epoch)
        padding = 1 - tokens / (pk.sequences * 1024)
        print(f"epoch {epoch}: {pk.sequences} sequences, padding {padding:.2%}")
        assert padding <= 0.05
        assert serving.steps(epoch) == pk.sequences // 64  # drop_remainder: whole steps


def test_packing_refuses_what_it_cannot_serve_by_name(tmp_path):
    with pytest.raises(ValueError, match="pack=True and an Augment crop"):
        tbljax.LoaderOptions(batch_size=2, patches=PACK, augment="rrc_flip")
    images = np.zeros((4, 8, 8, 3), np.uint8)
    tbljax.convert({"image": images, "segment_ids": [1, 2, 3, 4]}, tmp_path / "c.tbl", image_size=8, progress=False)
    with pytest.raises(ValueError, match=r"field\(s\) \['segment_ids'\] have the names of batch keys pack=True adds"):
        _pack_loader(str(tmp_path / "c.tbl"), fields="all")


def test_packed_fields_are_served_per_segment(tmp_path):
    """A str field and a field_fn of it come per segment: (B, S) lists and (B, S, ...) arrays,
    each segment its record's value, "" / zeros past a sequence's images."""
    n = 10
    images = np.random.default_rng(0).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
    captions = [f"record {i}" for i in range(n)]
    tbljax.convert({"image": images, "caption": captions}, tmp_path / "c.tbl", image_size=8, progress=False)

    def lengths(texts):
        return np.array([[len(t), 7] for t in texts], np.int32).reshape(-1, 2)

    patches = tbljax.Patches(size=4, max_tokens=16, pack=True, image_tokens=4)  # four 2x2 images a sequence
    common = dict(patches=patches, seed=SEED, dtype="uint8", num_epochs=1, drop_remainder=False)
    path = str(tmp_path / "c.tbl")
    text = tbljax.HostLoader(tbljax.open(path), tbljax.LoaderOptions(batch_size=2, fields=["caption"], **common))
    made = tbljax.HostLoader(
        tbljax.open(path),
        tbljax.LoaderOptions(batch_size=2, fields=["caption"], field_fn={"caption": lengths}, **common),
    )
    seen = 0
    for a, b in zip(text, made):
        index = a.fields["segment_index"][0]
        np.testing.assert_array_equal(index, b.fields["segment_index"][0])
        got, arr = a.texts["caption"], b.fields["caption"][0]
        assert len(got) == 2 and arr.shape == (2, index.shape[1], 2)
        for r in range(2):
            for k, i in enumerate(index[r].tolist()):
                assert got[r][k] == (captions[i] if i >= 0 else "")
                assert arr[r, k].tolist() == ([len(captions[i]), 7] if i >= 0 else [0, 0])
                seen += i >= 0
    assert seen == n

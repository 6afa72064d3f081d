"""Issue 49 through the real host loader: aspect-ratio buckets (every record once an epoch,
one bucket per step, pixels the NumPy oracle's cover-crop of each record, the conditioning
keys, resume equal to the tail) and NaFlex patch sequences (un-patchifying a row gives the
oracle's resize of the record to big_vision's sequence size, bit for bit); and the
combinations refused by name."""

from __future__ import annotations

import functools
import io

import numpy as np
import pytest
from PIL import Image

import tbljax
from tbljax._src.engine import native_res
from tbljax._src.rules import augment as _augment
from tbljax._src.rules import buckets as _buckets
from tbljax._src.rules import erasing, naflex, pixel_ops, randaug

import oracle

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
        (dict(patches=tbljax.Patches(max_tokens=16, pack=True)), "patches with pack=True"),
        (dict(patches=tbljax.Patches(max_tokens=[16, 32], tokens_per_batch=64)), "list of max_tokens"),
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


NATIVE = {
    "buckets": dict(buckets=BUCKETS),
    "patches": dict(patches=tbljax.Patches(size=4, max_tokens=20)),
}


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
    keys = native_res.CONDITIONING if native == "buckets" else native_res.PATCH_KEYS
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

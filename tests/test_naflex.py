"""NaFlex rules (`_src/rules/naflex.py`) against independent references: big_vision's
``resize_to_sequence`` ported from its TensorFlow source (and its own test table), timm's NaFlex
batch-size rule ported from its source, patch layouts by explicit slicing, packing checked
token by token and its padding measured on real and ImageNet-like size distributions."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from tbljax._src.rules import naflex
from tbljax._src.rules.naflex import Patches


def big_vision_sizes(hw, patch_size, max_sequence_len, eps=1e-5):
    """big_vision/pp/proj/image_text/ops_naflex.py `_get_image_size_for_seq`, op for op in
    NumPy over many images at once (tf.float32 scalars; TF's int32 / int is float64;
    tf.cond per image is a where; the while_loop runs while any image's interval is open)."""
    image_hw = np.asarray(hw)  # (N, 2) int

    def prepare_target_hw(ratio):
        target_hw = image_hw.astype(np.float32) * ratio[:, None]
        target_hw = np.float32(patch_size) * np.ceil(target_hw / np.float32(patch_size))
        target_hw = np.maximum(target_hw, np.float32(patch_size))
        return target_hw.astype(np.int32)

    def is_feasible(ratio):
        num_patches = prepare_target_hw(ratio) / patch_size  # int32 / int: float64 in TF
        return np.prod(num_patches, axis=1) <= max_sequence_len

    lb = np.full(len(image_hw), np.float32(eps / 10.0), np.float32)
    rb = np.full(len(image_hw), np.float32(100.0), np.float32)
    while True:
        open_ = (rb - lb) >= np.float32(eps)
        if not open_.any():
            break
        mid = (lb + rb) / np.float32(2)
        ok = is_feasible(mid)
        lb = np.where(open_ & ok, mid, lb)
        rb = np.where(open_ & ~ok, mid, rb)
    assert (lb > np.float32(eps)).all() and (lb < np.float32(100.0)).all()
    return prepare_target_hw(lb)


# big_vision's own ops_naflex_test.py expectations: (image hw, patch, seq_len, expected hw).
BIG_VISION_CASES = [
    ((48, 48), 3, 121, (33, 33)),
    ((112, 109), 7, 225, (105, 105)),
    ((176, 176), 11, 64, (88, 88)),
    ((256, 64), 16, 12, (96, 32)),
    ((256, 64), 8, 15, (56, 16)),
    ((63, 241), 16, 16, (32, 128)),
    ((16, 512), 16, 16, (16, 256)),
]


@pytest.mark.parametrize("hw,patch,seq_len,expected", BIG_VISION_CASES)
def test_sequence_size_matches_big_vision_test_table(hw, patch, seq_len, expected):
    h, w = naflex.sequence_size(np.array([hw[0]]), np.array([hw[1]]), patch, seq_len)
    assert (int(h[0]), int(w[0])) == expected


def _sweep(n, seed):
    rng = np.random.default_rng(seed)
    # Sides 8..4096, log-uniform and independent (aspects up to 512:1): inside big_vision's range.
    return np.exp(rng.uniform(np.log(8), np.log(4096), (n, 2))).astype(np.int64)


@pytest.mark.parametrize("patch,max_tokens", [(16, 256), (14, 1024), (16, 64), (32, 576)])
def test_sequence_size_equals_big_vision_over_a_sweep(patch, max_tokens):
    hw = _sweep(25_000, patch * max_tokens)  # 4 cases: 10^5 sizes in all
    h, w = naflex.sequence_size(hw[:, 0], hw[:, 1], patch, max_tokens)
    expected = big_vision_sizes(hw, patch, max_tokens)
    np.testing.assert_array_equal(np.stack([h, w], axis=1), expected)
    grid = (h // patch).astype(np.int64) * (w // patch)
    assert (h % patch == 0).all() and (w % patch == 0).all() and (grid <= max_tokens).all()
    assert grid.mean() > 0.85 * max_tokens  # it fills the budget, as the rule intends


def test_sequence_size_jax_equals_numpy():
    jnp = pytest.importorskip("jax.numpy")
    hw = _sweep(4000, 1)
    want = naflex.sequence_size(hw[:, 0], hw[:, 1], 16, 256)
    got = naflex.sequence_size(jnp.asarray(hw[:, 0], jnp.int32), jnp.asarray(hw[:, 1], jnp.int32), 16, 256, xp=jnp)
    np.testing.assert_array_equal(np.asarray(got[0]), want[0])
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])


def test_sequence_size_refuses_a_bad_side_naming_the_record():
    with pytest.raises(ValueError, match=r"record 1: width must be an integer in \[1, 65535\], got 0"):
        naflex.sequence_size(np.array([300, 1]), np.array([200, 0]), 16, 1024)
    with pytest.raises(ValueError, match=r"record 0: height .* got 70000"):
        naflex.sequence_size(np.array([70000]), np.array([200]), 16, 1024)
    # The extremes big_vision's assertions guard stay inside its range: no error, one patch / the cap.
    for patch, tokens in ((1, 1), (16, 1024)):
        h, w = naflex.sequence_size(np.array([65535, 1]), np.array([65535, 1]), patch, tokens)
        np.testing.assert_array_equal(np.stack([h, w], 1), big_vision_sizes([[65535, 65535], [1, 1]], patch, tokens))


def test_patchify_unpatchify_round_trip_bit_exact_against_explicit_slices():
    rng = np.random.default_rng(0)
    p, t = 4, 20
    img = rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)  # 3x5 patches
    row = naflex.patchify(img, p, t)
    assert row.shape == (t, p * p * 3) and row.dtype == np.uint8
    for gy in range(3):
        for gx in range(5):
            np.testing.assert_array_equal(row[gy * 5 + gx], img[gy * p : (gy + 1) * p, gx * p : (gx + 1) * p].ravel())
    assert not row[15:].any()
    np.testing.assert_array_equal(naflex.unpatchify(row, 12, 20, p), img)
    # float32 too, bit for bit (NaN payloads and -0.0 included).
    f = rng.standard_normal((8, 8, 3)).astype(np.float32)
    f[0, 0, 0], f[1, 1, 1] = np.float32("nan"), np.float32(-0.0)
    back = naflex.unpatchify(naflex.patchify(f, 4, 4), 8, 8, 4)
    np.testing.assert_array_equal(back.view(np.uint32), f.view(np.uint32))


def test_patch_coords_match_a_meshgrid_and_jax():
    gh, gw, t = np.array([2, 3, 1]), np.array([3, 1, 4]), 8
    yx, valid = naflex.patch_coords(gh, gw, t)
    for b in range(3):
        y, x = np.meshgrid(np.arange(gh[b]), np.arange(gw[b]), indexing="ij")
        k = gh[b] * gw[b]
        np.testing.assert_array_equal(yx[b, :k], np.stack([y.ravel(), x.ravel()], axis=1))
        assert not yx[b, k:].any() and valid[b, :k].all() and not valid[b, k:].any()
    jnp = pytest.importorskip("jax.numpy")
    jyx, jvalid = naflex.patch_coords(jnp.asarray(gh), jnp.asarray(gw), t, xp=jnp)
    np.testing.assert_array_equal(np.asarray(jyx), yx)
    np.testing.assert_array_equal(np.asarray(jvalid), valid)


def timm_batch_size(tokens_per_batch, seq_len, divisor):
    """timm/data/naflex_dataset.py `calculate_naflex_batch_size` (rounding='floor', no max)."""
    raw_batch_size = tokens_per_batch / seq_len
    if divisor > 1:
        batch_size = math.floor(raw_batch_size / divisor) * divisor
    else:
        batch_size = int(raw_batch_size)
    return max(1, batch_size)


def test_batch_size_equals_timm():
    for tokens in (1, 100, 4096, 16384, 65536, 12345):
        for seq_len in (1, 7, 128, 256, 576, 784, 1024, 5000):
            for d in (1, 2, 8):
                assert int(naflex.length_batch_size(tokens, seq_len, d)) == timm_batch_size(tokens, seq_len, d)


def _all_records(s, n, seed, epoch):
    return np.concatenate([naflex.step_indices(s, k, n, seed=seed, epoch=epoch) for k in range(len(s.seq_len))])


def test_length_schedule_serves_every_record_once_within_the_token_budget():
    n, p = 1000, Patches(max_tokens=[256, 576, 1024], tokens_per_batch=16384, batch_divisor=8)
    s = naflex.length_schedule(n, p, seed=3, epoch=0, drop_remainder=False)
    assert set(s.seq_len.tolist()) <= {256, 576, 1024} and len(set(s.seq_len.tolist())) > 1
    for length, size in zip(s.seq_len, s.batch_size):
        assert size == timm_batch_size(16384, int(length), 8) and length * size <= 16384
    rec = _all_records(s, n, 3, 0)
    np.testing.assert_array_equal(np.sort(rec[rec >= 0]), np.arange(n))
    assert (s.count < s.batch_size).sum() <= 1  # only the clipped batch is padded
    # The canonical lengths are the seed's (timm): another epoch reorders them, and the records.
    t = naflex.length_schedule(n, p, seed=3, epoch=1, drop_remainder=False)
    assert sorted(t.seq_len.tolist()) == sorted(s.seq_len.tolist())
    assert not np.array_equal(t.seq_len, s.seq_len) or not np.array_equal(_all_records(t, n, 3, 1), rec)
    other = naflex.length_schedule(n, p, seed=4, epoch=0, drop_remainder=False)
    assert not np.array_equal(other.seq_len[:10], s.seq_len[:10])


def test_length_schedule_resume_and_drop_remainder():
    n, p = 999, Patches(max_tokens=[64, 256], tokens_per_batch=2048, batch_divisor=1)
    full = naflex.length_schedule(n, p, seed=1, epoch=2, drop_remainder=False)
    for start in (0, 5, len(full.seq_len)):
        tail = naflex.length_schedule(n, p, seed=1, epoch=2, drop_remainder=False, start=start)
        for a, b in zip(tail, full):
            np.testing.assert_array_equal(a, b[start:])
    drop = naflex.length_schedule(n, p, seed=1, epoch=2, drop_remainder=True)
    clipped = int((full.count < full.batch_size).sum())
    assert len(drop.seq_len) == len(full.seq_len) - clipped
    assert (drop.count == drop.batch_size).all() and drop.count.sum() == full.count.sum() - full.count[
        full.count < full.batch_size
    ].sum()
    with pytest.raises(ValueError, match="start"):
        naflex.length_schedule(n, p, seed=1, epoch=2, drop_remainder=False, start=len(full.seq_len) + 1)


def test_patches_is_validated_naming_the_value():
    with pytest.raises(ValueError, match="tokens_per_batch"):
        Patches(max_tokens=[256, 576])
    with pytest.raises(ValueError, match="pack=True with max_tokens"):
        Patches(max_tokens=[256, 576], tokens_per_batch=4096, pack=True)
    with pytest.raises(ValueError, match="size must be an integer"):
        Patches(size=0)
    with pytest.raises(ValueError, match="max_tokens must be"):
        Patches(max_tokens="256")
    with pytest.raises(ValueError, match=r"image_tokens must be an integer \[1, 256\]"):
        Patches(max_tokens=256, pack=True, image_tokens=300)
    with pytest.raises(ValueError, match="image_tokens=64 applies to pack=True only"):
        Patches(image_tokens=64)
    assert Patches(max_tokens=1024, pack=True).image_tokens == 256
    assert Patches(max_tokens=[576, 256, 576], tokens_per_batch=4096).max_tokens == (256, 576)


def _check_packing(pk, tokens, max_tokens):
    """Every record in one sequence, inside it, no two overlapping, segment ids token for token."""
    ends = pk.offset.astype(np.int64) + tokens
    assert (pk.offset >= 0).all() and (ends <= max_tokens).all() and pk.seq.max() == pk.sequences - 1
    cover = np.zeros((pk.sequences, max_tokens), np.int64)
    for s, o, t in zip(pk.seq, pk.offset, tokens):
        cover[s, o : o + t] += 1
    assert cover.max() == 1
    seg = naflex.segment_ids(pk, tokens, max_tokens)
    np.testing.assert_array_equal(seg > 0, cover == 1)
    for s in np.unique(pk.seq)[:50]:
        mine = np.flatnonzero(pk.seq == s)
        mine = mine[np.argsort(pk.offset[mine])]
        for number, i in enumerate(mine, 1):
            assert (seg[s, pk.offset[i] : pk.offset[i] + tokens[i]] == number).all()


def test_pack_is_first_fit_decreasing_per_window():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 60, 103)
    pk = naflex.pack(tokens, 64, window=25)
    _check_packing(pk, tokens, 64)
    # The textbook first-fit-decreasing, one window at a time, as the reference.
    seq_base = 0
    for w0 in range(0, 103, 25):
        win = list(range(w0, min(w0 + 25, 103)))
        bins: list[int] = []
        for i in sorted(win, key=lambda i: (-tokens[i], i)):
            j = next((j for j, room in enumerate(bins) if room >= tokens[i]), len(bins))
            if j == len(bins):
                bins.append(64)
            assert pk.seq[i] == seq_base + j and pk.offset[i] == 64 - bins[j]
            bins[j] -= tokens[i]
        seq_base += len(bins)
    assert pk.sequences == seq_base
    with pytest.raises(ValueError, match="record 2 has 65"):
        naflex.pack(np.array([1, 2, 65]), 64, window=4)


PACKED = Patches(max_tokens=1024, pack=True)  # the defaults the module docstring's padding is for


def _padding(heights, widths, p=PACKED):
    h, w = naflex.sequence_size(heights, widths, p.size, p.image_tokens)
    tokens = (h // p.size).astype(np.int64) * (w // p.size)
    pk = naflex.pack(tokens, p.max_tokens, p.pack_window)
    if len(tokens) < 3000:  # the token-by-token check costs a Python loop per record
        _check_packing(pk, tokens, p.max_tokens)
    return 1 - tokens.sum() / (pk.sequences * p.max_tokens)


def imagenet_like_sizes(n, seed=0):
    """ImageNet-train-like sizes: area log-normal around 400*350 (sd 0.35 in log), aspect w/h
    log-normal around 1.14 (sd 0.25 in log) clipped to [1/2, 2]."""
    rng = np.random.default_rng(seed)
    area = 400 * 350 * np.exp(rng.normal(0, 0.35, n))
    aspect = np.clip(1.14 * np.exp(rng.normal(0, 0.25, n)), 0.5, 2.0)
    return np.round(np.sqrt(area / aspect)).astype(np.int64), np.round(np.sqrt(area * aspect)).astype(np.int64)


def test_packing_pads_under_5_percent_on_imagenet_like_sizes():
    h, w = imagenet_like_sizes(20_000)
    pad = _padding(h, w)
    print(f"padding on ImageNet-like sizes: {pad:.2%}")
    assert pad <= 0.05


def _photo_sizes(folder):
    with open(folder / "labels.csv") as f:
        rows = list(csv.DictReader(f))
    return np.array([int(r["height"]) for r in rows]), np.array([int(r["width"]) for r in rows])


def test_packing_pads_under_5_percent_on_real_photos(kodak, caltech101):
    kh, kw = _photo_sizes(kodak)
    ch, cw = _photo_sizes(caltech101)
    pad = _padding(np.concatenate([kh, ch]), np.concatenate([kw, cw]))
    print(f"padding on Kodak + Caltech-101 photo sizes: {pad:.2%}")
    assert pad <= 0.05

"""Order and augmentation keys: permutations checked exhaustively, the hash against a plain
Python reference, jax.numpy twins bit for bit, RRC boxes against a float64 torchvision-style
reference, and the state's validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tbljax import order
from tbljax._src.rules import augment
from tbljax._src.rules.augment import Augment
from tbljax._src.rules.order import permute_reference

from oracle import rrc_reference, torchvision_sample

SIZES = [1, 2, 3, 5, 7, 8, 13, 15, 16, 17, 31, 32, 33, 97, 127, 128, 129, 1000, 1021, 1024, 4095, 4097]
SEEDS = [0, 1, 2**40 + 3]


def mix32_ref(x: int) -> int:
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def test_mix32_matches_plain_python():
    xs = np.random.default_rng(0).integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32)
    got = order.mix32(xs)
    assert got.dtype == np.uint32
    assert got.tolist() == [mix32_ref(int(x)) for x in xs]


def hash32_ref(words, iv=0x243F6A88) -> int:
    h = iv
    for w in words:
        h = mix32_ref(h ^ w)
    return mix32_ref(h ^ 0x9E3779B9)


def permute_ref(x: int, n: int, seed: int, epoch: int) -> int:
    """The shuffle as order.py's docstring defines it, in plain Python ints."""
    k = (n - 1).bit_length()
    a, b = k - k // 2, k // 2
    keys = [hash32_ref([0x53484646, seed & 0xFFFFFFFF, seed >> 32, epoch, r]) for r in range(8)]
    while True:
        left, right, wl = x >> b, x & ((1 << b) - 1), a
        for key in keys:
            left, right = right, left ^ (mix32_ref(right ^ key) & ((1 << wl) - 1))
            wl = a + b - wl
        x = (left << b) | right
        if x < n:
            return x


@pytest.mark.parametrize("n", [2, 3, 17, 1000, 4097, 3_000_017, 2**31 + 11, 2**62])
def test_native_shuffle_matches_the_definition_and_the_array_code(n):
    # order.permute runs the network in C++; the array code (permute_reference) is what
    # jax.numpy runs. Both must give the plain-Python definition's indices.
    pos = np.unique(
        np.r_[
            np.arange(min(n, 300)),
            n - 1 - np.arange(min(n, 300)),
            np.random.default_rng(n % 1000).integers(0, n, 300, dtype=np.int64),
        ]
    )
    for seed, epoch in ((0, 0), (7, 3), (2**63 + 5, 2**32 - 1)):
        want = [permute_ref(int(p), n, seed, epoch) for p in pos]
        assert order.permute(pos, n, seed, epoch).tolist() == want, (n, seed, epoch)
        assert permute_reference(pos, n, seed, epoch).tolist() == want


@pytest.mark.parametrize("n", SIZES)
def test_each_epoch_is_a_permutation(n):
    for seed in SEEDS:
        for epoch in (0, 1, 7):
            p = order.permute(np.arange(n), n, seed, epoch)
            assert p.dtype == np.int64
            assert np.array_equal(np.sort(p), np.arange(n)), (n, seed, epoch)


def test_large_n_permutation_and_o1_lookup():
    n = 3_000_017  # prime, just above 2^21 + 2^20: cycle walking is needed for most values
    p = order.permute(np.arange(n), n, seed=5, epoch=2)
    assert np.array_equal(np.bincount(p, minlength=n), np.ones(n, np.int64))
    # Positions looked up alone or in any batch give the same indices.
    pos = np.array([n - 1, 0, 12345, 2_999_999])
    assert np.array_equal(order.permute(pos, n, seed=5, epoch=2), p[pos])
    # Very large N is fine too (no table): distinct in-range values for a sample of positions.
    big = 2**40 + 15
    q = order.permute(np.arange(10_000) * 99_991, big, seed=1, epoch=0)
    assert len(set(q.tolist())) == 10_000 and q.min() >= 0 and q.max() < big


def test_epochs_and_seeds_differ_and_look_shuffled():
    n = 1000
    perms = {(s, e): order.permute(np.arange(n), n, s, e) for s in (0, 1) for e in (0, 1, 2)}
    keys = list(perms)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert (perms[a] != perms[b]).mean() > 0.9, (a, b)
    for p in perms.values():
        assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.15
        assert (p == np.arange(n)).sum() < 10
    # Where sample 0 lands, over many epochs of a small dataset: roughly uniform.
    counts = np.bincount([int(np.argmax(order.permute(np.arange(8), 8, 3, e) == 0)) for e in range(1600)], minlength=8)
    assert counts.min() > 130 and counts.max() < 270, counts


def test_shuffle_false_is_identity_and_bad_input_is_named():
    assert order.permute(np.arange(9), 9, 1, 1, shuffle=False).tolist() == list(range(9))
    with pytest.raises(IndexError, match="position 9 is outside"):
        order.permute(np.array([3, 9]), 9)
    with pytest.raises(IndexError, match="position -1"):
        order.permute(np.array([-1]), 9)
    with pytest.raises(ValueError, match="got 0"):
        order.permute(np.arange(1), 0)
    with pytest.raises(ValueError, match=r"seed must be .* got -1"):
        order.permute(np.arange(3), 3, seed=-1)
    with pytest.raises(ValueError, match=r"epoch must be .* got 1.5"):
        order.permute(np.arange(3), 3, epoch=1.5)


def test_jax_numpy_twin_is_bit_exact():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    pos = np.arange(700)
    for n in (700, 1024, 5003):  # one shape: eager jax.numpy compiles once per shape
        want = order.permute(pos, n, seed=9, epoch=4)
        got = order.permute(jnp.asarray(pos, jnp.int32), n, seed=9, epoch=4, xp=jnp)
        assert np.array_equal(np.asarray(got), want), n
    # The augmentation twin also runs inside jit, where it would be used.
    idx = np.arange(300)

    @jax.jit
    def twin(i):
        return (
            order.random_bits(i[:, None], jnp.arange(41), seed=2**33 + 1, epoch=6, xp=jnp),
            augment.crop_boxes(i, height=64, width=48, seed=3, epoch=1, xp=jnp),
            augment.crop_boxes(i, height=7, width=300, seed=3, epoch=1, xp=jnp),
            augment.flips(i, seed=3, epoch=1, xp=jnp),
        )

    bits, boxes_a, boxes_b, flips = (np.asarray(x) for x in twin(jnp.asarray(idx, jnp.int32)))
    assert np.array_equal(bits, order.random_bits(idx[:, None], np.arange(41), seed=2**33 + 1, epoch=6))
    assert np.array_equal(boxes_a, augment.crop_boxes(idx, height=64, width=48, seed=3, epoch=1))
    assert np.array_equal(boxes_b, augment.crop_boxes(idx, height=7, width=300, seed=3, epoch=1))
    assert np.array_equal(flips, augment.flips(idx, seed=3, epoch=1))


def test_random_bits_are_keyed_by_seed_epoch_index_counter_only():
    idx = np.arange(2000)
    a = order.random_bits(idx[:, None], np.arange(4), seed=1, epoch=0)
    # Any subset, in any order, gives the same words per (index, counter).
    sel = np.array([1999, 5, 5, 700])
    assert np.array_equal(order.random_bits(sel[:, None], np.arange(4), seed=1, epoch=0), a[sel])
    assert (order.random_bits(idx[:, None], np.arange(4), seed=1, epoch=1) != a).mean() > 0.99
    assert (order.random_bits(idx[:, None], np.arange(4), seed=2, epoch=0) != a).mean() > 0.99
    top = (a >> 31).mean(axis=0)
    assert np.all(np.abs(top - 0.5) < 0.05)
    c = np.corrcoef(a.T.astype(np.float64))
    assert np.all(np.abs(c[np.triu_indices(4, 1)]) < 0.1)


def test_steps_and_advance():
    assert order.steps_in_epoch(37, 8, drop_remainder=True) == 4
    assert order.steps_in_epoch(37, 8, drop_remainder=False) == 5
    assert order.steps_in_epoch(37, 8, drop_remainder=True, start=30) == 0
    assert order.steps_in_epoch(37, 8, drop_remainder=False, start=30) == 1
    assert order.advance(0, 32, 37, 8, drop_remainder=True) == (1, 0)
    assert order.advance(0, 32, 37, 8, drop_remainder=False) == (0, 32)
    assert order.advance(0, 40, 37, 8, drop_remainder=False) == (1, 0)
    with pytest.raises(ValueError, match="got 0"):
        order.steps_in_epoch(37, 0, drop_remainder=True)


def test_state_roundtrip_and_clear_errors():
    s = order.make_state(seed=3, epoch=2, position=16, fingerprint="37-abc")
    assert s == {"version": 1, "seed": 3, "epoch": 2, "position": 16, "fingerprint": "37-abc"}
    assert order.check_state(dict(s), seed=3, fingerprint="37-abc", n=37) == (2, 16)
    with pytest.raises(ValueError, match="version 99 is not supported"):
        order.check_state({**s, "version": 99}, seed=3, fingerprint="37-abc", n=37)
    with pytest.raises(ValueError, match="'37-abc' but this loader reads dataset '40-def'"):
        order.check_state(s, seed=3, fingerprint="40-def", n=40)
    with pytest.raises(ValueError, match="seed=3 but this loader has seed=4"):
        order.check_state(s, seed=4, fingerprint="37-abc", n=37)
    with pytest.raises(ValueError, match=r"missing \['position'\]"):
        order.check_state({k: v for k, v in s.items() if k != "position"}, seed=3, fingerprint="37-abc", n=37)
    with pytest.raises(ValueError, match=r"\[0, 37\], got 38"):
        order.check_state({**s, "position": 38}, seed=3, fingerprint="37-abc", n=37)
    with pytest.raises(ValueError, match="must be a dict"):
        order.check_state([1], seed=3, fingerprint="37-abc", n=37)


# ---- augmentation ----


@pytest.mark.parametrize("hw", [(64, 48), (160, 160), (3, 200), (37, 5)])
def test_crop_boxes_follow_torchvision_semantics(hw):
    h, w = hw
    idx = np.arange(3000)
    opts = Augment(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
    boxes = augment.crop_boxes(idx, height=h, width=w, seed=11, epoch=2)
    assert boxes.dtype == np.int32 and boxes.shape == (3000, 4)
    y, x, bh, bw = boxes.T
    assert (y >= 0).all() and (x >= 0).all() and (bh >= 1).all() and (bw >= 1).all()
    assert (y + bh <= h).all() and (x + bw <= w).all()
    u = order.random_bits(idx[:, None, None], np.arange(40).reshape(10, 4), 11, 2)
    ref = np.array([rrc_reference(u[i], h, w, opts.scale, opts.ratio) for i in range(len(idx))])
    # Float32 table arithmetic vs float64 exp/sqrt: a side may round the other way right at .5.
    same = (boxes == ref).all(axis=1)
    assert same.mean() > 0.99
    assert np.abs(boxes[:, 2:] - ref[:, 2:]).max() <= 1


def test_crop_boxes_statistics_and_keys():
    idx = np.arange(20_000)
    b = augment.crop_boxes(idx, height=512, width=512, seed=0, epoch=0)
    frac = b[:, 2] * b[:, 3] / 512**2
    assert 0.075 <= frac.min() and frac.max() <= 1.0
    # The same distribution as torchvision's sampler run on NumPy's own generator.
    rng = np.random.default_rng(0)
    tv = np.array([torchvision_sample(rng, 512, 512) for _ in range(20_000)])
    tv_frac = tv[:, 0] * tv[:, 1] / 512**2
    assert abs(frac.mean() - tv_frac.mean()) < 0.01
    assert abs(np.median(frac) - np.median(tv_frac)) < 0.015
    logr = np.log(b[:, 3] / b[:, 2])
    assert abs(logr.mean() - np.log(tv[:, 1] / tv[:, 0]).mean()) < 0.01
    assert logr.min() > math.log(3 / 4) - 0.02
    # A sample's box depends on (seed, epoch, index) only: any batch split, any order.
    sel = np.array([19_999, 3, 3, 12_345])
    assert np.array_equal(augment.crop_boxes(sel, height=512, width=512, seed=0, epoch=0), b[sel])
    other = augment.crop_boxes(idx, height=512, width=512, seed=0, epoch=1)
    assert (other != b).any(axis=1).mean() > 0.95
    f = augment.flips(idx, seed=0, epoch=0)
    assert f.dtype == bool and abs(f.mean() - 0.5) < 0.02
    assert np.array_equal(augment.flips(sel, seed=0, epoch=0), f[sel])


def test_fallback_is_the_clamped_centre_crop():
    # A 1-pixel-high strip: no attempt fits, so the centre crop at the widest allowed ratio.
    b = augment.crop_boxes(np.arange(50), height=1, width=1000, seed=0, epoch=0)
    assert (b == [0, 499, 1, 1]).all()  # x0 = (1000 - 1) // 2
    b = augment.crop_boxes(np.arange(50), height=900, width=2, seed=0, epoch=0)
    assert (b == [448, 0, 3, 2]).all()


def test_augment_options_validate():
    assert Augment.from_spec("rrc_flip") == Augment()
    assert Augment.from_spec("flip") == Augment(crop=False)
    assert Augment.from_spec(None) is None
    assert Augment(size=[32, 24]).size == (32, 24)
    with pytest.raises(ValueError, match="got 'crop'"):
        Augment.from_spec("crop")
    with pytest.raises(ValueError, match=r"scale must satisfy .* got \(0.5, 0.1\)"):
        Augment(scale=(0.5, 0.1))
    with pytest.raises(ValueError, match=r"ratio .* got \(0, 1\)"):
        Augment(ratio=(0, 1))
    with pytest.raises(ValueError, match=r"size must be .* got \(0, 5\)"):
        Augment(size=(0, 5))
    with pytest.raises(ValueError, match="needs crop=True"):
        Augment(crop=False, size=(8, 8))
    with pytest.raises(ValueError, match="height must be .* got 70000"):
        augment.crop_boxes(np.arange(2), height=70000, width=5, seed=0, epoch=0)
    with pytest.raises(dataclasses_frozen_error()):
        Augment().flip = False


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError

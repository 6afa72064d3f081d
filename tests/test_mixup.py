"""Batch-level Mixup/CutMix (`tbljax.ops.mixup_cutmix`, its host twin): equal to timm's ``Mixup``
given the same λ and box centre, the draws distributed as timm draws them, the same bits in jit
and on the host, per device on 4 CPU devices."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tbljax import ops
from tbljax._src.rules import mixup as rule


def _timm_mixup():
    """timm's timm/data/mixup.py loaded on its own (`import timm` needs torchvision)."""
    pytest.importorskip("torch")
    spec = importlib.util.find_spec("timm")
    if spec is None:
        pytest.skip("timm is not installed (the test extra pins timm==1.0.31)")
    path = os.path.join(os.path.dirname(spec.origin), "data", "mixup.py")
    s = importlib.util.spec_from_file_location("timm_data_mixup", path)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def _forced(timm, m, draws, monkeypatch):
    """A timm Mixup (or FastCollateMixup) whose draws are ours: its parameter draws return our
    (λ, cutmix) and np.random.randint returns our box centres in the order timm asks for them."""
    centres = []
    rows = range(len(draws.applied)) if m.mode == "elem" else range(len(draws.applied) // 2)
    if m.mode == "batch":
        rows = [0]
    for i in rows:
        if draws.applied[i] and draws.cutmix[i]:
            centres += [int(draws.cy[i]), int(draws.cx[i])]
    it = iter(centres)
    monkeypatch.setattr(np.random, "randint", lambda lo, hi, size=None: next(it))
    kw = dict(
        mixup_alpha=m.mixup_alpha,
        cutmix_alpha=m.cutmix_alpha,
        prob=m.prob,
        switch_prob=m.switch_prob,
        mode=m.mode,
        label_smoothing=m.label_smoothing,
        num_classes=m.num_classes,
    )

    def per_batch(self):
        return (float(draws.drawn[0]) if draws.applied[0] else 1.0), bool(draws.cutmix[0])

    def per_elem(self, n):
        lam = np.where(draws.applied[:n], draws.drawn[:n], np.float32(1)).astype(np.float32)
        return lam, draws.cutmix[:n].copy()

    monkeypatch.setattr(timm.Mixup, "_params_per_batch", per_batch)
    monkeypatch.setattr(timm.Mixup, "_params_per_elem", per_elem)
    return kw, lambda: list(it)


@pytest.mark.parametrize("mode", rule.MODES)
def test_float32_equals_timm_given_the_same_draws(mode, monkeypatch):
    import torch

    timm = _timm_mixup()
    rng = np.random.default_rng(0)
    b, c, h, w = 8, 3, 16, 12
    m = rule.Mixup(num_classes=7, mode=mode, prob=0.8)
    cases = set()
    for step in range(24):
        x = rng.standard_normal((b, c, h, w)).astype(np.float32)
        y = rng.integers(0, 7, b)
        d = rule.block_params(m, b, h, w, seed=5, step=step)
        kw, left = _forced(timm, m, d, monkeypatch)
        want_x, want_y = timm.Mixup(**kw)(torch.from_numpy(x.copy()), torch.from_numpy(y))
        assert left() == []  # timm asked for every centre we drew
        got_x, got_y = ops.mixup_cutmix_host(x, y, seed=5, step=step, num_classes=7, mode=mode, prob=0.8, layout="NCHW")
        assert np.array_equal(got_x, want_x.numpy()), (mode, step)
        # timm mixes targets by its float64 λ (batch mode); ours is that λ rounded to float32.
        np.testing.assert_allclose(got_y, want_y.numpy(), rtol=0, atol=2.0**-23)
        nhwc = ops.mixup_cutmix_host(x.transpose(0, 2, 3, 1), y, seed=5, step=step, num_classes=7, mode=mode, prob=0.8)[
            0
        ]
        assert np.array_equal(nhwc, got_x.transpose(0, 2, 3, 1))
        cases |= {(bool(a), bool(k)) for a, k in zip(d.applied, d.cutmix)}
    assert cases == {(False, False), (False, True), (True, False), (True, True)}  # every branch met


@pytest.mark.parametrize("mode", rule.MODES)
def test_uint8_equals_timm_fast_collate_mixup(mode, monkeypatch):
    timm = _timm_mixup()
    rng = np.random.default_rng(1)
    b, h, w = 6, 10, 14
    m = rule.Mixup(num_classes=5, mode=mode, label_smoothing=0.0)
    for step in range(12):
        x = rng.integers(0, 256, (b, 3, h, w), dtype=np.uint8)
        y = rng.integers(0, 5, b)
        d = rule.block_params(m, b, h, w, seed=9, step=step)
        kw, _ = _forced(timm, m, d, monkeypatch)
        want_x, want_y = timm.FastCollateMixup(**kw)([(x[i].copy(), int(y[i])) for i in range(b)])
        got_x, got_y = ops.mixup_cutmix_host(
            x, y, seed=9, step=step, num_classes=5, mode=mode, label_smoothing=0.0, layout="NCHW"
        )
        assert got_x.dtype == np.uint8 and np.array_equal(got_x, want_x.numpy()), (mode, step)
        np.testing.assert_allclose(got_y, want_y.numpy(), rtol=0, atol=2.0**-23)


def _ks(a, b) -> float:
    """The two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)).max())


@pytest.mark.parametrize("alpha", [0.2, 0.8, 1.0, 2.0])
def test_lambda_draws_follow_beta(alpha):
    n = 100_000
    d = rule.block_params(
        rule.Mixup(num_classes=2, mixup_alpha=alpha, cutmix_alpha=0.0, mode="elem"), n, 224, 224, seed=1, step=0
    )
    # float32, as timm keeps λ (`_params_per_elem`): near 1 both round to 1.0.
    ref = np.random.default_rng(0).beta(alpha, alpha, n).astype(np.float32)
    assert _ks(d.drawn, ref) < 1.95 * np.sqrt(2 / n)  # the 0.1% critical value


def test_switch_and_apply_frequencies_match_their_probabilities():
    n = 100_000
    d = rule.block_params(rule.Mixup(num_classes=2, prob=0.7, switch_prob=0.3, mode="elem"), n, 32, 32, seed=2, step=4)
    sigma = np.sqrt(0.25 / n)
    assert abs(d.applied.mean() - 0.7) < 5 * sigma and abs(d.cutmix.mean() - 0.3) < 5 * sigma
    assert not (d.mixes & ~d.applied).any() and (d.box[~(d.applied & d.cutmix)] == 0).all()


def test_boxes_follow_timms_rand_bbox_given_lambda():
    timm = _timm_mixup()
    n, h, w = 20_000, 40, 56
    d = rule.block_params(rule.Mixup(num_classes=2, mixup_alpha=0.0, mode="elem"), n, h, w, seed=3, step=1)
    np.random.seed(0)
    ref = np.array([timm.rand_bbox((3, h, w), float(lam)) for lam in d.drawn])  # (yl, yh, xl, xh)
    for k in range(4):
        assert _ks(d.box[:, k], ref[:, k]) < 1.95 * np.sqrt(2 / n), k
    area = (d.box[:, 1] - d.box[:, 0]) * (d.box[:, 3] - d.box[:, 2])
    assert np.array_equal(d.lam, (1 - area / (h * w)).astype(np.float32))


@pytest.mark.parametrize("dtype", ["float32", "uint8", "bfloat16"])
@pytest.mark.parametrize("mode", rule.MODES)
def test_in_jit_equals_the_host_bit_for_bit(mode, dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 9, 7, 3)) * 60 + 100
    x = x.clip(0, 255).astype(np.uint8) if dtype == "uint8" else x.astype(jnp.dtype(dtype))
    y = rng.integers(-1, 6, 8)
    kw = dict(seed=11, num_classes=6, mode=mode)
    f = jax.jit(lambda a, b, s: ops.mixup_cutmix(a, b, step=s, **kw))
    for step in range(8):
        hx, hy = ops.mixup_cutmix_host(x, y, step=step, **kw)
        jx, jy = f(x, y, jnp.uint32(step))
        assert hx.dtype == x.dtype and np.array_equal(hx, np.asarray(jx)), step
        assert np.array_equal(hy, np.asarray(jy)), step


def test_padding_rows_have_zero_targets_and_add_nothing():
    m = dict(num_classes=4, seed=0, label_smoothing=0.2, mixup_alpha=1.0, cutmix_alpha=0.0)
    y = np.array([2, 0, 1, -1])
    x = np.zeros((4, 2, 2, 3), np.float32)
    _, t = ops.mixup_cutmix_host(x, y, step=0, **m)
    lam = rule.block_params(
        rule.Mixup(num_classes=4, mixup_alpha=1.0, cutmix_alpha=0.0, label_smoothing=0.2), 4, 2, 2, seed=0, step=0
    ).lam[0]
    smooth = np.full((4, 4), 0.05, np.float32)
    smooth[np.arange(4), np.maximum(y, 0)] = 0.85
    smooth[3] = 0
    want = smooth * lam + smooth[::-1] * (np.float32(1) - lam)
    np.testing.assert_allclose(t, want, rtol=0, atol=1e-7)
    assert t[0].sum() == pytest.approx(lam, abs=1e-6)  # row 0's partner is the padding row


def test_a_step_mixes_the_same_pairs_after_a_resume():
    x = np.random.default_rng(5).standard_normal((4, 6, 6, 3)).astype(np.float32)
    y = np.arange(4)
    runs = [
        [ops.mixup_cutmix_host(x, y, seed=7, step=s, num_classes=4, mode="elem")[1] for s in steps]
        for steps in (range(6), range(3, 6))
    ]
    for a, b in zip(runs[0][3:], runs[1]):
        assert np.array_equal(a, b)
    assert not np.array_equal(runs[0][0], runs[0][1])


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(mixup_alpha=0.0, cutmix_alpha=0.0), "mixup_alpha=0 and cutmix_alpha=0"),
        (dict(mode="half"), "mode must be one of"),
        (dict(prob=1.5), "prob must be a number in [0, 1]"),
        (dict(num_classes=0), "num_classes must be an integer >= 1"),
        (dict(label_smoothing=1.0), "label_smoothing must be a number in [0, 1)"),
        (dict(step=-1), "step must be an integer in [0, 2**32)"),
        (dict(images=np.zeros((6, 4, 4, 3), np.int16)), "images must be one of"),
        (dict(images=np.zeros((5, 4, 4, 3), np.float32), labels=np.zeros(5, int)), "even number of rows"),
        (dict(labels=np.array([0, 1, 7, 2, 3, 0])), "labels row 2: 7 is neither a class id in [0, 4)"),
        (dict(labels=np.zeros(6, np.float32)), "labels must be (6,) integers"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, words):
    args = (
        dict(images=np.zeros((6, 4, 4, 3), np.float32), labels=np.zeros(6, int), seed=0, step=0, num_classes=4) | kwargs
    )
    images, labels = args.pop("images"), args.pop("labels")
    for fn in (ops.mixup_cutmix_host, ops.mixup_cutmix):
        with pytest.raises(ValueError, match=re.escape(words)):
            fn(images, labels, **args)


_FOUR_DEVICES = textwrap.dedent("""
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from tbljax import ops
    assert jax.device_count() == 4
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = NamedSharding(mesh, P("data"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8, 6, 3)).astype(np.float32)
    y = rng.integers(0, 5, 16)
    for mode in ("batch", "pair", "elem"):
        kw = dict(seed=3, num_classes=5, mode=mode)
        want = ops.mixup_cutmix_host(x, y, step=2, blocks=4, **kw)
        one = ops.mixup_cutmix_host(x, y, step=2, **kw)
        assert not np.array_equal(want[0], one[0])  # partners differ: within each device's 4 rows
        xs, ys = jax.device_put(x, rows), jax.device_put(y, rows)
        f = jax.jit(lambda a, b, s: ops.mixup_cutmix(a, b, step=s, sharding=mesh, **kw))
        got = f(xs, ys, 2)
        assert all(np.array_equal(np.asarray(g), w) for g, w in zip(got, want)), mode
        assert got[0].sharding.is_equivalent_to(rows, 4)
        text = f.lower(xs, ys, 2).compile().as_text()
        assert not any(c in text for c in ("all-gather", "all-to-all", "collective-permute", "all-reduce")), text
        if mode != "pair":
            continue  # the other placements once
        eager = ops.mixup_cutmix(xs, ys, step=2, **kw)  # a concrete sharded batch: per device too
        assert all(np.array_equal(np.asarray(g), w) for g, w in zip(eager, want)), mode
        inside = jax.jit(jax.shard_map(lambda a, b: ops.mixup_cutmix(a, b, step=2, **kw), mesh=mesh,
                                       in_specs=(P("data"), P("data")), out_specs=(P("data"), P("data"))))
        assert all(np.array_equal(np.asarray(g), w) for g, w in zip(inside(xs, ys), want)), mode
    print("OK")
""")


def test_each_of_4_cpu_devices_mixes_its_own_rows():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _FOUR_DEVICES], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr

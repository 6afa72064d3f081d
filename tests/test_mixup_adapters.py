"""Issue 47: ``mixup=`` on `tbljax.torch.loader` and `tbljax.mlx.loader`. Every batch equals, bit
for bit, `tbljax.ops.mixup_cutmix` run in `jax.jit` on the same loader's unmixed batch with the
same seed and the step counted across epochs (float32, bfloat16 and uint8; each rank's rows one
block); a resumed loader mixes the same pairs; a padding row's label adds nothing to its
partner's target; mixed images are new memory; what cannot be mixed is refused by name when
the loader is made."""

from __future__ import annotations

import dataclasses
import gc
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tbljax
from tbljax import ops

import _loader_testing as T

N, H, W, B, C = 22, 6, 5, 4, 10  # 22 = 5 full steps of 4 and one with 2 padding rows
SEED = 9


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    labels = (np.arange(N) * 7) % C
    return T.write_tbl(tmp_path_factory.mktemp("mixup") / "a.tbl", T.images(N, H, W), labels)


def _framework(name):
    """(loader function, array → NumPy with bfloat16 as float32 (exact))."""
    if name == "torch":
        torch = pytest.importorskip("torch")
        import tbljax.torch

        return tbljax.torch.loader, lambda t: (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    mx = pytest.importorskip("mlx.core")
    import tbljax.mlx

    return tbljax.mlx.loader, lambda a: np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)


def _epochs(ld, epochs, host, start=0, stop_after=None):
    """[(epoch, step in epoch, images, labels, valid)] over `epochs` passes, as NumPy copies."""
    out = []
    for e in range(start, epochs):
        ld.set_epoch(e)
        first = ld.cursor[1] // ld.rows.global_batch  # a resumed loader starts inside the epoch
        for k, b in enumerate(ld):
            valid = None if b.valid is None else host(b.valid)
            out.append((e, first + k, host(b.images), host(b.labels), valid))
            if stop_after is not None and len(out) == stop_after:
                return out
    return out


def _jit_op(m: ops.Mixup, layout):
    kw = dataclasses.asdict(m)
    return jax.jit(lambda x, y, s: ops.mixup_cutmix(x, y, seed=SEED, step=s, layout=layout, **kw))


CASES = [
    ("torch", "float32", "batch"),
    ("torch", "bfloat16", "elem"),
    ("torch", "uint8", "pair"),
    ("mlx", "float32", "pair"),
    ("mlx", "bfloat16", "batch"),
    ("mlx", "uint8", "elem"),
]


@pytest.mark.parametrize("framework,dtype,mode", CASES, ids=["-".join(c) for c in CASES])
def test_batches_equal_the_jit_op_on_the_unmixed_batch(path, framework, dtype, mode):
    loader, host = _framework(framework)
    m = ops.Mixup(num_classes=C, mode=mode)
    kw = dict(seed=SEED, dtype=dtype, augment="flip", drop_remainder=False)
    plain = loader(path, B, **kw)
    mixed = loader(path, B, mixup=m, **kw)
    layout = mixed.options.layout
    f = _jit_op(m, layout)
    steps = len(mixed)
    assert steps == 6
    changed = 0
    for (e, s, x, y, valid), (e2, s2, mx_, t, valid2) in zip(
        _epochs(plain, 2, host), _epochs(mixed, 2, host), strict=True
    ):
        assert (e, s) == (e2, s2)
        np.testing.assert_array_equal(valid, valid2)
        xj = jnp.asarray(x, jnp.dtype(dtype))  # bfloat16 through float32: exact
        want_x, want_t = f(xj, jnp.asarray(y, jnp.int32), jnp.uint32(e * steps + s))
        assert t.dtype == np.float32 and t.shape == (B, C)
        np.testing.assert_array_equal(mx_, np.asarray(want_x).astype(mx_.dtype), err_msg=f"{e} {s}")
        np.testing.assert_array_equal(t, np.asarray(want_t), err_msg=f"{e} {s}")
        changed += not np.array_equal(mx_, x)
    assert changed >= 10  # prob=1: (nearly) every step mixes something


def test_each_rank_is_one_block(path):
    """Two ranks: each mixes its own rows (partners within the rank), as the jit op mixes each
    device's rows."""
    loader, host = _framework("torch")
    m = ops.Mixup(num_classes=C, mode="pair")
    f = _jit_op(m, "NCHW")
    for rank in range(2):
        plain = loader(path, B // 2, rank=rank, world_size=2, seed=SEED)
        mixed = loader(path, B // 2, rank=rank, world_size=2, seed=SEED, mixup=m)
        for (_, s, x, y, _), (_, _, mx_, t, _) in zip(_epochs(plain, 1, host), _epochs(mixed, 1, host), strict=True):
            want_x, want_t = f(jnp.asarray(x), jnp.asarray(y, jnp.int32), jnp.uint32(s))
            np.testing.assert_array_equal(mx_, np.asarray(want_x))
            np.testing.assert_array_equal(t, np.asarray(want_t))


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_a_resumed_loader_mixes_the_same_pairs(path, framework):
    loader, host = _framework(framework)
    kw = dict(seed=SEED, augment="rrc_flip", mixup=ops.Mixup(num_classes=C, mode="elem"))
    full = _epochs(loader(path, B, **kw), 3, host)
    first = loader(path, B, **kw)
    head = _epochs(first, 3, host, stop_after=8)  # 5 steps an epoch: inside epoch 1
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["position"]) == (1, 3 * B)
    second = loader(path, B, **kw)
    second.load_state_dict(state)
    tail = _epochs(second, 3, host, start=state["epoch"])
    assert len(head) + len(tail) == len(full) == 15
    for a, b in zip(head + tail, full, strict=True):
        assert a[:2] == b[:2]
        np.testing.assert_array_equal(a[2], b[2])
        np.testing.assert_array_equal(a[3], b[3])
    assert not np.array_equal(full[0][3], full[5][3])  # another epoch, other draws


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_a_padding_rows_label_adds_nothing(path, framework):
    """The last step of 22 holds 2 real rows and 2 padding rows (label -1, valid False): rows 0
    and 1 mix with padding rows 3 and 2, so each target holds only its own label (its λ share),
    and a padding row's only its real partner's; images of padding rows are zeros before mixing."""
    loader, host = _framework(framework)
    m = ops.Mixup(num_classes=C, mixup_alpha=1.0, cutmix_alpha=0.0, label_smoothing=0.0)
    ld = loader(path, B, seed=SEED, drop_remainder=False, mixup=m, shuffle=False)
    *_, (_, s, _, t, valid) = _epochs(ld, 1, host)
    assert s == 5 and valid.tolist() == [True, True, False, False]
    labels = (np.arange(20, 22) * 7) % C
    for r, own in ((0, labels[0]), (1, labels[1]), (2, labels[1]), (3, labels[0])):
        assert np.flatnonzero(t[r]).tolist() == [own], (r, t[r])
    np.testing.assert_allclose(t[0].sum() + t[3].sum(), 1, atol=1e-6)  # λ and 1 - λ
    assert 0 < t[0].sum() < 1


def test_mixed_torch_images_are_new_memory_not_the_ring(path):
    loader, _ = _framework("torch")
    ld = loader(path, B, seed=SEED, prefetch=1, mixup=ops.Mixup(num_classes=C))
    ring = {s.views()[0].ctypes.data for s in ld.ring.slots}
    held = [x for x, _ in ld]
    assert not {x.data_ptr() for x in held} & ring
    assert ld.metrics()["slots_replaced"] == 0  # held batches keep no slot busy
    del held
    gc.collect()


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_what_cannot_be_mixed_is_refused_when_the_loader_is_made(path, framework, tmp_path):
    loader, _ = _framework(framework)
    m = ops.Mixup(num_classes=C)
    with pytest.raises(TypeError, match=r"mixup must be None or a tbljax.ops.Mixup, got dict"):
        loader(path, B, mixup={"num_classes": C})
    with pytest.raises(ValueError, match=r"mixup= with batch_size=3 on this rank.*even number of rows"):
        loader(path, 3, mixup=m)
    with pytest.raises(ValueError, match=r"a.tbl: record 1 has label 7, not a class id in \[0, 7\)"):
        loader(path, B, mixup=ops.Mixup(num_classes=7))  # labels 0, 7, 4, ...
    unlabelled = T.write_tbl(tmp_path / "u.tbl", T.images(4, H, W), np.array([1, 2, -1, 0]))
    with pytest.raises(ValueError, match=r"u.tbl: record 2 has no label \(1 such records\)"):
        loader(unlabelled, B, mixup=m)


def test_the_jax_loader_takes_no_mixup_its_step_calls_the_op(path):
    with pytest.raises(TypeError, match="tbljax.loader.*mixup"):
        tbljax.loader(path, B, mixup=ops.Mixup(num_classes=C))

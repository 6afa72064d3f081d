"""tbljax.mlx against the JAX loader and plain NumPy, with real MLX (mlx[cpu] on Linux): the same
order, pixels and labels for every dtype and layout, batches that own their memory (the ring is
recycled at once), resume from state_dict, rank splits, and one epoch per pass."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import tbljax  # noqa: E402
import tbljax.mlx  # noqa: E402
from tbljax import order  # noqa: E402

import _loader_testing as T  # noqa: E402

N, H, W, B = 37, 6, 5, 4
MEAN, STD = tbljax.IMAGENET_MEAN, tbljax.IMAGENET_STD


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlx")
    imgs = T.images(N, H, W)
    labels = (np.arange(N) * 3) % 7
    return imgs, labels, T.write_tbl(d / "a.tbl", imgs, labels)


def bits(a):
    """An mx.array as NumPy; bfloat16 as its raw 16 bits (NumPy has no bfloat16 buffer)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16))
    return np.array(a)


@pytest.mark.parametrize(
    "dtype,layout", [("float32", "NHWC"), ("float32", "NCHW"), ("bfloat16", "NHWC"), ("uint8", "NCHW")]
)
def test_same_order_and_pixels_as_the_jax_loader_and_numpy(data, dtype, layout):
    imgs, labels, path = data
    mx_dtype = {"float32": mx.float32, "bfloat16": mx.bfloat16, "uint8": mx.uint8}[dtype]
    ld = tbljax.mlx.loader(
        path, B, seed=7, dtype=mx_dtype if dtype == "bfloat16" else dtype, layout=layout, augment="rrc_flip"
    )
    want = [
        {k: np.asarray(v) for k, v in b.items()}
        for b in tbljax.loader(path, B, seed=7, num_epochs=1, dtype=dtype, layout=layout, augment="rrc_flip")
    ]
    got = list(ld)
    assert len(got) == len(ld) == len(want) == N // B
    for s, (batch, w) in enumerate(zip(got, want)):
        x, y = batch
        assert isinstance(x, mx.array) and x.dtype == mx_dtype and y.dtype == mx.int32
        idx = order.permute(s * B + np.arange(B), N, 7, 0)
        np.testing.assert_array_equal(np.array(batch.index), idx)
        np.testing.assert_array_equal(np.array(y), labels[idx])
        np.testing.assert_array_equal(bits(x), w["image"].view(bits(x).dtype))
    # Without augmentation, straight against the NumPy normalization.
    if dtype != "uint8":
        for batch in tbljax.mlx.loader(path, B, seed=7, dtype=dtype, layout=layout):
            idx = np.array(batch.index)
            ref = T.normalize(imgs[idx], MEAN, STD, np.dtype(w["image"].dtype), layout)
            np.testing.assert_array_equal(bits(batch[0]), ref.view(bits(batch[0]).dtype))


def test_batches_own_their_memory_and_the_ring_is_recycled(data):
    imgs, _, path = data
    ld = tbljax.mlx.loader(path, B, seed=2, prefetch=1)
    kept = []
    for _epoch in range(3):
        kept += list(ld)
    gc.collect()
    assert ld.metrics()["slots_replaced"] == 0  # copied out: the ring never waits on a batch
    for b in kept:
        np.testing.assert_array_equal(np.array(b[0]), T.normalize(imgs[np.array(b.index)], MEAN, STD))
    assert [b.epoch for b in kept] == [e for e in range(3) for _ in range(len(ld))]
    x = kept[-1][0]  # an ordinary mx.array for this thread's MLX ops
    assert float((x * 2).sum()) == pytest.approx(2 * float(np.array(x).astype(np.float64).sum()), rel=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_pixel_value_normalizes_by_the_contract(tmp_path, dtype):
    """All 256 values in every channel: equal to tbljax.kernels.normalize_table."""
    import ml_dtypes

    from tbljax._src.engine import kernels

    v = np.arange(256, dtype=np.uint8).reshape(16, 16)
    img = np.stack([v, v[::-1], v.T], axis=-1)[None]
    path = T.write_tbl(tmp_path / "v.tbl", img, [0])
    x, _ = next(iter(tbljax.mlx.loader(path, 1, dtype=dtype)))
    np_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    table = kernels.normalize_table(MEAN, STD, np_dtype)
    want = table[np.arange(3), img[0]]
    np.testing.assert_array_equal(bits(x)[0], want.view(bits(x).dtype))


def test_padding_ranks_and_resume(data):
    _, labels, path = data
    want = [
        {k: np.asarray(v) for k, v in b.items()}
        for b in tbljax.loader(path, 2 * B, seed=1, num_epochs=1, drop_remainder=False)
    ]
    served = []
    for r in range(2):
        got = list(tbljax.mlx.loader(path, B, seed=1, rank=r, world_size=2, drop_remainder=False))
        assert len(got) == len(want)
        for b, w in zip(got, want):
            rows = slice(r * B, (r + 1) * B)
            np.testing.assert_array_equal(np.array(b[0]), w["image"][rows])
            np.testing.assert_array_equal(np.array(b.valid), w["valid"][rows])
            np.testing.assert_array_equal(np.array(b[1]), w["label"][rows])
            served += np.array(b.index)[np.array(b.valid)].tolist()
    assert sorted(served) == list(range(N))

    full = []
    ld = tbljax.mlx.loader(path, B, seed=1)
    for epoch in range(2):
        ld.set_epoch(epoch)
        full += [np.array(b.index) for b in ld]
    first = tbljax.mlx.loader(path, B, seed=1)
    head = [np.array(b.index) for _, b in zip(range(5), first)]
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["position"]) == (0, 5 * B)
    second = tbljax.mlx.loader(path, B, seed=1)
    second.load_state_dict(state)
    tail = []
    for epoch in range(state["epoch"], 2):
        second.set_epoch(epoch)
        tail += [np.array(b.index) for b in second]
    np.testing.assert_array_equal(np.stack(head + tail), np.stack(full))


def test_arguments_are_checked(data):
    _, _, path = data
    with pytest.raises(ValueError, match="dtype must be one of mx.uint8, mx.float32, mx.bfloat16"):
        tbljax.mlx.loader(path, B, dtype=mx.float16)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 2\), got -1"):
        tbljax.mlx.loader(path, B, rank=-1, world_size=2)
    with pytest.raises(
        ValueError,
        match=r"partition=None only .* tbljax.loader \(JAX\) and "
        r"tbljax.torch.loader \(torch.distributed\)",
    ):
        tbljax.mlx.loader(path, B, partition="host")
    assert "rank 0 of 1" in repr(tbljax.mlx.loader(path, B))


def test_without_mlx_the_error_says_what_to_install(data, monkeypatch):
    import sys

    _, _, path = data
    monkeypatch.setitem(sys.modules, "mlx.core", None)  # as if MLX were not installed
    with pytest.raises(ImportError, match=r"pip install 'tbljax\[mlx\]'"):
        tbljax.mlx.loader(path, B)

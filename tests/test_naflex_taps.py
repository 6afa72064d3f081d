"""The twin's NaFlex tap bound (issue 49): `naflex.max_taps` against kernel.h's tap count of every
size `naflex.sequence_size` gives over a sweep of box sizes, and `gather_normalize(patches=...,
max_taps=)` on the twin writing the host kernel's bytes with weights of that many taps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tbljax
from tbljax._src.rules import naflex


def _taps(h, w, th, tw):
    """kernel.h's taps per axis of an h×w box resized to th×tw (the larger of the two axes')."""
    return np.maximum(2 * np.maximum(h, th) // th + 1, 2 * np.maximum(w, tw) // tw + 1)


@pytest.mark.parametrize("side", [9, 37, 500, 4000])
def test_the_bound_holds_for_every_swept_box_and_is_far_below_any_shrinks(side):
    for p in (1, 4, 16):
        for t in (1, 3, 16, 64, 256, 1024):
            bound = naflex.max_taps(side, p, t)
            s = np.unique(np.r_[1 : min(side, 48) + 1, np.linspace(1, side, 90).astype(np.int64), side - 1, side])
            h, w = (a.reshape(-1) for a in np.meshgrid(s[s >= 1], s[s >= 1]))
            th, tw = naflex.sequence_size(h, w, p, t)
            most = int(_taps(h, w, th, tw).max())
            assert most <= bound <= 2 * max(side, p) // p + 1, (side, p, t, most, bound)
            assert bound <= most * 6 // 5 + 2, (side, p, t, most, bound)  # and within 20% of the worst
    assert naflex.max_taps(4000, 16, 256) == 33  # the twin's weights: 33 taps per axis instead of 501


def test_the_twin_writes_the_kernels_bytes_within_the_bound_with_weights_of_that_many_taps(tmp_path):
    rng = np.random.default_rng(3)
    sizes = [(90, 7), (3, 88), (64, 64), (17, 90), (90, 90), (5, 5)]
    imgs = [rng.integers(0, 256, (h, w, 3), np.uint8) for h, w in sizes]
    path = str(tmp_path / "mixed.tbl")
    with tbljax.Writer(path, len(sizes)) as wr:
        for im in imgs:
            wr.add_raw(im)
    data = tbljax.ResidentDataset(path).data
    p, t = 4, 16
    hw = np.array(sizes)
    boxes = np.concatenate([np.zeros_like(hw), hw], 1).astype(np.int32)
    boxes[2] = (5, 9, 50, 41)  # a crop inside its record
    seq = np.stack(naflex.sequence_size(boxes[:, 2], boxes[:, 3], p, t), -1).astype(np.int32)
    bound, generic = naflex.max_taps(90, p, t), 2 * 90 // p + 1
    assert bound < generic and int(_taps(boxes[:, 2], boxes[:, 3], seq[:, 0], seq[:, 1]).max()) > 3
    flips = np.array([True, False, True, False, True, False])
    want = np.zeros((len(sizes), t, p * p * 3), np.uint8)  # the host kernel, a record at a time
    for r, im in enumerate(imgs):
        tbljax.kernels.gather(
            im[None], np.zeros(1, np.int64), want[r : r + 1], crop=boxes[r : r + 1], flip=flips[r : r + 1],
            patches=(p, seq[r : r + 1]),
        )  # fmt: skip

    def twin(d, c, fl, s, taps):
        i = jnp.arange(len(sizes), dtype=jnp.int32)
        kw = dict(crop=c, flip=fl, patches=(p, s), out_size=(t, p * p * 3), dtype="uint8", backend="twin")
        return tbljax.ops.gather_normalize(d, i, max_taps=taps, **kw)

    got = jax.jit(lambda d, c, fl, s: twin(d, c, fl, s, bound))(data, boxes, flips, seq)
    np.testing.assert_array_equal(np.asarray(got), want)
    for taps, k in ((bound, bound), (None, generic)):  # the weights (B, T, p, taps) per axis
        text = str(jax.make_jaxpr(lambda d, c, fl, s, taps=taps: twin(d, c, fl, s, taps))(data, boxes, flips, seq))
        assert f"i32[6,16,4,{k}]" in text and (k == generic or f"i32[6,16,4,{generic}]" not in text), (taps, k)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(max_taps=3), r"max_taps=3: row 0's box \(10, 12\) resized to \(4, 4\) reads 7 taps"),
        (dict(max_taps=2), "max_taps must be an integer >= 3"),
        (dict(max_taps=4, patches=None, out_size=(8, 8)), "max_taps bounds the resize of NaFlex rows"),
    ],
)
def test_a_bound_below_a_rows_taps_or_without_patches_is_refused_by_name(kw, words):
    data = np.zeros((3, 10, 12, 3), np.uint8)
    args = dict(crop=np.array([[0, 0, 10, 12]] * 2, np.int32), patches=(4, np.array([[4, 4], [8, 12]])))
    args |= dict(out_size=(6, 48)) | kw
    with pytest.raises(ValueError, match=words):
        tbljax.ops.gather_normalize(data, np.array([0, 1]), **args)

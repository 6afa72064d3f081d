"""Geometric fields in a `ResidentDataset` (issue 48): masks, dense maps (nearest and linear),
boxes with their labels and keypoints served by `batch` inside `jax.jit` equal, byte for byte,
what `tbljax.loader` serves for the same steps (the host path is tested against torchvision v2
in test_geometric_serving.py / test_geometry.py), and equal to `rules/geometry`'s NumPy rules
at the crops `tbljax.augment.sample` draws. `DenseMap(interpolation="linear")` is served by the
documented rule, checked against a float64 oracle written from the reference's words in exact
fractions here (`_linear_oracle`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from fractions import Fraction

import jax
import numpy as np
import pytest

import tbljax
from tbljax import augment as tba
from tbljax._src.rules import geometry

N, S, MAXB, PERM = 8, 32, 3, [0, 2, 1]
RRC = tbljax.Augment(size=(20, 24), scale=(0.2, 1.0))


def _make(d, name, images, **convert):
    rng = np.random.default_rng(len(images))
    objects, kpts, depth = [], [], []
    for k, im in enumerate(images):
        h, w = im.shape[:2]
        n = k % 4 + 1  # 1..4 boxes a record: some cut at MAXB
        xy = rng.uniform(0, [w * 0.6, h * 0.6], (n, 2))
        objects.append({"boxes": np.concatenate([xy, xy + rng.uniform(2, 12, (n, 2))], 1).tolist(), "labels": [k] * n})
        kpts.append(np.concatenate([rng.uniform(0, [w, h], (2, 3, 2)), np.full((2, 3, 1), 2.0)], -1))
        dm = rng.uniform(1, 10, (h, w)).astype(np.float32)
        dm[rng.random((h, w)) < 0.3] = 0  # invalid
        depth.append(dm)
    fields = {
        "seg": tbljax.Mask(ignore=255),
        "boxes": tbljax.Boxes(key="objects", labels="box_labels"),
        "kpts": tbljax.Keypoints(flip_permutation=PERM),
        "near": tbljax.DenseMap(invalid=0.0),
        "depth": tbljax.DenseMap(interpolation="linear", invalid=0.0),
    }
    seg = [np.digitize(im[..., 0], [85, 170]).astype(np.uint8) for im in images]
    cols = {"image": images, "seg": seg, "objects": objects, "kpts": kpts, "near": depth, "depth": depth}
    path = d / f"{name}.tbl"
    tbljax.convert(cols, path, image_size=S, format="raw", progress=False, fields=fields, **convert)
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("resident_geo")
    rng = np.random.default_rng(3)
    square = _make(d, "square", list(rng.integers(0, 256, (N, S, S, 3), np.uint8)))
    sides = [(40, 48), (48, 40), (32, 56), (36, 36)]
    sized = [rng.integers(0, 256, (*sides[k % 4], 3), np.uint8) for k in range(N)]
    return {"square": square, "sizes": _make(d, "sizes", sized, resize="shorter_side")}


def _np(batch) -> dict:
    return {k: np.asarray(v) for k, v in batch.items()}


def _same_as_the_loader(path, steps, **kw):
    rd = tbljax.ResidentDataset(path)
    assert rd.left_out == {}
    step = jax.jit(lambda ds, s: ds.batch(s, batch_size=4, **kw))
    got = []
    for s, want in enumerate(tbljax.loader(path, 4, num_epochs=2, **kw)):
        b = _np(step(rd, s))
        assert sorted(b) == sorted(want), s
        for k, v in _np(want).items():
            assert b[k].dtype == v.dtype and b[k].shape == v.shape, (s, k, b[k].dtype, v.dtype)
            np.testing.assert_array_equal(b[k], v, err_msg=f"step {s} {k}")
        got.append(b)
    assert len(got) == steps
    return got


@pytest.mark.parametrize("augment", [RRC, "flip", None], ids=["rrc_flip", "flip", "none"])
def test_resident_batches_equal_the_loaders_byte_for_byte(files, augment):
    got = _same_as_the_loader(files["square"], 4, augment=augment, dtype="uint8", max_boxes=MAXB, seed=5)
    assert sum(int(b["boxes_valid"].sum()) for b in got) > 0
    assert any((b["depth"] != 0).any() for b in got)
    if augment is RRC:
        _check_the_numpy_rules(files["square"], got[1], epoch=0, seed=5)


def test_records_of_different_sizes_equal_the_loaders(files):
    kw = dict(augment=RRC, dtype="uint8", max_boxes=MAXB, seed=2, min_visibility=0.3)
    _same_as_the_loader(files["sizes"], 4, **kw)


def _check_the_numpy_rules(path, b, *, epoch, seed):
    """Independent of the loader: a resident batch's fields are rules/geometry's NumPy
    functions (tested against torchvision v2) of the stored values at the crops
    tbljax.augment.sample draws, and the linear map `_linear_oracle`'s."""
    ds = tbljax.open(path)
    crops, flips = tba.sample(RRC, b["index"].astype(np.int64), geometry=ds.geometry, seed=seed, epoch=epoch)
    for r, k in enumerate(b["index"].tolist()):
        box, flip = tuple(int(v) for v in crops[r]), bool(flips[r])
        seg = np.asarray(ds.field("seg")[k])
        np.testing.assert_array_equal(b["seg"][r], geometry.serve_mask(seg, box, (20, 24), flip))
        boxes = np.asarray(ds.field("boxes")[k])
        want = geometry.serve_boxes(boxes, np.asarray(ds.field("box_labels")[k]), box, (20, 24), flip, max_boxes=MAXB)
        np.testing.assert_allclose(b["boxes"][r], want["boxes"], atol=1e-4)
        assert b["boxes_valid"][r].tolist() == want["boxes_valid"].tolist()
        assert b["box_labels"][r].tolist() == want["box_labels"].tolist()
        assert b["boxes_count"][r] == len(boxes)
        kp = np.asarray(ds.field("kpts")[k])
        np.testing.assert_allclose(b["kpts"][r, : len(kp)], geometry.serve_keypoints(kp, box, (20, 24), flip, PERM))
        depth = np.asarray(ds.field("depth")[k], np.float64)
        np.testing.assert_array_equal(b["depth"][r], _linear_oracle(depth, box, (20, 24), flip, 0.0))


def _linear_oracle(a, box, out_hw, flip, invalid):
    """The reference's linear rule, word for word, in exact fractions then float64: output o of
    an axis sits at ((2o + 1)·length − out) / (2·out) past the crop's start, clamped to the
    crop; taps ⌊p⌋ and the next (clamped), the second weighing (p − ⌊p⌋) rounded half up to a
    multiple of 2^-14; the four taps summed in order (y0x0, y0x1, y1x0, y1x1), invalid ones
    left out, over the valid weights; no valid weight: invalid; float32 at the end."""
    y0, x0, h, w = box

    def taps(start, length, out):
        res = []
        for o in range(out):
            p = min(max(Fraction((2 * o + 1) * length - out, 2 * out), Fraction(0)), Fraction(length - 1))
            i = int(p)  # p >= 0: the floor
            q = int((p - i) * 2**14 + Fraction(1, 2))
            res.append((start + i, start + min(i + 1, length - 1), q / 2**14))
        return res

    out = np.zeros(out_hw, np.float32)
    for oy, (ya, yb, fy) in enumerate(taps(y0, h, out_hw[0])):
        for ox, (xa, xb, fx) in enumerate(taps(x0, w, out_hw[1])):
            total = weight = 0.0
            for yy, wy in ((ya, 1 - fy), (yb, fy)):
                for xx, wx in ((xa, 1 - fx), (xb, fx)):
                    if a[yy, xx] != invalid:
                        total += wy * wx * float(a[yy, xx])
                        weight += wy * wx
            out[oy, ox] = total / weight if weight > 0 else invalid
    return out[:, ::-1] if flip else out


@pytest.mark.parametrize("out_hw", [(7, 5), (19, 33)], ids=["down", "up"])
def test_the_linear_rule_is_the_documented_one(out_hw):
    rng = np.random.default_rng(out_hw[0])
    a = rng.uniform(-5, 5, (23, 17)).astype(np.float32)
    a[rng.random(a.shape) < 0.4] = 7.5  # invalid
    a[:4, :4] = 7.5  # a corner with no valid tap
    crops = [(0, 0, 23, 17), (2, 3, 9, 11), (0, 0, 4, 4), (5, 1, 1, 16)]
    for box in crops:
        for flip in (False, True):
            got = geometry.serve_linear_batch(lambda ys, xs: a[ys, xs], [box], out_hw, [flip], 7.5)[0]
            np.testing.assert_array_equal(got, _linear_oracle(a, box, out_hw, flip, 7.5), err_msg=str((box, flip)))
    whole = geometry.serve_linear_batch(lambda ys, xs: a[ys, xs], [(0, 0, 4, 4)], out_hw, None, 7.5)[0]
    assert (whole == 7.5).all()  # no valid source: invalid everywhere


def test_the_loader_serves_a_linear_dense_map_by_the_rule(files):
    path = files["square"]
    ds = tbljax.open(path)
    b = next(iter(tbljax.loader(path, 4, augment=RRC, seed=9, fields=["depth"])))
    idx = np.asarray(b["index"]).astype(np.int64)
    crops, flips = tba.sample(RRC, idx, geometry=ds.geometry, seed=9, epoch=0)
    for r, k in enumerate(idx.tolist()):
        depth = np.asarray(ds.field("depth")[k], np.float64)
        want = _linear_oracle(depth, tuple(int(v) for v in crops[r]), (20, 24), bool(flips[r]), 0.0)
        np.testing.assert_array_equal(np.asarray(b["depth"][r]), want, err_msg=f"record {k}")


def test_a_boxes_field_without_its_labels_is_served_without_them(files):
    rd = tbljax.ResidentDataset(files["square"], fields=["boxes"])  # its labels not named: not served
    b = _np(rd.batch(0, batch_size=4, augment=RRC, max_boxes=MAXB))
    assert sorted(b) == ["boxes", "boxes_count", "boxes_valid", "image", "index", "label"]
    want = _np(next(iter(tbljax.loader(files["square"], 4, augment=RRC, max_boxes=MAXB, fields=["boxes"]))))
    for k in ("boxes", "boxes_count", "boxes_valid"):
        np.testing.assert_array_equal(b[k], want[k], err_msg=k)


_EIGHT = textwrap.dedent("""
    import sys
    import numpy as np, jax, pytest
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tbljax
    path = sys.argv[1]
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("batch", "data"))
    kw = dict(augment=tbljax.Augment(size=(20, 24), scale=(0.2, 1.0)), dtype="uint8", max_boxes=3, seed=5)
    ds = tbljax.ResidentDataset(path)  # a copy on every device; the batch over all 8
    f = jax.jit(lambda ds, s: ds.batch(s, batch_size=8, **kw))
    for s, want in enumerate(tbljax.loader(path, 8, num_epochs=1, **kw)):
        got = f(ds, s)
        assert sorted(got) == sorted(want)
        for k in want:
            assert np.array_equal(np.asarray(got[k]), np.asarray(want[k])), (s, k)
    assert got["seg"].sharding.shard_shape(got["seg"].shape)[0] == 1
    with pytest.raises(ValueError, match=r"the geometric fields \\['seg', .*\\] are held whole on every device"):
        tbljax.ResidentDataset(path, NamedSharding(mesh, P("data")))
    tbljax.ResidentDataset(path, NamedSharding(mesh, P("data")), fields=None)  # left out: held
    print("OK")
""")


def test_eight_devices_serve_the_batch_split_and_refuse_partitioned_records(files):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    r = subprocess.run(
        [sys.executable, "-c", _EIGHT, files["square"]], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


def test_the_native_linear_rule_is_the_numpy_one_bit_for_bit():
    # The host loaders' C++ path (`_core.serve_linear`) against the NumPy rule the jit path
    # runs: channels, enlarging and shrinking crops, flips, with and without `invalid`.
    from tbljax import _core

    rng = np.random.default_rng(11)
    for t in range(40):
        shape = (int(rng.integers(1, 40)), int(rng.integers(1, 40))) + ((), (2,))[t % 2]
        a = rng.uniform(-5, 5, shape).astype(np.float32)
        a[rng.random(shape) < 0.3] = 0.0
        h, w = shape[:2]
        y0, x0 = rng.integers(0, h, 3), rng.integers(0, w, 3)
        crops = np.stack([y0, x0, rng.integers(1, h - y0 + 1), rng.integers(1, w - x0 + 1)], 1).astype(np.int32)
        flips = rng.integers(0, 2, 3).astype(np.uint8)
        oh, ow = (int(v) for v in rng.integers(1, 60, 2))
        invalid = None if t % 3 == 0 else 0.0
        out = np.empty((3, oh, ow, *shape[2:]), np.float32)
        _core.serve_linear([a] * 3, np.full(3, h, np.int32), np.full(3, w, np.int32), crops, flips, out, invalid, 0)
        want = geometry.serve_linear_batch(lambda ys, xs, a=a: a[ys, xs], crops, (oh, ow), flips.astype(bool), invalid)
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32), err_msg=str(t))

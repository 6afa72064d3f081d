"""Large-scale jitter and evaluation's resize-longer-and-pad (issue 48, rules/scale_jitter.py,
engine/canvas.py): the boxes and extents against detectron2's ResizeScale + FixedSizeCrop
written out in plain float64 Python; served pixels against tests/oracle.py's crop-resize of the
drawn box at the drawn extent, padding 0, ``image_valid``; masks, boxes and keypoints against
rules/geometry on the extent; torch and MLX equal to the host loader; what is not served refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tbljax
from tbljax import augment as tba
from tbljax._src.rules import geometry, order, scale_jitter

import oracle

OUT, MAXB, PERM = (40, 36), 4, [0, 2, 1]
SIDES = ((40, 48), (48, 40), (32, 56))
LSJ = tbljax.Augment(scale_jitter=(0.3, 2.5), size=OUT)
PAD = tbljax.Augment(crop="longer_pad", flip=False, size=OUT)


def _classes(img):
    return np.digitize(img[..., 0], [85, 170]).astype(np.uint8)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """Seven RAW noise photos of three aspects (stored at shorter side 24), with masks from
    their own pixels, boxes and keypoints."""
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (*SIDES[k % 3], 3), np.uint8) for k in range(7)]
    objects, kpts = [], []
    for k, im in enumerate(images):
        h, w = im.shape[:2]
        n = k % 3 + 1
        xy = rng.uniform(0, [w - 12, h - 12], (n, 2))
        objects.append({"boxes": np.concatenate([xy, xy + rng.uniform(2, 12, (n, 2))], 1).tolist(), "labels": [k] * n})
        kpts.append(np.concatenate([rng.uniform(0, [w, h], (1, 3, 2)), np.full((1, 3, 1), 2.0)], -1))
    path = tmp_path_factory.mktemp("lsj") / "d.tbl"
    tbljax.convert(
        {"image": images, "seg": [_classes(im) for im in images], "objects": objects, "kpts": np.stack(kpts)},
        path,
        image_size=24,
        resize="shorter_side",
        format="raw",
        progress=False,
        fields={
            "seg": tbljax.Mask(ignore=255),
            "boxes": tbljax.Boxes(key="objects", labels="box_labels"),
            "kpts": tbljax.Keypoints(flip_permutation=PERM),
        },
    )
    return path


@pytest.fixture(scope="module")
def data(path):
    return tbljax.open(path)


def _detectron2(u_scale, u_offset, h, w, size, scale):
    """detectron2's ResizeScale._get_resize and FixedSizeCrop._get_crop for one record, given
    its two uniforms, with the crop window taken back to whole source pixels (the module doc)."""
    s = 1.0 if scale is None else scale[0] + (scale[1] - scale[0]) * u_scale
    f = min(size[0] * s / h, size[1] * s / w)
    big = [max(1, round(h * f)), max(1, round(w * f))]  # np.round: half to even, as Python's round
    off = [round(max(b - o, 0) * u_offset) for b, o in zip(big, size)]
    ext = [min(b, o) for b, o in zip(big, size)]
    box = []
    for o, e, b, n in zip(off, ext, big, (h, w)):
        start = math.floor(o * n / b)
        box.append((start, min(n - start, max(1, round(e * n / b)))))
    return [box[0][0], box[1][0], box[0][1], box[1][1]], ext


@pytest.mark.parametrize("scale", [(0.1, 2.0), None])
def test_boxes_and_extents_are_detectron2s(scale):
    rng = np.random.default_rng(0)
    idx = np.arange(300)
    hw = rng.integers(1, 3000, (300, 2))
    size = (1024, 800)
    boxes, ext = scale_jitter.decide(idx, hw, size=size, scale=scale, seed=5, epoch=2)
    words = order.random_bits(idx[:, None], np.array([50, 51], np.uint32), 5, 2)
    for r in range(len(idx)):
        u_s, u_o = (float(words[r, 0]) + 0.5) / 2**32, float(words[r, 1]) / 2**32
        want_box, want_ext = _detectron2(u_s, u_o, *hw[r], size, scale)
        assert boxes[r].tolist() == want_box and ext[r].tolist() == want_ext, r
    assert (boxes[:, :2] >= 0).all() and (boxes[:, :2] + boxes[:, 2:] <= hw).all()
    if scale is None:  # fits the size, one side reaching it
        assert ((ext[:, 0] == size[0]) | (ext[:, 1] == size[1])).all()
        assert (boxes[:, 2:] == hw).all()


def test_lsj_refused_where_not_served(data, path):
    with pytest.raises(ValueError, match="scale_jitter needs a fixed output size"):
        tbljax.Augment(scale_jitter=(0.1, 2.0))
    with pytest.raises(ValueError, match="crop='longer_pad' needs a fixed output size"):
        tbljax.Augment(crop="longer_pad", size={0: (8, 8), 2: (16, 16)})
    with pytest.raises(ValueError, match="scale_jitter with crop='center'"):
        tbljax.Augment(scale_jitter=(0.1, 2.0), crop="center", size=(8, 8))
    with pytest.raises(ValueError, match=r"scale_jitter with Augment\(ops=/erasing=\)"):
        tbljax.Augment(scale_jitter=(0.1, 2.0), size=(8, 8), ops=[tbljax.RandAugment()])
    with pytest.raises(ValueError, match="scale_jitter must satisfy"):
        tbljax.Augment(scale_jitter=(0.0, 2.0), size=(8, 8))
    with pytest.raises(ValueError, match=r"views\['a'\]: Augment\(scale_jitter=/crop='longer_pad'\) per view"):
        tbljax.LoaderOptions(batch_size=2, views={"a": (2, LSJ)})
    with pytest.raises(ValueError, match="buckets with an Augment crop"):
        tbljax.LoaderOptions(batch_size=2, augment=LSJ, buckets=tbljax.Buckets())
    with pytest.raises(ValueError, match=r"crop='longer_pad'\) with a mixture"):
        tbljax.HostLoader(
            tbljax.mix({"a": data, "b": data}, {"a": 1, "b": 1}, steps_per_epoch=2),
            tbljax.LoaderOptions(batch_size=2, augment=PAD),
        )
    pytest.importorskip("torch")
    pytest.importorskip("tbljax.torch")
    for aug, what in ((LSJ, "scale_jitter="), (PAD, "crop='longer_pad'")):
        with pytest.raises(ValueError, match=rf"mixup= with Augment\({what}\): Mixup/CutMix would blend the padding"):
            tbljax.torch.loader(
                path, 2, augment=aug, layout="NHWC", fields=None, mixup=tbljax.ops.Mixup(num_classes=50)
            )
    res = tbljax.ResidentDataset(path)
    with pytest.raises(ValueError, match=r"scale_jitter=...\) and Augment\(crop='longer_pad'\) are served by the host"):
        res.batch(0, batch_size=2, seed=0, augment=LSJ)


def _drawn(ds, aug, idx, epoch, seed=0):
    """What the loader must have drawn, from the public augment module."""
    idx = np.asarray(idx, np.int64)
    (boxes, ext), flips = tba.canvas_boxes(aug, idx, geometry=ds.geometry, seed=seed, epoch=epoch), None
    if aug.flip:
        flips = tba.flips(idx, seed=seed, epoch=epoch)
    return boxes, ext, flips


@pytest.mark.parametrize("aug", [LSJ, PAD], ids=["lsj", "longer_pad"])
def test_pixels_padding_and_fields_follow(data, aug):
    opts = tbljax.LoaderOptions(
        batch_size=3, augment=aug, dtype="uint8", drop_remainder=False, max_boxes=MAXB, num_epochs=1
    )
    seen = 0
    for hb in tbljax.HostLoader(data, opts):
        f, valid = hb.fields, hb.index >= 0
        assert f["image_valid"][0].shape == (3, *OUT) and f["image_valid"][0].dtype == np.bool_
        boxes, ext, flips = _drawn(data, aug, hb.index[valid], hb.epoch)
        for r, k in enumerate(hb.index.tolist()):
            img, iv, seg = hb.image[r], f["image_valid"][0][r], f["seg"][0][r]
            if k < 0:
                assert not iv.any() and (img == 0).all() and (seg == 255).all()
                continue
            (rh, rw), flip = ext[r], flips is not None and flips[r]
            want = oracle.crop_resize(data.read(k), boxes[r], rh, rw)
            np.testing.assert_array_equal(img[:rh, :rw], want[:, ::-1] if flip else want, err_msg=f"record {k}")
            assert (img[rh:] == 0).all() and (img[:, rw:] == 0).all()
            want_iv = np.zeros(OUT, bool)
            want_iv[:rh, :rw] = True
            np.testing.assert_array_equal(iv, want_iv)
            mask = np.asarray(data.field("seg")[k]).reshape(data.read(k).shape[:2])
            np.testing.assert_array_equal(
                seg, geometry.serve_mask(mask, boxes[r], (rh, rw), flip, place=(0, 0), canvas_hw=OUT, ignore=255)
            )
            obj = data.field("boxes")[k], data.field("box_labels")[k]
            wb = geometry.serve_boxes(*obj, boxes[r], (rh, rw), flip, max_boxes=MAXB)
            np.testing.assert_allclose(f["boxes"][0][r], wb["boxes"], atol=1e-4)
            assert f["boxes_valid"][0][r].tolist() == wb["boxes_valid"].tolist()
            assert f["box_labels"][0][r].tolist() == wb["box_labels"].tolist()
            assert (f["boxes"][0][r][:, 2] <= rw).all() and (f["boxes"][0][r][:, 3] <= rh).all()
            wk = geometry.serve_keypoints(data.field("kpts")[k], boxes[r], (rh, rw), flip, PERM)
            np.testing.assert_allclose(f["kpts"][0][r, :1], wk, atol=1e-4)
            seen += 1
    assert seen == len(data)


def test_float_pads_zero_after_normalization_in_either_layout(data):
    mean, std = (100.0, 110.0, 120.0), (50.0, 60.0, 70.0)
    rows = {}
    for layout in ("NHWC", "NCHW"):
        opts = tbljax.LoaderOptions(batch_size=7, augment=LSJ, mean=mean, std=std, layout=layout, fields=[])
        hb = next(iter(tbljax.HostLoader(data, opts)))
        rows[layout] = hb.image if layout == "NHWC" else hb.image.transpose(0, 2, 3, 1)
    boxes, ext, flips = _drawn(data, LSJ, hb.index, 0)
    for r, k in enumerate(hb.index.tolist()):
        rh, rw = ext[r]
        px = oracle.crop_resize(data.read(k), boxes[r], rh, rw)
        want = np.zeros((*OUT, 3), np.float32)
        want[:rh, :rw] = oracle.normalize(px[:, ::-1] if flips[r] else px, mean, std)
        for layout, img in rows.items():
            np.testing.assert_allclose(img[r], want, atol=1e-6, err_msg=f"{layout} record {k}")


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_torch_and_mlx_serve_the_host_loaders_bytes(data, framework):
    mod = pytest.importorskip(f"tbljax.{framework}")
    kw = dict(augment=LSJ, dtype="uint8", layout="NHWC", max_boxes=MAXB, seed=1)
    host = next(iter(tbljax.HostLoader(data, tbljax.LoaderOptions(batch_size=4, **kw))))
    b = next(iter(mod.loader(data, 4, **kw)))
    arr = (lambda t: t.numpy()) if framework == "torch" else np.array
    np.testing.assert_array_equal(arr(b.images), host.image)
    for key in ("image_valid", "seg", "boxes", "kpts"):
        np.testing.assert_array_equal(arr(b.fields[key]), host.fields[key][0], err_msg=key)


def test_a_loader_without_a_canvas_adds_no_key(data):
    aug = tbljax.Augment(size=OUT)
    hb = next(iter(tbljax.HostLoader(data, tbljax.LoaderOptions(batch_size=3, augment=aug, fields=["seg"]))))
    assert sorted(hb.fields) == ["seg"]

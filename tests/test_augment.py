"""Crop decisions for records of different sizes, against references written from the
definitions (tests/oracle.py: torchvision's RandomResizedCrop.get_params, FFCV's center crop):
box statistics on wide, tall and square records, NumPy and jax.numpy bit for bit, the center
crop's geometry, the size schedule's arithmetic and the validation of every new argument."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tbljax import order
from tbljax._src.rules import augment
from tbljax._src.rules.augment import Augment
from tbljax._src.rules.options import LoaderOptions
from tbljax._src.rules.record_geometry import RecordGeometry

from oracle import center_crop_box, fallback_box, rrc_reference, torchvision_sample

# Wide, tall, square, odd and small records (H, W); sample i lives on record i % len(SIZES).
SIZES = [
    (120, 400),
    (400, 120),
    (200, 200),
    (37, 53),
    (53, 37),
    (375, 500),
    (500, 333),
    (64, 48),
    (90, 301),
    (255, 256),
]
SAMPLES = 20_000


def geometry(sizes=SIZES, n=SAMPLES):
    hw = np.array([sizes[i % len(sizes)] for i in range(n)])
    return RecordGeometry(hw[:, 0], hw[:, 1]), hw


def test_boxes_match_torchvision_on_records_of_their_own_size():
    geo, hw = geometry()
    idx = np.arange(SAMPLES)
    boxes = augment.crop_boxes(idx, geometry=geo, seed=4, epoch=3)
    assert boxes.dtype == np.int32 and boxes.shape == (SAMPLES, 4)
    u = order.random_bits(idx[:, None, None], np.arange(40).reshape(10, 4), 4, 3)
    ref = np.array([rrc_reference(u[i], *hw[i], (0.08, 1.0), (3 / 4, 4 / 3)) for i in idx])
    # Float32 table arithmetic vs float64 exp/sqrt: a side may round the other way right at .5.
    assert (boxes == ref).all(axis=1).mean() > 0.99
    assert np.abs(boxes[:, 2:] - ref[:, 2:]).max() <= 1


def test_box_statistics_on_wide_tall_and_square_records():
    geo, hw = geometry()
    boxes = augment.crop_boxes(np.arange(SAMPLES), geometry=geo, seed=0, epoch=0)
    y, x, h, w = boxes.T.astype(np.float64)
    H, W = hw[:, 0].astype(np.float64), hw[:, 1].astype(np.float64)
    # Every box inside its own record.
    assert (y >= 0).all() and (x >= 0).all() and (h >= 1).all() and (w >= 1).all()
    assert (y + h <= H).all() and (x + w <= W).all()
    # Area fraction in [0.08, 1] and aspect in [3/4, 4/3], up to the rounding of w and h to
    # whole pixels (some real w', h' within half a pixel satisfies both). Where no attempt fits
    # (often on the 90x301 strip) torchvision takes the clamped central crop, of any area.
    area = H * W
    fallback = np.array([fallback_box(rh, rw, (3 / 4, 4 / 3)) for rh, rw in hw])
    fell_back = (boxes == fallback).all(axis=1)
    assert ((w + 0.5) * (h + 0.5) / area >= 0.08)[~fell_back].all()
    assert ((w - 0.5) * (h - 0.5) / area <= 1.0).all()
    assert ((w + 0.5) / np.maximum(h - 0.5, 0.5) >= 3 / 4).all()
    assert ((w - 0.5) / (h + 0.5) <= 4 / 3).all()
    rng = np.random.default_rng(0)
    for k, (rh, rw) in enumerate(SIZES):
        on = np.arange(SAMPLES) % len(SIZES) == k
        # The whole record is drawn from: the boxes reach every edge of it ...
        assert y[on].min() == 0 and x[on].min() == 0, (rh, rw)
        assert (y + h)[on].max() == rh and (x + w)[on].max() == rw, (rh, rw)
        # ... and the longer side is cropped beyond the central square, on both sides of it.
        side = min(rh, rw)
        if rw != rh:
            start, end = (y[on], (y + h)[on]) if rh > rw else (x[on], (x + w)[on])
            lo = (max(rh, rw) - side) // 2
            assert (start < lo).any() or lo == 0, (rh, rw)
            assert (end > lo + side).any(), (rh, rw)
        # The area fraction's distribution: torchvision's sampler on NumPy's own generator.
        tv = np.array([torchvision_sample(rng, rh, rw) for _ in range(4000)])
        frac, tv_frac = (h * w / area)[on], tv[:, 0] * tv[:, 1] / (rh * rw)
        assert abs(frac.mean() - tv_frac.mean()) < 0.03, (rh, rw, frac.mean(), tv_frac.mean())


def test_boxes_depend_on_each_samples_own_record_only():
    geo, hw = geometry()
    idx = np.arange(SAMPLES)
    boxes = augment.crop_boxes(idx, geometry=geo, seed=2, epoch=5)
    for k, (rh, rw) in enumerate(SIZES):
        on = idx[idx % len(SIZES) == k]
        alone = augment.crop_boxes(on, height=rh, width=rw, seed=2, epoch=5)
        np.testing.assert_array_equal(boxes[on], alone)
    # Any subset in any order: the same box per sample.
    sel = np.array([19_999, 3, 3, 12_345, 0])
    np.testing.assert_array_equal(augment.crop_boxes(sel, geometry=geo, seed=2, epoch=5), boxes[sel])


def test_equal_sides_in_arrays_are_the_uniform_path_bit_for_bit():
    idx = np.arange(5000)
    n = 6000
    geo = RecordGeometry(np.full(n, 64), np.full(n, 48))
    assert geo.shape == (64, 48)
    for kw in (dict(), dict(scale=(0.25, 1.0), ratio=(0.5, 2.0))):
        np.testing.assert_array_equal(
            augment.crop_boxes(idx, geometry=geo, seed=1, epoch=2, **kw),
            augment.crop_boxes(idx, height=64, width=48, seed=1, epoch=2, **kw),
        )


def test_fallback_is_torchvisions_clamped_centre_crop_per_record():
    # Strips no attempt fits: each record falls back to its own clamped central crop.
    sizes = [(1, 1000), (900, 2), (3, 1001), (1001, 4)]
    geo, hw = geometry(sizes, 200)
    boxes = augment.crop_boxes(np.arange(200), geometry=geo, seed=0, epoch=0)
    u = order.random_bits(np.arange(200)[:, None, None], np.arange(40).reshape(10, 4), 0, 0)
    ref = np.array([rrc_reference(u[i], *hw[i], (0.08, 1.0), (3 / 4, 4 / 3)) for i in range(200)])
    np.testing.assert_array_equal(boxes, ref)
    np.testing.assert_array_equal(boxes[:4], [[0, 499, 1, 1], [448, 0, 3, 2], [0, 498, 3, 4], [498, 0, 5, 4]])


@pytest.mark.parametrize(
    "hw",
    [
        (256, 320),
        (320, 256),
        (255, 321),
        (321, 255),
        (224, 224),
        (225, 225),
        (1, 7),
        (7, 1),
        (2, 3),
        (1, 1),
        (65535, 17),
    ],
)
@pytest.mark.parametrize("fraction", [0.875, 1.0, 0.5, 1e-6])
def test_center_crop_geometry(hw, fraction):
    box = augment.center_boxes(np.arange(3), fraction=fraction, height=hw[0], width=hw[1])
    assert box.dtype == np.int32 and box.shape == (3, 4)
    np.testing.assert_array_equal(box, [center_crop_box(*hw, fraction)] * 3)
    y0, x0, c, c2 = box[0]
    assert c == c2 and y0 + c <= hw[0] and x0 + c <= hw[1]
    # Centred: equal margins, the odd pixel at the bottom / right.
    assert hw[0] - c - 2 * y0 in (0, 1) and hw[1] - c - 2 * x0 in (0, 1)


def test_center_crop_per_record_and_sample():
    geo, hw = geometry()
    idx = np.array([5, 0, 1, 19_999, 7, 7])
    boxes, flips = augment.sample(
        Augment(crop="center", flip=False, size=(224, 224)), idx, geometry=geo, seed=0, epoch=0
    )
    assert flips is None
    np.testing.assert_array_equal(boxes, [center_crop_box(*hw[i], 0.875) for i in idx])
    assert augment.center_boxes(idx, fraction=0.875, geometry=geo).tolist() == boxes.tolist()
    # FFCV's 224 of 256: the classic evaluation crop.
    assert center_crop_box(256, 341, 0.875) == (16, 58, 224, 224)


def test_numpy_and_jax_numpy_boxes_are_identical_for_mixed_sizes():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(0)
    n = 4000
    # Random sides over the whole range, strips that always fall back, one-pixel records.
    heights = np.concatenate([rng.integers(1, 4000, n - 6), [1, 900, 1, 65535, 3, 65535]])
    widths = np.concatenate([rng.integers(1, 4000, n - 6), [1000, 2, 1, 65535, 65535, 7]])
    geo = RecordGeometry(heights, widths)
    idx = rng.permutation(n)[:3000]
    aug = Augment(size=(32, 32), scale=(0.2, 0.9), ratio=(0.6, 1.9))
    center = Augment(crop="center", size=(32, 32), center_fraction=0.7)

    @jax.jit
    def twin(i):
        return (
            augment.crop_boxes(i, geometry=geo, seed=7, epoch=3, xp=jnp),
            augment.sample(aug, i, geometry=geo, seed=7, epoch=3, xp=jnp),
            augment.sample(center, i, geometry=geo, seed=7, epoch=3, xp=jnp),
        )

    rrc, (boxes, flips), (cboxes, cflips) = twin(jnp.asarray(idx, jnp.int32))
    np.testing.assert_array_equal(np.asarray(rrc), augment.crop_boxes(idx, geometry=geo, seed=7, epoch=3))
    want_boxes, want_flips = augment.sample(aug, idx, geometry=geo, seed=7, epoch=3)
    np.testing.assert_array_equal(np.asarray(boxes), want_boxes)
    np.testing.assert_array_equal(np.asarray(flips), want_flips)
    np.testing.assert_array_equal(np.asarray(cboxes), [center_crop_box(heights[i], widths[i], 0.7) for i in idx])
    np.testing.assert_array_equal(np.asarray(cflips), augment.flips(idx, seed=7, epoch=3))
    # Eager jax.numpy too (no jit), through the step's draw as the loaders call it.
    from tbljax._src.engine import step

    opts = LoaderOptions(batch_size=8, seed=7, augment=aug)
    got = step.draw(jnp.arange(300, dtype=jnp.int32), opts, num_records=n, image_hw=geo, epoch=1, xp=jnp)
    want = step.draw(np.arange(300), opts, num_records=n, image_hw=geo, epoch=1)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)


def test_size_schedule():
    aug = Augment(size={30: (192, 192), 0: (160, 160), 60: [224, 224]})
    assert aug.schedule == ((0, (160, 160)), (30, (192, 192)), (60, (224, 224)))
    assert [aug.size_at(e) for e in (0, 29, 30, 59, 60, 10**6)] == [
        (160, 160),
        (160, 160),
        (192, 192),
        (192, 192),
        (224, 224),
        (224, 224),
    ]
    assert aug.at_epoch(45) == Augment(size=(192, 192))
    assert hash(aug) == hash(Augment(size={0: (160, 160), 30: (192, 192), 60: (224, 224)}))
    assert Augment(size={0: (8, 8)}) == Augment(size=(8, 8))
    assert Augment(size=(8, 8)).schedule == ((0, (8, 8)),)
    assert Augment().schedule == ((0, None),) and Augment().size_at(5) is None
    opts = LoaderOptions(batch_size=4, augment=aug, layout="NCHW")
    assert opts.output_size((500, 375), 31) == (192, 192)
    assert opts.row_shape(None, 60) == (3, 224, 224)  # records of different sizes
    with pytest.raises(ValueError, match="changes with the epoch"):
        opts.output_size((500, 375))
    with pytest.raises(ValueError, match="epoch must be an integer >= 0, got -1"):
        aug.size_at(-1)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(crop="centre"), "crop must be True .* got 'centre'"),
        (dict(crop=1), "crop must be True .* got 1"),
        (dict(flip="yes"), "flip must be True or False, got 'yes'"),
        (dict(crop="center"), "crop='center' needs an output size"),
        (dict(crop=False, size=(8, 8)), "needs crop=True or crop='center'"),
        (dict(crop="center", size=(8, 8), center_fraction=0), r"center_fraction .* \(0, 1\], got 0"),
        (dict(crop="center", size=(8, 8), center_fraction=1.01), r"got 1.01"),
        (dict(crop="center", size=(8, 8), center_fraction=float("nan")), r"got nan"),
        (dict(crop="center", size=(8, 8), center_fraction=True), r"got True"),
        (dict(size={5: (8, 8)}), r"starting at epoch 0, or None .*; got \{5: \(8, 8\)\}"),
        (dict(size={}), r"schedule .* got \{\}"),
        (dict(size={0: (8, 8), -3: (4, 4)}), r"got \{0: \(8, 8\), -3: \(4, 4\)\}"),
        (dict(size={0: (8, 8), 2: (0, 4)}), r"got \{0: \(8, 8\), 2: \(0, 4\)\}"),
        (dict(size={0: (8, 8), 2.5: (4, 4)}), r"got \{0: \(8, 8\), 2.5: \(4, 4\)\}"),
        (dict(size=(8, 8.0)), r"got \(8, 8.0\)"),
    ],
)
def test_new_arguments_validate(kw, match):
    with pytest.raises(ValueError, match=match):
        Augment(**kw)


def test_geometry_validates_and_names_the_record():
    with pytest.raises(ValueError, match="record 2: width must be an integer in .* got 0"):
        RecordGeometry(np.array([4, 5, 6]), np.array([4, 5, 0]))
    with pytest.raises(ValueError, match="one length"):
        RecordGeometry(np.array([4, 5]), np.array([4]))
    with pytest.raises(ValueError, match="height must be .* got 70000"):
        RecordGeometry(70000, 5)
    with pytest.raises(ValueError, match="either height and width or geometry"):
        augment.crop_boxes(np.arange(2), height=4, width=4, geometry=RecordGeometry(4, 4), seed=0, epoch=0)
    with pytest.raises(ValueError, match="give height and width"):
        augment.crop_boxes(np.arange(2), height=4, seed=0, epoch=0)
    g = RecordGeometry(np.array([3, 300]), np.array([5, 2]))
    assert g.shape is None and len(g) == 2 and "2 records of different sizes" in repr(g)
    assert RecordGeometry(7, 9).shape == (7, 9) and math.isclose(
        float(RecordGeometry(7, 9).sqrt_area_table()[0]), math.sqrt(63), rel_tol=1e-7
    )

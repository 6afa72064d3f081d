"""Per-image ops (issue 47): the NumPy pixel rules equal timm's PIL ops (timm 1.0.31 loaded by path,
`import timm` needs torchvision), the op/magnitude draws are distributed as timm draws them, the
decisions are the same in NumPy and jax.numpy, and adding ops moves no crop or flip."""

from __future__ import annotations

import glob
import importlib.util
import os
import random

import jax.numpy as jnp
import numpy as np
import pytest

import tbljax
from tbljax._src.rules import augment as aug_rule
from tbljax._src.rules import pixel_ops, randaug

KODAK = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "kodak", "images")


def _timm(module):
    spec = importlib.util.find_spec("timm")
    if spec is None:
        pytest.skip("timm is not installed (the test extra pins timm==1.0.31)")
    path = os.path.join(os.path.dirname(spec.origin), "data", module + ".py")
    s = importlib.util.spec_from_file_location("timm_data_" + module, path)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def timm_aa():
    return _timm("auto_augment")


@pytest.fixture(scope="module")
def images():
    from PIL import Image

    rng = np.random.default_rng(0)
    out = [
        rng.integers(0, 256, (40, 56, 3), dtype=np.uint8),  # noise
        np.where(rng.random((33, 30, 1)) < 0.5, 0, 255).astype(np.uint8).repeat(3, 2),  # saturated
        np.full((9, 8, 3), 7, np.uint8),  # one value
        np.concatenate([np.full((8, 8, 3), 0, np.uint8), np.full((8, 8, 3), 200, np.uint8)]),
    ]
    paths = sorted(glob.glob(os.path.join(KODAK, "*.jpg")))[:3]
    out += [np.asarray(Image.open(p).convert("RGB").resize((64, 48))) for p in paths]
    return out


EXACT = [
    "AutoContrast",
    "Equalize",
    "Invert",
    "Posterize",
    "PosterizeIncreasing",
    "PosterizeOriginal",
    "Solarize",
    "SolarizeIncreasing",
    "SolarizeAdd",
]
BLENDS = [
    "Color",
    "ColorIncreasing",
    "Contrast",
    "ContrastIncreasing",
    "Brightness",
    "BrightnessIncreasing",
    "Sharpness",
    "SharpnessIncreasing",
]
AFFINE = ["Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"]


def _timm_op(timm_aa, name, magnitude, negate, interpolation, images):
    """timm's AugmentOp at a forced magnitude and sign on each image (None where Pillow refuses)."""
    from PIL import Image

    hp = dict(
        translate_const=100,
        img_mean=(128, 128, 128),
        interpolation={"bilinear": Image.BILINEAR, "nearest": Image.NEAREST}[interpolation],
    )
    op = timm_aa.AugmentOp(name, prob=1.0, magnitude=magnitude, hparams=hp)
    out = []
    for im in images:
        random.seed(0)
        orig = random.random
        random.random = lambda: 1.0 if negate else 0.0  # _randomly_negate: negates when > 0.5
        try:
            out.append(np.asarray(op(Image.fromarray(im))))
        except ValueError:  # Pillow >= 11 refuses posterize(bits=0)
            out.append(None)
        finally:
            random.random = orig
    return out


@pytest.mark.parametrize("name", EXACT + BLENDS + AFFINE)
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
def test_each_op_equals_timm_pil(name, interpolation, timm_aa, images):
    if interpolation == "nearest" and name not in AFFINE:
        pytest.skip("interpolation only matters to the affine ops")
    ra = randaug.RandAugment(ops=[name], interpolation=interpolation)
    for magnitude in (0, 2.25, 5, 9, 10):  # float32 numbers: the affine ops carry the magnitude
        for negate in (False, True):
            want = _timm_op(timm_aa, name, magnitude, negate, interpolation, images)
            code, arg = randaug.op_arg(ra, name, magnitude, negate)
            for im, w in zip(images, want):
                got = pixel_ops.apply(im, code, arg, fill=ra.fill, interpolation=interpolation)
                if w is None:  # posterize to 0 bits: the older Pillow's (and TF's) all-zero result
                    assert not got.any()
                elif name in AFFINE and interpolation == "bilinear":  # float64 vs Pillow's: a rare pixel moves
                    assert (got == w).all(-1).mean() >= 0.995, (name, magnitude, negate, im.shape)
                else:
                    np.testing.assert_array_equal(got, w, err_msg=f"{name} m={magnitude} neg={negate}")


def test_draws_match_timms_distribution(timm_aa):
    """χ² homogeneity test of (op, argument) per slot: 10^5 images from timm's RandAugment (its own
    np.random/random draws, the ops replaced by recorders) against 10^5 of ours."""
    from scipy.stats import chi2_contingency

    config, n = "rand-m9-mstd0.5-inc1", 100_000
    ra_timm = timm_aa.rand_augment_transform(config, {"translate_const": 100, "img_mean": (128, 128, 128)})
    ours = tbljax.RandAugment.from_timm(config)
    assert [op.name for op in ra_timm.ops] == list(ours.ops)
    seen = []
    for op in ra_timm.ops:
        op.aug_fn = (lambda name: lambda img, *args, **kw: seen.append((name, args)) or img)(op.name)
    random.seed(0)
    np.random.seed(0)
    for _ in range(n):
        before = len(seen)
        ra_timm(None)
        seen += [None] * (2 - (len(seen) - before))  # slots not applied
    timm_cats = [("none", 0) if s is None else _timm_arg(ours, s) for s in seen]
    codes, args = tbljax.augment.decide((ours,), np.arange(n), seed=3, epoch=1)
    our_cats = list(zip(codes.ravel().tolist(), args.ravel().tolist()))
    timm_cats = [(pixel_ops.CODES["none"], 0) if c == ("none", 0) else c for c in timm_cats]
    keys = sorted(set(timm_cats) | set(our_cats))
    # Bin each op's argument by the deciles of its values so every cell is well filled.
    binned = {}
    for code in {k[0] for k in keys}:
        vals = np.array([_value(code, a) for c, a in timm_cats + our_cats if c == code])
        edges = np.unique(np.quantile(vals, np.linspace(0, 1, 9)[1:-1]))
        binned[code] = edges
    table = np.zeros((2, 0))
    cells = {}
    for row, cats in enumerate((timm_cats, our_cats)):
        for c, a in cats:
            cell = (c, int(np.searchsorted(binned[c], _value(c, a), side="right")))
            cells.setdefault(cell, [0, 0])[row] += 1
    table = np.array([v for v in cells.values() if sum(v) >= 20]).T
    assert table.shape[1] > 30  # the ops and their magnitude bins, both signs
    assert chi2_contingency(table)[1] > 1e-3


def _arg(recorded):
    name, args = recorded
    if not args:
        return 0
    return pixel_ops.f32_arg(args[0]) if isinstance(args[0], float) else int(args[0])


def _value(code, arg):
    return float(np.array(arg, np.int32).view(np.float32)) if code in pixel_ops.FLOAT_ARG else arg


def _timm_arg(ours, recorded):
    """A recorded timm call as our (code, arg): affine levels back to the signed magnitude."""
    code = randaug.op_arg(ours, recorded[0], 0)[0]
    if code in pixel_ops.AFFINE:
        unit = pixel_ops.affine_level(code, 10.0, ours.translate_const, ours.translate_pct)
        return code, pixel_ops.f32_arg(recorded[1][0] / unit * 10)
    return code, _arg(recorded)


def test_decisions_are_the_same_in_numpy_and_jax():
    pols = (tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1"), tbljax.RandAugment.from_big_vision("randaug(2,15)"))
    idx = np.arange(0, 5000, 7)
    rep = idx % 3
    got_np = tbljax.augment.decide(pols, idx, seed=11, epoch=4, repeat=rep)
    got_jx = tbljax.augment.decide(pols, jnp.asarray(idx), seed=11, epoch=4, repeat=jnp.asarray(rep), xp=jnp)
    for a, b in zip(got_np, got_jx):
        np.testing.assert_array_equal(a, np.asarray(b))
    er = tbljax.RandomErasing(p=0.6, mode="rand", max_count=3)
    e_np = tbljax.augment.decide_erasing(er, idx, height=37, width=50, seed=11, epoch=4, repeat=2)
    e_jx = tbljax.augment.decide_erasing(er, jnp.asarray(idx), height=37, width=50, seed=11, epoch=4, repeat=2, xp=jnp)
    for a, b in zip(e_np, e_jx):
        np.testing.assert_array_equal(a, np.asarray(b))
    # Another repeat is another draw.
    other = tbljax.augment.decide(pols, idx, seed=11, epoch=4, repeat=rep + 1)
    assert (other[0] != got_np[0]).any()


def test_ops_change_no_box_or_flip():
    plain = tbljax.Augment(size=(32, 32))
    with_ops = tbljax.Augment(size=(32, 32), ops=[tbljax.RandAugment()], erasing=tbljax.RandomErasing())
    for kw in (
        dict(height=64, width=80),
        dict(geometry=aug_rule.RecordGeometry(np.array([40, 90]), np.array([70, 30]))),
    ):
        idx = np.arange(2) if "geometry" in kw else np.arange(300)
        a = aug_rule.sample(plain, idx, seed=5, epoch=2, **kw)
        b = aug_rule.sample(with_ops, idx, seed=5, epoch=2, **kw)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_from_timm_reads_every_key_as_timm_does(timm_aa):
    for config in ("rand-m9-mstd0.5-inc1", "rand-m7-n3-p0.8", "rand-m15-mmax20-mstd101", "rand-n1", "rand-m9-inc0"):
        t = timm_aa.rand_augment_transform(config, {"translate_const": 100, "img_mean": (128, 128, 128)})
        ours = tbljax.RandAugment.from_timm(config)
        op = t.ops[0]
        assert ([o.name for o in t.ops], t.num_layers, op.prob, op.magnitude, op.magnitude_std, op.magnitude_max) == (
            list(ours.ops),
            ours.num_ops,
            ours.prob,
            ours.magnitude,
            ours.magnitude_std,
            ours.magnitude_max,
        ), config
    with pytest.raises(ValueError, match="unknown timm RandAugment config key 'x'"):
        tbljax.RandAugment.from_timm("rand-m9-x3")
    with pytest.raises(ValueError, match="'tweights'"):
        tbljax.RandAugment.from_timm("rand-m9-tweights")
    with pytest.raises(ValueError, match="starts with 'rand'"):
        tbljax.RandAugment.from_timm("augmix-m3")


def test_from_big_vision_and_bad_values_are_refused_by_name():
    bv = tbljax.RandAugment.from_big_vision("randaug(2,15)")
    assert (bv.num_ops, bv.magnitude, bv.prob, len(bv.ops), bv.interpolation) == (2, 15.0, 1.0, 16, "nearest")
    table = randaug.arg_table(bv)  # not clipped at 10: TF's 45 degrees, 150 pixels, 165 added
    as_f32 = table.view(np.float32)
    assert as_f32[bv.ops.index("Rotate"), 1, 0] == -15.0  # the signed magnitude: 45 degrees
    assert pixel_ops.affine_level(pixel_ops.CODES["TranslateX"], 15.0, bv.translate_const) == 150.0
    assert table[bv.ops.index("SolarizeAdd"), 0, 0] == 165
    for bad, match in (
        (dict(ops=["Blur"]), "'Blur' is not supported"),
        (dict(prob=1.5), "prob"),
        (dict(fill=(1, 2)), "fill"),
        (dict(interpolation="bicubic"), "bicubic"),
        (dict(num_ops=0), "num_ops"),
    ):
        with pytest.raises(ValueError, match=match):
            tbljax.RandAugment(**bad)
    with pytest.raises(ValueError, match="randaug"):
        tbljax.RandAugment.from_big_vision("randaug(2)")
    with pytest.raises(ValueError, match="mode"):
        tbljax.RandomErasing(mode="noise")
    with pytest.raises(ValueError, match="ops must be a list"):
        tbljax.Augment(size=(8, 8), ops=tbljax.RandAugment())
    # Served by the host loaders now (tests/test_kernel_ops.py); refused in jit there.
    aug = tbljax.Augment(size=(8, 8), ops=[tbljax.RandAugment()])
    assert tbljax.Augment.from_spec(aug) is aug


def test_erasing_equals_timm_given_our_boxes():
    """timm's RandomErasing fed our draws (its random calls return our count, area, aspect and
    corner) erases exactly our boxes: 'const' exactly; 'rand' one normal per channel per box."""
    torch = pytest.importorskip("torch")
    timm_re = _timm("random_erasing")
    er = tbljax.RandomErasing(p=0.7, mode="const", min_count=1, max_count=3)
    h, w = 24, 40
    boxes, keys = tbljax.augment.decide_erasing(er, np.arange(200), height=h, width=w, seed=1, epoch=0)
    assert 0 < (boxes[:, 0, 2] > 0).mean() < 1
    rng = np.random.default_rng(0)
    for row, key in zip(boxes, keys):
        x = rng.standard_normal((3, h, w)).astype(np.float32)
        live = [b for b in row.tolist() if b[2] > 0]
        if not live:
            continue
        count = len(live)
        uniforms = iter(v for (_, _, bh, bw) in live for v in (bh * bw * count / (h * w), np.log(bh / bw)))
        corners = iter(v for (y0, x0, _, _) in live for v in (y0, x0))
        t = timm_re.RandomErasing(probability=1.0, mode="const", max_count=count, min_count=count, device="cpu")
        orig = (random.random, random.uniform, random.randint)
        random.random, random.uniform = (lambda: 0.0), (lambda a, b, it=uniforms: next(it))
        random.randint = lambda a, b, it=corners: next(it)
        try:
            want = t(torch.from_numpy(x.copy())).numpy()
        finally:
            random.random, random.uniform, random.randint = orig
        np.testing.assert_array_equal(pixel_ops.erase(x, row, key, "const"), want)
        rand = pixel_ops.erase(x, row, key, "rand")
        for y0, x0, bh, bw in live[-1:]:  # the last box is not overwritten by another
            patch = rand[:, y0 : y0 + bh, x0 : x0 + bw]
            assert (patch == patch[:, :1, :1]).all()


def test_erasing_pixel_noise_is_standard_normal():
    from scipy.stats import kstest

    er = tbljax.RandomErasing(p=1.0, mode="pixel")
    boxes, keys = tbljax.augment.decide_erasing(er, np.arange(40), height=32, width=32, seed=2, epoch=0)
    vals = []
    for row, key in zip(boxes, keys):
        x = np.full((3, 32, 32), np.nan, np.float32)
        out = pixel_ops.erase(x, row, key, "pixel")
        vals.append(out[~np.isnan(out)])
    vals = np.concatenate(vals)
    assert len(vals) > 5000
    assert kstest(vals, "norm").pvalue > 1e-3

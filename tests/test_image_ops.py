"""Issue 47's other per-image ops against the real peers: torchvision v2 TrivialAugmentWide and
ColorJitter on PIL images (their own kernels, magnitudes and samplers), timm 1.0.31's "3a"
policy and Pillow's GaussianBlur / convert("L"); the decisions the same in NumPy and jax.numpy."""

from __future__ import annotations

import importlib.util
import os
import random

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import shared_dir

import tbljax
from tbljax._src.rules import image_ops, pixel_ops, quantiles

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
ImageFilter = pytest.importorskip("PIL.ImageFilter")


@pytest.fixture(scope="module")
def tv():
    """torchvision v2 transforms (the two operator schemas defined first: ../shared/README.md)."""
    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        tv.lib = lib
    except RuntimeError:
        pass  # defined already
    return pytest.importorskip("torchvision.transforms.v2")


@pytest.fixture(scope="module")
def timm_aa():
    spec = importlib.util.find_spec("timm")
    if spec is None:
        pytest.skip("timm is not installed (the test extra pins timm==1.0.31)")
    s = importlib.util.spec_from_file_location(
        "timm_data_auto_augment", os.path.join(os.path.dirname(spec.origin), "data", "auto_augment.py")
    )
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    smooth = np.asarray(Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((40, 30)))
    return [rng.integers(0, 256, (24, 32, 3), dtype=np.uint8), smooth, rng.integers(0, 256, (3, 5, 3), dtype=np.uint8)]


def test_trivial_augment_magnitudes_are_torch_linspace():
    for start, end in ((0.0, 0.99), (0.0, 32.0), (0.0, 135.0), (1.0, 0.0), (0.1, 2.0)):
        for n in (2, 10, 31, 100):
            np.testing.assert_array_equal(image_ops.tv_linspace(start, end, n), torch.linspace(start, end, n).numpy())


def _forced(ta, image, k, b, negate, monkeypatch):
    """torchvision's TrivialAugmentWide on a PIL image with its draws forced: op k, bin b, sign."""
    draws = iter([k, b])
    monkeypatch.setattr(torch, "randint", lambda *a, **kw: torch.tensor(next(draws)))
    monkeypatch.setattr(torch, "rand", lambda *a, **kw: torch.tensor(0.0 if negate else 1.0))
    try:
        return np.asarray(ta(Image.fromarray(image)))
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("k", range(14))
def test_trivial_augment_ops_equal_torchvision_on_pil(k, tv, images, monkeypatch):
    """Op k (torchvision's order), every third bin, both signs: our (code, arg) from the table,
    applied by pixel_ops, equals torchvision's forward on the PIL image with its draws forced."""
    ours = tbljax.TrivialAugment()
    ta = tv.TrivialAugmentWide()
    table, code = ours.arg_table(), image_ops.TA_SPACE[k][1]
    for b in range(0, 31, 3):
        for sign in (0, 1):
            for im in images:
                want = _forced(ta, im, k, b, sign == 1, monkeypatch)
                got = pixel_ops.apply(im, code, int(table[k, sign, b]), fill=ours.fill, interpolation="nearest")
                np.testing.assert_array_equal(got, want, err_msg=f"{image_ops.TA_SPACE[k][0]} bin {b} sign {sign}")


def test_three_augment_and_single_ops_equal_pillow(timm_aa, images):
    """timm's 3a ops (Solarize at 5 = threshold 128, Desaturate at 10 = grayscale, GaussianBlurRand)
    and Pillow's GaussianBlur / convert("L") equal our rules exactly."""
    hp = dict(translate_const=100, img_mean=(128, 128, 128))
    policy = timm_aa.auto_augment_policy("3a", hp)
    codes = {"Solarize": (pixel_ops.CODES["Solarize"], 128), "Desaturate": (pixel_ops.CODES["Grayscale"], 0)}
    for im in images:
        pil = Image.fromarray(im)
        for (op,) in policy[:2]:
            np.testing.assert_array_equal(pixel_ops.apply(im, *codes[op.name]), np.asarray(op(pil)), op.name)
        np.testing.assert_array_equal(
            pixel_ops.apply(im, pixel_ops.CODES["Grayscale"], 0), np.asarray(pil.convert("L").convert("RGB"))
        )
        for r in np.linspace(0.1, 2.0, 12).tolist() + [0.0, 0.3, 7.5]:
            np.testing.assert_array_equal(
                pixel_ops.apply(im, pixel_ops.CODES["GaussianBlur"], pixel_ops.f32_arg(r)),
                np.asarray(pil.filter(ImageFilter.GaussianBlur(r))),
                f"radius {r}",
            )
        random.seed(0)
        r = random.uniform(0.1, 2.0)  # timm's GaussianBlurRand at magnitude 10 draws this radius
        random.seed(0)
        np.testing.assert_array_equal(
            np.asarray(policy[2][0](pil)), pixel_ops.apply(im, pixel_ops.CODES["GaussianBlur"], pixel_ops.f32_arg(r))
        )


def test_color_jitter_equals_torchvision_given_its_params(tv, images):
    """torchvision's ColorJitter on a PIL image, its factors and order forced to ours: equal."""
    cj = tbljax.ColorJitter(0.3, 0.4, (0.2, 1.7))
    codes, args = tbljax.augment.decide([cj], np.arange(12), seed=0, epoch=0)
    names = {
        pixel_ops.CODES["Brightness"]: ("brightness_factor", 0),
        pixel_ops.CODES["Contrast"]: ("contrast_factor", 1),
        pixel_ops.CODES["Color"]: ("saturation_factor", 2),
    }
    t = tv.ColorJitter(0.3, 0.4, (0.2, 1.7))
    for row_c, row_a in zip(codes.tolist(), args.tolist()):
        params = dict(hue_factor=None, fn_idx=torch.tensor([names[c][1] for c in row_c] + [3]))
        for c, a in zip(row_c, row_a):
            params[names[c][0]] = float(np.array(a, np.int32).view(np.float32))
        for im in images:
            want = np.asarray(t.transform(Image.fromarray(im), params))
            np.testing.assert_array_equal(pixel_ops.apply_all(im, row_c, row_a), want)


def _hue_factor(shift):
    """A hue factor torchvision turns into `shift` (``np.int32(f * 255)`` as uint8)."""
    k = shift - 256 if shift >= 128 else shift
    f = (k + 0.5 * np.sign(k)) / 255
    assert int(np.int32(f * 255).astype(np.uint8)) == shift
    return f


def test_color_jitter_with_hue_equals_torchvision_given_its_params(tv, images):
    """With hue: four adjustments in a drawn order of four; torchvision's ColorJitter on the PIL
    image with that order and those factors is equal, byte for byte, on real photos too."""
    cj = tbljax.ColorJitter(0.3, 0.4, 0.5, hue=(-0.4, 0.3))
    codes, args = tbljax.augment.decide([cj], np.arange(16), seed=1, epoch=0)
    names = {
        pixel_ops.CODES["Brightness"]: ("brightness_factor", 0),
        pixel_ops.CODES["Contrast"]: ("contrast_factor", 1),
        pixel_ops.CODES["Color"]: ("saturation_factor", 2),
        pixel_ops.CODES["Hue"]: ("hue_factor", 3),
    }
    assert codes.shape == (16, 4) and len({tuple(r) for r in codes.tolist()}) > 4  # several orders drawn
    photos = [np.asarray(Image.open(p).convert("RGB").reduce(8)) for p in _kodak_paths()[:3]]
    t = tv.ColorJitter(0.3, 0.4, 0.5, hue=(-0.4, 0.3))
    for row_c, row_a in zip(codes.tolist(), args.tolist()):
        params = dict(fn_idx=torch.tensor([names[c][1] for c in row_c]))
        for c, a in zip(row_c, row_a):
            v = _hue_factor(a) if c == pixel_ops.CODES["Hue"] else float(np.array(a, np.int32).view(np.float32))
            params[names[c][0]] = v
        for im in images + photos:
            want = np.asarray(t.transform(Image.fromarray(im), params))
            np.testing.assert_array_equal(pixel_ops.apply_all(im, row_c, row_a), want)


def _kodak_paths():
    paths = sorted((shared_dir("kodak") / "images").glob("*.jpg"))
    if not paths:
        pytest.skip("no kodak photos (../shared/data/kodak)")
    return paths


def test_hue_equals_torchvision_adjust_hue_on_photos_and_every_hue():
    """pixel_ops' Hue against torchvision's adjust_hue (Pillow's HSV round trip) on kodak photos
    at shifts covering both signs, and on 2**16 random colours: exact."""
    ftv = pytest.importorskip("torchvision.transforms._functional_pil")
    rng = np.random.default_rng(3)
    colours = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    photos = [np.asarray(Image.open(p).convert("RGB").reduce(8)) for p in _kodak_paths()[::12]]
    for factor in (-0.5, -0.37, -0.004, 0.0, 0.05, 0.5):
        shift = int(np.int32(factor * 255).astype(np.uint8))
        for im in photos + [colours]:
            want = np.asarray(ftv.adjust_hue(Image.fromarray(im), factor))
            np.testing.assert_array_equal(pixel_ops.apply(im, pixel_ops.CODES["Hue"], shift), want, f"hue {factor}")


def test_hue_shift_is_torchvisions_over_the_factor_table():
    """Every hue factor ColorJitter can draw (its float32 quantile table) maps to torchvision's
    shift ``np.int32(f * 255).astype(np.uint8)``."""
    cj = tbljax.ColorJitter(hue=0.5)
    factors = quantiles.uniform_table(-0.5, 0.5)
    want = [np.int32(f * 255).astype(np.uint8) for f in factors.tolist()]  # torchvision gets a Python float
    np.testing.assert_array_equal(cj.factor_tables()[3], want)


def test_color_jitter_hue_order_and_shift_match_torchvisions_sampler(tv):
    """χ² homogeneity with hue: the order of the four adjustments (torch.randperm(4)) and the
    hue shift (uniform_ in [-0.2, 0.2], then torchvision's int(f * 255)). 6000 draws."""
    n = 6000
    torch.manual_seed(0)
    cj = tv.ColorJitter(0.3, 0.3, 0.3, hue=0.2)
    ps = [cj.make_params([]) for _ in range(n)]
    orders = [tuple(int(i) for i in p["fn_idx"]) for p in ps]
    shifts = np.array([int(np.int32(p["hue_factor"] * 255).astype(np.uint8)) for p in ps])
    codes, args = tbljax.augment.decide([tbljax.ColorJitter(0.3, 0.3, 0.3, hue=0.2)], np.arange(n), seed=2, epoch=0)
    rank = {pixel_ops.CODES[k]: i for i, k in enumerate(("Brightness", "Contrast", "Color", "Hue"))}
    ours = [tuple(rank[c] for c in row) for row in codes.tolist()]
    code_of = {o: i for i, o in enumerate(sorted(set(orders) | set(ours)))}
    assert len(code_of) == 24
    assert _chi2(np.array([code_of[o] for o in orders]), np.array([code_of[o] for o in ours])) > 1e-3
    ours_shift = args[codes == pixel_ops.CODES["Hue"]]
    assert _chi2((shifts + 128) % 256, (ours_shift + 128) % 256, edges=np.arange(80, 180, 5)) > 1e-3


def test_draws_are_the_same_in_numpy_and_jax():
    pols = [
        tbljax.TrivialAugment(),
        tbljax.ColorJitter(0.3, 0.3, 0.3, hue=0.1),
        tbljax.ThreeAugment(),
        tbljax.GaussianBlur(0.4),
    ]
    idx = np.arange(0, 3000, 7)
    a = tbljax.augment.decide(pols, idx, seed=4, epoch=1, repeat=idx % 2)
    b = tbljax.augment.decide(pols, jnp.asarray(idx), seed=4, epoch=1, repeat=jnp.asarray(idx % 2), xp=jnp)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, np.asarray(y))
    assert a[0].shape == (len(idx), 7)


def _chi2(a, b, edges=None):
    from scipy.stats import chi2_contingency

    if edges is not None:
        a, b = np.searchsorted(edges, a), np.searchsorted(edges, b)
    keys = np.union1d(a, b)
    table = np.array([[np.sum(a == k) for k in keys], [np.sum(b == k) for k in keys]])
    return chi2_contingency(table)[1]


def test_draw_distributions_match_the_peers_samplers(tv):
    """χ² homogeneity against the peers' own samplers: TrivialAugmentWide's op (torch.randint;
    its bin and sign are uniform draws checked through the table), ColorJitter's order and
    factors (torch.randperm, uniform_), ThreeAugment's op and radius (timm: random.choice,
    random.uniform). 2 * 10^4 draws each."""
    n = 20_000
    torch.manual_seed(0)
    keys = image_ops.TA_SPACE  # torchvision's 14 ops, in its order (checked op by op above)
    theirs_ops = np.array([int(torch.randint(len(keys), ())) for _ in range(n)])  # forward's op draw
    codes, _ = tbljax.augment.decide([tbljax.TrivialAugment()], np.arange(n), seed=1, epoch=0)
    code_to_k = {image_ops.TA_SPACE[k][1]: k for k in range(len(keys))}
    ours_ops = np.array([code_to_k[c] for c in codes[:, 0].tolist()])
    assert _chi2(theirs_ops, ours_ops) > 1e-3
    # ColorJitter: the order of the three adjustments and each factor.
    cj = tv.ColorJitter(0.3, 0.3, 0.3)
    orders, factors = [], []
    for _ in range(n):
        p = cj.make_params([])
        orders.append(tuple(int(i) for i in p["fn_idx"] if int(i) < 3))
        factors.append(p["brightness_factor"])
    codes, args = tbljax.augment.decide([tbljax.ColorJitter(0.3, 0.3, 0.3)], np.arange(n), seed=2, epoch=0)
    rank = {pixel_ops.CODES["Brightness"]: 0, pixel_ops.CODES["Contrast"]: 1, pixel_ops.CODES["Color"]: 2}
    our_orders = [tuple(rank[c] for c in row) for row in codes.tolist()]
    code_of = {o: i for i, o in enumerate(sorted(set(orders) | set(our_orders)))}
    assert _chi2(np.array([code_of[o] for o in orders]), np.array([code_of[o] for o in our_orders])) > 1e-3
    ours_b = args.view(np.float32)[codes == pixel_ops.CODES["Brightness"]]
    assert _chi2(np.array(factors), ours_b, edges=np.linspace(0.7, 1.3, 21)[1:-1]) > 1e-3
    # ThreeAugment against timm's AutoAugment('3a') choice and radius.
    random.seed(0)
    their_ops = [random.randrange(3) for _ in range(n)]
    their_r = [random.uniform(0.1, 2.0) for _ in range(n)]
    codes, args = tbljax.augment.decide([tbljax.ThreeAugment()], np.arange(n), seed=3, epoch=0)
    kinds = {pixel_ops.CODES["Solarize"]: 0, pixel_ops.CODES["Grayscale"]: 1, pixel_ops.CODES["GaussianBlur"]: 2}
    assert _chi2(np.array(their_ops), np.array([kinds[c] for c in codes[:, 0].tolist()])) > 1e-3
    radii = args[:, 0].view(np.float32)[codes[:, 0] == pixel_ops.CODES["GaussianBlur"]]
    assert _chi2(np.array(their_r), radii, edges=np.linspace(0.1, 2.0, 21)[1:-1]) > 1e-3


def test_bad_values_are_refused_by_name():
    for make, match in (
        (lambda: tbljax.ColorJitter(hue=0.6), "hue"),
        (lambda: tbljax.ColorJitter(hue=(0.2, -0.2)), "hue"),
        (lambda: tbljax.ColorJitter(-1), "brightness"),
        (lambda: tbljax.ColorJitter(contrast=(1.5, 0.5)), "contrast"),
        (lambda: tbljax.GaussianBlur(sigma=(2, 1)), "sigma"),
        (lambda: tbljax.Grayscale(p=2), "p"),
        (lambda: tbljax.Solarize(threshold=300), "threshold"),
        (lambda: tbljax.TrivialAugment(num_magnitude_bins=1), "num_magnitude_bins"),
        (lambda: tbljax.Augment(size=(8, 8), ops=tbljax.ThreeAugment()), "ops must be a list"),
    ):
        with pytest.raises(ValueError, match=match):
            make()

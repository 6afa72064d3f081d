"""The pure-JAX twin of the per-image ops (`_src/jax/twin_ops.py`) against the NumPy reference
`pixel_ops` (itself tested against timm / PIL): every op code with arguments drawn by the real
policies, on random, flat, narrow-range and tiny images, bit for bit; the affine ops under x64
and their refusal without it; random erasing."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from tbljax._src.jax import twin_affine, twin_ops
from tbljax._src.rules import image_ops, pixel_filters, pixel_ops, randaug

C = pixel_ops.CODES
AFFINE = sorted(pixel_ops.AFFINE | pixel_ops.TV_AFFINE)
OTHER = [c for c in C.values() if c and c not in AFFINE]
APPLY = jax.jit(twin_ops.apply_program, static_argnames="affine")


@functools.cache
def _legal_args() -> dict[int, np.ndarray]:
    """Each op code's arguments as the policies draw them (their real ranges), by code."""
    timm_ops = [n for n in randaug.OP_NAMES if n != "Cutout"]  # Cutout: big_vision only
    uniform = dict(num_ops=4, ops=timm_ops, prob=1.0, magnitude=10, magnitude_std=float("inf"))
    batches = [
        (randaug.RandAugment(**uniform), randaug.RandAugment.from_big_vision("randaug(2,15)")),
        (image_ops.TrivialAugment(), image_ops.ThreeAugment(), image_ops.ColorJitter(0.4, 0.4, 0.4, hue=0.5)),
        (
            image_ops.GaussianBlur(p=1.0, sigma=(0.1, 4.0)),
            image_ops.GaussianBlur(p=1.0, sigma=(4.0, 1000.0)),  # box radii past the image
            image_ops.Solarize(p=1.0),
            image_ops.Grayscale(p=1.0),
        ),
    ]
    pairs = [np.stack(randaug.decide(p, np.arange(600), seed=5, epoch=0), -1).reshape(-1, 2) for p in batches]
    pairs = np.concatenate(pairs)
    by_code = {int(c): np.unique(pairs[pairs[:, 0] == c, 1]) for c in np.unique(pairs[:, 0]) if c}
    assert sorted(by_code) == sorted(c for c in C.values() if c)  # every op is drawn
    return by_code


def _images(rng, n, h, w):
    """Random images, with flat ones, narrow ranges and AutoContrast's rounding cases
    (every value of (lo, hi) = (0, 105) and (3, 78): float64 LUT entries below the quotient)."""
    px = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    px[0::6] = rng.integers(0, 256, (len(px[0::6]), 1, 1, 3), dtype=np.uint8)
    px[1::6] = rng.integers(90, 120, px[1::6].shape, dtype=np.uint8)
    for k, (lo, hi) in ((2, (0, 105)), (3, (3, 78))):
        ramp = np.resize(np.arange(lo, hi + 1), h * w).reshape(h, w)
        px[k::6] = np.stack([ramp, ramp[::-1], rng.permutation(ramp.ravel()).reshape(h, w)], -1)
    return px


def _program(rng, codes, k):
    """(B, k) codes and legal args: first slot `codes`, later slots random codes or none."""
    args = _legal_args()
    first = np.asarray(codes)
    cols = [first] + [rng.choice([0] + list(args), len(first)) for _ in range(k - 1)]
    code = np.stack(cols, 1)
    arg = np.vectorize(lambda c: rng.choice(args[c]) if c else 0)(code)
    return code.astype(np.uint8), arg.astype(np.int32)


def _reference(px, codes, args, fill, interpolation):
    """pixel_ops.apply_all slot by slot (each slot its own fill and resampling)."""
    out = []
    for b in range(len(px)):
        img = px[b]
        for k in range(codes.shape[1]):
            img = pixel_ops.apply_all(
                img, codes[b, k : k + 1], args[b, k : k + 1], fill=fill[k], interpolation=interpolation[k]
            )
        out.append(img)
    return np.stack(out)


def _matrices(codes, args, h, w):
    """float64 (B, K, 6): each affine slot's matrix (pixel_ops.op_matrix), zeros elsewhere."""
    mats = np.zeros(codes.shape + (6,), np.float64)
    for (b, k), c in np.ndenumerate(codes):
        if c in AFFINE:
            mats[b, k] = pixel_ops.op_matrix(int(c), int(args[b, k]), h, w)
    return mats


def _run(px, codes, args, fill, nearest, mats=None):
    """The jitted twin; `mats` (float64 (B, K, 6)) passed as matrix_bits, None: affine=False."""
    bits = None if mats is None else mats.view(np.uint32).reshape(codes.shape + (6, 2))
    return np.asarray(APPLY(px, codes, args, bits, fill, nearest, affine=mats is not None))


@pytest.mark.parametrize("shape, k", [((9, 12), 2), ((2, 3), 1)], ids=["9x12-two-slots", "2x3"])
def test_every_op_equals_pixel_ops(shape, k):
    rng = np.random.default_rng(sum(shape))
    codes = np.repeat(OTHER, 6)
    code, arg = _program(rng, codes, k)
    code[:, 1:][np.isin(code[:, 1:], AFFINE)] = 0  # affine slots need x64: test_affine_ops_under_x64
    px = _images(rng, len(code), *shape)
    fill = rng.integers(0, 256, (k, 3), dtype=np.uint8)
    got = _run(px, code, arg, fill, np.zeros(k, np.uint8))
    want = _reference(px, code, arg, fill, ["bilinear"] * k)
    for b in range(len(px)):
        np.testing.assert_array_equal(got[b], want[b], err_msg=f"row {b}: codes {code[b]} args {arg[b]}")


def test_affine_ops_under_x64():
    """Every affine op, bilinear and nearest, with other ops in the second slot; and three rows
    whose matrices the policies never make, for Pillow's three nearest sweeps (a pure scale;
    16.16 fixed point; float64 row sums when a corner maps beyond 32768), against pixel_filters."""
    rng = np.random.default_rng(47)
    sweeps = np.array(
        [(1.37, 0.0, -2.3, 0.0, 0.71, 1.9), (0.9, 0.31, 1.2, -0.2, 1.1, 0.4), (1.0, 0.25, -40003.1, 0.1, 1.0, 2.2)]
    )
    with jax.enable_x64(True):
        code, arg = _program(rng, np.repeat(AFFINE, 4), 2)
        px = _images(rng, len(code), 7, 9)
        fill = np.array([[1, 2, 3], [250, 0, 9]], np.uint8)
        for nearest in ((0, 1), (1, 0)):
            mats = _matrices(code, arg, 7, 9)
            mats[-3:, 0], code[-3:, 1] = sweeps, 0
            got = _run(px, code, arg, fill, np.array(nearest, np.uint8), mats)
            want = _reference(px, code, arg, fill, [pixel_ops.INTERPOLATIONS[n] for n in nearest])
            interpolation = pixel_ops.INTERPOLATIONS[nearest[0]]
            want[-3:] = [
                pixel_filters.affine_transform(p, tuple(m), interpolation, fill[0]) for p, m in zip(px[-3:], sweeps)
            ]
            for b in range(len(px)):
                np.testing.assert_array_equal(got[b], want[b], err_msg=f"row {b}: {code[b]} {arg[b]} {nearest}")


def test_products_round_as_numpy_where_xla_fuses_multiply_add():
    """XLA on CPU fuses ``d + f * t`` into one fused multiply-add (rounded once, NumPy rounds
    twice): the twin's products (`split` in float32, `mul_exact` in float64) give NumPy's bits."""
    rng = np.random.default_rng(0)
    f = rng.uniform(0, 2, (512, 1)).astype(np.float32)
    t = np.arange(-255, 256, dtype=np.float32)[None]
    d = np.float32(97)

    def split_product(f, t):
        hi, lo = twin_ops.split(f)
        return d + (hi * t + lo * t)

    np.testing.assert_array_equal(np.asarray(jax.jit(split_product)(f, t)), d + f * t)
    with jax.enable_x64(True):
        u, v, c = rng.uniform(-255, 255, 4096), rng.uniform(0, 1, 4096), rng.uniform(0, 255, 4096)
        got = jax.jit(lambda u, v, c: c + twin_affine.mul_exact(u, v))(u, v, c)
        np.testing.assert_array_equal(np.asarray(got), c + u * v)


def test_affine_ops_without_x64_are_refused_by_name():
    px = np.zeros((1, 4, 4, 3), np.uint8)
    codes, args = np.array([[C["Rotate"]]], np.uint8), np.zeros((1, 1), np.int32)
    bits = np.zeros((1, 1, 6, 2), np.uint32)
    assert not jax.config.jax_enable_x64
    with pytest.raises(ValueError, match=r"affine ops \(Rotate.*jax_enable_x64.*FFI backend"):
        twin_ops.apply_program(px, codes, args, bits, np.zeros((1, 3), np.uint8), np.zeros(1, np.uint8))


def test_bad_shapes_are_refused_by_name():
    px, fill, near = np.zeros((2, 4, 4, 3), np.uint8), np.zeros((1, 3), np.uint8), np.zeros(1, np.uint8)
    codes, args = np.zeros((2, 1), np.uint8), np.zeros((2, 1), np.int32)
    with pytest.raises(ValueError, match=r"pixels must be uint8 \(B, H, W, 3\), got float32"):
        twin_ops.apply_program(px.astype(np.float32), codes, args, None, fill, near, affine=False)
    with pytest.raises(ValueError, match=r"codes and args must both be \(B=2, K\), got \(2, 1\) and \(2, 2\)"):
        twin_ops.apply_program(px, codes, np.zeros((2, 2), np.int32), None, fill, near, affine=False)
    with pytest.raises(ValueError, match=r"fill must be \(K=1, 3\)"):
        twin_ops.apply_program(px, codes, args, None, np.zeros(3, np.uint8), near, affine=False)
    with pytest.raises(ValueError, match="mode must be one of"):
        twin_ops.erase(np.zeros((1, 2, 2, 3), np.float32), np.zeros((1, 1, 4), np.int32), np.zeros(1), "noise")


@pytest.mark.parametrize("mode", twin_ops.ERASE_MODES)
def test_erase_equals_pixel_ops(mode):
    rng = np.random.default_rng(len(mode))
    b, h, w = 5, 9, 11
    values = rng.standard_normal((b, h, w, 3)).astype(np.float32)
    y0, x0 = rng.integers(0, h, (b, 3)), rng.integers(0, w, (b, 3))
    boxes = np.stack(
        [y0, x0, rng.integers(-1, h, (b, 3)), rng.integers(1, w + 3, (b, 3))], -1
    )  # some empty or past the edge
    keys = rng.integers(0, 2**32, b, dtype=np.uint32)
    got = np.asarray(jax.jit(twin_ops.erase, static_argnames="mode")(values, boxes, keys, mode=mode))
    for i in range(b):
        want = pixel_ops.erase(values[i].transpose(2, 0, 1), boxes[i], keys[i], mode).transpose(1, 2, 0)
        np.testing.assert_array_equal(got[i], want)
    assert (got != values).any()  # something was erased


def test_hue_equals_pixel_ops_on_random_colours_at_several_shifts():
    """Hue (ColorJitter's hue: Pillow's HSV round trip) on 2**16 random colours plus the grays
    and two-equal-channel colours (Pillow's branch ties), at several shifts, against the
    reference (the twin was checked on all 2**24 colours at shifts 0, 1, 77, 128, 200, 255)."""
    rng = np.random.default_rng(26)
    colours = rng.integers(0, 256, (1 << 16, 3), dtype=np.uint8)
    u = np.arange(256, dtype=np.uint8)
    ties = [
        np.stack([u, u, u], -1),
        np.stack([u, u, 255 - u], -1),
        np.stack([u, np.zeros_like(u), u], -1),
        np.stack([np.full_like(u, 9), u, u], -1),
    ]
    colours[: 4 * 256] = np.concatenate(ties)
    shifts = np.array([0, 1, 25, 128, 231, 255], np.int32)
    px = np.broadcast_to(colours.reshape(1, 256, 256, 3), (len(shifts), 256, 256, 3))
    codes = np.full((len(shifts), 1), C["Hue"], np.uint8)
    apply = jax.jit(twin_ops.apply_program, static_argnames=("affine", "may_draw"))
    got = np.asarray(
        apply(
            px,
            codes,
            shifts[:, None],
            None,
            np.zeros((1, 3), np.uint8),
            np.zeros(1, np.uint8),
            affine=False,
            may_draw=(C["Hue"],),
        )
    )
    for b, s in enumerate(shifts):
        np.testing.assert_array_equal(got[b], pixel_ops.apply_all(px[b], [C["Hue"]], [s]), err_msg=f"shift {s}")
    assert (got[1] != px[1]).any()  # the shift changed colours


def test_unknown_concrete_codes_are_refused_by_name():
    px, fill, near = np.zeros((2, 4, 4, 3), np.uint8), np.zeros((2, 3), np.uint8), np.zeros(2, np.uint8)
    codes, args = np.array([[3, 0], [C["Hue"], 200]], np.uint8), np.zeros((2, 2), np.int32)
    with pytest.raises(ValueError, match=r"ops: row 1 column 1: op code 200 is not one of pixel_ops.CODES"):
        twin_ops.apply_program(px, codes, args, None, fill, near, affine=False)

"""The pure-JAX twin's per-image ops and erasing on NaFlex rows (issue 49, `_src/jax/twin_patch_ops.py`):
`tbljax.ops.gather_normalize(patches=(p, sizes), ops=<a program of per-row sizes>, backend="twin")`
against the CPU FFI handler and the host kernel (`tbljax.kernels.gather(ops=, patches=)`, whose
matrices are built at each row's size on the host), bit for bit: every op code forced through the
program's arrays, rows of several sizes (1 to 16 patches, several aspects), each erasing mode."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tbljax
from tbljax._src.engine import pixel_program
from tbljax._src.rules import image_ops, pixel_ops, randaug

P, T = 4, 16
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
C = pixel_ops.CODES
TV = sorted(pixel_ops.TV_AFFINE)
AFFINE = sorted(pixel_ops.AFFINE | pixel_ops.TV_AFFINE)
# Column 0 is RandAugment's slot (timm's affine ops, bilinear), column 1 TrivialAugment's
# (torchvision's, nearest): each affine op in the column whose policy draws it.
RA = randaug.RandAugment(
    num_ops=1, ops=[n for n in randaug.OP_NAMES if n != "Cutout"], prob=1.0, magnitude=10, magnitude_std=float("inf")
)
TA = image_ops.TrivialAugment()
POLICIES = [RA, TA]
SIZES = np.array([(16, 16), (4, 4), (8, 20), (20, 12), (12, 4), (4, 24), (24, 8), (8, 8)], np.int32)


@functools.cache
def _legal() -> dict[int, list[tuple[int, int]]]:
    """{code: [(column, argument), ...]} as the policies draw them: affine ops in their own
    policy's column, the others in either."""
    by_code: dict[int, list] = {}
    others = (
        randaug.RandAugment.from_big_vision("randaug(2,15)"),  # Cutout
        image_ops.ThreeAugment(),
        image_ops.ColorJitter(0.4, 0.4, 0.4, hue=0.5),
        image_ops.GaussianBlur(p=1.0, sigma=(0.1, 4.0)),
        image_ops.GaussianBlur(p=1.0, sigma=(4.0, 1000.0)),  # box radii past the row's sides
    )
    for col, policy in [(0, RA), (1, TA)] + [(None, p) for p in others]:
        codes, args = randaug.decide([policy], np.arange(300), seed=3, epoch=0)
        for c, a in zip(codes.ravel().tolist(), args.ravel().tolist()):
            if c and (c not in AFFINE or col == (1 if c in TV else 0)):
                by_code.setdefault(c, []).append((col or 0, a))
    assert sorted(by_code) == sorted(c for c in C.values() if c), "a code is never drawn"
    return by_code


def _program(codes_wanted, rng):
    """(B, 2) codes and arguments: row b runs `codes_wanted[b]` in its column, and a random
    non-affine op or none in the other."""
    legal = _legal()
    plain = [c for c in legal if c not in AFFINE]
    b = len(codes_wanted)
    codes, args = np.zeros((b, 2), np.uint8), np.zeros((b, 2), np.int32)
    for i, c in enumerate(codes_wanted):
        col, a = legal[c][rng.integers(len(legal[c]))]
        codes[i, col], args[i, col] = c, a
        o = rng.choice(plain + [0])
        if o:
            codes[i, 1 - col], args[i, 1 - col] = o, legal[o][rng.integers(len(legal[o]))][1]
    return codes, args


def _case(codes_wanted, seed, erase_mode, dtype="float32"):
    rng = np.random.default_rng(seed)
    n = len(codes_wanted)
    data = rng.integers(0, 256, (4, 30, 36, 3), dtype=np.uint8)
    data[1] = rng.integers(90, 120, (1, 1, 3))  # flat: AutoContrast / Equalize's edge cases
    data[2] = rng.integers(40, 90, data[2].shape)  # a narrow range
    idx = rng.integers(0, 4, n)
    sizes = SIZES[np.arange(n) % len(SIZES)]
    y0, x0 = rng.integers(0, 10, n), rng.integers(0, 10, n)
    boxes = np.stack([y0, x0, rng.integers(5, 31 - y0), rng.integers(5, 37 - x0)], -1).astype(np.int32)
    flips = rng.random(n) < 0.5
    codes, args = _program(codes_wanted, rng)
    er = {}
    if erase_mode is not None:
        h, w = rng.integers(1, sizes[:, :1] + 1), rng.integers(1, sizes[:, 1:] + 1)  # (B, 1)
        ey, ex = rng.integers(0, sizes[:, :1] - h + 1), rng.integers(0, sizes[:, 1:] - w + 1)
        eb = np.stack([ey, ex, h, w], -1).astype(np.int32)  # one box a row
        eb[::3, 0, 2] = 0  # some rows: none
        er = dict(erase_boxes=eb, erase_keys=rng.integers(0, 2**32, n, dtype=np.uint32), erase_mode=erase_mode)
    norm = dict(mean=MEAN, std=STD) if dtype != "uint8" else {}
    want = np.zeros((n, T, P * P * 3), np.dtype(dtype))
    host = pixel_program.pixel_program(codes, args, sizes, policies=POLICIES, **er)
    tbljax.kernels.gather(data, idx, want, crop=boxes, flip=flips, patches=(P, sizes), ops=host, **norm)
    prog = tbljax.ops.pixel_program(codes, args, sizes, policies=POLICIES, **er)
    for backend in ("ffi", "twin"):

        @jax.jit
        def run(d, i, c, f, s, b=backend):  # a concrete program: the twin compiles only its ops
            return tbljax.ops.gather_normalize(
                d, i, crop=c, flip=f, patches=(P, s), ops=prog, out_size=(T, P * P * 3), dtype=dtype, backend=b, **norm
            )

        got = run(data, jnp.asarray(idx, jnp.int32), boxes, flips, sizes)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"{backend} (codes {codes.tolist()})")
    return codes, args


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def test_every_op_code_on_rows_of_several_sizes_equals_the_kernel(x64):
    # Each code twice (different rows, sizes and arguments), erasing per pixel.
    every = sorted(c for c in C.values() if c)
    _case(every + every[::-1], seed=1, erase_mode="pixel")


@pytest.mark.parametrize("erase_mode", ["pixel", "rand", "const"])
def test_pointwise_and_neighbourhood_ops_with_erasing_equal_the_kernel(erase_mode):
    # No affine op (no x64 needed): the statistics over valid tokens only, Sharpness's border,
    # Cutout's and erasing's coordinates, each erasing mode (bfloat16 rounds its noise).
    names = ["AutoContrast", "Equalize", "Contrast", "Sharpness", "Cutout", "GaussianBlur", "Hue", "GaussianBlur"]
    codes, args = _case(
        [C[n] for n in names], seed=3, erase_mode=erase_mode, dtype="bfloat16" if erase_mode == "rand" else "float32"
    )
    radii = args[codes == C["GaussianBlur"]].view(np.float32)
    assert (radii < 4).any() and (radii > 24).any(), radii  # a box within the row and one past its sides


def test_nearest_sweeps_past_the_fixed_point_range_equal_the_kernel(x64):
    # Pillow's third nearest case (a corner past +-32768: float64 sums down the first column,
    # then along each row), which no policy draws: a hand-made matrix in TrivialAugment's
    # nearest column, beside a bilinear one in RandAugment's; wide rows take the third case,
    # narrow ones the fixed-point one. The host kernel's program holds the same matrices.
    rng = np.random.default_rng(4)
    n = len(SIZES)
    data = rng.integers(0, 256, (n, 30, 36, 3), dtype=np.uint8)
    boxes = np.tile(np.array([[0, 0, 30, 36]], np.int32), (n, 1))
    codes = np.tile(np.array([[C["ShearX"], C["TvShearX"]]], np.uint8), (n, 1))
    legal = _legal()  # arguments its policy draws (the matrices are replaced below)
    args = np.tile(np.array([[legal[C["ShearX"]][0][1], legal[C["TvShearX"]][0][1]]], np.int32), (n, 1))
    m = np.array([[1.0, 0.25, -0.5, 0.125, 1.0, 0.5], [2000.5, -0.25, -2000.5 * 3.5 + 5.2, 0.125, 1.0, 0.5]])
    mats = np.broadcast_to(m, (n, 2, 6)).copy()
    fill, nearest = pixel_program.slot_constants(pixel_program.column_policies(POLICIES, 2))
    assert nearest.tolist() == [0, 1]
    empty = (np.zeros((n, 0, 4), np.int32), np.zeros(n, np.uint32), 0, np.zeros(4096, np.float32))
    host = pixel_program.PixelProgram((codes, args, mats, fill, nearest, *empty))
    want = np.zeros((n, T, P * P * 3), np.uint8)
    tbljax.kernels.gather(data, np.arange(n), want, crop=boxes, patches=(P, SIZES), ops=host)
    jit_prog = tbljax.ops.pixel_program(codes, args, SIZES, policies=POLICIES)
    bits = mats.view(np.uint32).reshape(n, 2, 6, 2)  # little-endian: [low word, high word]
    prog = type(jit_prog)((jit_prog[0], jit_prog[1], bits, *jit_prog[3:]), may_draw=jit_prog.may_draw, size_free=True)
    for backend in ("ffi", "twin"):
        got = jax.jit(
            lambda d, b=backend: tbljax.ops.gather_normalize(
                d,
                np.arange(n),
                crop=boxes,
                patches=(P, SIZES),
                ops=prog,
                out_size=(T, P * P * 3),
                dtype="uint8",
                backend=b,
            )
        )(data)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=backend)
    assert (want != 0).any()


def test_affine_ops_on_the_twin_without_x64_are_refused_by_name():
    # The affine ops resample in float64: without x64 the twin refuses them at trace time.
    legal = _legal()
    codes = np.array([[C["Rotate"], 0], [0, C["TvShearX"]]], np.uint8)
    args = np.array([[legal[C["Rotate"]][0][1], 0], [0, legal[C["TvShearX"]][0][1]]], np.int32)
    sizes = SIZES[:2]
    prog = tbljax.ops.pixel_program(codes, args, sizes, policies=POLICIES)
    with pytest.raises(ValueError, match="jax_enable_x64 is off"):
        tbljax.ops.gather_normalize(
            np.zeros((2, 20, 20, 3), np.uint8),
            np.arange(2),
            crop=np.array([[0, 0, 20, 20]] * 2, np.int32),
            patches=(P, sizes),
            ops=prog,
            out_size=(T, P * P * 3),
            backend="twin",
        )

"""Tests of the serve kernel (tbljax.kernels.gather) against a plain NumPy reference written
here: float64 normalization, the integer crop-resize formula of ffi/core/serve/kernel.h written out
directly, every dtype x layout x crop x flip x shards, every SIMD target, and the errors."""

import itertools
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tbljax
from tbljax import _core
from tbljax._src.engine import kernels
from tbljax._src.engine.ring import aligned_empty

import oracle
from oracle import axis_weights as ref_weights
from oracle import crop_resize as ref_crop_resize  # noqa: F401
from oracle import nearest_bf16_bits
from oracle import table as reference_table

BF16 = np.dtype(ml_dtypes.bfloat16)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TARGETS = _core.supported_kernel_targets()


@pytest.fixture(autouse=True)
def _restore_target():
    yield
    _core.set_kernel_target("auto")
    _core._set_normalization_path_limit("affine-f32")


NORM_PATHS = ["affine-f32", "affine-f64", "table"]  # how the SIMD targets may normalize

# The kernel's /proc/cpuinfo names of the CPU features the SIMD targets use (simd.h's names).
CPUINFO_FLAGS = {
    "avx2": "avx2",
    "fma": "fma",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "f16c": "f16c",
    "popcnt": "popcnt",
    "pclmul": "pclmulqdq",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512dq": "avx512dq",
    "avx512vbmi": "avx512vbmi",
}


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not Path("/proc/cpuinfo").exists(),
    reason="x86-64 Linux: the CPU detection checked against /proc/cpuinfo",
)
def test_cpu_features_and_targets_are_what_the_linux_kernel_reports():
    # Independent of the core's CPUID reading: the kernel's flags (it hides AVX where the OS
    # does not save the registers). A build whose detection reads nothing (zig's runtime left
    # __builtin_cpu_supports' table empty) would offer only scalar on every CPU.
    line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
    flags = set(line.split(":", 1)[1].split())
    info = tbljax.build_info()
    assert sorted(info["cpu_features"]) == sorted(n for n, f in CPUINFO_FLAGS.items() if f in flags)
    avx2 = {"avx2", "fma", "bmi1", "bmi2", "f16c", "popcnt", "pclmulqdq"} <= flags
    avx512 = avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    assert TARGETS == ["scalar"] + ["avx2"] * avx2 + ["avx512"] * avx512


# ---------------------------------------------------------------------------------------------
# The reference
# ---------------------------------------------------------------------------------------------


def out_buffer(batch, oh, ow, dtype, layout, fill=0x5A):
    shape = (batch, oh, ow, 3) if layout == "NHWC" else (batch, 3, oh, ow)
    buf = np.empty(shape, dtype)
    buf.view(np.uint8)[...] = fill  # garbage, so unwritten elements show
    return buf


def aligned_out_buffer(batch, oh, ow, dtype, layout, fill=0x5A):
    """out_buffer in 64-byte-aligned memory, as the loader's ring gives (a plain np.empty of a
    batch's size starts 16 bytes past a page, where the kernel takes ordinary stores)."""
    shape = (batch, oh, ow, 3) if layout == "NHWC" else (batch, 3, oh, ow)
    raw = aligned_empty(int(np.prod(shape)) * np.dtype(dtype).itemsize)
    raw[...] = fill
    out = raw.view(dtype).reshape(shape)
    assert out.ctypes.data % 64 == 0
    return out


def bits(a):
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def random_boxes(rng, batch, h, w):
    bh = rng.integers(1, h + 1, batch)
    bw = rng.integers(1, w + 1, batch)
    y0 = rng.integers(0, h - bh + 1)
    x0 = rng.integers(0, w - bw + 1)
    return np.stack([y0, x0, bh, bw], axis=1)


# ---------------------------------------------------------------------------------------------
# The reference itself
# ---------------------------------------------------------------------------------------------


def test_reference_weights_identity_bounds_and_antialiasing():
    assert (ref_weights(37, 37) == 2048 * np.eye(37, dtype=np.int64)).all()  # a plain crop
    for out_len, length in [(1, 1), (1, 9), (9, 1), (160, 50), (160, 176), (7, 300), (300, 7)]:
        w = ref_weights(out_len, length)
        assert (w >= 0).all() and (w.sum(axis=1) == 2048).all()
        taps = (w > 0).sum(axis=1)
        assert (taps <= 2 * max(length, out_len) // out_len + 1).all()
        if length <= out_len:  # upscaling: ordinary 2-tap bilinear
            assert (taps <= 2).all()
    # Shrinking by 2 averages with the triangle stretched 2x: (1, 3, 3, 1) / 8 inside.
    assert list(ref_weights(8, 16)[3, 5:9]) == [256, 768, 768, 256]


def test_nearest_bf16_rounds_once_from_float64():
    # ml_dtypes goes float64 -> float32 -> bfloat16 and rounds this down to 1.0; the nearest
    # bfloat16 is 1 + 2**-7, as the value is above the midpoint 1 + 2**-8.
    v = 1 + 2**-8 + 2**-30
    assert nearest_bf16_bits(v) == 0x3F81
    assert nearest_bf16_bits(1 + 2**-8) == 0x3F80  # a tie goes to even
    # The kernel's table (built in C++) rounds once too: x = 0 with mean -v, std 1 gives v.
    got = kernels.normalize_table((-v,) * 3, (1, 1, 1), BF16)[0, 0]
    assert int(np.asarray(got).view(np.uint16)) == 0x3F81


# ---------------------------------------------------------------------------------------------
# Normalization contract: all 256 values of every channel, every target, both layouts
# ---------------------------------------------------------------------------------------------

NORM_PARAMS = [
    (IMAGENET_MEAN, IMAGENET_STD),
    ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    ((-3.25, 100.0, 1e-3), (0.7, 3e-5, 1234.5)),  # std > 0: the contract (contract.h)
]


def _all_values_source():
    # 16x16 = 256 pixels; channel c of pixel k is (k * (2c + 1)) % 256: every value once per
    # channel, in a different order per channel.
    k = np.arange(256)
    img = np.stack([(k * (2 * c + 1)) % 256 for c in range(3)], axis=-1).astype(np.uint8)
    return img.reshape(1, 16, 16, 3)


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("params", NORM_PARAMS, ids=["imagenet", "half", "unit", "odd"])
@pytest.mark.parametrize("limit", NORM_PATHS)
def test_normalize_contract_all_values(dtype, params, limit):
    mean, std = params
    name = "float32" if dtype == np.float32 else "bfloat16"
    # The fast path is the one tested here (with limit "affine-f32").
    assert _core._normalization_path(mean, std, name) == "affine-f32"
    _core._set_normalization_path_limit(limit)
    want_table = reference_table(mean, std, dtype)
    np.testing.assert_array_equal(bits(kernels.normalize_table(mean, std, dtype)), bits(want_table))
    src = _all_values_source()
    want = want_table[np.arange(3), src[0]]  # (16, 16, 3)
    for target in TARGETS:
        _core.set_kernel_target(target)
        for layout in ("NHWC", "NCHW"):
            out = out_buffer(1, 16, 16, dtype, layout)
            kernels.gather(src, [0], out, layout=layout, mean=mean, std=std)
            got = out[0] if layout == "NHWC" else out[0].transpose(1, 2, 0)
            np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{target} {layout}")


def test_normalize_contract_random_params_every_target():
    # Many (mean, std): exercises the affine path's setup check and its table fallback.
    rng = np.random.default_rng(7)
    src = _all_values_source()
    for trial in range(40):
        mean = tuple(rng.uniform(-2, 2, 3))
        std = tuple(rng.uniform(0.01, 3, 3))  # > 0: the contract (contract.h)
        for dtype, limit in itertools.product((np.float32, BF16), NORM_PATHS):
            _core._set_normalization_path_limit(limit)
            with np.errstate(all="ignore"):
                table = kernels.normalize_table(mean, std, dtype)
            if dtype == np.float32:
                np.testing.assert_array_equal(bits(table), bits(reference_table(mean, std, dtype)))
            want = table[np.arange(3), src[0]]
            for target in TARGETS:
                _core.set_kernel_target(target)
                out = out_buffer(1, 16, 16, dtype, "NHWC")
                kernels.gather(src, [0], out, mean=mean, std=std)
                np.testing.assert_array_equal(
                    bits(out[0]), bits(want), err_msg=f"trial {trial} {target} {dtype} {limit}"
                )


def test_normalize_table_bf16_matches_independent_reference_on_random_params():
    rng = np.random.default_rng(11)
    for _ in range(5):
        mean, std = tuple(rng.uniform(-1, 1, 3)), tuple(rng.uniform(0.05, 2, 3))
        np.testing.assert_array_equal(
            bits(kernels.normalize_table(mean, std, BF16)), bits(reference_table(mean, std, BF16))
        )


# ---------------------------------------------------------------------------------------------
# The matrix: dtype x layout x crop x flip x shards
# ---------------------------------------------------------------------------------------------

H, W = 23, 29  # odd sizes: rows are not a whole number of vectors
CROP_OUT = (17, 31)


def _records(seed=0, n=12, h=H, w=W):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def _shard(records, parts):
    if parts == 1:
        return records
    # Three shards, one of them empty, to test index -> shard mapping.
    return [records[:5], records[5:5], records[5:]]


@pytest.mark.parametrize("shards", [1, 3], ids=["1shard", "3shards"])
@pytest.mark.parametrize("flip", [False, True], ids=["noflip", "flip"])
@pytest.mark.parametrize("crop", [False, True], ids=["nocrop", "crop"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize(
    "dtype, limit",
    [
        (np.uint8, "affine-f32"),
        (np.float32, "affine-f32"),
        (np.float32, "affine-f64"),
        (np.float32, "table"),
        (BF16, "affine-f32"),
        (BF16, "affine-f64"),
        (BF16, "table"),
    ],
    ids=["uint8", "float32", "float32-f64", "float32-table", "bfloat16", "bfloat16-f64", "bfloat16-table"],
)
def test_gather_matrix(dtype, limit, layout, crop, flip, shards):
    _core._set_normalization_path_limit(limit)
    rng = np.random.default_rng(1)
    records = _records()
    batch = 9
    idx = rng.integers(0, len(records), batch)
    idx[0], idx[1] = 0, len(records) - 1  # first and last record (shard edges)
    oh, ow = CROP_OUT if crop else (H, W)
    boxes = random_boxes(rng, batch, H, W) if crop else None
    if crop:
        boxes[0] = (0, 0, H, W)  # the whole image, resized
        boxes[1] = (3, 2, oh, ow - 10)  # same height: vertical identity
        boxes[2] = (H - 1, W - 1, 1, 1)  # one pixel
    flips = (rng.random(batch) < 0.5) if flip else None
    if flip:
        flips[:2] = True
    norm = {} if dtype == np.uint8 else {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
    want = oracle.gather(records, idx, (oh, ow), boxes, flips, dtype, layout, **norm)
    for target in TARGETS:
        _core.set_kernel_target(target)
        out = out_buffer(batch, oh, ow, dtype, layout)
        res = kernels.gather(_shard(records, shards), idx, out, layout=layout, crop=boxes, flip=flips, **norm)
        assert res is out
        np.testing.assert_array_equal(bits(out), bits(want), err_msg=target)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_large_float32_batches_use_streaming_stores_exactly(layout):
    # Outputs of 32 MiB or more take the non-temporal store path; an output whose first
    # element is not vector-aligned takes the ordinary stores. Both equal the reference.
    rng = np.random.default_rng(5)
    records = _records(7, n=40, h=100, w=100)
    batch = 300  # 300 x 100 x 100 x 3 float32 = 36 MB
    idx = rng.integers(0, len(records), batch)
    norm = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
    want = oracle.gather(records, idx, (100, 100), dtype=np.float32, layout=layout, **norm)
    shape = want.shape
    for target in TARGETS:
        _core.set_kernel_target(target)
        out = aligned_out_buffer(batch, 100, 100, np.float32, layout)
        kernels.gather(records, idx, out, layout=layout, **norm)
        np.testing.assert_array_equal(bits(out), bits(want), err_msg=target)
        raw = np.empty(out.nbytes + 64, np.uint8)
        start = -raw.ctypes.data % 64 + 4  # 4 bytes past a 64-byte boundary
        shifted = raw[start : start + out.nbytes].view(np.float32).reshape(shape)
        kernels.gather(records, idx, shifted, layout=layout, **norm)
        np.testing.assert_array_equal(bits(shifted), bits(want), err_msg=target)


def test_uint8_and_float_outputs_agree_exactly():
    # The float output is the normalization of exactly the uint8 output (resize before norm).
    rng = np.random.default_rng(2)
    records = _records(3, n=6, h=40, w=50)
    idx = rng.integers(0, 6, 16)
    boxes = random_boxes(rng, 16, 40, 50)
    flips = rng.random(16) < 0.5
    u8 = kernels.gather(records, idx, np.empty((16, 24, 24, 3), np.uint8), crop=boxes, flip=flips)
    for dtype in (np.float32, BF16):
        out = kernels.gather(
            records, idx, np.empty((16, 24, 24, 3), dtype), crop=boxes, flip=flips, mean=IMAGENET_MEAN, std=IMAGENET_STD
        )
        table = kernels.normalize_table(IMAGENET_MEAN, IMAGENET_STD, dtype)
        np.testing.assert_array_equal(bits(out), bits(table[np.arange(3), u8]))


def test_default_mean_std_is_x_over_255():
    records = _records(4, n=3)
    out = kernels.gather(records, [2, 0], np.empty((2, H, W, 3), np.float32))
    np.testing.assert_array_equal(out, (records[[2, 0]] / 255.0).astype(np.float32))


def test_crop_of_output_size_is_an_exact_crop_and_flip_mirrors():
    records = _records(5, n=4, h=30, w=40)
    boxes = np.array([[4, 7, 20, 25], [0, 0, 20, 25], [10, 15, 20, 25]])
    out = kernels.gather(records, [1, 2, 3], np.empty((3, 20, 25, 3), np.uint8), crop=boxes, flip=[False, True, False])
    np.testing.assert_array_equal(out[0], records[1, 4:24, 7:32])
    np.testing.assert_array_equal(out[1], records[2, 0:20, 0:25, :][:, ::-1])
    np.testing.assert_array_equal(out[2], records[3, 10:30, 15:40])


def test_flip_without_resize_all_small_widths():
    rng = np.random.default_rng(13)
    for w in range(1, 19):
        records = rng.integers(0, 256, (2, 3, w, 3), dtype=np.uint8)
        for target in TARGETS:
            _core.set_kernel_target(target)
            out = kernels.gather(records, [1, 0], np.empty((2, 3, w, 3), np.uint8), flip=[True, False])
            np.testing.assert_array_equal(out[0], records[1, :, ::-1], err_msg=f"{target} w={w}")
            np.testing.assert_array_equal(out[1], records[0], err_msg=f"{target} w={w}")


def test_resize_of_constant_image_is_constant():
    img = np.full((1, 50, 60, 3), (17, 128, 255), np.uint8)
    out = kernels.gather(img, [0], np.empty((1, 33, 97, 3), np.uint8), crop=[[3, 5, 41, 52]], flip=[True])
    assert (out == np.array([17, 128, 255], np.uint8)).all()


def test_random_resized_crop_sized_batch_every_target():
    # The shape the benchmark serves: 176 px sources, RRC-like boxes, 160 px output, many
    # samples (runs over the thread pool).
    rng = np.random.default_rng(6)
    records = rng.integers(0, 256, (20, 176, 176, 3), dtype=np.uint8)
    batch = 24
    idx = rng.integers(0, 20, batch)
    area = rng.uniform(0.08, 1.0, batch) * 176 * 176
    ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3), batch))
    bw = np.clip(np.round(np.sqrt(area * ratio)), 1, 176).astype(np.int64)
    bh = np.clip(np.round(np.sqrt(area / ratio)), 1, 176).astype(np.int64)
    boxes = np.stack([rng.integers(0, 176 - bh + 1), rng.integers(0, 176 - bw + 1), bh, bw], 1)
    flips = rng.random(batch) < 0.5
    for dtype, layout in [(np.float32, "NHWC"), (BF16, "NCHW"), (np.uint8, "NCHW")]:
        norm = {} if dtype == np.uint8 else {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
        want = oracle.gather(records, idx, (160, 160), boxes, flips, dtype, layout, **norm)
        for target in TARGETS:
            _core.set_kernel_target(target)
            out = out_buffer(batch, 160, 160, dtype, layout)
            kernels.gather(records, idx, out, layout=layout, crop=boxes, flip=flips, **norm)
            np.testing.assert_array_equal(bits(out), bits(want), err_msg=f"{target} {layout}")


@pytest.mark.parametrize(
    "src_hw, out_hw, boxes",
    [
        # Wide boxes: some SIMD resamplers' windows overflow (AVX-512 > 1.27x, AVX2 > ~4x
        # downscale) and those samples take the scalar loop; the others stay vectorized.
        (
            (40, 300),
            (37, 41),
            [(0, 0, 40, 300), (5, 10, 30, 50), (0, 200, 40, 100), (3, 1, 20, 200), (0, 299, 40, 1), (39, 0, 1, 60)],
        ),
        # Rows shorter than one 16-byte window.
        ((9, 4), (11, 13), [(0, 0, 9, 4), (2, 1, 5, 3), (8, 3, 1, 1), (0, 0, 9, 4), (1, 0, 3, 4), (0, 2, 9, 2)]),
        # Output widths around the vector sizes.
        (
            (30, 70),
            (5, 16),
            [(0, 0, 30, 70), (1, 2, 20, 16), (0, 50, 5, 20), (3, 3, 3, 3), (0, 0, 30, 17), (10, 60, 10, 10)],
        ),
        (
            (30, 70),
            (5, 47),
            [(0, 0, 30, 70), (1, 2, 20, 47), (0, 50, 5, 20), (3, 3, 3, 3), (0, 0, 30, 48), (10, 60, 10, 10)],
        ),
        # A full-aspect record shrunk whole and by boxes (the general path's vertical pass takes
        # rows in pairs: odd and even tap counts; rows of 3 * width bytes not a multiple of 32).
        (
            (192, 256),
            (112, 112),
            [
                (0, 0, 192, 256),
                (7, 9, 120, 120),
                (0, 100, 150, 156),
                (5, 3, 64, 64),
                (150, 0, 40, 256),
                (0, 0, 192, 250),
            ],
        ),
    ],
)
def test_resize_shapes_and_ratios_every_target(src_hw, out_hw, boxes):
    rng = np.random.default_rng(12)
    records = rng.integers(0, 256, (3, *src_hw, 3), dtype=np.uint8)
    boxes = np.array(boxes)
    batch = len(boxes)
    idx = rng.integers(0, 3, batch)
    for flips in (np.zeros(batch, bool), np.ones(batch, bool)):
        for dtype, layout in [(np.uint8, "NHWC"), (np.float32, "NCHW"), (np.float32, "NHWC"), (BF16, "NHWC")]:
            norm = {} if dtype == np.uint8 else {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
            want = oracle.gather(records, idx, out_hw, boxes, flips, dtype, layout, **norm)
            for target in TARGETS:
                _core.set_kernel_target(target)
                out = out_buffer(batch, *out_hw, dtype, layout)
                kernels.gather(records, idx, out, layout=layout, crop=boxes, flip=flips, **norm)
                np.testing.assert_array_equal(bits(out), bits(want), err_msg=f"{target} {layout} {dtype}")


def test_float32_batches_past_the_caches_take_non_temporal_stores_and_match():
    # A batch of 32 MiB or more in 64-byte-aligned memory is written with non-temporal stores
    # (kernel.cpp's kStreamMinBytes), on AVX-512 as each resized row is made: 120 x 160 x 160
    # x 3 float32 (35 MiB). Its first samples must equal the oracle.
    rng = np.random.default_rng(21)
    records = rng.integers(0, 256, (6, 176, 200, 3), dtype=np.uint8)
    batch = 120
    idx = rng.integers(0, 6, batch)
    boxes = random_boxes(rng, batch, 176, 200)
    boxes[:4] = [(0, 0, 176, 200), (10, 20, 90, 70), (5, 5, 160, 160), (3, 30, 170, 120)]
    flips = rng.random(batch) < 0.5
    norm = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
    want = oracle.gather(records, idx[:4], (160, 160), boxes[:4], flips[:4], np.float32, "NHWC", **norm)
    for target in TARGETS:
        _core.set_kernel_target(target)
        out = aligned_out_buffer(batch, 160, 160, np.float32, "NHWC")
        kernels.gather(records, idx, out, crop=boxes, flip=flips, **norm)
        np.testing.assert_array_equal(bits(out[:4]), bits(want), err_msg=target)
        # The next 20 as a batch too small to stream (6 MiB): the same bits.
        small = kernels.gather(
            records, idx[4:24], np.empty((20, 160, 160, 3), np.float32), crop=boxes[4:24], flip=flips[4:24], **norm
        )
        np.testing.assert_array_equal(bits(out[4:24]), bits(small), err_msg=target)


def test_small_batches_split_into_row_bands_match():
    rng = np.random.default_rng(8)
    records = _records(9, n=5, h=64, w=48)
    boxes = random_boxes(rng, 5, 64, 48)
    full = kernels.gather(
        records,
        np.arange(5),
        np.empty((5, 3, 61, 47), np.float32),
        layout="NCHW",
        crop=boxes,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )
    for b in range(5):  # batch of 1: the rows are spread over the pool
        one = kernels.gather(
            records,
            [b],
            np.empty((1, 3, 61, 47), np.float32),
            layout="NCHW",
            crop=boxes[b : b + 1],
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
        )
        np.testing.assert_array_equal(one[0], full[b])


def test_empty_batch_and_prebuilt_source():
    records = _records()
    src = kernels.raw_source([records[:4], records[4:]])
    assert (src.num_records, src.height, src.width, src.num_shards) == (12, H, W, 2)
    out = np.empty((0, H, W, 3), np.float32)
    assert kernels.gather(src, np.zeros(0, np.int64), out) is out
    out = kernels.gather(src, [11, 3], np.empty((2, H, W, 3), np.uint8))
    np.testing.assert_array_equal(out, records[[11, 3]])


def test_read_only_memmap_like_source():
    records = _records()
    records.flags.writeable = False
    out = kernels.gather(records, [1], np.empty((1, H, W, 3), np.uint8))
    np.testing.assert_array_equal(out[0], records[1])


# ---------------------------------------------------------------------------------------------
# SIMD dispatch: forced scalar (TBLJAX_SIMD in a fresh process) == dispatched, bit for bit
# ---------------------------------------------------------------------------------------------

_CASES_SCRIPT = textwrap.dedent("""
    import numpy as np, ml_dtypes
    from tbljax import kernels
    BF16 = np.dtype(ml_dtypes.bfloat16)
    def run():
        rng = np.random.default_rng(1234)
        records = rng.integers(0, 256, (30, 67, 53, 3), dtype=np.uint8)
        res = {}
        for k, (dtype, layout, crop, flip) in enumerate(
                [(d, l, c, f) for d in (np.uint8, np.float32, BF16) for l in ("NHWC", "NCHW")
                 for c in (False, True) for f in (False, True)]):
            idx = rng.integers(0, 30, 33)
            oh, ow = (45, 71) if crop else (67, 53)
            boxes = None
            if crop:
                bh = rng.integers(1, 68, 33); bw = rng.integers(1, 54, 33)
                boxes = np.stack([rng.integers(0, 68 - bh), rng.integers(0, 54 - bw), bh, bw], 1)
            flips = rng.random(33) < 0.5 if flip else None
            norm = {} if dtype == np.uint8 else dict(mean=(0.485, 0.456, 0.406),
                                                      std=(0.229, 0.224, 0.225))
            shape = (33, oh, ow, 3) if layout == "NHWC" else (33, 3, oh, ow)
            out = kernels.gather([records[:11], records[11:]], idx, np.empty(shape, dtype),
                                 layout=layout, crop=boxes, flip=flips, **norm)
            res[f"case{k}"] = out.view(np.uint8)
        return res
""")


def test_forced_scalar_process_matches_dispatched(tmp_path):
    path = tmp_path / "scalar.npz"
    script = _CASES_SCRIPT + textwrap.dedent(f"""
        from tbljax import _core
        assert _core.kernel_target() == "scalar", _core.kernel_target()
        assert _core.native_info()["simd"] == "scalar"
        np.savez({str(path)!r}, **run())
    """)
    env = dict(os.environ, TBLJAX_SIMD="scalar")
    subprocess.run([sys.executable, "-c", script], env=env, check=True)
    forced = np.load(path)
    ns: dict = {}
    exec(_CASES_SCRIPT, ns)
    for target in TARGETS:
        _core.set_kernel_target(target)
        here = ns["run"]()
        assert set(here) == set(forced.files)
        for k, v in here.items():
            np.testing.assert_array_equal(v, forced[k], err_msg=f"{target} {k}")


def test_target_reporting_and_env_errors():
    assert _core.kernel_target() in TARGETS
    assert kernels.kernel_target() == _core.kernel_target()
    assert _core.native_info()["simd"] == _core.kernel_target()
    assert TARGETS[0] == "scalar"
    assert _core.set_kernel_target("scalar") == "scalar"
    with pytest.raises(ValueError, match="not one of"):
        _core.set_kernel_target("sse9")
    code = "from tbljax import _core; _core.kernel_target()"
    env = dict(os.environ, TBLJAX_SIMD="bogus")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "TBLJAX_SIMD='bogus'" in r.stderr


# ---------------------------------------------------------------------------------------------
# Errors: a clear exception naming the value and the allowed range, never a crash
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def small():
    return _records(n=5)


def test_error_negative_index(small):
    with pytest.raises(IndexError, match=r"indices\[1\] = -1 is out of range.*allowed 0\.\.4"):
        kernels.gather(small, [0, -1], np.empty((2, H, W, 3), np.uint8))


def test_error_index_too_large(small):
    with pytest.raises(IndexError, match=r"indices\[0\] = 5 .*5 records \(allowed 0\.\.4\)"):
        kernels.gather([small[:2], small[2:]], [5], np.empty((1, H, W, 3), np.uint8))


def test_error_out_untouched_on_error(small):
    out = out_buffer(2, H, W, np.float32, "NHWC")
    before = out.copy()
    with pytest.raises(IndexError):
        kernels.gather(small, [0, 99], out)
    np.testing.assert_array_equal(bits(out), bits(before))


@pytest.mark.parametrize(
    "shape, layout, match",
    [
        ((2, H, W, 4), "NHWC", r"shape \(B, OH, OW, 3\)"),
        ((2, H, W, 3), "NCHW", r"shape \(B, 3, OH, OW\)"),
        ((2, H, W), "NHWC", r"shape \(B, OH, OW, 3\)"),
        ((3, H, W, 3), "NHWC", "batch size 3 but indices has 2"),
        ((2, H + 1, W, 3), "NHWC", "without crop boxes the output size must equal the source size"),
    ],
)
def test_error_out_shape(small, shape, layout, match):
    with pytest.raises(ValueError, match=match):
        kernels.gather(small, [0, 1], np.empty(shape, np.float32), layout=layout)


def test_error_out_dtype_and_layout(small):
    with pytest.raises(TypeError, match="out.dtype must be uint8, float32 or bfloat16, got float64"):
        kernels.gather(small, [0], np.empty((1, H, W, 3), np.float64))
    with pytest.raises(TypeError, match="out must be a numpy.ndarray"):
        kernels.gather(small, [0], [[0]])
    with pytest.raises(ValueError, match="layout must be one of"):
        kernels.gather(small, [0], np.empty((1, H, W, 3), np.uint8), layout="HWC")


def test_error_out_not_contiguous_or_read_only(small):
    big = np.empty((1, H, 2 * W, 3), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.gather(small, [0], big[:, :, ::2])
    ro = np.empty((1, H, W, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernels.gather(small, [0], ro)


def test_native_binding_never_converts(small):
    # Straight to _core: a float64 or strided out must be refused, not copied and dropped.
    src = _core.RawSource([small])
    idx = np.array([0], np.int64)
    args = ("NHWC", "float32", [0, 0, 0], [1, 1, 1], None, None)
    with pytest.raises(TypeError):
        _core.gather(src, idx, np.empty((1, H, W, 3), np.float64), *args)
    with pytest.raises(TypeError):
        _core.gather(src, idx, np.empty((1, H, 2 * W, 3), np.float32)[:, :, ::2], *args)
    with pytest.raises(TypeError):
        _core.gather(src, idx.astype(np.int32), np.empty((1, H, W, 3), np.float32), *args)
    with pytest.raises(TypeError, match="out_dtype='bfloat16'"):
        _core.gather(src, idx, np.empty((1, H, W, 3), np.float32), "NHWC", "bfloat16", [0, 0, 0], [1, 1, 1], None, None)
    out = np.empty((2, H, W, 3), np.uint8)
    for flips in (np.array([True, False]), np.array([3, 0], np.uint8)):  # bool or uint8
        _core.gather(src, np.array([1, 2], np.int64), out, "NHWC", "uint8", [0, 0, 0], [1, 1, 1], None, flips)
        np.testing.assert_array_equal(out, [small[1, :, ::-1], small[2]])
    with pytest.raises(TypeError, match="flip must be a uint8 or bool array"):
        _core.gather(
            src,
            np.array([1, 2], np.int64),
            out,
            "NHWC",
            "uint8",
            [0, 0, 0],
            [1, 1, 1],
            None,
            np.array([1, 0], np.int32),
        )
    with pytest.raises(ValueError, match="layout='NWHC'"):
        _core.gather(src, idx, np.empty((1, H, W, 3), np.float32), "NWHC", "float32", [0, 0, 0], [1, 1, 1], None, None)


@pytest.mark.parametrize(
    "mean, std, exc, match",
    [
        ((0.5, 0.5), None, ValueError, "mean must have 3 values"),
        (None, (1, 1, 1, 1), ValueError, "std must have 3 values"),
        (0.5, None, TypeError, "mean must be a sequence of 3 numbers"),
        (None, (1, 0, 1), ValueError, r"std\[1\] = 0.0 must be a finite number > 0"),
        (None, (1, -2, 1), ValueError, r"std\[1\] = -2.0 must be a finite number > 0"),
        ((0, float("nan"), 0), None, ValueError, r"mean\[1\] = nan must be a finite number"),
    ],
)
def test_error_mean_std(small, mean, std, exc, match):
    with pytest.raises(exc, match=match):
        kernels.gather(small, [0], np.empty((1, H, W, 3), np.float32), mean=mean, std=std)


def test_error_uint8_with_mean(small):
    with pytest.raises(ValueError, match="uint8 output is not normalized"):
        kernels.gather(small, [0], np.empty((1, H, W, 3), np.uint8), mean=IMAGENET_MEAN)


@pytest.mark.parametrize(
    "box, what",
    [
        ((-1, 0, 5, 5), "y0=-1"),
        ((0, -2, 5, 5), "x0=-2"),
        ((0, 0, 0, 5), "h=0"),
        ((0, 0, 5, 0), "w=0"),
        ((20, 0, 4, 5), "y0=20, x0=0, h=4, w=5"),
        ((0, 25, 5, 5), "x0=25"),
    ],
)
def test_error_crop_box(small, box, what):
    boxes = np.array([(0, 0, H, W), box])
    with pytest.raises(ValueError, match=rf"crop\[1\] = \(.*{what}.*inside the {H}x{W} image"):
        kernels.gather(small, [0, 1], np.empty((2, 8, 8, 3), np.uint8), crop=boxes)


def test_error_crop_and_flip_shapes(small):
    out = np.empty((2, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=r"crop must have shape \(2, 4\)"):
        kernels.gather(small, [0, 1], out, crop=[[0, 0, 5, 5]])
    with pytest.raises(TypeError, match="crop must hold integers"):
        kernels.gather(small, [0, 1], out, crop=np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="fit in int32"):
        kernels.gather(small, [0, 1], out, crop=np.full((2, 4), 2**40))
    with pytest.raises(ValueError, match=r"flip must have shape \(2,\)"):
        kernels.gather(small, [0, 1], np.empty((2, H, W, 3), np.uint8), flip=[True])


def test_error_indices_and_source(small):
    out = np.empty((1, H, W, 3), np.uint8)
    with pytest.raises(TypeError, match="indices must be integers"):
        kernels.gather(small, [0.5], out)
    with pytest.raises(ValueError, match="indices must be 1-D"):
        kernels.gather(small, [[0]], out)
    with pytest.raises(TypeError, match="must hold uint8 RGB pixels, got dtype float32"):
        kernels.gather(small.astype(np.float32), [0], out)
    with pytest.raises(ValueError, match=r"must have shape \(N, H, W, 3\), got \(5, 23, 29\)"):
        kernels.gather(small[..., 0].copy(), [0], out)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.gather(small[:, :, ::2], [0], out)
    with pytest.raises(ValueError, match="all shards must match"):
        kernels.gather([small, np.ascontiguousarray(small[:, :5])], [0], out)
    with pytest.raises(ValueError, match="empty list"):
        kernels.gather([], [0], out)
    with pytest.raises(TypeError):
        _core.RawSource([small.astype(np.float32)])
    with pytest.raises(ValueError, match="all shards must match"):
        _core.RawSource([small, np.ascontiguousarray(small[:, :5])])


def test_normalize_table_errors():
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        kernels.normalize_table(IMAGENET_MEAN, IMAGENET_STD, np.float64)
    with pytest.raises(ValueError, match="std must have 3 values"):
        kernels.normalize_table(IMAGENET_MEAN, (1, 1))

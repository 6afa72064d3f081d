"""The kernel's per-image op stages (issue 47): the pixel program and erasing, against
`pixel_ops.py` (the exact NumPy contract, itself tested against timm's PIL ops in
test_randaug.py) applied to the kernel's own output without ops, on every SIMD target; and the
host loaders end to end against the NumPy reference pipeline (tests/oracle.py + pixel_ops)."""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from conftest import shared_dir
from PIL import Image

import tbljax
from tbljax import _core
from tbljax._src.engine import kernels, pixel_program
from tbljax._src.rules import erasing, pixel_filters, pixel_ops, randaug

import oracle

# RandAugment's ops (codes 1-17; Cutout apart), then the other policies' (19-26) with their argument ranges.
OPS = [n for n, c in pixel_ops.CODES.items() if 0 < c < pixel_ops.CODES["Cutout"]]
MORE_OPS = {
    "Grayscale": lambda m: 0,
    "GaussianBlur": lambda m: pixel_ops.f32_arg(abs(m) / 4),  # radius 0..2.5 (DeiT's 0.1..2)
    "TvRotate": lambda m: pixel_ops.f32_arg(m * 13.5),  # degrees, TrivialAugmentWide's +-135
    "TvShearX": lambda m: pixel_ops.f32_arg(m * 0.099),
    "TvShearY": lambda m: pixel_ops.f32_arg(m * 0.099),
    "TvTranslateX": lambda m: int(m * 3.2),  # whole pixels
    "TvTranslateY": lambda m: int(m * 3.2),
    "Hue": lambda m: int(m * 12.8) & 0xFF,  # the shift mod 256 (ColorJitter's hue +-0.5)
}
MAGNITUDES = (0.0, 1.0, 4.5, 9.0, 10.0, -3.0, -9.0)  # negative: the op's sign drawn negative
MEAN, STD = tbljax.IMAGENET_MEAN, tbljax.IMAGENET_STD


def _photos(n, size=(48, 64)):
    """n kodak photos, resized, plus synthetic edge images (flat, two-valued, a ramp, noise)."""
    paths = sorted((shared_dir("kodak") / "images").glob("*.jpg"))[::40][:n]
    h, w = size
    imgs = [np.asarray(Image.open(p).convert("RGB").resize((w, h))) for p in paths]
    rng = np.random.default_rng(0)
    flat = np.full((h, w, 3), 77, np.uint8)
    two = np.where(rng.random((h, w, 1)) < 0.5, 3, 250).astype(np.uint8).repeat(3, axis=2)
    ramp = np.broadcast_to(np.linspace(0, 255, w).astype(np.uint8)[None, :, None], (h, w, 3)).copy()
    noise = rng.integers(0, 256, (h, w, 3), np.uint8)
    return np.stack(imgs + [flat, two, ramp, noise])


def _setup(out_hw=(40, 44)):
    src = _photos(4)
    n = len(src)
    idx = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(1)
    h, w = src.shape[1:3]
    crop = np.array([(int(rng.integers(0, 8)), int(rng.integers(0, 8)), h - 8, w - 8) for _ in range(n)], np.int32)
    crop[-1] = (0, 0, h, w)
    flip = np.arange(n) % 2 == 1
    base = np.zeros((n, *out_hw, 3), np.uint8)
    kernels.gather(src, idx, base, crop=crop, flip=flip)
    return src, idx, crop, flip, base


def _op(name, mag, ra):
    if name in MORE_OPS:
        return pixel_ops.CODES[name], MORE_OPS[name](mag)
    if name == "Cutout":
        return pixel_ops.CODES["Cutout"], (int(abs(mag) * 4) << 24) | (1234 << 12) | 3000
    return randaug.op_arg(ra, name, abs(mag), mag < 0)


@pytest.mark.parametrize("interp", pixel_ops.INTERPOLATIONS)
def test_every_op_equals_pixel_ops_on_the_kernels_own_output(interp):
    src, idx, crop, flip, base = _setup()
    ra = randaug.RandAugment(num_ops=1, interpolation=interp, fill=(10, 200, 30))
    for name in OPS + ["Cutout", *MORE_OPS]:
        for mag in MAGNITUDES:
            code, arg = _op(name, mag, ra)
            codes = np.full((len(idx), 1), code, np.uint8)
            args = np.full((len(idx), 1), arg, np.int32)
            out = np.zeros_like(base)
            kernels.gather(
                src,
                idx,
                out,
                crop=crop,
                flip=flip,
                ops=kernels.pixel_program(codes, args, base.shape[1:3], policies=(ra,)),
            )
            want = np.stack([pixel_ops.apply(im, code, arg, fill=ra.fill, interpolation=interp) for im in base])
            np.testing.assert_array_equal(out, want, err_msg=f"{name} {mag}")


def _program_batch(rng, n, k, ra):
    """Random pixel programs of k slots (some empty) over n rows, as `decide` would give."""
    names = OPS + list(MORE_OPS)
    codes = np.zeros((n, k), np.uint8)
    args = np.zeros((n, k), np.int32)
    for b in range(n):
        for j in range(k):
            if rng.random() < 0.85:
                codes[b, j], args[b, j] = _op(names[rng.integers(len(names))], float(rng.uniform(-10, 10)), ra)
    return codes, args


@pytest.mark.parametrize("dtype,layout", [(np.float32, "NHWC"), (ml_dtypes.bfloat16, "NCHW")])
@pytest.mark.parametrize("mode", erasing.ERASE_MODES)
def test_programs_then_erasing_equal_the_reference(dtype, layout, mode):
    src, idx, crop, flip, base = _setup()
    rng = np.random.default_rng(3)
    ra = randaug.RandAugment(num_ops=3)
    codes, args = _program_batch(rng, len(idx), 3, ra)
    er = tbljax.RandomErasing(p=0.8, mode=mode, max_count=3)
    boxes, keys = erasing.decide_erasing(er, idx + 5, height=40, width=44, seed=2, epoch=1)
    assert (boxes[:, :, 2] > 0).any()
    out = np.zeros((len(idx), 3, 40, 44) if layout == "NCHW" else (len(idx), 40, 44, 3), dtype)
    kernels.gather(
        src,
        idx,
        out,
        crop=crop,
        flip=flip,
        mean=MEAN,
        std=STD,
        layout=layout,
        ops=kernels.pixel_program(
            codes, args, (40, 44), policies=(ra,), erase_boxes=boxes, erase_keys=keys, erase_mode=mode
        ),
    )
    pix = np.stack([pixel_ops.apply_all(im, c, a) for im, c, a in zip(base, codes, args)])
    norm = oracle.normalize(pix, MEAN, STD, np.float32).transpose(0, 3, 1, 2)  # CHW float32
    want = np.stack([pixel_ops.erase(v, bx, k, mode) for v, bx, k in zip(norm, boxes, keys)])
    erased = want != norm
    if np.dtype(dtype) == np.float32:
        want = want.transpose(0, 2, 3, 1) if layout == "NHWC" else want
    else:  # values not erased: the contract's table (one rounding from float64); erased: float32 -> bf16
        table = oracle.normalize(pix, MEAN, STD, dtype).transpose(0, 3, 1, 2)
        want = np.where(erased, want.astype(dtype), table)
    np.testing.assert_array_equal(
        out.view(np.uint16 if out.itemsize == 2 else np.uint32),
        np.ascontiguousarray(want).view(out.view(np.uint16 if out.itemsize == 2 else np.uint32).dtype),
    )


@pytest.mark.parametrize("mode", erasing.ERASE_MODES)
def test_erasing_alone_equals_the_reference_on_every_target(mode):
    """Erasing with no ops in every dtype and layout, on every SIMD target: boxes narrower than a
    vector, with ragged tails, wider than the kernel's chunk of 256 values, overlapping (the later
    box wins) and none, against pixel_ops.erase on the normalized pixels: every bit."""
    rng = np.random.default_rng(53)
    img = rng.integers(0, 256, (3, 5, 300, 3), np.uint8)
    none = [0, 0, 0, 0]
    boxes = np.array(
        [[[0, 0, 5, 300], [1, 3, 2, 5], none], [[1, 20, 3, 263], [2, 30, 3, 17], [0, 7, 1, 1]], [none] * 3], np.int32
    )
    keys = np.array([1, 0xDEADBEEF, 7], np.uint32)
    erased = np.zeros((3, 3, 5, 300), bool)
    for b, e in np.argwhere(boxes[:, :, 2] > 0):
        y0, x0, h, w = boxes[b, e]
        erased[b, :, y0 : y0 + h, x0 : x0 + w] = True
    norm = oracle.normalize(img, MEAN, STD, np.float32).transpose(0, 3, 1, 2)  # CHW float32
    noise = np.stack([pixel_ops.erase(v, bx, k, mode) for v, bx, k in zip(norm, boxes, keys)])
    ops = kernels.pixel_program(
        np.zeros((3, 0), np.uint8),
        np.zeros((3, 0), np.int32),
        (5, 300),
        erase_boxes=boxes,
        erase_keys=keys,
        erase_mode=mode,
    )
    for dtype in (np.float32, ml_dtypes.bfloat16):
        table = oracle.normalize(img, MEAN, STD, dtype).transpose(0, 3, 1, 2)
        want = np.where(erased, noise.astype(dtype), table)  # erased: float32 -> bf16 once
        for layout in ("NHWC", "NCHW"):
            laid = np.ascontiguousarray(want.transpose(0, 2, 3, 1) if layout == "NHWC" else want)
            try:
                for target in _core.supported_kernel_targets():
                    _core.set_kernel_target(target)
                    out = np.zeros_like(laid)
                    kernels.gather(img, np.arange(3), out, mean=MEAN, std=STD, layout=layout, ops=ops)
                    bits = np.uint16 if out.itemsize == 2 else np.uint32
                    np.testing.assert_array_equal(out.view(bits), laid.view(bits), err_msg=f"{target} {layout} {dtype}")
            finally:
                _core.set_kernel_target("auto")


_TARGET_SCRIPT = """
import sys, numpy as np
sys.path[:0] = {paths!r}
import test_kernel_ops as t
from tbljax._src.engine import kernels
np.save({out!r}, t._every_stage_batch())
print(kernels.kernel_target())
"""


def _every_stage_batch():
    """One float32 batch through every op (slots of two fills) and every erase mode's
    boxes, from real photos and edge images."""
    src, idx, crop, flip, _ = _setup()
    rng = np.random.default_rng(9)
    pols = (randaug.RandAugment(num_ops=2), randaug.RandAugment(num_ops=2, fill=(0, 0, 0), interpolation="nearest"))
    codes, args = _program_batch(rng, len(idx), 4, pols[0])
    boxes, keys = erasing.decide_erasing(
        tbljax.RandomErasing(p=1.0, max_count=2), idx, height=40, width=44, seed=0, epoch=0
    )
    out = np.zeros((len(idx), 40, 44, 3), np.float32)
    kernels.gather(
        src,
        idx,
        out,
        crop=crop,
        flip=flip,
        mean=MEAN,
        std=STD,
        ops=kernels.pixel_program(codes, args, (40, 44), policies=pols, erase_boxes=boxes, erase_keys=keys),
    )
    return out


def test_every_simd_target_gives_the_same_bytes(tmp_path):
    here = _every_stage_batch()
    paths = [os.path.dirname(__file__)]  # tbljax itself: the one this run imports (PYTHONPATH or installed)
    seen = set()
    for target in ("scalar", "avx2", "avx512"):
        out = tmp_path / f"{target}.npy"
        r = subprocess.run(
            [sys.executable, "-c", _TARGET_SCRIPT.format(paths=paths, out=str(out))],
            env=dict(os.environ, TBLJAX_SIMD=target),
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        seen.add(r.stdout.strip())
        np.testing.assert_array_equal(np.load(out).view(np.uint32), here.view(np.uint32), err_msg=target)
    assert "scalar" in seen


def test_rows_without_ops_are_todays_bytes():
    src, idx, crop, flip, base = _setup()
    plain = np.zeros((len(idx), 40, 44, 3), np.float32)
    kernels.gather(src, idx, plain, crop=crop, flip=flip, mean=MEAN, std=STD)
    codes = np.zeros((len(idx), 2), np.uint8)
    codes[0, 1] = pixel_ops.CODES["Invert"]
    with_ops = np.zeros_like(plain)
    kernels.gather(
        src,
        idx,
        with_ops,
        crop=crop,
        flip=flip,
        mean=MEAN,
        std=STD,
        ops=kernels.pixel_program(codes, np.zeros_like(codes, np.int32), (40, 44)),
    )
    np.testing.assert_array_equal(with_ops[1:].view(np.uint32), plain[1:].view(np.uint32))
    np.testing.assert_array_equal(with_ops[0], oracle.normalize(255 - base[:1], MEAN, STD)[0])


def test_bad_ops_are_refused_by_name():
    src, idx, crop, flip, base = _setup()
    codes = np.full((len(idx), 1), pixel_ops.CODES["Posterize"], np.uint8)
    with pytest.raises(ValueError, match="row 0, slot 0: argument 9 out of range"):
        kernels.gather(
            src,
            idx,
            base.copy(),
            crop=crop,
            ops=kernels.pixel_program(codes, np.full(codes.shape, 9, np.int32), (40, 44)),
        )
    codes[:] = pixel_ops.CODES["GaussianBlur"]
    with pytest.raises(ValueError, match="row 0, slot 0: GaussianBlur radius -1.0+ is not in"):
        kernels.gather(
            src,
            idx,
            base.copy(),
            crop=crop,
            ops=kernels.pixel_program(codes, np.full(codes.shape, pixel_ops.f32_arg(-1.0), np.int32), (40, 44)),
        )
    boxes = np.zeros((len(idx), 1, 4), np.int32)
    boxes[2, 0] = (30, 0, 20, 5)
    prog = kernels.pixel_program(
        np.zeros((len(idx), 0), np.uint8),
        np.zeros((len(idx), 0), np.int32),
        (40, 44),
        erase_boxes=boxes,
        erase_keys=np.zeros(len(idx), np.uint32),
    )
    with pytest.raises(ValueError, match="uint8 output with erasing is not supported"):
        kernels.gather(src, idx, base.copy(), crop=crop, ops=prog)
    with pytest.raises(ValueError, match=r"row 2, box 0 \(30, 0, 20, 5\) does not lie inside"):
        kernels.gather(src, idx, np.zeros(base.shape, np.float32), crop=crop, ops=prog)


# ---- the loaders end to end ----

_RECIPE = dict(ops=[tbljax.RandAugment.from_timm("rand-m9-mstd0.5-inc1")], erasing=tbljax.RandomErasing(p=0.5))


@pytest.fixture(scope="module")
def kodak_files(tmp_path_factory):
    """Ten kodak photos at full aspect, shorter side 40, as RAW and as compact JPEG records."""
    photos = sorted((shared_dir("kodak") / "images").glob("*.jpg"))[::31][:10]
    d = tmp_path_factory.mktemp("kops")
    out = {}
    for fmt in ("raw", "jpeg"):
        out[fmt] = d / f"{fmt}.tbl"
        tbljax.convert(
            photos,
            out[fmt],
            image_size=40,
            resize="shorter_side",
            format=fmt,
            progress=False,
            **(dict(quality=90) if fmt == "jpeg" else {}),
        )
    return out


def _program(img, codes, args, policies):
    """pixel_ops.apply of a row's slots in order, each with its policy's fill, interpolation and
    translation constants (the policy's own attributes, as its peer applies them)."""
    slots = [p for p in policies for _ in range(p.num_ops if isinstance(p, randaug.RandAugment) else p.num_slots)]
    keys = ("fill", "interpolation", "translate_const", "translate_pct")
    for code, arg, p in zip(codes.tolist(), args.tolist(), slots, strict=True):
        if code:
            img = pixel_ops.apply(img, code, arg, **{k: getattr(p, k) for k in keys if hasattr(p, k)})
    return img


def _reference(ds, opts, hb, epoch=0):
    """The NumPy pipeline: the oracle's crop-resize and flip of the decided boxes, pixel_ops'
    program, the oracle's normalize, pixel_ops' erasing."""
    aug = opts.augment
    idx = hb.index.astype(np.int64)
    geo = tbljax.augment.RecordGeometry(*np.array([ds.read(i).shape[:2] for i in range(len(ds))]).T)
    boxes, flips = tbljax.augment.sample(aug, idx, geometry=geo, seed=opts.seed, epoch=epoch)
    oh, ow = aug.size
    codes, args = randaug.decide(aug.ops, idx, seed=opts.seed, epoch=epoch)
    rows = []
    for b, i in enumerate(idx):
        img = oracle.crop_resize(ds.read(int(i)), boxes[b], oh, ow)
        img = img[:, ::-1] if flips[b] else img
        rows.append(_program(np.ascontiguousarray(img), codes[b], args[b], aug.ops))
    pix = np.stack(rows)
    if opts.out_dtype == np.uint8:
        return pix
    norm = oracle.normalize(pix, MEAN, STD, np.float32)
    eb, keys = erasing.decide_erasing(aug.erasing, idx, height=oh, width=ow, seed=opts.seed, epoch=epoch)
    erased = np.stack(
        [
            pixel_ops.erase(v.transpose(2, 0, 1), x, k, aug.erasing.mode).transpose(1, 2, 0)
            for v, x, k in zip(norm, eb, keys)
        ]
    )
    if opts.out_dtype == np.float32:
        return erased
    return np.where(
        erased != norm, erased.astype(ml_dtypes.bfloat16), oracle.normalize(pix, MEAN, STD, ml_dtypes.bfloat16)
    )


@pytest.mark.parametrize("fmt", ["raw", "jpeg"])
@pytest.mark.parametrize("dtype", ["uint8", "float32", "bfloat16"])
def test_loader_batch_is_the_numpy_pipeline(kodak_files, fmt, dtype):
    ds = tbljax.open(kodak_files[fmt])
    recipe = _RECIPE if dtype != "uint8" else dict(ops=_RECIPE["ops"])
    opts = tbljax.LoaderOptions(batch_size=10, seed=3, dtype=dtype, augment=tbljax.Augment(size=(24, 28), **recipe))
    hb = next(iter(tbljax.HostLoader(ds, opts)))
    want = _reference(ds, opts, hb)
    got = hb.image
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


POLICIES = {
    "TrivialAugment": [tbljax.TrivialAugment()],
    "ColorJitter": [tbljax.ColorJitter(0.4, 0.4, 0.4)],
    "ColorJitter hue": [tbljax.ColorJitter(0.4, 0.4, 0.4, hue=0.1)],
    "ThreeAugment": [tbljax.ThreeAugment(), tbljax.ColorJitter(0.3, 0.3, 0.3)],  # DeiT III's recipe
    "Grayscale": [tbljax.Grayscale(p=0.5)],
    "Solarize": [tbljax.Solarize(p=0.5)],
    "GaussianBlur": [tbljax.GaussianBlur(p=0.7)],
    "RandAugment nearest": [tbljax.RandAugment.from_big_vision("randaug(2,15)")],
}


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_in_the_loader_is_the_numpy_pipeline(kodak_files, name):
    """Each policy served by the host loader (JPEG records, float32, erasing): the oracle's crop
    with the decided ops applied by pixel_ops, normalized and erased -- and the ops did act."""
    ds = tbljax.open(kodak_files["jpeg"])
    aug = tbljax.Augment(size=(24, 28), ops=POLICIES[name], erasing=tbljax.RandomErasing(p=0.5))
    opts = tbljax.LoaderOptions(batch_size=10, seed=5, dtype="float32", augment=aug)
    hb = next(iter(tbljax.HostLoader(ds, opts)))
    codes, _ = randaug.decide(aug.ops, hb.index.astype(np.int64), seed=5, epoch=0)
    assert (codes != 0).any(axis=1).sum() >= 3  # most rows got an op
    np.testing.assert_array_equal(hb.image.view(np.uint32), _reference(ds, opts, hb).view(np.uint32))


def test_same_batches_across_threads_torch_and_mlx(kodak_files):
    ds = tbljax.open(kodak_files["jpeg"])
    kw = dict(batch_size=5, seed=1, num_epochs=1, augment=tbljax.Augment(size=(24, 24), **_RECIPE))
    first = np.stack([np.array(hb.image) for hb in tbljax.HostLoader(ds, tbljax.LoaderOptions(**kw))])
    assert len(first) == 2
    for threads in (1, 3):
        again = [np.array(hb.image) for hb in tbljax.HostLoader(ds, tbljax.LoaderOptions(threads=threads, **kw))]
        np.testing.assert_array_equal(np.stack(again), first)
    del kw["num_epochs"]  # the adapters serve one epoch per pass
    pytest.importorskip("torch")
    t = [np.asarray(b[0]) for b in tbljax.torch.loader(kodak_files["jpeg"], layout="NHWC", **kw)]
    np.testing.assert_array_equal(np.stack(t), first)
    pytest.importorskip("mlx.core")
    m = [np.array(b[0]) for b in tbljax.mlx.loader(kodak_files["jpeg"], **kw)]
    np.testing.assert_array_equal(np.stack(m), first)


def test_loader_without_ops_serves_todays_boxes_flips_and_bytes(kodak_files):
    ds = tbljax.open(kodak_files["raw"])
    plain = tbljax.LoaderOptions(batch_size=10, seed=4, augment=tbljax.Augment(size=(24, 24)))
    ops = tbljax.LoaderOptions(
        batch_size=10, seed=4, augment=tbljax.Augment(size=(24, 24), ops=[tbljax.RandAugment(prob=0.0)])
    )
    a, b = next(iter(tbljax.HostLoader(ds, plain))), next(iter(tbljax.HostLoader(ds, ops)))
    np.testing.assert_array_equal(a.index, b.index)
    np.testing.assert_array_equal(a.image.view(np.uint32), b.image.view(np.uint32))
    geo = tbljax.augment.RecordGeometry(*np.array([ds.read(i).shape[:2] for i in range(len(ds))]).T)
    boxes, flips = tbljax.augment.sample(plain.augment, a.index.astype(np.int64), geometry=geo, seed=4, epoch=0)
    want = oracle.normalize(
        np.stack(
            [
                (lambda im: im[:, ::-1] if f else im)(oracle.crop_resize(ds.read(int(i)), x, 24, 24))
                for i, x, f in zip(a.index, boxes, flips)
            ]
        ),
        MEAN,
        STD,
    )
    np.testing.assert_array_equal(a.image, want)


def test_paths_not_covered_refuse_by_name(kodak_files):
    ds = tbljax.open(kodak_files["raw"])
    aug = tbljax.Augment(size=(24, 24), **_RECIPE)
    with pytest.raises(ValueError, match="needs dtype='float32' or 'bfloat16', not uint8"):
        tbljax.HostLoader(ds, tbljax.LoaderOptions(batch_size=2, dtype="uint8", augment=aug))
    jax = pytest.importorskip("jax")
    res = tbljax.ResidentDataset(kodak_files["raw"]) if hasattr(tbljax, "ResidentDataset") else None
    if res is None:
        pytest.skip("no ResidentDataset")
    with pytest.raises(ValueError, match="needs dtype='float32' or 'bfloat16', not uint8"):
        res.batch(jax.numpy.int32(0), batch_size=2, dtype="uint8", augment=aug)


@pytest.mark.parametrize("interp", pixel_ops.INTERPOLATIONS)
def test_affine_ops_equal_pixel_ops_over_many_matrices(interp):
    """The affine stage's vectorized coordinates (issue 47's Fast) against pixel_ops over 60
    random signed magnitudes per op: every byte, fill and clamped edges included."""
    src, idx, crop, flip, base = _setup()
    rng = np.random.default_rng(47)
    ra = randaug.RandAugment(num_ops=1, fill=(10, 200, 30), interpolation=interp)
    names = [n for n, c in pixel_ops.CODES.items() if c in pixel_ops.AFFINE]
    rows = [(name, float(m)) for name in names for m in rng.uniform(-10, 10, 60)]
    ops = np.array([_op(name, m, ra) for name, m in rows], np.int64)
    pick = np.arange(len(rows)) % len(idx)
    out = np.zeros((len(rows), *base.shape[1:]), np.uint8)
    kernels.gather(
        src,
        idx[pick],
        out,
        crop=crop[pick],
        flip=flip[pick],
        ops=kernels.pixel_program(
            ops[:, :1].astype(np.uint8), ops[:, 1:].astype(np.int32), base.shape[1:3], policies=(ra,)
        ),
    )
    want = np.stack(
        [pixel_ops.apply(base[p], c, a, fill=ra.fill, interpolation=interp) for p, (c, a) in zip(pick, ops)]
    )
    np.testing.assert_array_equal(out, want)


def _random_matrices(rng, n, h, w):
    """Affine matrices of every kind Pillow's nearest sweep tells apart: pure scales and
    translations (b = d = 0), general maps within its 16.16 range, and maps whose corners leave
    +-32768 (its float64 row sums), with fractions that land exactly on pixel edges."""
    out = []
    for i in range(n):
        a, e = rng.uniform(-2, 2, 2)
        b, d = (0.0, 0.0) if i % 3 == 0 else rng.uniform(-1.5, 1.5, 2)
        if i % 3 == 2:  # one steep axis: row or column 0 inside, the far corners past 32768
            b, d = (rng.choice([-1, 1]) * 1300.0, d) if i % 2 else (b, rng.choice([-1, 1]) * 1300.0)
        # the centre mapped near the centre, so most maps sample the image
        c = w / 2 - (a * w / 2 + b * h / 2) + rng.uniform(-w / 4, w / 4)
        f = h / 2 - (d * w / 2 + e * h / 2) + rng.uniform(-h / 4, h / 4)
        if i % 3 == 2:
            c, f = (rng.uniform(0, w) - b / 2, f) if i % 2 else (c, rng.uniform(0, h) - d / 2)
        if i % 5 == 0:  # dyadic values: coordinates exactly on pixel edges
            a, b, c, d, e, f = (round(v * 8) / 8 for v in (a, b, c, d, e, f))
        out.append((a, b, c, d, e, f))
    return np.array(out, np.float64)


def test_nearest_equals_pixel_filters_over_random_matrices():
    """Nearest resampling (Pillow's sweep, all three of its cases) against pixel_filters over
    300 random matrices, every byte and the fill."""
    src, idx, crop, flip, base = _setup()
    rng = np.random.default_rng(48)
    n, fill = 300, (10, 200, 30)
    pick = np.arange(n) % len(idx)
    mats = _random_matrices(rng, n, *base.shape[1:3])
    ra = randaug.RandAugment(num_ops=1, fill=fill, interpolation="nearest")
    codes = np.full((n, 1), pixel_ops.CODES["Rotate"], np.uint8)
    prog = list(kernels.pixel_program(codes, np.zeros((n, 1), np.int32), base.shape[1:3], policies=(ra,)))
    prog[2] = np.ascontiguousarray(mats[:, None])  # the matrices column: any map, not only timm's
    out = np.zeros((n, *base.shape[1:]), np.uint8)
    kernels.gather(src, idx[pick], out, crop=crop[pick], flip=flip[pick], ops=pixel_program.PixelProgram(prog))
    want = np.stack([pixel_filters.affine_transform(base[p], m, "nearest", fill) for p, m in zip(pick, mats)])
    np.testing.assert_array_equal(out, want)


def test_hue_equals_pixel_ops_on_many_colours():
    """The kernel's Hue (ColorJitter's hue) on 2**16 random colours at shifts of both signs:
    pixel_ops' rule (itself Pillow's HSV round trip on every colour, test_image_ops)."""
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (4, 128, 128, 3), np.uint8)
    crop = np.tile(np.array([[0, 0, 128, 128]], np.int32), (4, 1))
    code = pixel_ops.CODES["Hue"]
    for shift in (1, 26, 128, 201, 255):
        out = np.zeros_like(img)
        program = kernels.pixel_program(np.full((4, 1), code, np.uint8), np.full((4, 1), shift, np.int32), (128, 128))
        kernels.gather(img, np.arange(4), out, crop=crop, ops=program)
        want = np.stack([pixel_ops.apply(im, code, shift) for im in img])
        np.testing.assert_array_equal(out, want, err_msg=f"shift {shift}")


def test_hue_equals_pillows_hsv_round_trip_on_every_colour():
    """The kernel's Hue on all 2**24 colours against Pillow itself (convert("HSV"), the hue
    byte shifted, convert("RGB")), as torchvision's adjust_hue does it: exact."""
    allc = np.arange(1 << 24, dtype=np.uint32)
    img = np.stack([(allc >> 16) & 255, (allc >> 8) & 255, allc & 255], -1).astype(np.uint8).reshape(16, 1024, 1024, 3)
    crop = np.tile(np.array([[0, 0, 1024, 1024]], np.int32), (16, 1))
    code = pixel_ops.CODES["Hue"]
    for shift in (37, 219):
        out = np.zeros_like(img)
        program = kernels.pixel_program(
            np.full((16, 1), code, np.uint8), np.full((16, 1), shift, np.int32), (1024, 1024)
        )
        kernels.gather(img, np.arange(16), out, crop=crop, ops=program)
        h, s, v = Image.fromarray(img.reshape(4096, 4096, 3)).convert("HSV").split()
        h = Image.fromarray((np.asarray(h).astype(np.uint16) + shift).astype(np.uint8), "L")
        want = np.asarray(Image.merge("HSV", (h, s, v)).convert("RGB")).reshape(img.shape)
        np.testing.assert_array_equal(out, want, err_msg=f"shift {shift}")


def _each_target():
    """Sets each SIMD target this CPU runs in turn and yields its name; avx512 twice where the
    CPU has AVX-512 VBMI, the second time with VBMI off (its code without VBMI: the same bytes)."""
    try:
        for target in _core.supported_kernel_targets():
            _core.set_kernel_target(target)
            yield target
            if target == "avx512":
                _core.set_vbmi_allowed(False)
                yield "avx512 without VBMI"
                _core.set_vbmi_allowed(True)
    finally:
        _core.set_vbmi_allowed(True)
        _core.set_kernel_target("auto")


def _gather_on_every_target(want, src, pick, crop, flip=None, ops=None):
    """``kernels.gather(src, pick, ...)`` at every SIMD target this CPU runs: each equal to
    `want`, every byte (the target named in a failure)."""
    for target in _each_target():
        out = np.zeros_like(want)
        kernels.gather(src, pick, out, crop=crop, flip=flip, ops=ops)
        np.testing.assert_array_equal(out, want, err_msg=target)


def _one_op_rows_on_every_target(img, rows):
    """Rows (image index, op code, argument) of whole images `img` (N, h, w, 3), one op each,
    through the kernel on every SIMD target against pixel_ops.apply: every byte."""
    h, w = img.shape[1:3]
    pick = np.array([p for p, _, _ in rows])
    crop = np.tile(np.array([[0, 0, h, w]], np.int32), (len(rows), 1))
    want = np.stack([pixel_ops.apply(img[p], c, a) for p, c, a in rows])
    prog = kernels.pixel_program(
        np.array([[c] for _, c, _ in rows], np.uint8), np.array([[a] for _, _, a in rows], np.int32), (h, w)
    )
    _gather_on_every_target(want, img, pick, crop, ops=prog)


@pytest.mark.parametrize("out_hw", [(21, 30), (8, 9)])
def test_the_last_op_hands_its_rows_to_the_normalize_on_every_target(out_hw):
    """The program's last op hands its rows on to the normalize and write as it makes them:
    every op last, alone (slot 0, slot 1 empty) and after Rotate (which trades the buffers), at
    an odd height and a short one, float32 NHWC out, against the reference's pixels normalized,
    on every SIMD target: every bit."""
    src, idx, crop, flip, base = _setup(out_hw)
    ra = randaug.RandAugment(num_ops=2, fill=(10, 200, 30))
    names = OPS + ["Cutout", *MORE_OPS]
    rotate = _op("Rotate", 5.0, ra)
    codes = np.zeros((2 * len(names), 2), np.uint8)
    args = np.zeros((2 * len(names), 2), np.int32)
    for i, name in enumerate(names):
        codes[2 * i, 0], args[2 * i, 0] = _op(name, 7.0, ra)
        codes[2 * i + 1], args[2 * i + 1] = (rotate[0], codes[2 * i, 0]), (rotate[1], args[2 * i, 0])
    pick = np.arange(len(codes)) % len(idx)
    pix = np.stack([pixel_ops.apply_all(base[p], c, a, fill=ra.fill) for p, c, a in zip(pick, codes, args)])
    want = oracle.normalize(pix, MEAN, STD, np.float32)
    prog = kernels.pixel_program(codes, args, out_hw, policies=(ra,))
    for target in _each_target():
        out = np.zeros_like(want)
        kernels.gather(src, idx[pick], out, crop=crop[pick], flip=flip[pick], mean=MEAN, std=STD, ops=prog)
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32), err_msg=target)


@pytest.mark.parametrize("out_hw", [(23, 37), (9, 2), (1, 3)])
def test_bilinear_equals_pixel_filters_over_random_matrices_on_every_target(out_hw):
    """Bilinear resampling (the SIMD sampler: float64 lanes, paired gathers, edge and end-of-image
    taps, row tails) against pixel_filters over 90 random matrices, on every SIMD target; widths
    that fill no whole vector included."""
    src, idx, crop, flip, base = _setup(out_hw)
    rng = np.random.default_rng(49)
    n, fill = 90, (10, 200, 30)
    pick = np.arange(n) % len(idx)
    mats = _random_matrices(rng, n, *out_hw)
    ra = randaug.RandAugment(num_ops=1, fill=fill)
    codes = np.full((n, 1), pixel_ops.CODES["Rotate"], np.uint8)
    prog = list(kernels.pixel_program(codes, np.zeros((n, 1), np.int32), out_hw, policies=(ra,)))
    prog[2] = np.ascontiguousarray(mats[:, None])  # any map, not only timm's
    want = np.stack([pixel_filters.affine_transform(base[p], m, "bilinear", fill) for p, m in zip(pick, mats)])
    _gather_on_every_target(want, src, idx[pick], crop[pick], flip[pick], pixel_program.PixelProgram(prog))


@pytest.mark.parametrize("interp", pixel_ops.INTERPOLATIONS)
@pytest.mark.parametrize("out_hw", [(23, 37), (31, 70), (5, 9)])
def test_row_affine_ops_equal_pixel_ops_on_every_target(interp, out_hw):
    """ShearX and TranslateX/Y (one y per output row: rows of fill, contiguous pair loads, steps
    wholly outside) against pixel_ops over 40 random signed magnitudes each plus whole-pixel
    and zero shifts, at odd sizes, on every SIMD target: every byte."""
    src, idx, crop, flip, base = _setup(out_hw)
    rng = np.random.default_rng(50)
    ra = randaug.RandAugment(num_ops=1, fill=(10, 200, 30), interpolation=interp)
    names = ("ShearX", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel")
    mags = [*rng.uniform(-10, 10, 40), 0.0, 0.1, -0.3, 10.0, -10.0]
    ops = np.array([_op(name, float(m), ra) for name in names for m in mags], np.int64)
    pick = np.arange(len(ops)) % len(idx)
    want = np.stack(
        [pixel_ops.apply(base[p], c, a, fill=ra.fill, interpolation=interp) for p, (c, a) in zip(pick, ops)]
    )
    prog = kernels.pixel_program(
        ops[:, :1].astype(np.uint8), ops[:, 1:].astype(np.int32), base.shape[1:3], policies=(ra,)
    )
    _gather_on_every_target(want, src, idx[pick], crop[pick], flip[pick], prog)


def _row_matrices(rng, h, w):
    """(1, b, c, 0, e, f) maps (one y per output row, x stepping by one): whole-pixel shifts (the
    taps' fractions all 0), half ones (fx or fy 0 alone; c = 0.5 puts x coordinates on powers of
    2), random shifts, shears and both, rows and runs of pixels outside, shifts past the image
    (the edges of the inside found by bisection), and c = 1 - 2**-50, whose
    x + 0.5 + c rounds up past an integer from a few pixels on (the taps of a run step by 2 once:
    float64 rounding, not the map)."""
    mats = [(1.0, 0.0, 0.0, 0.0, 1.0, 0.0), (1.0, 0.0, 1 - 2.0**-50, 0.0, 1.0, 0.0)]
    for c, f in [
        (3.0, -2.0),
        (-1.0, 0.25),
        (0.5, 1.0),
        (0.37, -0.61),
        (w * 0.6, 0.0),
        (-w * 0.3, h * 0.4),
        (5.0 * w, 0.0),
        (-5.0 * w, 0.0),
    ]:
        mats.append((1.0, 0.0, c, 0.0, 1.0, f))
    for i in range(24):  # shears (c = 0), shifts (b = 0) and both: the sampler tells them apart
        b, c = rng.uniform(-0.4, 0.4) * (i % 3 != 1), rng.uniform(-w / 3, w / 3) * (i % 3 != 0)
        e, f = rng.choice([1.0, rng.uniform(0.5, 1.5)]), rng.choice([0.0, rng.uniform(-h / 3, h / 3)])
        mats.append((1.0, b, c, 0.0, e, f))
    return np.array(mats, np.float64)


def _row_cases(mats, h, w):
    """Which of the one-y-per-row sampler's cases the maps reach (pixel_filters' coordinates):
    fill, taps clamped at an edge, and runs of contiguous taps with fractions (fx all 0, fy 0)
    of each kind, and a run whose taps step by 2."""
    cases = set()
    for a, b, c, d, e, f in mats:
        x, y = np.arange(w) + 0.5, np.arange(h)[:, None] + 0.5
        xin, yin = a * x + b * y + c, np.broadcast_to(d * x + e * y + f, (h, w))
        inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
        xs, ys = xin - 0.5, yin - 0.5
        xt, fx, fy = np.floor(xs), xs - np.floor(xs), (ys - np.floor(ys))[:, 0]
        run = inside & (xt >= 0) & (xt <= w - 2)
        cases |= {"fill"} if (~inside).any() else set()
        cases |= {"edge"} if (inside & ~run).any() else set()
        for r in np.flatnonzero(run.any(1)):
            cases.add(("fy 0" if fy[r] == 0 else "fy") + (", fx 0" if (fx[r] == 0).all() else ", fx"))
        steps = np.diff(xt, axis=1)[run[:, 1:] & run[:, :-1]]
        cases |= {"step 2"} if (steps == 2).any() else set()
    return cases


@pytest.mark.parametrize("out_hw", [(7, 300), (9, 37), (4, 1), (3, 2), (5, 3)])
def test_row_bilinear_equals_pixel_filters_on_every_target(out_hw):
    """The one-y-per-row bilinear sampler (a == 1, d == 0: runs of contiguous taps blended
    value-major, a pixel with a clamped tap alone, fill) against pixel_filters over maps that
    reach each of its cases (checked here on the reference's coordinates), at widths over several
    chunks and vectors and of 1 to 3 pixels, on every SIMD target: every byte."""
    src, idx, crop, flip, base = _setup(out_hw)
    h, w = out_hw
    mats = _row_matrices(np.random.default_rng(53), h, w)
    if w >= 9:
        assert _row_cases(mats, h, w) == {"fill", "edge", "fy 0, fx 0", "fy 0, fx", "fy, fx 0", "fy, fx", "step 2"}
    n, fill = len(mats), (10, 200, 30)
    pick = np.arange(n) % len(idx)
    ra = randaug.RandAugment(num_ops=1, fill=fill)
    codes = np.full((n, 1), pixel_ops.CODES["ShearX"], np.uint8)
    prog = list(kernels.pixel_program(codes, np.zeros((n, 1), np.int32), out_hw, policies=(ra,)))
    prog[2] = np.ascontiguousarray(mats[:, None])  # any such map, not only timm's
    want = np.stack([pixel_filters.affine_transform(base[p], m, "bilinear", fill) for p, m in zip(pick, mats)])
    _gather_on_every_target(want, src, idx[pick], crop[pick], flip[pick], pixel_program.PixelProgram(prog))


def _column_cases(mats, h, w):
    """Which of the x-is-its-own-column sampler's cases the maps reach (pixel_filters'
    coordinates): fill, a tap clamped at an edge, and chunks of 128 columns whose runs of one
    row offset (yt - y) are long (fewer than one change per 8 columns: block copies) or short;
    for ShearY itself (e == 1, f == 0: a pixel's key and fy carried down its column), a column
    whose y coordinate passes a power of 2 between two rows of runs, and one outside above that
    comes inside."""
    cases = set()
    for _, _, _, d, e, f in mats:
        x, y = np.arange(w) + 0.5, np.arange(h)[:, None] + 0.5
        yin = d * x + e * y + f
        inside = (yin >= 0) & (yin < h)
        yt = np.floor(np.where(inside, yin, 0.5) - 0.5)
        run = inside & (yt >= 0) & (yt <= h - 2)
        cases |= {"fill"} if (~inside).any() else set()
        cases |= {"edge"} if (inside & ~run).any() else set()
        if e == 1 and f == 0:
            binade = np.floor(np.log2(np.maximum(yin, 1)))
            cases |= {"binade"} if (run[1:] & run[:-1] & (yin[:-1] >= 1) & (binade[1:] != binade[:-1])).any() else set()
            cases |= {"fill above"} if ((yin[:-1] < 0) & inside[1:]).any() else set()
        key = np.where(run, yt - np.arange(h)[:, None], np.where(inside, -1e9, -2e9))
        for x0 in range(0, w, 128):
            k = key[:, x0 : x0 + 128]
            changes = (k[:, 1:] != k[:, :-1]).sum(1)
            cases |= {"long runs"} if (run[:, x0 : x0 + 128].any(1) & (changes * 8 < k.shape[1])).any() else set()
            cases |= {"short runs"} if (run[:, x0 : x0 + 128].any(1) & (changes * 8 >= k.shape[1])).any() else set()
    return cases


@pytest.mark.parametrize("out_hw", [(224, 224), (7, 300), (300, 7), (1, 5), (5, 1), (3, 2)])
def test_sheary_equals_pixel_filters_on_every_target(out_hw):
    """ShearY's sampler (a == 1, b == c == 0: every pixel's taps in its own column, copied as
    runs or pixel by pixel, one blend with each pixel's fy; for ShearY itself coordinates carried
    down a column within a binade) against
    pixel_filters over shears of both signs from 1e-17 to 50 (fill visible) and maps with other
    e and f, on noise and a photo, at sizes over several chunks and of 1 to 3 pixels, on every
    SIMD target: every byte; the sampler's cases checked reached on the reference's coordinates."""
    h, w = out_hw
    rng = np.random.default_rng(54)
    img = np.stack([rng.integers(0, 256, (h, w, 3), np.uint8), _photos(1, (h, w))[0]])
    mags = [1e-17, 1e-9, 0.004, 0.05, 0.27, 0.3, 1.0, 3.0, 50.0]
    mats = [(1.0, 0.0, 0.0, s * m, 1.0, 0.0) for m in mags for s in (1, -1)]
    mats += [(1.0, 0.0, 0.0, 0.2, 0.7, 3.3), (1.0, 0.0, 0.0, -0.15, 1.3, -h * 0.3), (1.0, 0.0, 0.0, 0.01, 1.0, 0.5)]
    mats = np.array(mats, np.float64)
    if h >= 7 and w >= 7:  # 7 rows: too few for a shear's short runs inside
        want_cases = {"fill", "edge", "long runs", "short runs", "binade", "fill above"}
        want_cases -= {"short runs"} if h < 8 else set()
        assert _column_cases(mats, h, w) == want_cases
    n, fill = len(mats), (10, 200, 30)
    pick = np.arange(n) % len(img)
    crop = np.tile(np.array([[0, 0, h, w]], np.int32), (n, 1))
    ra = randaug.RandAugment(num_ops=1, fill=fill)
    codes = np.full((n, 1), pixel_ops.CODES["ShearY"], np.uint8)
    prog = list(kernels.pixel_program(codes, np.zeros((n, 1), np.int32), out_hw, policies=(ra,)))
    prog[2] = np.ascontiguousarray(mats[:, None])  # any such map, not only timm's
    want = np.stack([pixel_filters.affine_transform(img[p], m, "bilinear", fill) for p, m in zip(pick, mats)])
    _gather_on_every_target(want, img, pick, crop, ops=pixel_program.PixelProgram(prog))


@pytest.mark.parametrize("hw", [(3, 3), (2, 5), (7, 100), (33, 181), (4, 300), (3, 517)])
def test_sharpness_equals_pixel_ops_on_every_target(hw):
    """Sharpness (Pillow's SMOOTH, the rows in strips of up to 768 values, then the blend) on noise
    and photo crops at many factors of both signs, rows of one, two and three strips and the
    smallest images, on every SIMD target: pixel_ops' rule, every byte."""
    h, w = hw
    rng = np.random.default_rng(51)
    photo = _photos(1, (h, w))[0]
    img = np.stack([rng.integers(0, 256, (h, w, 3), np.uint8), photo, 255 - photo])
    ra = randaug.RandAugment(num_ops=1)
    ops = np.array([randaug.op_arg(ra, "Sharpness", float(m), bool(m < 0)) for m in (0.0, 1.0, 4.5, 9.0, 10.0)])
    rows = [(p, c, a) for p in range(len(img)) for c, a in ops] + [
        (0, ops[0][0], pixel_ops.f32_arg(s)) for s in (0.0, 1.0)
    ]
    _one_op_rows_on_every_target(img, rows)


@pytest.mark.parametrize("hw", [(1, 1), (7, 5), (33, 181)])
def test_lut_ops_equal_pixel_ops_on_every_target(hw):
    """Equalize and AutoContrast (histograms over an odd number of pixels, the LUT applied 48
    values a step plus a tail of whole pixels) on noise, a photo crop and a flat image, on every
    SIMD target: pixel_ops' rule, every byte."""
    h, w = hw
    rng = np.random.default_rng(52)
    photo = _photos(1, (h, w))[0]
    img = np.stack([rng.integers(0, 256, (h, w, 3), np.uint8), photo, np.full((h, w, 3), 9, np.uint8)])
    codes = [pixel_ops.CODES["Equalize"], pixel_ops.CODES["AutoContrast"]]
    _one_op_rows_on_every_target(img, [(p, c, 0) for p in range(len(img)) for c in codes])


@pytest.mark.parametrize("hw", [(1, 1), (7, 5), (33, 181)])
def test_luma_blends_equal_pixel_ops_on_every_target(hw):
    """Color and Contrast (each pixel's luma, 16 pixels a step on AVX-512, plus a tail; the
    luma sum) on noise, a photo crop and a flat image, at factors of both signs, 0 and large, on
    every SIMD target: pixel_ops' rule, every byte."""
    h, w = hw
    rng = np.random.default_rng(53)
    photo = _photos(1, (h, w))[0]
    img = np.stack([rng.integers(0, 256, (h, w, 3), np.uint8), photo, np.full((h, w, 3), 200, np.uint8)])
    codes = [pixel_ops.CODES["Color"], pixel_ops.CODES["Contrast"]]
    factors = (0.0, 0.1, 0.73, 1.9, 3.5, -0.6)
    rows = [(p, c, pixel_ops.f32_arg(f)) for p in range(len(img)) for c in codes for f in factors]
    _one_op_rows_on_every_target(img, rows)


def test_value_maps_equal_pixel_ops_on_every_target():
    """The ops that are one map of the value (Solarize at every threshold, SolarizeAdd, Brightness,
    a map of 256 bytes on AVX-512 VBMI, the rule per value elsewhere) on an image holding every
    byte value, 837 values (13 steps of 64 and a tail), on every SIMD target: pixel_ops' rule."""
    h, w = 9, 31
    img = (np.arange(h * w * 3) * 7 % 256).astype(np.uint8).reshape(1, h, w, 3)
    rows = [(pixel_ops.CODES["Solarize"], t) for t in range(257)]
    rows += [(pixel_ops.CODES["SolarizeAdd"], a) for a in (0, 1, 77, 127, 128, 200, 255)]
    rows += [(pixel_ops.CODES["Brightness"], pixel_ops.f32_arg(f)) for f in (0.0, 0.1, 0.73, 1.9, 3.5)]
    _one_op_rows_on_every_target(img, [(0, c, a) for c, a in rows])

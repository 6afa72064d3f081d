"""Compact JPEG records decoded inside the fused pass (tbljax.kernels.serve_jpeg, the loaders on
compact files): the crop-aware decode gives Pillow's whole-image pixels for every box class
(corners, whole image, one MCU, odd sizes; 4:2:0, 4:2:2, 4:4:4, grayscale, progressive), the
batch equals the NumPy oracle over Pillow's decode, a compact file serves exactly what its RAW
twin (`tbljax convert --format raw`) serves through the host loader, torch and MLX, damaged and
truncated records fail naming file and record, and the DCT-scaled option is taken only where
allowed.

The box-class tests are what proves the decoded window's margins (ffi/core/jpeg/decode.cpp,
StoredWindow: one MCU left, right and above the box): built with the window cut exactly at the
box, 15 of the box-class and oracle tests fail (chroma upsampling next to a cropped or skipped
edge differs from a whole decode)."""

from __future__ import annotations

import io
import shutil
import struct

import numpy as np
import pytest
from conftest import shared_dir
from PIL import Image

import tbljax
from tbljax import _core
from tbljax._src.engine import kernels

import oracle

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def textured(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Edges, gradients and noise: chroma that changes across every MCU border."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([(x * 7 + y * 3) % 256, (y * 11) % 256, ((x ^ y) * 13) % 256], -1)
    return np.clip(a + rng.integers(-40, 41, a.shape), 0, 255).astype(np.uint8)


def pil_decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def source_of(blobs: list[bytes], sizes_hw: list[tuple[int, int]]):
    """A JpegSource over the blobs packed one after another in one buffer."""
    buf = np.frombuffer(b"".join(blobs), np.uint8).copy()
    lens = np.array([len(b) for b in blobs], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]])
    hw = np.array(sizes_hw, np.int32).reshape(-1, 2)
    return kernels.jpeg_source([buf], [len(blobs)], offsets, lens, hw[:, 0], hw[:, 1])


def box_pixels(src, i: int, box) -> np.ndarray:
    """Serve the box at its own size: a resize to the same size is the pixels themselves."""
    out = np.empty((1, box[2], box[3], 3), np.uint8)
    kernels.serve_jpeg(src, [i], out, crop=[box])
    return out[0]


def box_classes(h: int, w: int, mcu: int, rng) -> list[tuple[int, int, int, int]]:
    boxes = [
        (0, 0, h, w),
        (0, 0, 1, 1),
        (h - 1, w - 1, 1, 1),
        (0, w - 1, 1, 1),
        (h - 1, 0, 1, 1),
        (mcu, mcu, mcu, mcu),
        (mcu - 1, mcu - 1, mcu + 2, mcu + 2),
        (mcu + 1, mcu + 1, 1, 1),
        (0, 0, mcu, mcu),
        (h - mcu, w - mcu, mcu, mcu),
        (h // 2, 0, 1, w),
        (0, w // 2, h, 1),
        (1, 1, h - 2, w - 2),
        (3, 5, 7, 9),
        (h - 7, w - 5, 7, 5),
    ]
    for _ in range(60):
        bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
    return boxes


@pytest.mark.parametrize("subsampling,mcu", [("420", 16), ("422", 16), ("444", 8)])
@pytest.mark.parametrize("hw", [(67, 93), (33, 257), (256, 171), (16, 16)])
def test_box_decode_is_the_whole_decode_for_every_box_class(subsampling, mcu, hw):
    h, w = hw
    blob = _core.encode_jpeg(textured(h, w), quality=90, subsampling=subsampling)
    whole = pil_decode(blob)  # Pillow: libjpeg-turbo, ISLOW, fancy upsampling, whole image
    src = source_of([blob], [hw])
    for y0, x0, bh, bw in box_classes(h, w, mcu, np.random.default_rng(h * w)):
        if y0 < 0 or x0 < 0 or y0 + bh > h or x0 + bw > w:
            continue
        np.testing.assert_array_equal(
            box_pixels(src, 0, (y0, x0, bh, bw)), whole[y0 : y0 + bh, x0 : x0 + bw], err_msg=str((y0, x0, bh, bw))
        )


@pytest.mark.parametrize("kind", ["gray", "progressive"])
def test_box_decode_of_grayscale_and_progressive_records(kind):
    h, w = 75, 130
    img = textured(h, w, seed=3)
    if kind == "gray":
        blob = _core.encode_jpeg(img[..., 1].copy(), quality=90)
    else:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90, progressive=True)
        blob = buf.getvalue()
    whole = pil_decode(blob)
    src = source_of([blob], [(h, w)])
    for y0, x0, bh, bw in box_classes(h, w, 16, np.random.default_rng(7))[:30]:
        np.testing.assert_array_equal(box_pixels(src, 0, (y0, x0, bh, bw)), whole[y0 : y0 + bh, x0 : x0 + bw])


def test_box_decode_of_real_photos_is_the_whole_decode(tmp_path):
    photos = sorted((shared_dir("kodak") / "images").glob("*.jpg"))[::13]
    photos += sorted(shared_dir("caltech101").rglob("*.jpg"))[::400]
    path = tmp_path / "c.tbl"
    tbljax.convert(photos, path, image_size=256, resize="max_side", format="jpeg", quality=90, progress=False)
    ds = tbljax.open(path)
    src = kernels.jpeg_source(*ds.jpeg_records())
    rng = np.random.default_rng(0)
    for i in range(len(ds)):
        info = ds.info(i)
        with open(info.file, "rb") as f:
            f.seek(info.offset)
            whole = pil_decode(f.read(info.size))
        h, w = whole.shape[:2]
        for y0, x0, bh, bw in box_classes(h, w, 16, rng)[:25]:
            np.testing.assert_array_equal(box_pixels(src, i, (y0, x0, bh, bw)), whole[y0 : y0 + bh, x0 : x0 + bw])


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, "bfloat16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_batch_is_the_numpy_oracle_over_pillows_decode(dtype, layout):
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    rng = np.random.default_rng(11)
    sizes = [(int(rng.integers(20, 200)), int(rng.integers(20, 200))) for _ in range(12)]
    blobs = [_core.encode_jpeg(textured(h, w, s), quality=90) for s, (h, w) in enumerate(sizes)]
    records = [pil_decode(b) for b in blobs]
    src = source_of(blobs, sizes)
    idx = rng.integers(0, len(blobs), 24)
    crop = []
    for i in idx:
        h, w = sizes[i]
        bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        crop.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
    crop = np.array(crop, np.int32)
    flip = rng.integers(0, 2, len(idx)).astype(bool)
    norm = {} if dtype == np.uint8 else dict(mean=MEAN, std=STD)
    shape = (len(idx), 40, 56, 3) if layout == "NHWC" else (len(idx), 3, 40, 56)
    out = np.empty(shape, dtype)
    kernels.serve_jpeg(src, idx, out, layout=layout, crop=crop, flip=flip, **norm)
    want = oracle.gather(records, idx, (40, 56), crop, flip, dtype, layout, **norm)
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


# ---- files: a compact file serves exactly what its RAW twin serves ----


def synthetic_photos(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [textured(int(rng.integers(60, 320)), int(rng.integers(60, 320)), seed + k) for k in range(n)]


@pytest.fixture(scope="module", params=["max_side", "center_crop"])
def twins(request, tmp_path_factory):
    """(compact file, its RAW twin) converted from synthetic photos: full-aspect (max_side)
    or square (center_crop)."""
    d = tmp_path_factory.mktemp("twins")
    compact, raw = d / "compact.tbl", d / "raw.tbl"
    tbljax.convert(
        synthetic_photos(37, 5),
        compact,
        image_size=96,
        resize=request.param,
        format="jpeg",
        quality=90,
        labels=list(range(37)),
        progress=False,
    )
    assert tbljax.open(compact).recipe["stored"] == "resized"
    tbljax.convert(compact, raw, format="raw", progress=False)
    assert tbljax.open(raw).record_format == "raw"
    return compact, raw


AUGMENTS = {"rrc": dict(size=(64, 48)), "center": dict(crop="center", flip=False, size=(72, 72), center_fraction=0.875)}


def host_batches(path, **kw):
    opts = tbljax.LoaderOptions(batch_size=8, num_epochs=1, drop_remainder=False, seed=3, **kw)
    return [(np.array(b.image).view(np.uint8), b.index.copy()) for b in tbljax.HostLoader(tbljax.open(path), opts)]


@pytest.mark.parametrize("augment", sorted(AUGMENTS))
@pytest.mark.parametrize("dtype", ["uint8", "float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_host_loader_serves_the_raw_twins_pixels(twins, augment, dtype, layout):
    compact, raw = twins
    kw = dict(dtype=dtype, layout=layout, augment=tbljax.Augment(**AUGMENTS[augment]))
    got, want = host_batches(compact, **kw), host_batches(raw, **kw)
    assert len(got) == len(want) == 5
    for (g, gi), (w, wi) in zip(got, want):
        np.testing.assert_array_equal(gi, wi)
        np.testing.assert_array_equal(g, w)


def test_square_compact_file_without_augment_serves_the_stored_pixels(tmp_path):
    imgs = synthetic_photos(9, 2)
    tbljax.convert(imgs, tmp_path / "c.tbl", image_size=48, format="jpeg", quality=90, progress=False)
    tbljax.convert(tmp_path / "c.tbl", tmp_path / "r.tbl", format="raw", progress=False)
    for (g, _), (w, _) in zip(
        host_batches(tmp_path / "c.tbl", dtype="uint8"), host_batches(tmp_path / "r.tbl", dtype="uint8")
    ):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8"])
def test_torch_serves_the_raw_twins_pixels(twins, dtype):
    torch = pytest.importorskip("torch")
    import tbljax.torch

    compact, raw = twins
    tdtype = getattr(torch, dtype)
    batches = []
    for path in (compact, raw):
        ld = tbljax.torch.loader(path, 8, seed=1, dtype=tdtype, augment=tbljax.Augment(size=(40, 40)))
        batches.append([(x.view(torch.uint8) if dtype != "uint8" else x).numpy() for x, _ in ld])
    assert len(batches[0]) == 4
    for g, w in zip(*batches):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_mlx_serves_the_raw_twins_pixels(twins, dtype):
    mx = pytest.importorskip("mlx.core")
    import tbljax.mlx

    compact, raw = twins
    batches = []
    for path in (compact, raw):
        ld = tbljax.mlx.loader(
            path, 8, seed=1, dtype=dtype, augment=tbljax.Augment(crop="center", flip=False, size=(40, 40))
        )
        batches.append([np.array(x) for x, _ in ld])
    assert len(batches[0]) == 4 and mx is not None
    for g, w in zip(*batches):
        np.testing.assert_array_equal(g, w)


def test_real_photos_compact_serves_the_raw_twins_pixels(tmp_path):
    photos = sorted((shared_dir("kodak") / "images").glob("*.jpg"))[::9]
    photos += sorted(shared_dir("caltech101").rglob("*.jpg"))[::300]
    tbljax.convert(
        photos, tmp_path / "c.tbl", image_size=256, resize="max_side", format="jpeg", quality=90, progress=False
    )
    tbljax.convert(tmp_path / "c.tbl", tmp_path / "r.tbl", format="raw", progress=False)
    for aug in AUGMENTS.values():
        kw = dict(dtype="float32", augment=tbljax.Augment(**aug))
        for (g, _), (w, _) in zip(host_batches(tmp_path / "c.tbl", **kw), host_batches(tmp_path / "r.tbl", **kw)):
            np.testing.assert_array_equal(g, w)


# ---- damaged records ----


def scan_start(jpeg: bytes) -> int:
    """Offset of the first byte of entropy-coded data (after the SOS segment)."""
    pos = 2
    while True:
        marker, length = jpeg[pos + 1], struct.unpack_from(">H", jpeg, pos + 2)[0]
        if marker == 0xDA:
            return pos + 2 + length
        pos += 2 + length


def sof_offset(jpeg: bytes) -> int:
    pos = 2
    while jpeg[pos + 1] not in (0xC0, 0xC1, 0xC2):
        pos += 2 + struct.unpack_from(">H", jpeg, pos + 2)[0]
    return pos


@pytest.fixture
def damaged(tmp_path):
    """A compact file whose record 3 is damaged by `damage(payload) -> bytes` (same length)."""
    src = tmp_path / "good.tbl"
    tbljax.convert(
        synthetic_photos(6, 9), src, image_size=64, resize="max_side", format="jpeg", quality=90, progress=False
    )

    def make(damage):
        path = tmp_path / "bad.tbl"
        shutil.copy(src, path)
        info = tbljax.open(src).info(3)
        with open(path, "r+b") as f:
            f.seek(info.offset)
            payload = f.read(info.size)
            new = damage(payload)
            assert len(new) == len(payload)
            f.seek(info.offset)
            f.write(new)
        return path

    return make


def serve_all(path, size=(32, 32)):
    opts = tbljax.LoaderOptions(
        batch_size=6,
        num_epochs=1,
        shuffle=False,
        augment=tbljax.Augment(crop="center", flip=False, size=size, center_fraction=1.0),
    )
    return [np.array(b.image) for b in tbljax.HostLoader(tbljax.open(path), opts)]


def test_truncated_record_fails_naming_file_and_record(damaged):
    def truncate(p):  # an EOI marker a third into the scan: the data ends before the image
        cut = scan_start(p) + (len(p) - scan_start(p)) // 3
        return p[:cut] + b"\xff\xd9" + b"\0" * (len(p) - cut - 2)

    path = damaged(truncate)
    with pytest.raises(tbljax.DecodeError, match=r"bad\.tbl: record 3: .*(truncated|corrupt)"):
        serve_all(path)


def test_record_that_is_not_a_jpeg_fails_naming_file_and_record(damaged):
    path = damaged(lambda p: b"\0" * len(p))
    with pytest.raises(tbljax.DecodeError, match=r"bad\.tbl: record 3: not a JPEG"):
        serve_all(path)


def test_record_of_another_size_than_its_index_fails(damaged):
    def grow(p):  # the SOF says one row more than the index
        o = sof_offset(p) + 5
        h = struct.unpack_from(">H", p, o)[0]
        return p[:o] + struct.pack(">H", h + 1) + p[o + 2 :]

    path = damaged(grow)
    with pytest.raises(tbljax.CorruptFileError, match=r"bad\.tbl: record 3: .*the index says"):
        serve_all(path)


def test_damaged_restart_segment_or_marker_fails_naming_file_and_record(damaged):
    # Compact records carry restart markers: the first RST0 ends the first segment.
    def first_marker(p):
        return p.index(b"\xff\xd0", scan_start(p))

    def zero_first_segment(p):
        return p[: scan_start(p)] + b"\0" * (first_marker(p) - scan_start(p)) + p[first_marker(p) :]

    def garble_first_marker(p):
        return p[: first_marker(p) + 1] + b"\xd3" + p[first_marker(p) + 2 :]

    with pytest.raises(tbljax.DecodeError, match=r"bad\.tbl: record 3: corrupt"):
        serve_all(damaged(zero_first_segment))
    with pytest.raises(tbljax.DecodeError, match=r"bad\.tbl: record 3: .*restart marker 1 is RST3"):
        serve_all(damaged(garble_first_marker))


def test_truncated_bytes_fail_when_the_box_reaches_them():
    h, w = 96, 80
    blob = _core.encode_jpeg(textured(h, w), quality=90)
    cut = blob[: scan_start(blob) + (len(blob) - scan_start(blob)) // 2]
    src = source_of([cut], [(h, w)])
    with pytest.raises(tbljax.DecodeError, match="truncated|corrupt"):
        box_pixels(src, 0, (0, 0, h, w))
    # The top rows lie before the cut: decoding stops after the box, so they are served, and
    # they are the whole decode's pixels.
    np.testing.assert_array_equal(box_pixels(src, 0, (0, 0, 8, w)), pil_decode(blob)[:8])


# ---- DCT-domain downscaling ----


def scaled_reference(blob: bytes, box, out_hw, k: int) -> np.ndarray:
    """Decode at 1/k (libjpeg's scaled IDCT), box rounded outwards to whole scaled pixels,
    then the exact resize."""
    img = np.asarray(_core.decode_jpeg(blob, k))
    y0, x0, bh, bw = box
    ys, xs = y0 // k, x0 // k
    ye, xe = min(img.shape[0], -(-(y0 + bh) // k)), min(img.shape[1], -(-(x0 + bw) // k))
    return oracle.crop_resize(img, (ys, xs, ye - ys, xe - xs), *out_hw)


@pytest.mark.parametrize(
    "box,out_hw,k",
    [
        ((0, 0, 240, 320), (30, 40), 4),  # 8x the output: 1/4 (1/8 would leave 1x, not 2x)
        ((8, 16, 200, 256), (24, 32), 4),
        ((3, 5, 130, 170), (30, 40), 2),  # 4.3x: 1/2
        ((0, 0, 240, 320), (12, 16), 8),  # 20x: 1/8
        ((0, 0, 100, 100), (60, 60), 1),  # under 4x: the exact path
        ((10, 10, 200, 60), (30, 30), 1),  # wide enough on one axis only: exact
    ],
)
def test_dct_scale_is_taken_only_where_the_scaled_box_still_covers_the_output_twice(box, out_hw, k):
    h, w = 240, 320
    blob = _core.encode_jpeg(textured(h, w, 4), quality=90)
    src = source_of([blob], [(h, w)])
    fast, exact = np.empty((2, 1, *out_hw, 3), np.uint8)
    kernels.serve_jpeg(src, [0], fast, crop=[box], dct_scale=True)
    kernels.serve_jpeg(src, [0], exact, crop=[box])
    np.testing.assert_array_equal(exact[0], oracle.crop_resize(pil_decode(blob), box, *out_hw))
    np.testing.assert_array_equal(fast[0], scaled_reference(blob, box, out_hw, k))
    if k > 1:
        mse = np.mean((fast.astype(float) - exact.astype(float)) ** 2)
        assert 10 * np.log10(255**2 / mse) > 25  # close, but not the same pixels


def test_loader_option_jpeg_dct_scale(twins):
    compact, raw = twins
    kw = dict(dtype="uint8", augment=tbljax.Augment(crop="center", flip=False, size=(8, 8)))
    fast = host_batches(compact, jpeg_dct_scale=True, **kw)
    exact = host_batches(compact, **kw)
    assert any(not np.array_equal(f, e) for (f, _), (e, _) in zip(fast, exact))
    with pytest.raises(ValueError, match="jpeg_dct_scale must be True or False"):
        tbljax.LoaderOptions(batch_size=2, jpeg_dct_scale=1)


def test_shard_files_read_as_one_serve_their_raw_twins(tmp_path):
    parts = [synthetic_photos(9, 20), synthetic_photos(7, 30)]
    compact, raw = [], []
    for k, imgs in enumerate(parts):
        compact.append(tmp_path / f"c{k}.tbl")
        raw.append(tmp_path / f"r{k}.tbl")
        tbljax.convert(imgs, compact[k], image_size=80, resize="max_side", format="jpeg", quality=90, progress=False)
        tbljax.convert(compact[k], raw[k], format="raw", progress=False)
    kw = dict(dtype="float32", augment=tbljax.Augment(size=(48, 48)))
    got, want = host_batches(compact, **kw), host_batches(raw, **kw)
    assert len(got) == 2
    for (g, _), (w, _) in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda s, o: kernels.serve_jpeg(object(), [0], o), TypeError, "jpeg_source"),
        (lambda s, o: kernels.serve_jpeg(s, [0], o, crop=[(10, 0, 60, 8)]), ValueError, "box"),
        (lambda s, o: kernels.serve_jpeg(s, [1], o, crop=[(0, 0, 8, 8)]), IndexError, "1"),
        (lambda s, o: kernels.serve_jpeg(s, [0], o), ValueError, "size"),
        (
            lambda s, o: kernels.serve_jpeg(s, [0], o, crop=[(0, 0, 8, 8)], dct_scale=1),
            TypeError,
            "dct_scale must be True or False",
        ),
        (lambda s, o: kernels.serve_jpeg(s, [0], o, crop=[(0, 0, 8, 8)], threads=-1), ValueError, "threads must be"),
        (
            lambda s, o: kernels.jpeg_source([np.zeros(10, np.uint8)], [1], [4], [20], [8], [8]),
            tbljax.CorruptFileError,
            "does not lie inside its shard",
        ),
    ],
)
def test_bad_arguments_are_clear_errors(call, exc, match):
    src = source_of([_core.encode_jpeg(textured(64, 48), quality=90)], [(64, 48)])
    out = np.zeros((1, 8, 8, 3), np.uint8)
    with pytest.raises(exc, match=match):
        call(src, out)
    assert not out.any()  # nothing written before the checks passed

"""Hostile arguments: every public function given wrong types, shapes, ranges, empty and
damaged files, and files replaced or truncated while open. Each must answer with a clear
exception naming what is wrong, never a crash, a hang or a silently wrong result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types

import numpy as np
import pytest

import tbljax
from tbljax import _core, order
from tbljax._src.engine import kernels
from tbljax._src.file.format import Writer

from _loader_testing import images, write_tbl

N, H, W = 5, 6, 5


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    """Files to be hostile with: a good RAW file, an empty one, a JPEG-record one, a non-TBL
    file, a directory, and what they hold."""
    d = tmp_path_factory.mktemp("hostile")
    imgs = images(N, H, W)
    write_tbl(d / "raw.tbl", imgs, np.arange(N))
    with Writer(d / "empty.tbl", 0):
        pass
    with Writer(d / "jpeg.tbl", 2) as w:
        for k in range(2):
            w.add_encoded(_core.encode_jpeg(np.full((8, 8, 3), 40 * k, np.uint8)), "JPEG", 8, 8)
        w.set_metadata(labels=[0, 1], recipe={"image_size": 8, "resize": "squash"})
    (d / "notes.txt").write_bytes(b"not a TBL file, just some text " * 4)
    (d / "short.tbl").write_bytes(b"TBL\x02")
    (d / "zero.tbl").write_bytes(b"")
    (d / "folder").mkdir()
    return types.SimpleNamespace(
        dir=d,
        imgs=imgs,
        raw=d / "raw.tbl",
        empty=d / "empty.tbl",
        jpeg=d / "jpeg.tbl",
        text=d / "notes.txt",
        short=d / "short.tbl",
        zero=d / "zero.tbl",
        folder=d / "folder",
        ds=tbljax.open(d / "raw.tbl"),
    )


def out(b=2, dtype=np.float32, h=H, w=W):
    return np.empty((b, h, w, 3), dtype)


def u8(b=2, h=H, w=W):
    return np.empty((b, h, w, 3), np.uint8)


# (id, call, exception, what the message must say)
# One hostile input a line: the table reads best unwrapped.
# fmt: off
CASES = [
    # ---- tbljax.open / Dataset ----
    ("open-None", lambda f: tbljax.open(None), TypeError, "path or a list of paths, got NoneType"),
    ("open-int", lambda f: tbljax.open(3), TypeError, "got int"),
    ("open-list-of-int", lambda f: tbljax.open([f.raw, 3]), TypeError, "str, bytes or os.PathLike, got int"),
    ("open-no-paths", lambda f: tbljax.open([]), ValueError, "no paths"),
    ("open-nul", lambda f: tbljax.open(str(f.raw) + "\0x"), ValueError, "NUL byte"),
    ("open-missing", lambda f: tbljax.open(f.dir / "nope.tbl"), FileNotFoundError, "tbljax.open: no such file: .*nope.tbl"),
    ("open-directory", lambda f: tbljax.open(f.folder), OSError, "folder: not a regular file"),
    ("open-non-tbl", lambda f: tbljax.open(f.text), tbljax.CorruptFileError, "notes.txt: not a TBL file"),
    ("open-4-bytes", lambda f: tbljax.open(f.short), tbljax.CorruptFileError, "shorter than the 64-byte"),
    ("open-0-bytes", lambda f: tbljax.open(f.zero), tbljax.CorruptFileError, "file is 0 bytes"),
    ("read-past-end", lambda f: f.ds.read(N), IndexError, f"record {N} out of range for a dataset of {N}"),
    ("read-negative", lambda f: f.ds.read(-N - 1), IndexError, "out of range"),
    ("read-huge", lambda f: f.ds.read(2**70), IndexError, "out of range"),
    ("read-float", lambda f: f.ds.read(1.0), TypeError, "record index must be an integer, got float"),
    ("read-str", lambda f: f.ds.read("1"), TypeError, "must be an integer, got str"),
    ("read-bool", lambda f: f.ds.read(True), TypeError, "must be an integer"),
    ("info-past-end", lambda f: f.ds.info(99), IndexError, "record 99 out of range"),
    ("read_into-float-indices", lambda f: f.ds.read_into([0.5], u8(1)), TypeError, "integers, got float64"),
    ("read_into-2d-indices", lambda f: f.ds.read_into([[0]], u8(1)), TypeError, r"1-D array of integers, got int64 of shape \(1, 1\)"),
    ("read_into-past-end", lambda f: f.ds.read_into([N], u8(1)), IndexError, "out of range"),
    ("read_into-out-float", lambda f: f.ds.read_into([0], out(1)), ValueError, "out must be uint8"),
    ("read_into-out-list", lambda f: f.ds.read_into([0], [[0]]), TypeError, "out must be a numpy.ndarray"),
    ("read_into-out-batch", lambda f: f.ds.read_into([0, 1], u8(1)), ValueError, "B=2"),
    ("read_into-out-size", lambda f: f.ds.read_into([0], u8(1, 4, 4)), ValueError, r"record 0 is \(6, 5, 3\), batch rows are \(4, 4, 3\)"),
    ("read_into-out-read-only", lambda f: f.ds.read_into([0], np.broadcast_to(u8(1), (1, H, W, 3))), ValueError, "read-only"),
    ("verify-threads-negative", lambda f: f.ds.verify(-1), ValueError, r"threads must be None or 0 \(the pool.s default\) or an integer in \[1, 1024\], got -1"),
    ("verify-threads-million", lambda f: f.ds.verify(10**6), ValueError, "threads must be"),
    ("verify-threads-str", lambda f: f.ds.verify("2"), ValueError, "threads must be"),
    ("view-empty", lambda f: tbljax.open(f.empty).view(), ValueError, "holds no records"),
    ("view-jpeg", lambda f: tbljax.open(f.jpeg).view(), ValueError, "not uniform uncompressed RAW_U8"),
    ("view-of-shards", lambda f: tbljax.open([f.raw, f.raw]).view(), ValueError, "use shard_views"),
    ("read-empty", lambda f: tbljax.open(f.empty).read(0), IndexError, "dataset of 0 records"),
    # ---- tbljax.loader ----
    ("loader-None", lambda f: tbljax.loader(None, 2), TypeError, "TBL path, a list of shard paths or a tbljax.Dataset, got NoneType"),
    ("loader-int", lambda f: tbljax.loader(7, 2), TypeError, "got int"),
    ("loader-empty-dataset", lambda f: tbljax.loader(f.empty, 2), ValueError, "holds no records"),
    ("loader-non-tbl", lambda f: tbljax.loader(f.text, 2), tbljax.CorruptFileError, "not a TBL file"),
    ("loader-directory", lambda f: tbljax.loader(f.folder, 2), OSError, "not a regular file"),
    ("loader-batch-0", lambda f: tbljax.loader(f.raw, 0), ValueError, "batch_size must be an integer >= 1, got 0"),
    ("loader-batch-negative", lambda f: tbljax.loader(f.raw, -4), ValueError, "batch_size must be an integer >= 1, got -4"),
    ("loader-batch-float", lambda f: tbljax.loader(f.raw, 2.0), ValueError, "batch_size must be an integer"),
    ("loader-batch-bool", lambda f: tbljax.loader(f.raw, True), ValueError, "batch_size must be an integer"),
    ("loader-batch-too-big", lambda f: tbljax.loader(f.raw, N + 1), ValueError, "larger than the dataset"),
    ("loader-mean-2", lambda f: tbljax.loader(f.raw, 2, mean=(0.5, 0.5)), ValueError, "mean must have 3 values"),
    ("loader-mean-4", lambda f: tbljax.loader(f.raw, 2, mean=(0.5,) * 4), ValueError, "mean must have 3 values"),
    ("loader-std-2", lambda f: tbljax.loader(f.raw, 2, std=(0.5, 0.5)), ValueError, "std must have 3 values"),
    ("loader-std-zero", lambda f: tbljax.loader(f.raw, 2, std=(0.2, 0.0, 0.2)), ValueError, r"std\[1\] = 0.0 must be a finite number > 0"),
    ("loader-std-negative", lambda f: tbljax.loader(f.raw, 2, std=(0.2, -1, 0.2)), ValueError, "> 0"),
    ("loader-mean-nan", lambda f: tbljax.loader(f.raw, 2, mean=(float("nan"), 0, 0)), ValueError, r"mean\[0\] = nan must be a finite number"),
    ("loader-std-inf", lambda f: tbljax.loader(f.raw, 2, std=(float("inf"), 1, 1)), ValueError, r"std\[0\] = inf must be a finite number > 0"),
    ("loader-mean-str", lambda f: tbljax.loader(f.raw, 2, mean="abc"), TypeError, "mean must be a sequence of 3 numbers"),
    ("loader-dtype-float64", lambda f: tbljax.loader(f.raw, 2, dtype="float64"), ValueError, "dtype must be one of"),
    ("loader-dtype-int16", lambda f: tbljax.loader(f.raw, 2, dtype=np.int16), ValueError, "dtype must be one of"),
    ("loader-dtype-object", lambda f: tbljax.loader(f.raw, 2, dtype=object()), ValueError, "dtype must be one of"),
    ("loader-layout", lambda f: tbljax.loader(f.raw, 2, layout="HWC"), ValueError, "layout must be one of"),
    ("loader-seed-negative", lambda f: tbljax.loader(f.raw, 2, seed=-1), ValueError, r"seed must be an integer in \[0, 2\*\*64\)"),
    ("loader-num-epochs-0", lambda f: tbljax.loader(f.raw, 2, num_epochs=0), ValueError, "num_epochs"),
    ("loader-prefetch-0", lambda f: tbljax.loader(f.raw, 2, prefetch=0), ValueError, "prefetch must be an integer >= 1"),
    ("loader-threads-negative", lambda f: tbljax.loader(f.raw, 2, threads=-1), ValueError, r"threads must be None or 0 \(the pool's default\) or an integer in \[1, 1024\]"),
    ("loader-threads-too-many", lambda f: tbljax.loader(f.raw, 2, threads=1025), ValueError, "threads must be None or 0"),
    ("loader-augment", lambda f: tbljax.loader(f.raw, 2, augment="zoom"), ValueError, "augment must be"),
    ("loader-augment-size", lambda f: tbljax.loader(f.raw, 2, augment=tbljax.Augment(size=(0, 4))), ValueError, "size must be"),
    ("loader-sharding", lambda f: tbljax.loader(f.raw, 2, sharding="batch"), TypeError, "sharding must be"),
    ("loader-shuffle-int", lambda f: tbljax.loader(f.raw, 2, shuffle=1), ValueError, "shuffle must be True or False"),
    ("set_epoch-negative", lambda f: tbljax.loader(f.raw, 2).set_epoch(-1), ValueError, r"epoch must be an integer in \[0, 2\*\*32\)"),
    ("load_state-None", lambda f: tbljax.loader(f.raw, 2).load_state_dict(None), ValueError, "state must be a dict"),
    ("load_state-missing", lambda f: tbljax.loader(f.raw, 2).load_state_dict({"seed": 0}), ValueError, "state is missing"),
    ("load_state-other-dataset", lambda f: tbljax.loader(f.raw, 2).load_state_dict(
        dict(tbljax.loader(f.raw, 2).state_dict(), fingerprint="0-0")), ValueError, "is for dataset"),
    ("load_state-position-negative", lambda f: tbljax.loader(f.raw, 2).load_state_dict(
        dict(tbljax.loader(f.raw, 2).state_dict(), position=-1)), ValueError, "position must be an integer in"),
    ("load_state-position-past-end", lambda f: tbljax.loader(f.raw, 2).load_state_dict(
        dict(tbljax.loader(f.raw, 2).state_dict(), position=N + 1)), ValueError, "position must be"),
    # ---- kernels.gather ----
    ("gather-index-negative", lambda f: kernels.gather(f.imgs, [0, -1], out()), IndexError, r"indices\[1\] = -1 is out of range"),
    ("gather-index-past-end", lambda f: kernels.gather(f.imgs, [0, N], out()), IndexError, f"allowed 0..{N - 1}"),
    ("gather-index-uint64-huge", lambda f: kernels.gather(f.imgs, np.array([0, 2**63], np.uint64), out()), IndexError, "out of range"),
    ("gather-index-float", lambda f: kernels.gather(f.imgs, [0.0, 1.0], out()), TypeError, "indices must be integers, got dtype float64"),
    ("gather-index-bool", lambda f: kernels.gather(f.imgs, [True, False], out()), TypeError, "indices must be integers"),
    ("gather-index-2d", lambda f: kernels.gather(f.imgs, [[0, 1]], out()), ValueError, "indices must be 1-D"),
    ("gather-out-float64", lambda f: kernels.gather(f.imgs, [0, 1], out(dtype=np.float64)), TypeError, "out.dtype must be uint8, float32 or bfloat16, got float64"),
    ("gather-out-int32", lambda f: kernels.gather(f.imgs, [0, 1], out(dtype=np.int32)), TypeError, "got int32"),
    ("gather-out-channels", lambda f: kernels.gather(f.imgs, [0, 1], np.empty((2, H, W, 4), np.float32)), ValueError, r"out must have shape \(B, OH, OW, 3\)"),
    ("gather-out-3d", lambda f: kernels.gather(f.imgs, [0, 1], np.empty((2, H, W), np.float32)), ValueError, "out must have shape"),
    ("gather-out-batch", lambda f: kernels.gather(f.imgs, [0, 1, 2], out()), ValueError, "out has batch size 2 but indices has 3"),
    ("gather-out-size-no-crop", lambda f: kernels.gather(f.imgs, [0, 1], out(h=4)), ValueError, "without crop boxes the output size must equal"),
    ("gather-out-list", lambda f: kernels.gather(f.imgs, [0, 1], [[0]]), TypeError, "out must be a numpy.ndarray"),
    ("gather-out-strided", lambda f: kernels.gather(f.imgs, [0, 1], out(4)[::2]), ValueError, "C-contiguous"),
    ("gather-out-read-only", lambda f: kernels.gather(f.imgs, [0, 1], np.broadcast_to(out(1), (2, H, W, 3))), ValueError, "C-contiguous|read-only"),
    ("gather-mean-2", lambda f: kernels.gather(f.imgs, [0, 1], out(), mean=[0.5, 0.5]), ValueError, "mean must have 3 values"),
    ("gather-std-4", lambda f: kernels.gather(f.imgs, [0, 1], out(), std=[1, 1, 1, 1]), ValueError, "std must have 3 values"),
    ("gather-std-zero", lambda f: kernels.gather(f.imgs, [0, 1], out(), std=[1, 0, 1]), ValueError, r"std\[1\] = 0.0 must be a finite number > 0"),
    ("gather-mean-nan", lambda f: kernels.gather(f.imgs, [0, 1], out(), mean=[0, 0, np.nan]), ValueError, r"mean\[2\] = nan must be a finite number"),
    ("gather-std-nan", lambda f: kernels.gather(f.imgs, [0, 1], out(), std=[np.nan, 1, 1]), ValueError, r"std\[0\] = nan"),
    ("gather-mean-str", lambda f: kernels.gather(f.imgs, [0, 1], out(), mean="abc"), TypeError, "mean must be a sequence of 3 numbers"),
    ("gather-uint8-with-mean", lambda f: kernels.gather(f.imgs, [0, 1], u8(), mean=[0, 0, 0]), ValueError, "uint8 output is not normalized"),
    ("gather-source-empty", lambda f: kernels.gather(np.zeros((0, H, W, 3), np.uint8), [0], out(1)), IndexError, "source of 0 records"),
    ("gather-source-float", lambda f: kernels.gather(f.imgs.astype(np.float32), [0], out(1)), TypeError, "source must hold uint8 RGB pixels, got dtype float32"),
    ("gather-source-list-of-lists", lambda f: kernels.gather([[1]], [0], out(1)), TypeError, r"source\[0\] must be a numpy.ndarray"),
    ("gather-source-empty-list", lambda f: kernels.gather([], [0], out(1)), ValueError, "empty list"),
    ("gather-source-zero-pixels", lambda f: kernels.gather(np.zeros((2, 0, W, 3), np.uint8), [0], np.empty((1, 0, W, 3), np.float32)), ValueError, "at least 1x1"),
    ("gather-source-shards-mismatch", lambda f: kernels.gather([f.imgs, np.ascontiguousarray(f.imgs[:, :4])], [0], out(1)), ValueError, r"source\[1\] holds 4x5 records"),
    ("gather-layout", lambda f: kernels.gather(f.imgs, [0, 1], out(), layout="nhwc"), ValueError, "layout must be one of"),
    ("gather-crop-negative-size", lambda f: kernels.gather(f.imgs, [0, 1], out(), crop=[[0, 0, -1, 2], [0, 0, 2, 2]]), ValueError, r"crop\[0\] = \(y0=0, x0=0, h=-1, w=2\) is not a non-empty box"),
    ("gather-crop-outside", lambda f: kernels.gather(f.imgs, [0, 1], out(), crop=[[0, 0, 2, 2], [5, 4, 2, 2]]), ValueError, r"crop\[1\]"),
    ("gather-crop-float", lambda f: kernels.gather(f.imgs, [0, 1], out(), crop=[[0, 0, 1.0, 2], [0, 0, 2, 2]]), TypeError, "crop must hold integers"),
    ("gather-crop-shape", lambda f: kernels.gather(f.imgs, [0, 1], out(), crop=[[0, 0, 2, 2]]), ValueError, r"crop must have shape \(2, 4\)"),
    ("gather-crop-int64-huge", lambda f: kernels.gather(f.imgs, [0, 1], out(), crop=np.array([[0, 0, 2**40, 2], [0, 0, 2, 2]])), ValueError, "crop values must fit in int32"),
    ("gather-flip-shape", lambda f: kernels.gather(f.imgs, [0, 1], out(), flip=[True]), ValueError, r"flip must have shape \(2,\)"),
    ("gather-flip-str", lambda f: kernels.gather(f.imgs, [0, 1], out(), flip=["a", "b"]), TypeError, "flip must hold booleans"),
    ("normalize_table-std-zero", lambda f: kernels.normalize_table([0, 0, 0], [0, 1, 1]), ValueError, r"std\[0\] = 0.0"),
    ("normalize_table-dtype", lambda f: kernels.normalize_table([0, 0, 0], [1, 1, 1], np.float64), TypeError, "float32 or bfloat16, got float64"),
    # ---- order / augment ----
    ("permute-n-0", lambda f: order.permute(np.arange(1), 0), ValueError, "n .* must be an integer in"),
    ("permute-position-outside", lambda f: order.permute(np.array([5]), 5), IndexError, r"position 5 is outside \[0, 5\)"),
    ("permute-float-positions", lambda f: order.permute(np.array([0.5]), 5), TypeError, "positions must be an integer array"),
    ("steps-batch-0", lambda f: order.steps_in_epoch(10, 0, drop_remainder=True), ValueError, "global batch must be an integer >= 1"),
    ("augment-scale", lambda f: tbljax.Augment(scale=(0.5, 0.1)), ValueError, "scale must satisfy 0 < lo <= hi"),
    ("augment-ratio-negative", lambda f: tbljax.Augment(ratio=(-1, 2)), ValueError, "ratio must satisfy"),
    # ---- Writer ----
    ("writer-capacity-negative", lambda f: Writer(f.dir / "w.tbl", -1), ValueError, r"capacity must be an integer in \[0, 2\*\*40\]"),
    ("writer-capacity-float", lambda f: Writer(f.dir / "w.tbl", 1.5), ValueError, "capacity must be an integer"),
    ("writer-capacity-2**64", lambda f: Writer(f.dir / "w.tbl", 2**64), ValueError, "capacity must be an integer"),
    ("writer-dst-exists", lambda f: Writer(f.raw, 1), ValueError, "already exists"),
    ("writer-dst-directory", lambda f: Writer(f.folder, 1, overwrite=True), ValueError, "exists and is not a regular file"),
    ("writer-dst-no-dir", lambda f: Writer(f.dir / "nope" / "w.tbl", 1), OSError, "does not exist"),
    ("writer-dst-empty", lambda f: Writer("", 1), ValueError, "destination path is empty"),
    ("writer-dst-None", lambda f: Writer(None, 1), TypeError, "a path must be str, bytes or os.PathLike"),
    ("add_raw-float", lambda f: Writer(f.dir / "w1.tbl", 1).add_raw(np.zeros((2, 2, 3), np.float32)), ValueError, r"add_raw takes \(H, W, 3\) uint8, got float32"),
    ("add_raw-gray", lambda f: Writer(f.dir / "w2.tbl", 1).add_raw(np.zeros((2, 2), np.uint8)), ValueError, "add_raw takes"),
    ("add_raw-zero-pixels", lambda f: Writer(f.dir / "w3.tbl", 1).add_raw(np.zeros((0, 2, 3), np.uint8)), ValueError, "at least 1x1"),
    ("add_raw-too-wide", lambda f: Writer(f.dir / "w4.tbl", 1).add_raw(np.zeros((1, 70000, 3), np.uint8)), ValueError, "65535-pixel side"),
    ("add_raw-over-capacity", lambda f: [w := Writer(f.dir / "w5.tbl", 0), w.add_raw(f.imgs[0])], ValueError, "capacity of 0 records is full"),
    ("add_encoded-format", lambda f: Writer(f.dir / "w6.tbl", 1).add_encoded(b"x", "GIF", 1, 1), ValueError, "unknown record format 'GIF'"),
    ("add_encoded-width-negative", lambda f: Writer(f.dir / "w7.tbl", 1).add_encoded(b"x", "JPEG", -1, 1), ValueError, r"width must be an integer in \[0, 65535\]"),
    ("add_encoded-str", lambda f: Writer(f.dir / "w8.tbl", 1).add_encoded("x", "JPEG", 1, 1), TypeError, "bytes-like"),
    ("set_metadata-labels-str", lambda f: Writer(f.dir / "w9.tbl", 1).set_metadata(labels=["a"]), ValueError, "labels must be a 1-D sequence of integers"),
    ("finalize-labels-count", lambda f: [w := Writer(f.dir / "w10.tbl", 2), w.set_metadata(labels=[1, 2, 3]), w.finalize()], ValueError, "3 labels given for 0 records"),
    ("finalize-after-abort", lambda f: [w := Writer(f.dir / "w11.tbl", 1), w.abort(), w.finalize()], ValueError, "already finalized or aborted"),
    # ---- convert ----
    ("convert-size-0", lambda f: tbljax.convert(f.imgs, f.dir / "c.tbl", image_size=0), ValueError, r"image_size must be an int in \[1, 65535\], got 0"),
    ("convert-size-negative", lambda f: tbljax.convert(f.imgs, f.dir / "c.tbl", image_size=-8), ValueError, "image_size"),
    ("convert-size-float", lambda f: tbljax.convert(f.imgs, f.dir / "c.tbl", image_size=8.0), ValueError, "image_size"),
    ("convert-resize", lambda f: tbljax.convert(f.imgs, f.dir / "c.tbl", image_size=8, resize="zoom"), ValueError, "resize must be one of"),
    ("convert-format", lambda f: tbljax.convert(f.imgs, f.dir / "c.tbl", image_size=8, format="png"), ValueError, "format must be one of"),
    ("convert-threads-negative", lambda f: tbljax.convert(f.imgs, f.dir / "c.tbl", image_size=8, threads=-1), ValueError, r"threads must be None or 0 \(the pool's default\) or an integer in \[1, 1024\]"),
    ("convert-threads-str", lambda f: tbljax.convert(f.imgs, f.dir / "c.tbl", image_size=8, threads="2"), ValueError, "threads must be"),
    ("convert-labels-count", lambda f: tbljax.convert(f.imgs, f.dir / "c.tbl", image_size=8, labels=[1]), ValueError, r"labels must have shape \(5,\)"),
    ("convert-sources-None", lambda f: tbljax.convert(None, f.dir / "c.tbl", image_size=8), TypeError, "sources must be"),
    ("convert-sources-missing", lambda f: tbljax.convert(f.dir / "none.tar", f.dir / "c.tbl", image_size=8), FileNotFoundError, "none.tar"),
    ("convert-sources-empty", lambda f: tbljax.convert([], f.dir / "c.tbl", image_size=8), ValueError, "no sources"),
    ("convert-sources-unknown", lambda f: tbljax.convert(f.text, f.dir / "c.tbl", image_size=8), ValueError, "cannot tell what kind of source"),
    ("convert-dst-exists", lambda f: tbljax.convert(f.imgs, f.raw, image_size=8), FileExistsError, "already exists"),
    ("convert-dst-directory", lambda f: tbljax.convert(f.imgs, f.folder, image_size=8, overwrite=True), IsADirectoryError, "is a directory: the output must be a file path"),
    ("convert-dst-no-dir", lambda f: tbljax.convert(f.imgs, f.dir / "nope" / "c.tbl", image_size=8), OSError, "does not exist"),
    # ---- decode ----
    ("decode-str", lambda f: _core.decode_jpeg("abc"), TypeError, "expected a bytes-like object"),
    ("decode-empty", lambda f: _core.decode_jpeg(b""), tbljax.DecodeError, "not a JPEG: input is empty"),
    ("decode-png", lambda f: _core.decode_jpeg(b"\x89PNG\r\n\x1a\n" + bytes(20)), tbljax.DecodeError, r"not a JPEG \(looks like PNG\)"),
    ("decode-scale-3", lambda f: _core.decode_jpeg(_core.encode_jpeg(u8(1)[0]), 3), ValueError, "scale_denom must be 1, 2, 4 or 8"),
    ("decode_resize-size-0", lambda f: _core.decode_resize(_core.encode_jpeg(u8(1)[0]), 0), ValueError, r"size must be in \[1, 65535\]"),
    ("decode_resize-mode", lambda f: _core.decode_resize(_core.encode_jpeg(u8(1)[0]), 4, "zoom"), ValueError, "resize mode='zoom' is not one of"),
    ("decode_resize_into-threads", lambda f: _core.decode_resize_into([b""], u8(1, 4, 4), "squash", -1), ValueError, "threads must be 0"),
    ("decode_resize_into-shape", lambda f: _core.decode_resize_into([b"", b""], u8(1, 4, 4), "squash"), ValueError, r"out must have shape \(2, S, S, 3\)"),
    ("resize-size-0", lambda f: _core.resize(f.imgs[0], 0), ValueError, r"size must be in \[1, 65535\]"),
    ("resize-gray", lambda f: _core.resize(np.zeros((4, 4), np.uint8), 2), ValueError, r"\(H, W, 3\) uint8"),
    ("resize-float", lambda f: _core.resize(np.zeros((4, 4, 3), np.float32), 2), TypeError, "incompatible function arguments"),
    ("encode-quality", lambda f: _core.encode_jpeg(u8(1)[0], 0), ValueError, r"quality must be in \[1, 100\]"),
]
# fmt: on


@pytest.mark.parametrize("call, exc, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_argument(f, call, exc, match):
    with pytest.raises(exc, match=match):
        call(f)


def test_bytes_and_pathlike_paths_work(f):
    assert len(tbljax.open(os.fsencode(f.raw))) == N
    assert len(tbljax.open([f.raw, str(f.raw)])) == 2 * N


def test_writer_failing_to_finalize_releases_its_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TBLJAX_NO_O_TMPFILE", "1")  # a named temp file shows in the folder
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError, match="3 labels given for 1 records"):
        with Writer(tmp_path / "a.tbl", 1) as w:
            w.add_raw(images(1)[0])
            w.set_metadata(labels=[1, 2, 3])
    assert os.listdir(tmp_path) == [] and len(os.listdir("/proc/self/fd")) == fds


def test_writer_hostile_input_leaves_no_file(f):
    names = set(os.listdir(f.dir))
    w = Writer(f.dir / "partial.tbl", 2)
    w.add_raw(f.imgs[0])
    with pytest.raises(ValueError):
        w.add_raw(f.imgs[0].astype(np.float32))
    w.abort()
    assert set(os.listdir(f.dir)) == names


# ---------------------------------------------------------------------------------------------
# Damaged metadata: the dataset block's JSON is as untrusted as the rest of the file.

# One hostile input a line: the table reads best unwrapped.
# fmt: off
META_CASES = {
    "labels-not-object": ({"labels": "x"}, "'labels' must be"),
    "labels-bad-base64": ({"labels": {"base64": "!!!"}}, "'labels' must be base64 of 2 integers"),
    "labels-float-dtype": ({"labels": {"dtype": "<f8", "base64": "AAAAAAAAAAAAAAAAAAAAAA=="}}, "'labels' must be"),
    "labels-object-dtype": ({"labels": {"dtype": "O", "base64": "AAAAAAAAAAAAAAAAAAAAAA=="}}, "'labels' must be"),
    "labels-count": ({"labels": {"dtype": "<i8", "base64": "AAAAAAAAAAA="}}, "holds 1 labels for 2 records"),
    "labels-ragged": ({"labels": {"dtype": "<i8", "base64": "AAAAAAAAAAAA"}}, "'labels' must be base64"),
    "keys-not-list": ({"keys": 5}, "'keys' must be a list of strings"),
    "keys-of-ints": ({"keys": [1, 2]}, "'keys' must be a list of strings"),
    "keys-count": ({"keys": ["a"]}, "holds 1 keys for 2 records"),
    "classes-not-list": ({"classes": {"a": 1}}, "'classes' must be a list of strings"),
    "recipe-not-object": ({"recipe": [1]}, "'recipe' must be an object"),
    "recipe-size-str": ({"recipe": {"image_size": "abc"}}, "image_size is an integer"),
    "recipe-size-huge": ({"recipe": {"image_size": 10**9}}, "image_size is an integer"),
    "recipe-size-zero": ({"recipe": {"image_size": 0}}, "image_size is an integer"),
    "recipe-resize": ({"recipe": {"image_size": 8, "resize": "zoom"}}, "resize is one of"),
    "skipped-not-list": ({"skipped": 5}, "'skipped' must be a list of objects"),
    "not-an-object": ([1, 2], "not a JSON object"),
    "not-json": ("{{{", "not valid JSON"),
}
# fmt: on


@pytest.mark.parametrize("name", sorted(META_CASES))
@pytest.mark.parametrize("kind", ["raw", "jpeg"])
def test_damaged_dataset_metadata(tmp_path, name, kind):
    meta, match = META_CASES[name]
    p = tmp_path / "m.tbl"
    w = _core.TblWriter(str(p), 2, False)
    for k in range(2):
        if kind == "raw":
            w.add(np.full(4 * 4 * 3, k, np.uint8), _core.FORMATS["RAW_U8"], 4, 4, False)
        else:
            w.add(
                np.frombuffer(_core.encode_jpeg(np.full((8, 8, 3), k, np.uint8)), np.uint8),
                _core.FORMATS["JPEG"],
                8,
                8,
                False,
            )
    w.finalize(meta if isinstance(meta, str) else json.dumps(meta))
    ds = tbljax.open(p)  # the header, index and block checksum are fine: open is O(1)
    with pytest.raises(tbljax.CorruptFileError, match=f"m.tbl: .*{match}"):
        ds.labels  # noqa: B018 - reading the property is the test
    with pytest.raises(tbljax.CorruptFileError, match=match):
        tbljax.loader(p, 2)


# ---------------------------------------------------------------------------------------------
# A file replaced, rewritten or truncated while a Dataset or loader has it open.


def _old_mtime(p):
    # Modification times have a coarse clock: start from one well in the past, so a rewrite
    # within the same tick as the file's creation still shows.
    os.utime(p, (time.time() - 100, time.time() - 100))


def _rows(batch):
    return np.asarray(batch["image"]), np.asarray(batch["index"])


def test_file_renamed_over_keeps_serving_the_old_file(tmp_path):
    old, new = images(12, seed=1), images(12, seed=2)
    p = write_tbl(tmp_path / "a.tbl", old, np.arange(12))
    ds = tbljax.open(p)
    it = iter(tbljax.loader(p, 4, dtype="uint8", shuffle=False, num_epochs=2))
    first = _rows(next(it))
    write_tbl(tmp_path / "b.tbl", new, np.arange(12))
    os.replace(tmp_path / "b.tbl", p)  # what convert(..., overwrite=True) does
    got = [first] + [_rows(b) for b in it]
    assert len(got) == 6
    for image, index in got:  # every batch from the old file, none mixed
        np.testing.assert_array_equal(image, old[index])
    np.testing.assert_array_equal(ds.read(3), old[3])
    np.testing.assert_array_equal(ds.view(), old)
    assert ds.verify() == []
    np.testing.assert_array_equal(tbljax.open(p).view(), new)  # a new open sees the new file


def test_file_truncated_under_a_loader_fails_the_next_batch(tmp_path):
    imgs = images(12)
    p = write_tbl(tmp_path / "a.tbl", imgs, np.arange(12))
    _old_mtime(p)
    it = iter(tbljax.loader(p, 4, dtype="uint8", shuffle=False, num_epochs=3, prefetch=1))
    image, index = _rows(next(it))
    np.testing.assert_array_equal(image, imgs[index])
    # Cut the dataset block off the end: the records stay within the file, so the producer
    # thread cannot fault on them whatever it is doing; the size no longer matches.
    os.truncate(p, tbljax.open(p).info(11).offset + imgs[0].nbytes)
    served = 0
    with pytest.raises(
        tbljax.CorruptFileError, match=r"a.tbl: the file changed on disk while open \(size \d+ -> \d+ bytes\)"
    ):
        for batch in it:  # prefetched batches (built before the cut) may still arrive
            image, index = _rows(batch)
            np.testing.assert_array_equal(image, imgs[index])
            served += 1
    assert served <= 2


def test_file_rewritten_in_place_under_a_loader_fails(tmp_path):
    imgs = images(12)
    p = write_tbl(tmp_path / "a.tbl", imgs, np.arange(12))
    _old_mtime(p)
    ds = tbljax.open(p)
    it = iter(tbljax.loader(ds, 4, dtype="uint8", shuffle=False, num_epochs=3, prefetch=1))
    next(it)
    with open(p, "r+b") as fh:  # same size, other pixels: what `cp other.tbl a.tbl` ends with
        fh.seek(ds.info(0).offset)
        fh.write(bytes(imgs.nbytes))
    with pytest.raises(tbljax.CorruptFileError, match="rewritten in place"):
        for batch in it:
            image, index = _rows(batch)
            np.testing.assert_array_equal(image, imgs[index])  # never a zeroed (mixed) batch
    with pytest.raises(tbljax.CorruptFileError, match="changed on disk"):
        ds.read(0)


def test_file_truncated_under_a_dataset_fails_every_read(tmp_path):
    imgs = images(12)
    p = write_tbl(tmp_path / "a.tbl", imgs, np.arange(12))
    ds = tbljax.open(p)
    cut = 4096 + imgs[0].nbytes * 3  # records 3.. are gone
    os.truncate(p, cut)
    for call in (
        lambda: ds.read(5),
        lambda: ds.read_into(np.array([5]), np.empty((1, 6, 5, 3), np.uint8)),
        lambda: ds.verify(),
        lambda: ds.check_unchanged(),
        lambda: tbljax.loader(ds, 4, dtype="uint8").__iter__().__next__(),
    ):
        with pytest.raises(tbljax.CorruptFileError, match=rf"size \d+ -> {cut} bytes"):
            call()
    with pytest.raises(tbljax.CorruptFileError, match="truncated"):
        tbljax.open(p)  # opened again: the index points past the end


_SIGBUS_CHILD = r"""
import os, sys, tbljax
ds = tbljax.open(sys.argv[1])
v = ds.view()
os.truncate(sys.argv[1], 4096)
try:
    ds.check_unchanged()
except tbljax.CorruptFileError as e:
    print("checked:", e, flush=True)
print(int(v[-1].sum()))  # reading a page past the new end of the file: SIGBUS
"""


def test_reading_a_view_of_a_truncated_file_is_sigbus_unless_checked(tmp_path):
    """Documents the limit of a memory map: the zero-copy view (and only it: every reader in
    tbljax checks first) faults when its file is truncated under it. `check_unchanged()` says
    so with an exception; the raw memory access itself cannot."""
    p = write_tbl(tmp_path / "a.tbl", images(400, 32, 32), np.arange(400))
    r = subprocess.run([sys.executable, "-c", _SIGBUS_CHILD, str(p)], capture_output=True, timeout=60)
    assert b"checked: " in r.stdout and b"changed on disk" in r.stdout
    # SIGBUS; under scripts/sanitize.sh ASan catches it and reports it before aborting.
    assert r.returncode == -7 or b"AddressSanitizer: BUS" in r.stderr, (r.returncode, r.stderr[-500:])


def _with_sample_metadata(path, blocks):
    """Rewrites a TBL file with turboloader-style per-sample JSON metadata blocks appended."""
    import struct
    import zlib

    b = bytearray(path.read_bytes())
    meta = b"".join(struct.pack("<QIHH", i, len(j), _core.META_JSON, 0) + j for i, j in blocks)
    struct.pack_into("<QQ", b, 24, len(b), len(meta))
    struct.pack_into("<I", b, 40, struct.unpack_from("<I", b, 40)[0] | _core.FLAG_HAS_METADATA)
    struct.pack_into("<I", b, 44, 0)
    struct.pack_into("<I", b, 44, zlib.crc32(bytes(b[:64])))
    path.write_bytes(bytes(b) + meta)


def test_foreign_per_sample_metadata(tmp_path):
    p = tmp_path / "t.tbl"
    with Writer(p, 3) as w:  # no dataset block: labels come from per-sample blocks
        for im in images(3):
            w.add_raw(im)
    _with_sample_metadata(
        p, [(0, b'{"label": 4, "key": "a"}'), (1, b"not json"), (2, b'{"cls": true}'), (99, b'{"label": 1}')]
    )
    ds = tbljax.open(p)
    assert ds.labels.tolist() == [4, -1, -1] and ds.keys == ["a", "", ""]
    _with_sample_metadata(p, [(1, b'{"label": 1180591620717411303424}')])
    with pytest.raises(tbljax.CorruptFileError, match="record 1: label 1180591620717411303424 does not fit in int64"):
        tbljax.open(p).labels  # noqa: B018 - reading the property is the test

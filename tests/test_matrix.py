"""The combination matrix: every record kind tbljax writes × {one file, two shard files} ×
every path a user combines them with, each cell checked against the NumPy oracle
(tests/oracle.py) over each record's reference pixels (tests/_matrix_data.py: read from the
file's bytes by NumPy or Pillow, not by tbljax's decoders), or against the documented error.
Tiny images, so the whole matrix runs in seconds; every new feature adds its row here.

Paths: the JAX loader (uint8 random-resized crop; the same on a cold file, read ahead and
swept; float32 centre-crop eval with the last batch padded; a mid-epoch state resumed by a new
loader; `repeats=2`, each repeat its own crop; `views=`, each view its own crop and a group
with its own ops; `buckets=` centre-cropped (and in jit, a `ResidentDataset`'s bucket plan, on
RAW and compact full-aspect files), `patches=` NaFlex sequences, a length schedule of them
(HostLoader, tbljax.loader, and in jit a `ResidentDataset`'s length plan, on compact
full-aspect files) and packed NaFlex sequences (and in jit, a `ResidentDataset`'s pack plan,
on the FFI handler and the twin); per-image ops (pixel_ops' rules) with each of those four,
at each row's own size, on one cell per kernel path), torch, MLX (and both
with `mixup=`, against `tbljax.ops.mixup_cutmix`), `ResidentDataset` inside `jax.jit` (with
per-image ops drawn and run there, and NaFlex patch sequences, with per-image ops too: "ops ×
patches in jit", on the FFI handler and, slow, on the twin), `gather_normalize(ops=)` on the
FFI handler and on the pure-JAX twin (records of one size and packed; the twin's cases slow),
`partition="host"` in two real processes (JAX and torch.distributed), `patches=` over host
parts and over a mixture and its host parts (each row the whole dataset's or its source's),
`show`, `bench`, `info`/`verify`, TBL → RAW; and the dataset contract itself on every dataset
kind. The "fields" row's records carry a str, a json, a fixed and a ragged ndarray field: every
path that serves them is checked against the values the source TAR held (`check_fields`). The
geometric row: each record kind converted with a mask and boxes (original JPEG bytes refused by
name), served through RRC + flip by the JAX and torch loaders and by a `ResidentDataset` in
jit, against `rules/geometry`'s conversion and serving rules of the source's values at the crop
`tbljax.augment.sample` draws; a linear `DenseMap` the same way on two record kinds. The
detection-crop row (`Augment(crop="bbox")`): the same files through the JAX loader, pixels
against the oracle and masks/boxes against `rules/geometry` at the crop `sample` draws around
each record's stored boxes; the large-scale-jitter and longer_pad rows: pixels against the
oracle's crop-resize at `tbljax.augment.canvas_boxes`' box and extent on a zero canvas,
`image_valid`, masks/boxes served onto the extent."""

from __future__ import annotations

import json
import math
import os
import types
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import tbljax
from tbljax import augment as tba
from tbljax._src.datasets.host_part import PartDataset
from tbljax._src.engine import naflex_pack
from tbljax._src.engine.record_source import RecordSource
from tbljax._src.file.format import FORMATS
from tbljax._src.rules import bbox_crop, geometry, naflex, pixel_ops
from tbljax._src.rules.augment import sample
from tbljax._src.rules.dataset import RecordDataset, members
from tbljax._src.rules.randaug import decide
from tbljax._src.rules.record_geometry import RecordGeometry

import _matrix_data as M
import _two_jobs
import oracle
from _loader_testing import spans, spy_on_sweeps, two_host_parts

SEED, B = 3, 4
RRC = tbljax.Augment(size=M.OUT)
CENTER = tbljax.Augment(crop="center", flip=False, size=M.OUT)
MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)
CELLS = [(k, layout) for k in M.KINDS for layout in M.LAYOUTS]
IDS = [f"{k}-{layout}" for k, layout in CELLS]
FULL_ASPECT = {"raw_shorter_side", "raw_max_side", "compact_full_aspect", "compact_raw_budget"}
MODES = {
    "raw_square": "gather",
    "raw_shorter_side": "gather_variable",
    "raw_max_side": "gather_variable",
    "compact_square": "jpeg_boxes",
    "compact_full_aspect": "jpeg_boxes",
    "compact_raw_budget": "jpeg_boxes",
    "original_jpeg": "decode",
    "lz4": "decode",
    "fields": "gather",
}
VALUES = M.field_values()


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    pytest.importorskip("PIL")
    files = M.make(tmp_path_factory.mktemp("matrix"))
    return files, M.references(files)


def _geometry(imgs) -> RecordGeometry:
    return RecordGeometry(np.array([im.shape[0] for im in imgs]), np.array([im.shape[1] for im in imgs]))


def expected(imgs, idx, aug, *, epoch=0, dtype=np.uint8, layout="NHWC", mean=None, std=None):
    """The oracle's rows for samples `idx` (the augmentation keyed by global index)."""
    idx = np.asarray(idx, np.int64)
    boxes, flips = sample(aug, idx, geometry=_geometry(imgs), seed=SEED, epoch=epoch)
    return oracle.gather(imgs, idx, aug.size, crop=boxes, flip=flips, dtype=dtype, layout=layout, mean=mean, std=std)


def _host(x) -> np.ndarray:
    return np.asarray(x)


def serve(kind) -> dict:
    """The loader arguments a kind needs (the fields kind: a length for its ragged field)."""
    return M.SERVE.get(kind, {})


def check_fields(kind, fields, idx, where=""):
    """A batch's fields (`fields`: name → NumPy array or list, this process's rows) against the
    source TAR's values for records `idx`; padding rows (index -1) hold zeros, "" and None."""
    if kind != "fields":
        return
    assert sorted(fields) == ["caption", "emb", "tags", "tok", "tok_length"], where
    emb, tok, length = (np.asarray(fields[k]) for k in ("emb", "tok", "tok_length"))
    assert emb.dtype == np.float16 and tok.dtype == np.int32 and tok.shape == (len(idx), M.PAD), where
    assert len(fields["caption"]) == len(fields["tags"]) == len(idx), where
    for r, i in enumerate(np.asarray(idx).tolist()):
        if i < 0:
            assert fields["caption"][r] == "" and fields["tags"][r] is None, where
            assert not emb[r].any() and not tok[r].any() and length[r] == 0, where
            continue
        v = VALUES[i]
        assert fields["caption"][r] == v["caption"] and fields["tags"][r] == v["tags"], (where, i)
        np.testing.assert_array_equal(emb[r], v["emb"], err_msg=f"{where} {i}")
        want = np.zeros(M.PAD, np.int32)
        want[: min(M.PAD, len(v["tok"]))] = v["tok"][: M.PAD]
        np.testing.assert_array_equal(tok[r], want, err_msg=f"{where} {i}")
        assert length[r] == len(v["tok"]), (where, i)  # the true length, before the cut


def _jax_fields(batch) -> dict:
    return {
        k: (v if isinstance(v, list) else _host(v))
        for k, v in batch.items()
        if k not in ("image", "label", "index", "valid")
    }


# ---- the dataset contract ----


def _kinds_of_dataset(files, kind, layout):
    """Every dataset kind for one cell: the opened file(s), and host parts cut from them."""
    ds = tbljax.open(files[kind, layout])
    n = len(ds)
    yield "dataset", ds, 0
    if layout == "shards":
        first = tbljax.open(files[kind, layout][1])  # a part of whole files: the second file
        yield "part of files", PartDataset(first, 0, len(first), "fp"), n - len(first)
    else:
        yield "part of records", PartDataset(ds, 3, n, "fp"), 3


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_every_dataset_kind_implements_the_whole_contract(matrix, kind, layout):
    files, refs = matrix
    ref = refs[kind, layout]
    for what, ds, lo in _kinds_of_dataset(files, kind, layout):
        assert isinstance(ds, RecordDataset), what
        assert all(hasattr(ds, m) for m in members()), what
        mine = ref[lo:]
        assert len(ds) == len(mine)
        g = ds.geometry  # the served sizes
        assert [(int(h), int(w)) for h, w in zip(*np.broadcast_arrays(g.heights, g.widths))] == (
            [mine[0].shape[:2]] if g.shape else [im.shape[:2] for im in mine]
        ), what
        assert (ds.image_shape is None) == (kind in FULL_ASPECT)
        assert ds.labels.tolist() == list(range(lo, M.N)), what
        for i in (0, len(ds) - 1, -1):
            assert np.array_equal(ds.read(i), mine[i]), (what, i)
        path, j = ds.locate(len(ds) - 1)
        assert path == ds.paths[-1] and j == len(tbljax.open(path)) - 1
        files_, offsets, sizes = ds.byte_ranges(np.arange(len(ds)))
        data = {p: np.fromfile(p, np.uint8) for p in ds.paths}
        assert all(o + s <= len(data[ds.paths[f]]) for f, o, s in zip(files_, offsets, sizes))
        assert ds.compact == kind.startswith("compact")
        if ds.compact or ds.record_format == "jpeg":
            r = ds.jpeg_records()
            assert int(r.counts.sum()) == len(ds) and np.array_equal(r.offsets, offsets)
            index = tbljax.open(files[kind, layout]).index[len(tbljax.open(files[kind, layout])) - len(ds) :]
            stored_raw = np.array([e["format"] == FORMATS["RAW_U8"] for e in index])
            assert r.stored_raw.tolist() == stored_raw.tolist(), what
            if kind == "compact_raw_budget":  # both kinds of record, in every file
                assert ds.record_format == "mixed" and 0 < stored_raw.sum() < len(ds), what
        else:
            with pytest.raises(ValueError, match="only JPEG records"):
                ds.jpeg_records()
        if ds.record_format == "raw":
            assert int(ds.raw_records().counts.sum()) == len(ds)
        else:
            with pytest.raises(ValueError, match="only uncompressed RAW"):
                ds.raw_records()
        with pytest.raises(IndexError):
            ds.read(len(ds))
        # The engine takes each kind's fast path from every dataset kind (a host part of
        # compact records decodes only each box's part, as the whole dataset does).
        assert RecordSource(ds, 0).mode == MODES[kind], what
        if kind == "fields":
            assert list(ds.fields) == ["caption", "tags", "emb", "tok"], what
            rows = [0, len(ds) - 1]
            src = [VALUES[lo + r] for r in rows]
            np.testing.assert_array_equal(ds.field_rows("emb", rows), [v["emb"] for v in src])
            assert ds.field_rows("caption", rows) == [v["caption"] for v in src], what
            assert [t.tolist() for t in ds.field_rows("tok", rows)] == [v["tok"].tolist() for v in src]
        else:
            assert ds.fields == {}, what


def test_a_dataset_that_leaves_out_part_of_the_contract_cannot_be_made():
    class Partial(RecordDataset):
        def __len__(self):
            return 1

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_the_loader_refuses_what_is_not_a_dataset_by_name():
    with pytest.raises(TypeError, match="tbljax.loader takes a TBL path.*got dict"):
        tbljax.loader({"image": 1}, 4)
    with pytest.raises(ValueError, match="empty list of paths"):
        tbljax.loader([], 4)


def test_original_bytes_report_the_served_geometry(matrix):
    files, refs = matrix
    ds = tbljax.open(files["original_jpeg", "file"])
    assert (ds.index["height"] != M.S).any()  # the index holds the source photos' sizes
    assert ds.geometry.shape == (M.S, M.S)  # ... the records serve at 16x16
    stored = int(ds.index["size"].sum())
    info = _info(files["original_jpeg", "file"])[0]
    assert info["record_sizes_hxw"] == {f"{M.S}x{M.S}": M.N}
    assert info["ratio_to_raw"] == round(stored / (M.N * M.S * M.S * 3), 4) and info["ratio_to_raw"] > 1


# ---- the JAX loader ----


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_loader_uint8_random_resized_crop(matrix, kind, layout):
    files, refs = matrix
    got = 0
    for batch in tbljax.loader(
        files[kind, layout], B, seed=SEED, dtype="uint8", augment=RRC, num_epochs=1, **serve(kind)
    ):
        idx = _host(batch["index"])
        np.testing.assert_array_equal(_host(batch["image"]), expected(refs[kind, layout], idx, RRC))
        assert _host(batch["label"]).tolist() == idx.tolist()
        check_fields(kind, _jax_fields(batch), idx, "rrc")
        got += 1
    assert got == M.N // B


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_a_cold_epoch_reads_ahead_and_sweeps_the_records_it_serves(matrix, kind, layout, monkeypatch):
    """Every step taken as cold (the test files are in the page cache): the per-step requests
    and the sweep of the whole source run beside the kernel and change no pixel; the sweep asks
    for exactly each file's record bytes (the index's offsets), for the kinds the kernel reads
    from the mapping; the kinds the dataset decodes are not swept."""
    files, refs = matrix
    requests, sweeps = spy_on_sweeps(monkeypatch, run_to_end=True)
    monkeypatch.setattr(RecordSource, "resident", lambda self, indices: False)
    got = 0
    for batch in tbljax.loader(
        files[kind, layout], B, seed=SEED, dtype="uint8", augment=RRC, num_epochs=1, **serve(kind)
    ):
        idx = _host(batch["index"])
        np.testing.assert_array_equal(_host(batch["image"]), expected(refs[kind, layout], idx, RRC))
        got += 1
    assert got == M.N // B
    if MODES[kind] == "decode" or not hasattr(os, "posix_fadvise") or not os.path.exists("/proc/meminfo"):
        assert not [s for s in sweeps if s is not None] and not requests
        return
    (sw,) = sweeps
    assert sw.join(30)
    paths = files[kind, layout]
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        index = tbljax.open(path).index
        ends = index["offset"].astype(np.int64) + index["size"]
        # One span, from the first record's first byte to the last one's end.
        assert spans(requests, os.stat(path).st_ino) == [(int(index["offset"].min()), int(ends.max()))], path


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_eval_float32_center_crop_serves_every_record_once(matrix, kind, layout):
    files, refs = matrix
    seen = []
    for batch in tbljax.loader(
        files[kind, layout],
        B,
        seed=SEED,
        augment=CENTER,
        num_epochs=1,
        drop_remainder=False,
        mean=MEAN,
        std=STD,
        **serve(kind),
    ):
        idx, valid = _host(batch["index"]), _host(batch["valid"])
        check_fields(kind, _jax_fields(batch), idx, "eval")  # padding rows: zeros, "", None
        assert (idx >= 0).tolist() == valid.tolist()
        want = expected(refs[kind, layout], idx[valid], CENTER, dtype=np.float32, mean=MEAN, std=STD)
        np.testing.assert_array_equal(_host(batch["image"])[valid], want)
        assert not _host(batch["image"])[~valid].any()
        seen += idx[valid].tolist()
    assert sorted(seen) == list(range(M.N))


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_mid_epoch_state_resumes_the_identical_stream(matrix, kind, layout):
    files, _ = matrix
    kw = dict(seed=SEED, dtype="uint8", augment=RRC, num_epochs=2, **serve(kind))
    ld = tbljax.loader(files[kind, layout], B, **kw)
    it = iter(ld)
    next(it), next(it), next(it)  # into the second epoch
    state = ld.state_dict()
    rest = [(_host(b["index"]), _host(b["image"]), _jax_fields(b)) for b in it]
    again = tbljax.loader(files[kind, layout], B, **kw)
    again.load_state_dict(state)
    resumed = [(_host(b["index"]), _host(b["image"]), _jax_fields(b)) for b in again]
    assert len(rest) == len(resumed) == 1
    for (i1, x1, f1), (i2, x2, f2) in zip(rest, resumed):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(x1, x2)
        check_fields(kind, f1, i1, "uninterrupted")
        check_fields(kind, f2, i2, "resumed")


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_repeats_serve_every_record_repeat_once_with_its_crop(matrix, kind, layout):
    """The "repeats" row (issue 47): repeats=2 serves each (record, repeat) once an epoch, each
    row the oracle's pixels of its repeat's own crop and flip."""
    files, refs = matrix
    seen = []
    for batch in tbljax.loader(
        files[kind, layout],
        B,
        seed=SEED,
        dtype="uint8",
        augment=RRC,
        num_epochs=1,
        repeats=2,
        drop_remainder=False,
        **serve(kind),
    ):
        idx, rep, valid = _host(batch["index"]), _host(batch["repeat"]), _host(batch["valid"])
        boxes, flips = sample(
            RRC, idx[valid], geometry=_geometry(refs[kind, layout]), seed=SEED, epoch=0, repeat=rep[valid]
        )
        want = oracle.gather(refs[kind, layout], idx[valid], RRC.size, crop=boxes, flip=flips)
        np.testing.assert_array_equal(_host(batch["image"])[valid], want)
        seen += list(zip(idx[valid].tolist(), rep[valid].tolist()))
    assert sorted(seen) == [(i, r) for i in range(M.N) for r in range(2)]


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_views_serve_each_view_the_oracle_crop_of_its_own_draw(matrix, kind, layout):
    """The "views" row (issue 47): two view groups of 2 and 1 views, each view v of a record the
    oracle's pixels at the crop and flip drawn for (seed, epoch, index, v), views numbered across
    the groups in order; the second group with its own ops (per-view ops): pixel_ops' program of
    the ops decided for (seed, epoch, index, v) on that crop; every record once an epoch."""
    files, refs = matrix
    small = tbljax.Augment(size=(8, 8), scale=(0.1, 0.5), ops=[tbljax.RandAugment(num_ops=2, magnitude=9, prob=0.7)])
    views = {"big": (2, RRC), "small": (1, small)}
    drawn = 0
    seen = []
    for batch in tbljax.loader(
        files[kind, layout], B, seed=SEED, dtype="uint8", views=views, num_epochs=1, **serve(kind)
    ):
        idx = _host(batch["index"])
        geometry = _geometry(refs[kind, layout])
        first = 0
        for name, (count, aug) in views.items():
            got = _host(batch[name])
            assert got.shape == (len(idx), count, *aug.size, 3)
            for v in range(count):
                boxes, flips = sample(aug, idx, geometry=geometry, seed=SEED, epoch=0, view=first + v)
                want = oracle.gather(refs[kind, layout], idx, aug.size, crop=boxes, flip=flips)
                if aug.ops:
                    codes, args = decide(aug.ops, idx, seed=SEED, epoch=0, view=first + v)
                    want, drawn = _ops_applied(want, codes, args, aug.ops), drawn + int(codes.any(1).sum())
                np.testing.assert_array_equal(got[:, v], want, err_msg=f"{name}[{v}]")
            first += count
        seen += idx.tolist()
    assert sorted(seen) == sorted(set(seen)) and len(seen) == (M.N // B) * B and drawn > 0


def _bucket_of(h: int, w: int, sizes) -> tuple[int, tuple[int, int]]:
    """(id, (bh, bw)) of the bucket nearest h×w's aspect in log space, ids by aspect w/h."""
    ranked = sorted(sizes, key=lambda s: Fraction(s[1], s[0]))
    k = min(range(len(ranked)), key=lambda j: abs(math.log(w / h) - math.log(ranked[j][1] / ranked[j][0])))
    return k, ranked[k]


BUCKET_SIZES = [(8, 12), (8, 8), (12, 8)]


def _bucket_crop(img, sizes) -> tuple[int, tuple[int, int], np.ndarray]:
    """(bucket id, crop_yx, pixels): the oracle's resize to img's bucket of the largest box of
    the bucket's aspect (sides rounded half up) centred in img, unflipped."""
    h, w = img.shape[:2]
    k, (bh, bw) = _bucket_of(h, w, sizes)
    half = Fraction(1, 2)
    if w * bh > h * bw:  # wider than the bucket: full height
        box = (h, min(w, max(1, math.floor(Fraction(h * bw, bh) + half))))
    else:
        box = (min(h, max(1, math.floor(Fraction(w * bh, bw) + half))), w)
    y0, x0 = (h - box[0]) // 2, (w - box[1]) // 2
    return k, (y0, x0), oracle.crop_resize(img, (y0, x0, *box), bh, bw)


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_buckets_serve_each_record_covered_and_center_cropped_to_its_bucket(matrix, kind, layout):
    """The "buckets" row: every record once, each step one bucket; a row is the oracle's resize
    of the largest box of its bucket's aspect (sides rounded half up) centred in the record,
    flipped by `tbljax.augment.flips`; orig_hw/crop_yx/bucket the record's conditioning."""
    files, refs = matrix
    sizes = BUCKET_SIZES
    buckets = tbljax.Buckets(sizes=sizes, crop="center")
    kw = dict(seed=SEED, dtype="uint8", augment="flip", num_epochs=1, drop_remainder=False, **serve(kind))
    seen, shapes, served = [], set(), []
    for batch in tbljax.loader(files[kind, layout], B, buckets=buckets, **kw):
        served.append({k: _host(v) for k, v in batch.items()})
        shapes.add(np.shape(batch["image"])[1:3])
        idx, valid, image = (_host(batch[k]) for k in ("index", "valid", "image"))
        flips = tbljax.augment.flips(idx, seed=SEED, epoch=0)
        for r in np.flatnonzero(valid):
            i = int(idx[r])
            h, w = refs[kind, layout][i].shape[:2]
            k, (y0, x0), want = _bucket_crop(refs[kind, layout][i], sizes)
            assert image.shape[1:3] == want.shape[:2] and int(_host(batch["bucket"])[r]) == k, (kind, i)
            np.testing.assert_array_equal(image[r], want[:, ::-1] if flips[r] else want, err_msg=f"{kind} {i}")
            assert _host(batch["orig_hw"])[r].tolist() == [h, w] and _host(batch["crop_yx"])[r].tolist() == [y0, x0]
        assert not image[~valid].any()
        fields = {k: v for k, v in _jax_fields(batch).items() if k not in ("orig_hw", "crop_yx", "bucket")}
        check_fields(kind, fields, np.where(valid, idx, -1), "buckets")
        seen += idx[valid].tolist()
    assert sorted(seen) == list(range(M.N))
    if kind in ("raw_shorter_side", "compact_full_aspect"):  # photos of more than one aspect
        assert len(shapes) > 1
    if kind in ("raw_shorter_side", "compact_full_aspect") and layout == "file":  # in jit: each step the loader's
        import jax

        rd = tbljax.ResidentDataset(files[kind, layout], **serve(kind))
        plan = rd.bucket_plan(B, buckets, seed=SEED)
        step = jax.jit(
            lambda ds, p, s, k: ds.batch(s, batch_size=B, seed=SEED, plan=p, bucket=k, augment="flip", dtype="uint8"),
            static_argnums=3,
        )
        assert plan.steps == len(served)
        for s, want in enumerate(served):
            got = step(rd, plan, s, int(plan.bucket[s]))
            assert sorted(got) == sorted(want), kind
            for k, v in want.items():
                np.testing.assert_array_equal(_host(got[k]), v, err_msg=f"{kind} step {s} {k}")


def _oracle_patches(imgs, idx, aug, p, t):
    """[(row (t, p·p·3) uint8, its grid (gh, gw))] of samples `idx`: the random crop and flip `sample`
    draws, resized by the oracle to its sequence size (through pixel_ops' program of the ops
    `aug.ops` decide for (seed, epoch 0, index), if any, at that size), patch (gy, gx) at row
    gy·gw + gx, zeros after."""
    boxes, flips = sample(aug, np.asarray(idx, np.int64), geometry=_geometry(imgs), seed=SEED, epoch=0)
    out = []
    for i, box, flip in zip(idx, boxes, flips):
        hh, ww = (int(v[0]) for v in naflex.sequence_size(box[2:3], box[3:4], p, t))
        img = oracle.crop_resize(imgs[i], box, hh, ww)
        img = img[:, ::-1] if flip else img
        if aug.ops:
            codes, args = decide(aug.ops, np.array([i]), seed=SEED, epoch=0)
            img = _ops_applied(img[None], codes, args, aug.ops)[0]
        gh, gw = hh // p, ww // p
        want = np.zeros((t, p * p * 3), np.uint8)
        want[: gh * gw] = [img[y * p : y * p + p, x * p : x * p + p].reshape(-1) for y in range(gh) for x in range(gw)]
        out.append((want, (gh, gw)))
    return out


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_naflex_patch_sequences_are_the_oracle_crops_patchified(matrix, kind, layout):
    """The "NaFlex" row: each sample's random crop and flip (as the RRC row draws them) resized
    to its sequence size by the oracle and laid out patch by patch in raster order, (py, px, c)
    inside a patch, zeros after; patch_yx/patch_valid the grid's."""
    files, refs = matrix
    p, t = 4, 12
    aug = tbljax.Augment(size=None)
    kw = dict(seed=SEED, dtype="uint8", augment=aug, num_epochs=1, drop_remainder=False, **serve(kind))
    patches = tbljax.Patches(size=p, max_tokens=t)
    seen = []
    for batch in tbljax.loader(files[kind, layout], B, patches=patches, **kw):
        idx, valid, image = (_host(batch[k]) for k in ("index", "valid", "image"))
        yx, pv = _host(batch["patch_yx"]), _host(batch["patch_valid"])
        for r, (want, grid) in enumerate(_oracle_patches(refs[kind, layout], idx[valid], aug, p, t)):
            np.testing.assert_array_equal(image[r], want, err_msg=f"{kind} {idx[r]}")
            assert yx[r].tolist() == [
                [k // grid[1], k % grid[1]] if k < grid[0] * grid[1] else [0, 0] for k in range(t)
            ]
            assert pv[r].tolist() == [k < grid[0] * grid[1] for k in range(t)]
        assert not image[~valid].any() and not pv[~valid].any()
        fields = {k: v for k, v in _jax_fields(batch).items() if k not in ("patch_yx", "patch_valid")}
        check_fields(kind, fields, np.where(valid, idx, -1), "patches")
        seen += idx[valid].tolist()
    assert sorted(seen) == list(range(M.N))


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_packed_naflex_sequences_hold_the_oracle_resizes_first_fit_decreasing(matrix, kind, layout, monkeypatch):
    """The "packed NaFlex" row: each record, whole and flipped as the flip row draws it, resized
    to its sequence size at image_tokens by the oracle and patchified, at its segment's tokens;
    the sequences' records those of first-fit-decreasing over the epoch's order (`naflex.pack`
    on the records' token counts); the fields per segment, each its record's source values.
    Every step taken as cold, so each step's packed records are read ahead."""
    files, refs = matrix
    monkeypatch.setattr(RecordSource, "resident", lambda self, indices: False)
    p, t, c = 4, 12, 4
    imgs = refs[kind, layout]
    kw = dict(seed=SEED, dtype="uint8", augment="flip", num_epochs=1, drop_remainder=False, **serve(kind))
    patches = tbljax.Patches(size=p, max_tokens=t, pack=True, image_tokens=c, pack_window=4)
    rows = []
    for batch in tbljax.loader(files[kind, layout], B, patches=patches, **kw):
        rows += _packed_rows_hold_the_oracle(kind, imgs, batch, p, c)
        fields = {k: v for k, v in _jax_fields(batch).items() if k not in naflex_pack.PACK_KEYS}
        flat = {
            k: [x for row in v for x in row] if isinstance(v, list) else v.reshape(-1, *v.shape[2:])
            for k, v in fields.items()
        }
        check_fields(kind, flat, _host(batch["segment_index"]).reshape(-1), "pack")
    assert rows == _packing_by_sequence(imgs, p, t, c, len(rows))


def _packed_rows_hold_the_oracle(kind, imgs, batch, p, c):
    """Each packed image of `batch` is its record, whole and flipped as the flip row draws it,
    resized by the oracle to its sequence size at `c` tokens and patchified, at its segment's
    tokens; zeros elsewhere. Returns each sequence's records, by offset."""
    h, w = np.array([im.shape[0] for im in imgs]), np.array([im.shape[1] for im in imgs])
    th, tw = naflex.sequence_size(h, w, p, c)
    image, seg, index = (_host(batch[k]) for k in ("image", "segment_ids", "segment_index"))
    rows = []
    for r in range(len(image)):
        rows.append(index[r][index[r] >= 0].tolist())
        for k, i in enumerate(index[r].tolist()):
            if i < 0:
                continue
            img = oracle.crop_resize(imgs[i], (0, 0, h[i], w[i]), int(th[i]), int(tw[i]))
            flip = sample(tbljax.Augment(crop=False), np.array([i]), geometry=_geometry(imgs), seed=SEED, epoch=0)[1]
            want = naflex.patchify(img[:, ::-1] if flip[0] else img, p, c)[: th[i] // p * (tw[i] // p)]
            np.testing.assert_array_equal(image[r][seg[r] == k + 1], want, err_msg=f"{kind} {i}")
        assert not image[r][seg[r] == 0].any()
    return rows


def _packing_by_sequence(imgs, p, t, c, rows):
    """Epoch 0's `rows` sequences: each the records `naflex.pack` puts there (first-fit-decreasing
    over the epoch's order, windows of 4), by offset; empty past the packing's."""
    h, w = np.array([im.shape[0] for im in imgs]), np.array([im.shape[1] for im in imgs])
    th, tw = naflex.sequence_size(h, w, p, c)
    rec = tbljax.order.permute(np.arange(M.N), M.N, SEED, 0)
    packing = naflex.pack((th // p * (tw // p))[rec], t, 4)
    by_seq = [[] for _ in range(max(rows, packing.sequences))]
    for q in np.lexsort((packing.offset, packing.seq)).tolist():
        by_seq[packing.seq[q]].append(int(rec[q]))
    return by_seq


@pytest.mark.parametrize("kind, backend", [("raw_shorter_side", "ffi"), ("fields", "twin")])
def test_packed_naflex_sequences_in_jit_hold_the_oracle_resizes(matrix, kind, backend):
    """The "packed NaFlex × ResidentDataset jit" row: `pack_plan` and `batch(plan=)` in one jitted
    step, each packed image against the oracle as the packed row checks the loader's, the
    sequences those of `naflex.pack`, the numeric fields per segment the source's values."""
    import jax

    files, refs = matrix
    imgs, p, t, c = refs[kind, "file"], 4, 12, 4
    rd = tbljax.ResidentDataset(files[kind, "file"], **serve(kind))
    patches = tbljax.Patches(size=p, max_tokens=t, pack=True, image_tokens=c, pack_window=4)
    plan = rd.pack_plan(B, patches, seed=SEED)
    kw = dict(batch_size=B, seed=SEED, augment="flip", dtype="uint8", backend=backend)
    step = jax.jit(lambda ds, plan, s: ds.batch(s, plan=plan, **kw))
    rows = []
    for s in range(plan.steps):
        batch = step(rd, plan, s)
        rows += _packed_rows_hold_the_oracle(kind, imgs, batch, p, c)
        index = _host(batch["segment_index"]).reshape(-1)
        flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in _jax_fields(batch).items() if k not in naflex_pack.PACK_KEYS}
        texts = {
            n: [VALUES[i][n] if i >= 0 else e for i in index.tolist()] for n, e in (("caption", ""), ("tags", None))
        }
        check_fields(kind, {**flat, **texts}, index, "resident pack")
    assert rows == _packing_by_sequence(imgs, p, t, c, len(rows))


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_naflex_length_schedule_rows_are_the_oracle_crops_at_each_steps_length(matrix, kind, layout, monkeypatch):
    """The "length schedule" row (`tbljax.HostLoader`, and `tbljax.loader` the same steps as
    global arrays): each
    step one length of the list and tokens_per_batch // length rows; each row the oracle's
    random crop and flip (as the RRC row draws them) resized to its sequence size at that
    length and patchified; every record once an epoch; the fields of each row its record's.
    Every step taken as cold, so each is read ahead (at its own epoch's schedule)."""
    files, refs = matrix
    monkeypatch.setattr(RecordSource, "resident", lambda self, indices: False)
    imgs = refs[kind, layout]
    aug = tbljax.Augment(size=None)
    patches = tbljax.Patches(size=4, max_tokens=[4, 12], tokens_per_batch=24, batch_divisor=1)
    kw = dict(
        batch_size=6,
        patches=patches,
        seed=SEED,
        dtype="uint8",
        augment=aug,
        drop_remainder=False,
        num_epochs=3,  # epoch 2's steps start at other positions than epoch 0's
        **serve(kind),
    )
    seen = {0: [], 1: [], 2: []}
    host = list(tbljax.HostLoader(tbljax.open(files[kind, layout]), tbljax.LoaderOptions(**kw)))
    jax_batches = list(tbljax.loader(files[kind, layout], **kw))
    assert len(jax_batches) == len(host)
    for hb, jb in zip(host, jax_batches):  # tbljax.loader: the same steps as global arrays
        for name, want in [("image", hb.image), ("index", hb.index)] + [(k, v[0]) for k, v in hb.fields.items()]:
            np.testing.assert_array_equal(np.asarray(jb[name]), want, err_msg=name)
    for hb in host:
        t = hb.image.shape[1]
        assert hb.image.shape == (24 // t, t, 48)
        valid = hb.valid
        idx = hb.index[valid]
        boxes, flips = sample(aug, idx, geometry=_geometry(imgs), seed=SEED, epoch=hb.epoch)
        for r, (i, box, flip) in enumerate(zip(idx, boxes, flips)):
            hh, ww = (int(v[0]) for v in naflex.sequence_size(box[2:3], box[3:4], 4, t))
            img = oracle.crop_resize(imgs[i], box, hh, ww)
            np.testing.assert_array_equal(hb.image[r], naflex.patchify(img[:, ::-1] if flip else img, 4, t))
        assert not hb.image[~valid].any()
        fields = {k: v[0] for k, v in hb.fields.items() if k not in ("patch_yx", "patch_valid")} | hb.texts
        check_fields(kind, fields, np.where(valid, hb.index, -1), "length schedule")
        seen[hb.epoch] += idx.tolist()
    assert all(sorted(seen[e]) == list(range(M.N)) for e in seen)
    if kind == "compact_full_aspect" and layout == "file":  # in jit (the FFI handler on CPU): each step the loader's
        import jax

        rd = tbljax.ResidentDataset(files[kind, layout], **serve(kind))
        kw = dict(batch_size=6, seed=SEED, augment=aug, dtype="uint8")
        step = jax.jit(lambda ds, p, s, t: ds.batch(s, plan=p, max_tokens=t, **kw), static_argnums=3)
        got = []
        for epoch in range(3):
            plan = rd.length_plan(patches, seed=SEED, epoch=epoch)
            got += [step(rd, plan, s, int(plan.length[s])) for s in range(plan.steps)]
        assert len(got) == len(jax_batches)
        for s, (g, want) in enumerate(zip(got, jax_batches)):
            assert sorted(g) == sorted(want), kind
            for k, v in want.items():
                np.testing.assert_array_equal(_host(g[k]), _host(v), err_msg=f"{kind} step {s} {k}")


# The per-image ops with native resolution: RandAugment's default ops (affine ones too, their
# matrices at each row's own size), on some rows only.
NATIVE_OPS = [tbljax.RandAugment(num_ops=2, magnitude=9, prob=0.7)]
# One cell per path the kernel takes (gather, gather_variable, jpeg_boxes over RAW and JPEG
# records, decode), both layouts: the rows of combinations each path serves alike.
PATH_CELLS = [
    ("raw_square", "file"),
    ("raw_shorter_side", "shards"),
    ("compact_raw_budget", "file"),
    ("lz4", "shards"),
]


def _native_rows(native, path, imgs, kind):
    """(record, epoch, served row, the oracle's image before the ops, image -> row) of every
    record served with NATIVE_OPS under `native`: "buckets", "patches" (one max_tokens),
    "schedule" (a length schedule, HostLoader) or "pack" (packed sequences, per segment)."""
    geo, p = _geometry(imgs), 4
    kw = dict(seed=SEED, dtype="uint8", drop_remainder=False, **serve(kind))
    whole = tbljax.Augment(crop=False, size=None, ops=NATIVE_OPS)  # buckets and packing: no crop
    crop = tbljax.Augment(size=None, ops=NATIVE_OPS)  # patches: RRC's random crop and flip
    if native == "buckets":
        b_kw = dict(buckets=tbljax.Buckets(sizes=BUCKET_SIZES, crop="center"), augment=whole, num_epochs=1)
        for b in tbljax.loader(path, B, **b_kw, **kw):
            idx, valid, image = (_host(b[k]) for k in ("index", "valid", "image"))
            for r in np.flatnonzero(valid):
                want = _bucket_crop(imgs[idx[r]], BUCKET_SIZES)[2]
                flip = tba.flips(idx[r : r + 1], seed=SEED, epoch=0)[0]
                yield int(idx[r]), 0, image[r], want[:, ::-1] if flip else want, lambda x: x
    elif native in ("patches", "schedule"):
        if native == "patches":
            t_kw = dict(patches=tbljax.Patches(size=p, max_tokens=12), augment=crop, num_epochs=1)
            steps = [(0, _host(b["index"]), _host(b["image"])) for b in tbljax.loader(path, B, **t_kw, **kw)]
        else:
            lengths = tbljax.Patches(size=p, max_tokens=[4, 12], tokens_per_batch=24, batch_divisor=1)
            opts = tbljax.LoaderOptions(batch_size=6, patches=lengths, augment=crop, num_epochs=2, **kw)
            steps = [(hb.epoch, hb.index, hb.image) for hb in tbljax.HostLoader(tbljax.open(path), opts)]
        for epoch, idx, image in steps:
            t = image.shape[1]
            boxes, flips = sample(crop, idx[idx >= 0], geometry=geo, seed=SEED, epoch=epoch)
            for r, (i, box, flip) in enumerate(zip(idx[idx >= 0], boxes, flips)):
                hh, ww = (int(v[0]) for v in naflex.sequence_size(box[2:3], box[3:4], p, t))
                want = oracle.crop_resize(imgs[i], box, hh, ww)
                yield int(i), epoch, image[r], want[:, ::-1] if flip else want, lambda x, t=t: naflex.patchify(x, p, t)
    else:
        packing = tbljax.Patches(size=p, max_tokens=12, pack=True, image_tokens=4, pack_window=4)
        for b in tbljax.loader(path, B, patches=packing, augment=whole, num_epochs=1, **kw):
            image, seg, index = (_host(b[k]) for k in ("image", "segment_ids", "segment_index"))
            for r, k in zip(*np.nonzero(index >= 0)):
                i = int(index[r, k])
                h, w = imgs[i].shape[:2]
                th, tw = (int(v[0]) for v in naflex.sequence_size(np.array([h]), np.array([w]), p, 4))
                want = oracle.crop_resize(imgs[i], (0, 0, h, w), th, tw)
                flip = sample(whole, np.array([i]), geometry=geo, seed=SEED, epoch=0)[1][0]
                tokens = th // p * (tw // p)
                yield (
                    i,
                    0,
                    image[r][seg[r] == k + 1],
                    want[:, ::-1] if flip else want,
                    lambda x, n=tokens: naflex.patchify(x, p, 4)[:n],
                )


@pytest.mark.parametrize("native", ["buckets", "patches", "schedule", "pack"])
@pytest.mark.parametrize("kind,layout", PATH_CELLS, ids=[f"{k}-{layout}" for k, layout in PATH_CELLS])
def test_per_image_ops_with_buckets_patches_a_length_schedule_and_packing(matrix, kind, layout, native):
    """The "native ops" row: with buckets, NaFlex patches, a length schedule and packing, each
    row (each packed image) is pixel_ops' program of the ops decided for (seed, epoch, index),
    run on the oracle's image at that row's own size (the bucket's; the sequence size of its
    crop at the row's length; of the whole record at image_tokens), then laid out as served;
    every record once an epoch."""
    files, refs = matrix
    rows = list(_native_rows(native, files[kind, layout], refs[kind, layout], kind))
    for epoch in sorted({e for _, e, *_ in rows}):
        assert sorted(i for i, e, *_ in rows if e == epoch) == list(range(M.N)), epoch
    drawn = 0
    for i, epoch, got, plain, to_row in rows:
        codes, args = decide(NATIVE_OPS, np.array([i]), seed=SEED, epoch=epoch)
        want = to_row(_ops_applied(plain[None], codes, args, NATIVE_OPS)[0])
        np.testing.assert_array_equal(got, want, err_msg=f"{native}: record {i}, epoch {epoch}")
        drawn += int(codes.any())
    assert drawn > 0


PATCHES = tbljax.Patches(size=4, max_tokens=12)
PATCH_KEYS = ("image", "patch_yx", "patch_valid")


def _whole_patch_rows(path, epochs=1, **kw) -> dict[tuple[int, int], list[np.ndarray]]:
    """{(epoch, record): [image, patch_yx, patch_valid]} of the whole-dataset loader at PATCHES
    (HostLoader, every record in one step): what a host part's or a mixture's row must equal."""
    opts = tbljax.LoaderOptions(batch_size=M.N, patches=PATCHES, seed=SEED, dtype="uint8", num_epochs=epochs, **kw)
    return {
        (hb.epoch, int(i)): [hb.image[r], *(hb.fields[k][0][r] for k in PATCH_KEYS[1:])]
        for hb in tbljax.HostLoader(tbljax.open(path), opts)
        for r, i in enumerate(hb.index)
    }


def _check_patch_rows(hb, want, where, epoch=None):
    """Each row of HostBatch `hb` against `want` (keyed (epoch, index) by default), padding rows
    empty; returns the rows' indices."""
    served = []
    for r, i in enumerate(hb.index.tolist()):
        got = [hb.image[r], *(hb.fields[k][0][r] for k in PATCH_KEYS[1:])]
        if i < 0:
            assert not got[0].any() and not got[2].any(), where
            continue
        for a, b, k in zip(got, want[(hb.epoch if epoch is None else epoch, i)], PATCH_KEYS):
            np.testing.assert_array_equal(a, b, err_msg=f"{where}: record {i} {k}")
        served.append(i)
    return served


@pytest.mark.parametrize("kind,layout", PATH_CELLS, ids=[f"{k}-{layout}" for k, layout in PATH_CELLS])
def test_patches_over_host_parts_serve_the_whole_dataset_loaders_rows(matrix, kind, layout):
    """The "patches over host parts" row: partition="host" at two ranks (threads exchanging
    their parts' sizes), each reading its `tbljax.host_part` (a shard file; a single file's
    records): every row, with its random crop and flip, the whole-dataset loader's row for that
    record, patch keys included; every record once an epoch over the ranks."""
    files, _ = matrix
    path = files[kind, layout]
    kw = dict(augment=tbljax.Augment(size=None), drop_remainder=False, **serve(kind))
    want = _whole_patch_rows(path, epochs=2, **kw)
    if layout == "shards":  # whole files: the records of the rank's file
        ends = np.cumsum([0] + [len(tbljax.open(f)) for f in path])
        part = [range(ends[f], ends[f + 1]) for f in (tbljax.host_part(2, r, 2)[0] for r in (0, 1))]
    else:
        part = [tbljax.host_part(M.N, r, 2) for r in (0, 1)]
    opts = tbljax.LoaderOptions(batch_size=4, patches=PATCHES, seed=SEED, dtype="uint8", num_epochs=2, **kw)
    seen = {0: [], 1: []}
    for rank, batches in enumerate(two_host_parts(path, opts)):
        for hb in batches:
            served = _check_patch_rows(hb, want, f"rank {rank} epoch {hb.epoch}")
            assert set(served) <= set(part[rank]), rank
            seen[hb.epoch] += served
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(M.N))


def test_patches_over_a_mixture_and_its_host_parts_serve_each_sources_rows(matrix, mixed):
    """The "patches over a mixture" row: `tbljax.mix` of a RAW square file and compact
    full-aspect shards, served whole (no augmentation), by `tbljax.loader` and by the mixture's
    host parts at two ranks: each row is its source's record as that source alone serves it."""
    files, _ = matrix
    mixture, _ = mixed
    cells = {"square": ("raw_square", "file"), "full": ("compact_full_aspect", "shards")}
    want = {}  # (0, mixture index) -> the source alone's row of that record
    for k, name in enumerate(mixture.sources):
        for (_, r), row in _whole_patch_rows(files[cells[name]]).items():
            want[0, int(mixture.offsets[k]) + r] = row
    served = []
    for b in tbljax.loader(mixture, 8, patches=PATCHES, seed=SEED, dtype="uint8", num_epochs=1):
        hb = types.SimpleNamespace(index=_host(b["index"]), image=_host(b["image"]), epoch=0)
        hb.fields = {k: [_host(b[k])] for k in PATCH_KEYS[1:]}
        served += _check_patch_rows(hb, want, "mixture")
    opts = tbljax.LoaderOptions(batch_size=8, patches=PATCHES, seed=SEED, dtype="uint8", num_epochs=1)
    for rank, batches in enumerate(two_host_parts(mixture, opts)):
        for hb in batches:
            served += _check_patch_rows(hb, want, f"mixture rank {rank}", epoch=0)
    assert len(served) == 2 * 5 * 8 and {i >= M.N for i in served} == {False, True}


# ---- torch, MLX, the dataset on device ----


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_per_image_ops_and_checked_records(matrix, kind, layout):
    """The "ops" and "verify_records" rows: an Invert-only RandAugment applied to every row is
    255 minus the oracle's crop, on every kind; checking every record as it is served changes
    no byte (every kind here is written with per-record checksums)."""
    files, refs = matrix
    invert = tbljax.Augment(size=M.OUT, ops=[tbljax.RandAugment(num_ops=1, ops=["Invert"], prob=1.0)])
    kw = dict(seed=SEED, dtype="uint8", num_epochs=1, **serve(kind))
    for batch in tbljax.loader(files[kind, layout], B, augment=invert, verify_records=True, **kw):
        idx = _host(batch["index"])
        np.testing.assert_array_equal(_host(batch["image"]), 255 - expected(refs[kind, layout], idx, RRC))


# Every per-image op class at once (codes 1-26, nearest and bilinear; hue: 26): one batch a cell.
POLICY_OPS = [
    tbljax.TrivialAugment(),
    tbljax.ThreeAugment(),
    tbljax.ColorJitter(0.3, 0.3, 0.3, hue=0.1),
    tbljax.Grayscale(p=0.3),
]
POLICY_OPS_2 = [tbljax.Solarize(p=0.5), tbljax.GaussianBlur(p=0.5), tbljax.RandAugment.from_big_vision("randaug(2,15)")]


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_every_policy_class(matrix, kind, layout):
    """The "policy ops" row: every op class served equals pixel_ops applied, slot by slot with
    its policy's fill and interpolation, to the oracle's crop (first batch of each cell)."""
    files, refs = matrix
    for ops in (POLICY_OPS, POLICY_OPS_2):
        aug = tbljax.Augment(size=M.OUT, ops=ops)
        loader = tbljax.loader(files[kind, layout], B, augment=aug, seed=SEED, dtype="uint8", **serve(kind))
        batch = next(iter(loader))
        loader.close()
        idx = _host(batch["index"])
        codes, args = decide(ops, idx.astype(np.int64), seed=SEED, epoch=0)
        want = _ops_applied(expected(refs[kind, layout], idx, aug), codes, args, ops)
        np.testing.assert_array_equal(_host(batch["image"]), want)


def _ops_applied(imgs, codes, args, ops) -> np.ndarray:
    """Each uint8 row of `imgs` through pixel_ops, slot by slot with its policy's fill and
    interpolation: the NumPy rule of the per-image ops."""
    slots = [p for p in ops for _ in range(getattr(p, "num_slots", getattr(p, "num_ops", 1)))]
    want = []
    for img, cs, a_s in zip(imgs, codes, args):
        for code, arg, p in zip(cs.tolist(), a_s.tolist(), slots):
            if code:
                kw = {k: getattr(p, k) for k in ("fill", "interpolation") if hasattr(p, k)}
                img = pixel_ops.apply(img, code, arg, **kw)
        want.append(img)
    return np.stack(want)


# One affine op (the twin's float64 matrices: x64) and two colour ops, each row two of them.
TWIN_OPS = [tbljax.RandAugment(num_ops=2, magnitude=9, ops=["Rotate", "Solarize", "Color"], prob=1.0)]


@pytest.mark.parametrize("kind", ["raw_square", "raw_shorter_side"], ids=["one-size", "packed"])
@pytest.mark.parametrize("backend", ["ffi", "twin"])
def test_gather_normalize_runs_per_image_ops_on_either_backend_as_pixel_ops(matrix, backend, kind):
    """The "twin ops" row: `gather_normalize(ops=pixel_program(...))` in jit, under x64 (the
    twin's affine op needs it), over a `ResidentDataset`'s records (one size, and a
    `PackedRecords` of full-aspect ones): pixel_ops' program of the oracle's crop, normalized by
    the contract, on the FFI handler and on the twin -- so the twin's bytes are the handler's."""
    import jax

    files, refs = matrix
    aug = tbljax.Augment(size=M.OUT, ops=TWIN_OPS)
    data = tbljax.ResidentDataset(files[kind, "file"]).data
    assert isinstance(data, tbljax.ops.PackedRecords) == (kind in FULL_ASPECT)
    idx = np.array([0, 3, 5, 9, 2, 7])
    crops, flips = sample(aug, idx, geometry=_geometry(refs[kind, "file"]), seed=SEED, epoch=0)
    codes, args = decide(aug.ops, idx, seed=SEED, epoch=0)
    assert np.isin(codes, sorted(pixel_ops.AFFINE)).any()
    want = _ops_applied(expected(refs[kind, "file"], idx, aug), codes, args, aug.ops)
    want = oracle.normalize(want, MEAN, STD, np.float32)

    def step(d, i, c, f, co, a):
        prog = tbljax.ops.pixel_program(co, a, M.OUT, policies=tuple(aug.ops))
        return tbljax.ops.gather_normalize(
            d, i, crop=c, flip=f, out_size=M.OUT, ops=prog, backend=backend, mean=MEAN, std=STD
        )

    with jax.enable_x64(True):
        got = np.asarray(jax.jit(step)(data, idx.astype(np.int32), crops.astype(np.int32), flips, codes, args))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_torch(matrix, kind, layout):
    pytest.importorskip("torch")
    import tbljax.torch

    files, refs = matrix
    for b in tbljax.torch.loader(
        files[kind, layout], B, seed=SEED, dtype="uint8", layout="NHWC", augment=RRC, **serve(kind)
    ):
        idx = b.index.numpy()
        np.testing.assert_array_equal(b.images.numpy(), expected(refs[kind, layout], idx, RRC))
        check_fields(kind, {k: v if isinstance(v, list) else v.numpy() for k, v in b.fields.items()}, idx, "torch")


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_mlx(matrix, kind, layout):
    pytest.importorskip("mlx.core")
    import tbljax.mlx

    files, refs = matrix
    for b in tbljax.mlx.loader(files[kind, layout], B, seed=SEED, dtype="uint8", augment=RRC, **serve(kind)):
        idx = np.array(b.index)
        np.testing.assert_array_equal(np.array(b.images), expected(refs[kind, layout], idx, RRC))
        check_fields(kind, {k: v if isinstance(v, list) else np.array(v) for k, v in b.fields.items()}, idx, "mlx")
    with pytest.raises(ValueError, match="partition=None only"):
        tbljax.mlx.loader(files[kind, layout], B, partition="host")


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_torch_and_mlx_mixup(matrix, kind, layout):
    """The "mixup" row: each kind served with mixup= equals `tbljax.ops.mixup_cutmix` (jit) on the
    oracle's rows and the source's labels (record i's label is i), keyed by the step."""
    pytest.importorskip("torch")
    pytest.importorskip("mlx.core")
    import tbljax.mlx
    import tbljax.torch
    from tbljax import ops

    files, refs = matrix
    kw = dict(seed=SEED, dtype="uint8", augment=RRC, mixup=ops.Mixup(num_classes=M.N, mode="pair"), **serve(kind))
    for ld, host in (
        (tbljax.torch.loader(files[kind, layout], B, layout="NHWC", **kw), lambda t: t.numpy()),
        (tbljax.mlx.loader(files[kind, layout], B, **kw), np.array),
    ):
        for s, b in enumerate(ld):
            idx = host(b.index)
            x, t = ops.mixup_cutmix(
                expected(refs[kind, layout], idx, RRC), idx, seed=SEED, step=s, num_classes=M.N, mode="pair"
            )
            np.testing.assert_array_equal(host(b.images), np.asarray(x), err_msg=f"{type(ld).__name__} {s}")
            np.testing.assert_array_equal(host(b.labels), np.asarray(t), err_msg=f"{type(ld).__name__} {s}")


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_resident_dataset_inside_jit(matrix, kind, layout):
    import jax

    files, refs = matrix
    rd = tbljax.ResidentDataset(files[kind, layout], **serve(kind))
    # The "ops in jit" row rides in the same program, once per record kind (its file cell): the
    # per-image ops drawn and run in jit (an Invert-only RandAugment: 255 minus the oracle's crop).
    # The "patches × ResidentDataset jit" row too: NaFlex rows of the RRC row's crop and flip
    # (Augment(size=None)), against the NaFlex row's oracle; and the "ops × patches in jit" row:
    # those rows through NATIVE_OPS at each row's own size (the CPU FFI handler).
    invert = tbljax.Augment(size=M.OUT, ops=[tbljax.RandAugment(num_ops=1, ops=["Invert"], prob=1.0)])
    augs = (RRC, invert) if layout == "file" else (RRC,)
    nf, p, t = tbljax.Augment(size=None), 4, 12
    nf_augs = (nf,) if layout == "file" else ()
    if kind == "compact_full_aspect" and layout == "file":  # one cell: ~1 s of jit
        nf_augs += (tbljax.Augment(size=None, ops=NATIVE_OPS),)
    patches = tbljax.Patches(size=p, max_tokens=t)

    def run(ds, s):
        extra = [ds.batch(s, batch_size=B, seed=SEED, augment=a, dtype="uint8", patches=patches) for a in nf_augs]
        return [ds.batch(s, batch_size=B, seed=SEED, augment=a, dtype="uint8") for a in augs], extra

    step = jax.jit(run)
    for s in range(M.N // B):
        (batch, *inverted), naflex_rows = step(rd, s)
        for nb, a in zip(naflex_rows, nf_augs):
            rows = _oracle_patches(refs[kind, layout], _host(nb["index"]), a, p, t)
            np.testing.assert_array_equal(_host(nb["image"]), np.stack([r for r, _ in rows]), err_msg=kind)
            np.testing.assert_array_equal(_host(nb["patch_valid"]).sum(1), [gh * gw for _, (gh, gw) in rows])
        idx = _host(batch["index"])
        np.testing.assert_array_equal(_host(batch["image"]), expected(refs[kind, layout], idx, RRC))
        for b in inverted:
            np.testing.assert_array_equal(_host(b["index"]), idx)
            np.testing.assert_array_equal(_host(b["image"]), 255 - expected(refs[kind, layout], idx, RRC))
        if kind == "fields":  # the numeric fields, drawn in jit by the same indices
            got = _jax_fields(batch)
            assert sorted(got) == ["emb", "tok", "tok_length"]
            check_fields(
                kind,
                {**got, "caption": [VALUES[i]["caption"] for i in idx], "tags": [VALUES[i]["tags"] for i in idx]},
                idx,
                "resident",
            )


def test_ops_on_naflex_rows_in_jit_on_the_twin_hold_the_oracle(matrix):
    # The "ops × patches in jit" row on the pure-JAX twin (token space, x64 for the affine ops):
    # NATIVE_OPS on each NaFlex row at its own size, against the NaFlex row's oracle, on the cell
    # where test_resident_dataset_inside_jit runs the same row on the CPU FFI handler.
    import jax

    files, refs = matrix
    cell, aug, p, t = ("compact_full_aspect", "file"), tbljax.Augment(size=None, ops=NATIVE_OPS), 4, 12
    kw = dict(batch_size=B, seed=SEED, augment=aug, dtype="uint8", patches=tbljax.Patches(size=p, max_tokens=t))
    with jax.enable_x64(True):
        rd = tbljax.ResidentDataset(files[cell], **serve(cell[0]))
        step = jax.jit(lambda ds, s: ds.batch(s, backend="twin", **kw))
        for s in range(M.N // B):
            nb = step(rd, s)
            rows = _oracle_patches(refs[cell], _host(nb["index"]), aug, p, t)
            np.testing.assert_array_equal(_host(nb["image"]), np.stack([r for r, _ in rows]), err_msg=f"step {s}")
            np.testing.assert_array_equal(_host(nb["patch_valid"]).sum(1), [gh * gw for _, (gh, gw) in rows])


# ---- host-local reading in two real processes ----


def test_host_partition_in_two_processes_serves_the_one_process_crops(matrix, tmp_path):
    pytest.importorskip("torch")
    files, refs = matrix
    spec = tmp_path / "spec.json"
    names = {f"{k}-{layout}": (k, layout) for k, layout in CELLS}
    spec.write_text(
        json.dumps(
            {
                "datasets": {n: files[c] for n, c in names.items()},
                "serve": {n: serve(c[0]) for n, c in names.items()},
                "batch": 2,
                "seed": SEED,
                "out": list(M.OUT),
            }
        )
    )
    outs = _two_jobs.run(Path(__file__).with_name("_matrix_worker.py"), spec, tmp_path)
    for name, cell in names.items():
        for framework in ("jax", "torch"):
            key = f"{name}|{framework}"
            errors = [str(o[key + "|error"]) for o in outs if key + "|error" in o]
            assert errors == [], (key, errors)
            served = []
            for o in outs:
                idx, img = o[key + "|index"], o[key + "|image"]
                np.testing.assert_array_equal(img, expected(refs[cell], idx, RRC), err_msg=key)
                check_fields(
                    cell[0],
                    {
                        k.split("|")[-1]: (json.loads(str(v)) if v.dtype.kind == "U" else v)
                        for k, v in o.items()
                        if k.startswith(key + "|field|")
                    },
                    idx,
                    key,
                )
                served += idx.tolist()
            # Each process serves its own part: whole records, none twice (drop_remainder).
            assert len(served) == len(set(served)) and set(served) <= set(range(M.N)), key


# ---- the tools ----


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_show_draws_what_the_loader_serves(matrix, kind, layout):
    files, refs = matrix
    grid, captions = tbljax.show.sample_grid(files[kind, layout], count=3, columns=3, augment=RRC, seed=SEED)
    oh, ow = M.OUT
    want = expected(refs[kind, layout], [0, 1, 2], RRC)
    for k in range(3):
        np.testing.assert_array_equal(grid[1 : 1 + oh, 1 + k * (ow + 2) : 1 + k * (ow + 2) + ow], want[k])
    assert captions == ["0: 0", "1: 1", "2: 2"]


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_bench(matrix, kind, layout):
    files, _ = matrix
    report = tbljax.bench(files[kind, layout], batch_size=B, steps=2, augment=RRC, dtype="uint8", **serve(kind))
    assert report.produce_img_s > 0 and report.consumed_img_s > 0
    if kind in FULL_ASPECT:  # no output size: the documented error, naming what to pass
        with pytest.raises(ValueError, match="different sizes"):
            tbljax.bench(files[kind, layout], batch_size=B, steps=2)


def _info(where) -> list[dict]:
    import contextlib
    import io

    from tbljax._src.tools.cli import main

    paths = [where] if isinstance(where, str) else where
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["info", "--json", *paths]) == 0
    return [json.loads(line) for line in buf.getvalue().splitlines()]  # one object a file


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_info_and_verify(matrix, kind, layout):
    from tbljax._src.tools.cli import main

    files, refs = matrix
    paths = [files[kind, layout]] if layout == "file" else files[kind, layout]
    ref, lo = refs[kind, layout], 0
    for info in _info(paths):
        mine = ref[lo : lo + info["records"]]
        lo += info["records"]
        sizes = {}
        for im in mine:
            sizes[f"{im.shape[0]}x{im.shape[1]}"] = sizes.get(f"{im.shape[0]}x{im.shape[1]}", 0) + 1
        shown = info["record_sizes_hxw"]  # the 5 most common served sizes
        assert len(shown) == min(5, len(sizes)) and all(sizes[k] == n for k, n in shown.items())
        raw = sum(im.size for im in mine)
        assert info["ratio_to_raw"] == round(info["stored_payload_bytes"] / raw, 4)
        if kind == "fields":  # each field with its kind, dtype, shape and bytes
            f = info["fields"]
            assert (f["emb"]["kind"], f["emb"]["dtype"], f["emb"]["shape"]) == ("ndarray", "float16", [3])
            assert f["emb"]["bytes"] == info["records"] * 3 * 2 and f["tok"]["shape"] == [None]
            assert f["caption"]["kind"] == "str" and f["tags"]["kind"] == "json"
        else:
            assert not info.get("fields")
    assert lo == M.N
    assert main(["verify", *paths]) == 0


@pytest.mark.parametrize("kind,layout", CELLS, ids=IDS)
def test_tbl_to_raw_keeps_the_served_pixels(matrix, kind, layout, tmp_path):
    files, refs = matrix
    dst = tmp_path / "raw.tbl"
    tbljax.convert(files[kind, layout], dst, format="raw", progress=False)
    out = tbljax.open(dst)
    assert out.record_format == "raw" and out.labels.tolist() == list(range(M.N))
    for i, want in enumerate(refs[kind, layout]):
        np.testing.assert_array_equal(out.read(i), want)
    if kind == "fields":  # carried, every value as the source held it
        assert list(out.field("caption")) == [v["caption"] for v in VALUES]
        assert list(out.field("tags")) == [v["tags"] for v in VALUES]
        np.testing.assert_array_equal(out.field("emb"), np.stack([v["emb"] for v in VALUES]))
        assert [t.tolist() for t in out.field("tok")] == [v["tok"].tolist() for v in VALUES]
    else:
        assert out.fields == {}


# ---- the mixture row: two sources of other kinds and geometries, mixed by weight ----

MIX_WEIGHTS = {"square": 0.75, "full": 0.25}  # dyadic: the quotas are exact fractions


@pytest.fixture(scope="module")
def mixed(matrix):
    files, refs = matrix
    cells = {"square": ("raw_square", "file"), "full": ("compact_full_aspect", "shards")}
    mixture = tbljax.mix({n: files[c] for n, c in cells.items()}, weights=MIX_WEIGHTS, steps_per_epoch=5)
    return mixture, [img for n in mixture.sources for img in refs[cells[n]]]


def _mixed_expected(mixture, ref, idx, source, step, epoch=0):
    """The oracle's rows, each crop keyed by the pass over its source the row's draw is in:
    with G=8 and weights 3/4, 1/4 a step holds 6 and 2 rows, so the passes over the 10-record
    sources are whole steps' draws: pass = (global step * quota) // n."""
    quota = {0: 6, 1: 2}
    rows = []
    for i, k in zip(idx.tolist(), source.tolist()):
        g = epoch * 5 + step
        q = (g * quota[k] + (quota[k] - 1)) // M.N  # the pass of the step's last draw ...
        q0 = (g * quota[k]) // M.N  # ... and of its first
        boxes = [sample(RRC, np.array([i]), geometry=_geometry(ref), seed=SEED, epoch=p) for p in sorted({q0, q})]
        rows.append([oracle.gather(ref, [i], M.OUT, crop=b, flip=f) for b, f in boxes])
    return rows


def test_mixture_row_loader_torch_mlx_show_bench(mixed):
    pytest.importorskip("torch")
    pytest.importorskip("mlx.core")
    import tbljax.mlx
    import tbljax.torch

    mixture, ref = mixed
    assert len(mixture) == 2 * M.N and mixture.sources == ["square", "full"]
    seen = {0: [], 1: []}
    for step, batch in enumerate(tbljax.loader(mixture, 8, seed=SEED, dtype="uint8", augment=RRC, num_epochs=1)):
        idx, source, img = (_host(batch[k]) for k in ("index", "source", "image"))
        assert np.bincount(source, minlength=2).tolist() == [6, 2]
        assert ((source == 0) == (idx < M.N)).all()  # index is in the mixture's numbering
        for row, options in zip(img, _mixed_expected(mixture, ref, idx, source, step)):
            assert any(np.array_equal(row, o[0]) for o in options)
        for k in (0, 1):
            seen[k] += idx[source == k].tolist()
    # Without replacement within a pass: 5 steps draw 30 rows of source 0 (3 passes of 10)
    # and 10 of source 1 (one pass).
    assert sorted(seen[1]) == list(range(M.N, 2 * M.N))
    for p in range(3):
        assert sorted(seen[0][10 * p : 10 * p + 10]) == list(range(M.N))
    jax_rows = [
        (_host(b["index"]), _host(b["image"]))
        for b in tbljax.loader(mixture, 8, seed=SEED, dtype="uint8", augment=RRC, num_epochs=1)
    ]
    torch_rows = [
        (b.index.numpy(), b.images.numpy(), b.source.numpy())
        for b in tbljax.torch.loader(mixture, 8, seed=SEED, dtype="uint8", layout="NHWC", augment=RRC)
    ]
    assert len(torch_rows) == len(jax_rows)
    for (i1, x1), (i2, x2, s2) in zip(jax_rows, torch_rows):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(x1, x2)
        assert ((s2 == 0) == (i2 < M.N)).all()
    mlx_rows = [
        (np.array(b.index), np.array(b.images))
        for b in tbljax.mlx.loader(mixture, 8, seed=SEED, dtype="uint8", augment=RRC)
    ]
    for (i1, x1), (i2, x2) in zip(jax_rows, mlx_rows):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(x1, x2)
    grid, captions = tbljax.show.sample_grid(mixture, count=8, columns=8, augment=RRC, seed=SEED)
    oh, ow = M.OUT
    np.testing.assert_array_equal(grid[1 : 1 + oh, 1 : 1 + ow], jax_rows[0][1][0])
    report = tbljax.bench(mixture, batch_size=8, steps=2, augment=RRC, dtype="uint8")
    assert report.produce_img_s > 0


def test_mixture_resumes_mid_epoch_exactly(mixed):
    mixture, _ = mixed
    kw = dict(seed=SEED, dtype="uint8", augment=RRC, num_epochs=2)
    ld = tbljax.loader(mixture, 8, **kw)
    it = iter(ld)
    for _ in range(7):
        next(it)
    state = ld.state_dict()
    rest = [(_host(b["index"]), _host(b["source"]), _host(b["image"])) for b in it]
    again = tbljax.loader(mixture, 8, **kw)
    again.load_state_dict(state)
    resumed = [(_host(b["index"]), _host(b["source"]), _host(b["image"])) for b in again]
    assert len(rest) == len(resumed) == 3
    for a, b in zip(rest, resumed):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    other = tbljax.mix(
        dict(zip(mixture.sources, mixture.datasets)), weights={"square": 0.5, "full": 0.5}, steps_per_epoch=5
    )
    with pytest.raises(ValueError, match="state is for dataset 'mix20-"):  # other weights
        tbljax.loader(other, 8, **kw).load_state_dict(state)


def test_one_process_of_host_parts_is_the_unpartitioned_mixture(mixed):
    mixture, _ = mixed
    kw = dict(seed=SEED, dtype="uint8", augment=RRC, num_epochs=1)
    of_paths = tbljax.mix(mixture.given, weights=MIX_WEIGHTS, steps_per_epoch=5)
    whole = [(_host(b["index"]), _host(b["image"])) for b in tbljax.loader(mixture, 8, **kw)]
    parts = [(_host(b["index"]), _host(b["image"])) for b in tbljax.loader(of_paths, 8, partition="host", **kw)]
    assert len(whole) == len(parts) == 5
    for (i1, x1), (i2, x2) in zip(whole, parts):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(x1, x2)


def test_mixture_refuses_what_it_does_not_serve_by_name(mixed, matrix):
    mixture, _ = mixed
    files, _ = matrix
    with pytest.raises(ValueError, match="drop_remainder=True"):
        tbljax.loader(mixture, 8, drop_remainder=False, augment=RRC)
    with pytest.raises(ValueError, match="shuffle=False"):
        tbljax.loader(mixture, 8, shuffle=False, augment=RRC)
    with pytest.raises(ValueError, match="repeats=3 is not supported with a mixture"):
        tbljax.loader(mixture, 8, repeats=3, augment=RRC)
    with pytest.raises(ValueError, match="differ in size"):
        tbljax.loader(mixture, 8)  # a full-aspect source and no output size
    with pytest.raises(ValueError, match="ResidentDataset serves one dataset"):
        tbljax.ResidentDataset(mixture)
    opened = tbljax.mix(dict(zip(mixture.sources, mixture.datasets)), weights=MIX_WEIGHTS, steps_per_epoch=5)
    with pytest.raises(TypeError, match=r"sources \['square', 'full'\] are open datasets"):
        tbljax.loader(opened, 8, augment=RRC, partition="host")
    with pytest.raises(ValueError, match="steps_per_epoch=N, or epoch_of"):
        tbljax.mix({"a": files["raw_square", "file"]}, weights={"a": 1})
    with pytest.raises(ValueError, match="weights must name every source"):
        tbljax.mix({"a": files["raw_square", "file"]}, weights={"b": 1}, steps_per_epoch=1)
    with pytest.raises(ValueError, match=r"weights\[.a.\] must be a finite number > 0, got 0"):
        tbljax.mix({"a": files["raw_square", "file"]}, weights={"a": 0}, steps_per_epoch=1)


def test_a_mixture_implements_the_whole_contract(mixed):
    mixture, ref = mixed
    assert isinstance(mixture, RecordDataset) and all(hasattr(mixture, m) for m in members())
    assert len(mixture) == len(ref) and mixture.image_shape is None  # one source is full-aspect
    g = mixture.geometry
    assert [(int(h), int(w)) for h, w in zip(g.heights, g.widths)] == [im.shape[:2] for im in ref]
    for i in (0, M.N - 1, M.N, -1):
        np.testing.assert_array_equal(mixture.read(i), ref[i])
    assert mixture.locate(M.N) == (mixture.datasets[1].paths[0], 0)
    files, offsets, sizes = mixture.byte_ranges(np.arange(len(mixture)))
    assert files.max() == len(mixture.paths) - 1 and (sizes > 0).all()
    assert mixture.labels.tolist() == list(range(M.N)) * 2
    shifted = tbljax.mix(
        dict(zip(mixture.sources, mixture.datasets)), weights=MIX_WEIGHTS, steps_per_epoch=5, label_offset={"full": 100}
    )
    assert shifted.labels.tolist() == list(range(M.N)) + list(range(100, 100 + M.N))
    with pytest.raises(ValueError, match="only uncompressed RAW"):
        mixture.raw_records()
    with pytest.raises(IndexError):
        mixture.read(len(mixture))


def test_mixture_of_host_parts_in_two_processes(matrix, tmp_path):
    """partition="host" over tbljax.mix: each process draws its G/P rows of every step from
    its own part of every source (a shard-file source split by files, a single-file source by
    records), at the weights' shares, the global batch holding both processes' rows, and a
    mid-epoch state resumes exactly; the torch adapter serves the same rows."""
    pytest.importorskip("torch")
    files, refs = matrix
    cells = {"square": ("raw_square", "shards"), "full": ("compact_full_aspect", "file")}
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "sources": {n: files[c] for n, c in cells.items()},
                "weights": MIX_WEIGHTS,
                "steps": 5,
                "batch": 4,
                "seed": SEED,
                "out": list(M.OUT),
                "save_after": 6,
            }
        )
    )
    outs = _two_jobs.run(Path(__file__).with_name("_mixture_worker.py"), spec, tmp_path)
    ref = refs[cells["square"]] + refs[cells["full"]]  # the whole mixture's numbering
    geometry = _geometry(ref)
    shard_ends = np.cumsum([len(tbljax.open(p)) for p in files[cells["square"]]])
    quota, part_n = {0: 3, 1: 1}, {0: 5, 1: 5}  # 4 rows a process: 3/4, 1/4; parts of 5
    for p, o in enumerate(outs):
        assert int(o["len"]) == 5
        idx, source, img = o["jax|index"], o["jax|source"], o["jax|image"]
        assert idx.shape == (10, 4)  # 2 epochs of 5 steps, G/P = 4 rows
        k, r = idx // M.N, idx % M.N
        assert (k == source).all()
        # Shares per step: exactly the weights' over this process's 4 rows.
        assert all(np.bincount(s, minlength=2).tolist() == [3, 1] for s in source)
        # Its own part of every source: the shard file p of "square", records [5p, 5p+5) of
        # the single file of "full".
        assert (np.searchsorted(shard_ends, r[k == 0], side="right") == p).all()
        assert ((r[k == 1] >= 5 * p) & (r[k == 1] < 5 * p + 5)).all()
        # Without replacement per pass over the part: 30 draws of 5 records, 10 of 5.
        assert np.bincount(r[k == 0] - 5 * p, minlength=5).tolist() == [6] * 5
        assert np.bincount(r[k == 1] - 5 * p, minlength=5).tolist() == [2] * 5
        for g in range(10):
            for i, s, row in zip(idx[g].tolist(), source[g].tolist(), img[g]):
                first, last = g * quota[s], (g + 1) * quota[s] - 1
                options = [
                    oracle.gather(ref, [i], M.OUT, crop=b, flip=f)
                    for b, f in (
                        sample(RRC, np.array([i]), geometry=geometry, seed=SEED, epoch=q)
                        for q in sorted({first // part_n[s], last // part_n[s]})
                    )
                ]
                assert any(np.array_equal(row, x[0]) for x in options), (p, g, i)
        # The global batch holds both processes' rows, process 0's first.
        for g in range(10):
            assert o["jax|global"][g].tolist() == outs[0]["jax|index"][g].tolist() + outs[1]["jax|index"][g].tolist()
        for name in ("index", "source", "image"):  # resumed after step 6: steps 7, 8, 9
            np.testing.assert_array_equal(o["resumed|" + name], o["jax|" + name][7:], err_msg=name)
            np.testing.assert_array_equal(o["torch|" + name], o["jax|" + name][:5], err_msg=name)
    states = [json.loads(str(o["jax|state"])) for o in outs]
    assert states[0] == states[1] and states[0]["partition"] == "host"
    assert (states[0]["epoch"], states[0]["position"], states[0]["processes"]) == (1, 8, 2)
    assert states[0]["fingerprint"].startswith(f"mix{2 * M.N}-")


# ---- the new sources' row: Hugging Face, Parquet, TFRecord, ArrayRecord ----

SOURCES = ["hf_dataset", "parquet", "tfrecord", "array_record"]


def _write_source(kind, photos, d):
    """The matrix's photos (bytes, label) as a source of `kind`; returns what convert takes."""
    import test_hf_tfds_sources as S  # the tests of these sources: their writers and encoders

    if kind in ("hf_dataset", "parquet"):
        import datasets

        ds = datasets.Dataset.from_dict(
            {"image": [{"bytes": b, "path": None} for b, _ in photos], "label": [c for _, c in photos]},
            features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}),
        )
        if kind == "hf_dataset":
            return ds
        ds.to_parquet(d / "m.parquet", batch_size=4)
        return str(d / "m.parquet")
    if kind == "tfrecord":
        (d / "m.tfrecord").write_bytes(S.tfrecord([S.example({"image": b, "label": c}) for b, c in photos]))
        return str(d / "m.tfrecord")
    ar = pytest.importorskip("array_record.python.array_record_module")
    w = ar.ArrayRecordWriter(str(d / "m.array_record"), "group_size:1")
    for b, c in photos:
        w.write(S.example({"image": b, "label": c}))
    w.close()
    return str(d / "m.array_record")


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("kind", ["raw_square", "compact_full_aspect"])
def test_new_sources_write_the_matrix_records_and_serve(matrix, source, kind, tmp_path):
    """Each new source converted with a matrix recipe gives that cell's records (so every path
    above holds for it), and the loader serves them as the oracle says."""
    pytest.importorskip("datasets")
    pytest.importorskip("google_crc32c")
    files, refs = matrix
    photos = [
        (p.read_bytes(), i)
        for i, p in enumerate(
            sorted(Path(files["raw_square", "file"]).parent.glob("src/c*/img*.jpg"), key=lambda p: p.name)
        )
    ]
    dst = tmp_path / "m.tbl"
    named = {"label_column": "label"} if source in ("hf_dataset", "parquet") else {}  # no ClassLabel
    tbljax.convert(
        _write_source(source, photos, tmp_path), dst, image_size=M.S, progress=False, **named, **M.KINDS[kind]
    )
    ds, ref = tbljax.open(dst), refs[kind, "file"]
    assert ds.labels.tolist() == list(range(M.N))
    for i in range(M.N):
        np.testing.assert_array_equal(ds.read(i), ref[i])
    for batch in tbljax.loader(dst, B, seed=SEED, dtype="uint8", augment=RRC, num_epochs=1):
        idx = _host(batch["index"])
        np.testing.assert_array_equal(_host(batch["image"]), expected(ref, idx, RRC))


# ---- the geometric row (issue 48): a mask and boxes follow RRC + flip on every record kind ----


@pytest.fixture(scope="module")
def geo(tmp_path_factory):
    pytest.importorskip("PIL")
    d = tmp_path_factory.mktemp("geo")
    files = M.make_geometric(d)
    return files, M.geometric_values(M.photos(d / "src"))


def _geo_stored(kind, values, k):
    """Record k's mask, xyxy boxes and their labels as the conversion stores them, from the
    source's values by `rules/geometry`'s conversion rules."""
    v = values[k]
    h, w = v["seg"].shape
    plan = geometry.resize_plan(h, w, M.S, M.GEO_KINDS[kind]["resize"], 0)
    mask = geometry.resize_nearest(v["seg"], plan.int_box, (plan.out_h, plan.out_w))
    xyxy, keep = geometry.stored_boxes(v["boxes"], plan)
    return mask, xyxy, v["labels"][keep]


def _geo_geometry(kind, values) -> RecordGeometry:
    hws = [_geo_stored(kind, values, k)[0].shape for k in range(M.N)]
    return RecordGeometry(np.array([h for h, _ in hws]), np.array([w for _, w in hws]))


def _geo_reference(kind, values, k, box, flip, ext=None):
    """Record k's mask and boxes served through crop `box` and `flip` (onto the top-left `ext`
    of an M.OUT canvas, where given), from the source's values: stored at the conversion's
    geometry by `rules/geometry`'s conversion rules, then served."""
    mask, xyxy, labels = _geo_stored(kind, values, k)
    out = M.OUT if ext is None else tuple(ext)
    want = geometry.serve_boxes(xyxy, labels, box, out, flip, max_boxes=M.MAXB)
    if ext is None:
        return geometry.serve_mask(mask, box, out, flip), want, mask.shape, len(xyxy)
    canvas = geometry.serve_mask(mask, box, out, flip, place=(0, 0), canvas_hw=M.OUT, ignore=255)
    return canvas, want, mask.shape, len(xyxy)


def _check_geo(kind, values, index, f, epoch, where, crops=None, ext=None):
    """A batch's mask and box fields against `_geo_reference` at the crops and flips
    `tbljax.augment.sample` draws for RRC (or at `crops` = (boxes, flips) given, with `ext`)."""
    index = np.asarray(index, np.int64)
    real = index[index >= 0]
    if crops is None:
        crops = sample(RRC, real, geometry=_geo_geometry(kind, values), seed=SEED, epoch=epoch)
    boxes, flips = crops
    for r, k in enumerate(real.tolist()):
        e = None if ext is None else ext[r]
        mask, want, _, count = _geo_reference(kind, values, k, tuple(boxes[r]), bool(flips[r]), e)
        np.testing.assert_array_equal(f["seg"][r], mask, err_msg=f"{where} record {k}")
        np.testing.assert_allclose(f["boxes"][r], want["boxes"], atol=1e-4, err_msg=f"{where} record {k}")
        assert f["boxes_valid"][r].tolist() == want["boxes_valid"].tolist(), (where, k)
        assert f["box_labels"][r].tolist() == want["box_labels"].tolist(), (where, k)
        assert f["boxes_count"][r] == count, (where, k)
    for r in np.flatnonzero(index < 0).tolist():  # padding rows: no source pixel, no box
        assert (f["seg"][r] == 255).all() and not f["boxes_valid"][r].any(), where


@pytest.mark.parametrize("kind", list(M.GEO_KINDS))
def test_geometric_fields_follow_rrc_and_flip_on_every_record_kind(geo, kind):
    files, values = geo
    kw = dict(augment=RRC, dtype="uint8", seed=SEED, max_boxes=M.MAXB, drop_remainder=False)
    seen, kept, steps = [], 0, -(-M.N // B)
    for s, b in enumerate(tbljax.loader(files[kind], B, num_epochs=2, **kw)):
        b = {k: np.asarray(v) for k, v in b.items()}
        _check_geo(kind, values, b["index"], b, s // steps, f"jax step {s}")
        seen += b["index"][b["index"] >= 0].tolist()
        kept += int(b["boxes_valid"].sum())
    assert sorted(seen) == sorted(list(range(M.N)) * 2) and kept > 0
    if kind in M.GEO_LZ4:  # stored compressed: fewer bytes than the masks it serves
        raw = sum(_geo_stored(kind, values, k)[0].size for k in range(M.N))
        assert tbljax.open(files[kind]).field_bytes("seg") < raw
    torch_mod = pytest.importorskip("tbljax.torch")
    for b in torch_mod.loader(files[kind], B, layout="NHWC", **kw):
        _check_geo(kind, values, b.index.numpy(), {k: v.numpy() for k, v in b.fields.items()}, 0, "torch")


@pytest.mark.parametrize("kind", list(M.GEO_KINDS))
def test_geometric_fields_follow_rrc_and_flip_in_a_resident_dataset_in_jit(geo, kind):
    import jax

    files, values = geo
    rd = tbljax.ResidentDataset(files[kind])
    step = jax.jit(lambda ds, s: ds.batch(s, batch_size=B, augment=RRC, dtype="uint8", seed=SEED, max_boxes=M.MAXB))
    spe = rd.steps_per_epoch(B)
    for s in range(2 * spe):
        b = {k: np.asarray(v) for k, v in step(rd, s).items()}
        _check_geo(kind, values, b["index"], b, s // spe, f"resident step {s}")


def test_geometric_fields_are_refused_by_name_where_the_conversion_keeps_original_bytes(geo, tmp_path):
    files, _ = geo
    for kind in M.GEO_REFUSED:
        with pytest.raises(ValueError, match=r"geometric fields \(boxes, seg\) are stored at the record's geometry"):
            tbljax.convert([files["tar"]], tmp_path / "x.tbl", image_size=M.S, fields=M.GEO_FIELDS, **M.KINDS[kind])


@pytest.fixture(scope="module")
def geo_refs(geo):
    return M.geometric_references(geo[0])


BBOX = tbljax.Augment(crop="bbox", size=M.OUT)
LSJ = tbljax.Augment(scale_jitter=(0.3, 2.5), size=M.OUT)
LONGER_PAD = tbljax.Augment(crop="longer_pad", flip=False, size=M.OUT)


@pytest.mark.parametrize("kind", list(M.GEO_KINDS))
def test_pixels_and_geometric_fields_follow_the_bbox_crop_on_every_record_kind(geo, geo_refs, kind):
    """The detection crop drawn by `tbljax.augment.sample` around each record's stored boxes
    (the source's boxes through the conversion rules): pixels against the oracle, masks and
    boxes against `rules/geometry`."""
    files, values = geo
    geo_of, stored = _geo_geometry(kind, values), [_geo_stored(kind, values, k) for k in range(M.N)]
    kw = dict(augment=BBOX, dtype="uint8", seed=SEED, max_boxes=M.MAXB, drop_remainder=False)
    seen, cropped = [], 0
    for s, b in enumerate(tbljax.loader(files[kind], B, num_epochs=1, **kw)):
        b = {k: np.asarray(v) for k, v in b.items()}
        real = b["index"][b["index"] >= 0]
        objects = bbox_crop.pad_boxes([stored[k][1] for k in real])
        crops, flips = sample(BBOX, real, geometry=geo_of, seed=SEED, epoch=0, objects=objects)
        want = oracle.gather(geo_refs[kind], real, M.OUT, crop=crops, flip=flips)
        np.testing.assert_array_equal(b["image"][: len(real)], want, err_msg=f"{kind} step {s}")
        _check_geo(kind, values, b["index"], b, 0, f"bbox step {s}", crops=(crops, flips))
        seen += real.tolist()
        whole = np.array([stored[k][0].shape for k in real])
        cropped += int((crops[:, 2:] < whole).any(1).sum())
    assert sorted(seen) == list(range(M.N)) and cropped > 0


@pytest.mark.parametrize("aug", [LSJ, LONGER_PAD], ids=["scale_jitter", "longer_pad"])
@pytest.mark.parametrize("kind", list(M.GEO_KINDS))
def test_pixels_and_geometric_fields_follow_scale_jitter_and_longer_pad_on_every_record_kind(geo, geo_refs, kind, aug):
    """Each record's box and extent from `tbljax.augment.canvas_boxes`: pixels the oracle's
    crop-resize there on a zero canvas, `image_valid` the extent, masks and boxes `rules/geometry`'s
    serving onto the extent."""
    files, values = geo
    geo_of = _geo_geometry(kind, values)
    kw = dict(augment=aug, dtype="uint8", seed=SEED, max_boxes=M.MAXB, drop_remainder=False)
    seen, padded = [], 0
    for s, b in enumerate(tbljax.loader(files[kind], B, num_epochs=1, **kw)):
        b = {k: np.asarray(v) for k, v in b.items()}
        real = b["index"][b["index"] >= 0]
        boxes, ext = tba.canvas_boxes(aug, real, geometry=geo_of, seed=SEED, epoch=0)
        flips = tba.flips(real, seed=SEED, epoch=0) if aug.flip else np.zeros(len(real), bool)
        for r, k in enumerate(real.tolist()):
            (rh, rw), where = ext[r], f"{kind} step {s} record {k}"
            want = np.zeros((*M.OUT, 3), np.uint8)
            px = oracle.crop_resize(geo_refs[kind][k], boxes[r], rh, rw)
            want[:rh, :rw] = px[:, ::-1] if flips[r] else px
            np.testing.assert_array_equal(b["image"][r], want, err_msg=where)
            np.testing.assert_array_equal(b["image_valid"][r], _extent(rh, rw), err_msg=where)
        _check_geo(kind, values, b["index"], b, 0, f"canvas step {s}", crops=(boxes, flips), ext=ext)
        seen += real.tolist()
        padded += int((ext < M.OUT).any(1).sum())
    # Square records fill the canvas at longer_pad's fixed scale; jitter below 1 pads them too.
    square = M.GEO_KINDS[kind]["resize"] == "center_crop"
    assert sorted(seen) == list(range(M.N)) and (padded > 0 or (aug is LONGER_PAD and square))


def _extent(rh, rw) -> np.ndarray:
    valid = np.zeros(M.OUT, bool)
    valid[:rh, :rw] = True
    return valid


# ---- the linear dense-map row: DenseMap(interpolation="linear") on two record kinds ----


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    pytest.importorskip("PIL")
    return M.make_dense(tmp_path_factory.mktemp("dense"))


@pytest.mark.parametrize("kind", M.DENSE_KINDS)
def test_a_linear_dense_map_is_served_by_the_numpy_linear_rule(dense, kind):
    """Each record's map stored by `rules/geometry`'s conversion rule (`resize_dense`, linear,
    from the source's values), then served through the crop and flip `tbljax.augment.sample`
    draws by its serving rule (`serve_linear_batch`, invalid samples given no weight): the
    loader's float32 values bit for bit."""
    files, values = dense
    resize = M.KINDS[kind]["resize"]
    stored = []
    for v in values:
        plan = geometry.resize_plan(*v.shape, M.S, resize, 0)
        stored.append(geometry.resize_dense(v, plan, "linear", M.DENSE.invalid))
    seen, invalid = [], 0
    for b in tbljax.loader(files[kind], B, augment=RRC, seed=SEED, dtype="uint8", num_epochs=1, drop_remainder=False):
        idx, depth = _host(b["index"]), _host(b["depth"])
        real = idx[idx >= 0]
        crops, flips = sample(RRC, real, geometry=_geometry(stored), seed=SEED, epoch=0)
        for r, i in enumerate(real.tolist()):
            want = geometry.serve_linear_batch(
                lambda ys, xs, a=stored[i]: a[ys, xs], crops[r : r + 1], M.OUT, flips[r : r + 1], 0.0
            )
            assert depth.dtype == np.float32
            np.testing.assert_array_equal(depth[r], want[0], err_msg=f"{kind} record {i}")
            invalid += int((want[0] == 0).sum())
        seen += real.tolist()
    assert sorted(seen) == list(range(M.N)) and invalid > 0

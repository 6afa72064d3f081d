"""The reader's promises to users: a missing file is a FileNotFoundError naming it, records are
random-access (`ds[i]`, for Grain and torch), and the fingerprint depends on the data alone,
so converting the same data again keeps a saved loader state valid."""

from __future__ import annotations

import numpy as np
import pytest

import tbljax
from tbljax._src.file.format import Writer


def write(path, imgs, labels, recipe=None, keys=None):
    with Writer(path, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(labels=labels, keys=keys, recipe=recipe)
    return str(path)


def imgs(n=6, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 8, 7, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    "open_it",
    [
        lambda p: tbljax.open(p),
        lambda p: tbljax.open([p]),
        lambda p: tbljax.loader(p, 2),
        lambda p: tbljax.torch.loader(p, 2),
    ],
    ids=["open", "open-list", "loader", "torch-loader"],
)
def test_a_missing_file_is_file_not_found_naming_it(tmp_path, open_it):
    missing = str(tmp_path / "nope.tbl")
    with pytest.raises(FileNotFoundError) as e:
        open_it(missing)
    assert e.value.filename == missing and "nope.tbl" in str(e.value)


def test_getitem_is_record_i_as_a_dict_with_a_fresh_image(tmp_path):
    data = imgs()
    ds = tbljax.open(write(tmp_path / "a.tbl", data, np.arange(6)))
    for i in (0, 3, 5, -1, -6):
        got = ds[i]
        assert sorted(got) == ["image", "key", "label"] and got["label"] == i % 6
        np.testing.assert_array_equal(got["image"], data[i])
        assert got["image"].flags.writeable and got["image"].dtype == np.uint8
    got["image"][:] = 0  # a fresh array: the file's mapping is untouched
    np.testing.assert_array_equal(ds[-6]["image"], data[0])
    np.testing.assert_array_equal(ds.read(0), data[0])  # read(i) stays the pixels alone
    with pytest.raises(IndexError, match="record 6 out of range"):
        ds[6]
    with pytest.raises(TypeError, match="record index must be an integer"):
        ds["0"]


def test_getitem_serves_grain_random_access(tmp_path):
    grain = pytest.importorskip("grain", reason="Grain is not installed (pip install grain)")
    data = imgs()
    ds = tbljax.open(write(tmp_path / "a.tbl", data, np.arange(6)))
    got = list(grain.MapDataset.source(ds))
    np.testing.assert_array_equal(np.stack([r["image"] for r in got]), data)
    assert [r["label"] for r in got] == list(range(6))


def test_getitem_serves_a_torch_dataloader(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tbljax[torch]')")
    data = imgs()
    ds = tbljax.open(write(tmp_path / "a.tbl", data, np.arange(6)))
    got = list(torch.utils.data.DataLoader(ds, batch_size=4))
    assert [tuple(b["image"].shape) for b in got] == [(4, 8, 7, 3), (2, 8, 7, 3)]
    np.testing.assert_array_equal(torch.cat([b["image"] for b in got]).numpy(), data)
    assert torch.cat([b["label"] for b in got]).tolist() == list(range(6))


def test_fingerprint_depends_on_the_data_only(tmp_path):
    data, labels = imgs(), np.arange(6) % 3
    recipe = {"image_size": 8, "resize": "squash", "format": "raw"}
    a = write(
        tmp_path / "a.tbl", data, labels, {**recipe, "created": "2026-01-01T00:00:00+00:00", "sources": ["/data/x.tar"]}
    )
    # Converted again later, from another folder: the same data, the same fingerprint.
    b = write(
        tmp_path / "b.tbl",
        data,
        labels,
        {**recipe, "created": "2026-12-01T10:00:00+00:00", "sources": ["/mnt/copy/x.tar"]},
    )
    fa = tbljax.open(a).fingerprint
    assert fa == tbljax.open(b).fingerprint
    # ... and a loader state saved on one resumes on the other.
    ld = tbljax.loader(a, 2, seed=1)
    next(iter(ld))
    state = ld.state_dict()
    ld.close()
    other = tbljax.loader(b, 2, seed=1)
    other.load_state_dict(state)
    other.close()
    # Anything about the data changes it: a pixel, a label, a key, the order, the recipe.
    changed = data.copy()
    changed[2, 0, 0, 0] ^= 1
    variants = [
        write(tmp_path / "pixel.tbl", changed, labels, recipe),
        write(tmp_path / "label.tbl", data, np.where(np.arange(6) == 4, 9, labels), recipe),
        write(tmp_path / "key.tbl", data, labels, recipe, keys=[str(i) for i in range(6)]),
        write(tmp_path / "order.tbl", data[::-1], labels[::-1], recipe),
        write(tmp_path / "recipe.tbl", data, labels, {**recipe, "resize": "center_crop"}),
    ]
    prints = {tbljax.open(p).fingerprint for p in variants}
    assert len(prints) == len(variants) and fa not in prints

"""User tools: `tbljax show` draws exactly what the loader serves; `tbljax bench` measures and
gives a verdict; loader state checkpoints with Orbax beside the model state."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import tbljax
from tbljax.format import Writer
from tbljax.show import sample_grid


@pytest.fixture
def small_file(tmp_path):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (24, 20, 18, 3), dtype=np.uint8)
    p = tmp_path / "s.tbl"
    with Writer(p, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im)
        w.set_metadata(labels=np.arange(24) % 3, classes=["cat", "dog", "eel"])
    return p, imgs


def tiles_of(grid, n, th, tw, cols):
    return np.stack([grid[(k // cols) * (th + 2) + 1:(k // cols) * (th + 2) + 1 + th,
                          (k % cols) * (tw + 2) + 1:(k % cols) * (tw + 2) + 1 + tw] for k in range(n)])


def test_show_grid_is_the_stored_pixels(small_file):
    p, imgs = small_file
    grid, captions = sample_grid(p, count=10, columns=4)
    np.testing.assert_array_equal(tiles_of(grid, 10, 20, 18, 4), imgs[:10])
    assert captions[:4] == ["0: cat", "1: dog", "2: eel", "3: cat"]


def test_show_augmented_grid_is_what_the_loader_serves(small_file):
    p, _ = small_file
    aug = tbljax.Augment(size=(16, 16))
    grid, _ = sample_grid(p, count=8, columns=8, augment=aug, seed=5, epoch=2)
    ld = tbljax.loader(p, 8, shuffle=False, seed=5, dtype="uint8", augment=aug, num_epochs=3)
    ld.set_epoch(2)
    want = np.asarray(next(iter(ld))["image"])
    ld.close()
    np.testing.assert_array_equal(tiles_of(grid, 8, 16, 16, 8), want)


def test_show_cli_writes_png(small_file, tmp_path):
    p, _ = small_file
    out = tmp_path / "g.png"
    r = subprocess.run([sys.executable, "-m", "tbljax.cli", "show", str(p), "--out", str(out), "--count", "6",
                        "--augment", "rrc_flip"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with Image.open(out) as im:
        assert im.format == "PNG" and im.width > 6 * 18

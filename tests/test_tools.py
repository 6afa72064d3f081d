"""User tools: `tbljax show` draws exactly what the loader serves; `tbljax bench` measures and
gives a verdict; loader state checkpoints with Orbax beside the model state."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import tbljax
from tbljax._src.file.format import Writer
from tbljax._src.tools.show import sample_grid


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
    return np.stack(
        [
            grid[
                (k // cols) * (th + 2) + 1 : (k // cols) * (th + 2) + 1 + th,
                (k % cols) * (tw + 2) + 1 : (k % cols) * (tw + 2) + 1 + tw,
            ]
            for k in range(n)
        ]
    )


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
    r = subprocess.run(
        [sys.executable, "-m", "tbljax", "show", str(p), "--out", str(out), "--count", "6", "--augment", "rrc_flip"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    with Image.open(out) as im:
        assert im.format == "PNG" and im.width > 6 * 18


STEP_MODULE = """
import jax, jax.numpy as jnp, time
_w = jnp.ones((3, 8))

@jax.jit
def _fast(x):
    return (x.astype(jnp.float32).mean(axis=(1, 2)) @ _w).sum()

def fast_step(batch):
    return _fast(batch["image"])

def slow_step(batch):
    time.sleep(0.05)  # a step far slower than the loader
    return _fast(batch["image"])
"""


def test_bench_cli_json_and_verdict(small_file, tmp_path):
    p, _ = small_file
    (tmp_path / "mysteps.py").write_text(STEP_MODULE)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tbljax",
            "bench",
            str(p),
            "--batch-size",
            "8",
            "--steps",
            "6",
            "--step",
            "mysteps:slow_step",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["produce_img_s"] > 0 and rep["consumed_img_s"] > 0
    assert rep["step_floor_ms"] >= 50 and rep["step_fed_ms"] >= 50
    assert rep["input_bound"] is False and rep["advice"] == ["the loader keeps up: nothing to change"]


def test_bench_advice_for_an_input_bound_run():
    from tbljax._src.tools.benchmark import BenchReport, advise

    rep = BenchReport(
        path="x",
        batch_size=256,
        settings={},
        produce_img_s=5000,
        consumed_img_s=4000,
        step_floor_ms=10.0,
        step_fed_ms=51.2,
        loader_wait_ms=41.0,
        input_bound=True,
        overhead=4.12,
    )
    tips = advise(rep, threads=1, cpus=8, dtype="float32", prefetch=2, dataset_bytes=2**30)
    assert any(t.startswith("threads: use all 8") for t in tips)
    assert any(t.startswith("prefetch:") for t in tips)
    assert any("uint8" in t for t in tips)
    assert any("ResidentDataset" in t and "25,600 img/s" in t for t in tips)
    ok = BenchReport(
        path="x",
        batch_size=256,
        settings={},
        produce_img_s=5e4,
        consumed_img_s=4e4,
        step_floor_ms=10.0,
        step_fed_ms=10.2,
        loader_wait_ms=0.0,
        input_bound=False,
        overhead=0.02,
    )
    assert advise(ok, threads=8, cpus=8, dtype="uint8", prefetch=2, dataset_bytes=1) == [
        "the loader keeps up: nothing to change"
    ]


def test_orbax_checkpoint_resumes_the_identical_stream(small_file, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is in the test extra")
    import jax.numpy as jnp

    p, _ = small_file

    def stream(ld, n):
        it = iter(ld)
        return [np.asarray(next(it)["index"]).tolist() for _ in range(n)]

    full = stream(tbljax.loader(p, 4, seed=9, dtype="uint8", augment="flip"), 9)  # crosses an epoch end

    ld = tbljax.loader(p, 4, seed=9, dtype="uint8", augment="flip")
    first = stream(ld, 7)
    params = {"w": jnp.arange(6.0)}
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(
            7, args=ocp.args.Composite(params=ocp.args.StandardSave(params), loader=ocp.args.JsonSave(ld.state_dict()))
        )
        mngr.wait_until_finished()
    ld.close()

    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        step = mngr.latest_step()
        got = mngr.restore(
            step, args=ocp.args.Composite(params=ocp.args.StandardRestore(params), loader=ocp.args.JsonRestore())
        )
    resumed = tbljax.loader(p, 4, seed=9, dtype="uint8", augment="flip")
    resumed.load_state_dict(got["loader"])
    rest = stream(resumed, 2)
    resumed.close()
    assert step == 7 and np.array_equal(got["params"]["w"], params["w"])
    assert first + rest == full


def test_bench_first_run_warms_up_before_timing(caltech101, tmp_path):
    """A first run on a fresh file: the mmap's first touch of the pages and of each ring slot
    is paid before the clock starts, so the loader alone produces at least what is consumed
    (the first round used to pay it alone: 13.5k img/s produced beside 20.5k consumed)."""
    p = tmp_path / "c.tbl"
    tbljax.convert(caltech101 / "images", p, image_size=128, progress=False)
    r = subprocess.run(
        [sys.executable, "-m", "tbljax", "bench", str(p), "--batch-size", "128"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    line = r.stdout.splitlines()[1]
    m = re.fullmatch(r"  loader alone: ([\d,]+) img/s produced, ([\d,]+) img/s when every byte is read", line)
    produced, consumed = (int(g.replace(",", "")) for g in m.groups())
    assert produced >= consumed > 0, line

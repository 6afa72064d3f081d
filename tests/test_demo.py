"""The README's main job, `tbljax demo`, runs end to end and learns its task."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


def demo(*args, **env):
    r = subprocess.run(
        [sys.executable, "-m", "tbljax", "demo", *args],
        capture_output=True,
        text=True,
        timeout=600,
        # The caller's XLA flags (conftest compiles the other tests unoptimized): the demo trains.
        env={**os.environ, "XLA_FLAGS": os.environ.get("TBLJAX_TESTS_USER_XLA_FLAGS", ""), **env},
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    return r.stdout


def test_demo_runs_and_learns_in_a_temporary_folder_it_deletes(tmp_path):
    out = demo("--steps", "80", TMPDIR=str(tmp_path))
    assert "wrote 2048 records" in out and "skipped 0; classes 4" in out
    acc = float(re.search(r"eval: accuracy ([0-9.]+) on 500 held-out images", out).group(1))
    assert acc > 0.8, out
    # The figure says the image size it was measured at and what it covers.
    assert re.search(
        r"throughput at 32x32 px: \d+ img/s training \(loader \+ this small CNN's step, "
        r"steps 2-80: compiling excluded\)",
        out,
    ), out
    # The folder is said to be temporary when first named, and deleted at the end.
    work = re.search(
        r"tbljax demo in (\S+) \(a temporary folder, deleted at the end "
        r"\(--workdir DIR keeps the files\);",
        out,
    ).group(1)
    assert work.startswith(str(tmp_path)) and not os.path.exists(work)
    assert out.strip().splitlines()[-1] == f"deleted {work} (pass --workdir DIR to keep the files)"


@pytest.mark.slow  # a second whole demo (10 s of CPU): the default run has the first
def test_demo_keeps_its_files_in_workdir(tmp_path):
    out = demo("--steps", "100", "--workdir", str(tmp_path))
    assert f"tbljax demo in {tmp_path} (kept;" in out and "deleted" not in out
    assert (tmp_path / "train.tbl").exists() and (tmp_path / "eval.tbl").exists()

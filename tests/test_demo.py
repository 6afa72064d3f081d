"""The README's main job, `tbljax demo`, runs end to end and learns its task."""
from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_runs_and_learns(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tbljax", "demo", "--steps", "150", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "wrote 2048 records" in out and "skipped 0" in out
    acc = float(re.search(r"eval: accuracy ([0-9.]+) on 500 held-out images", out).group(1))
    assert acc > 0.8, out
    # The figure says the image size it was measured at and what it covers.
    assert re.search(r"throughput at 32x32 px: \d+ img/s training \(loader \+ this small CNN's step, "
                     r"steps 2-150: compiling excluded\)", out), out
    assert f"tbljax demo in {tmp_path} (kept;" in out
    assert (tmp_path / "train.tbl").exists() and (tmp_path / "eval.tbl").exists()


def test_demo_says_its_temporary_folder_is_deleted(tmp_path):
    """Without --workdir the files go to a temporary folder: the first line says it will be
    deleted, the last that it was, and it is gone."""
    r = subprocess.run([sys.executable, "-m", "tbljax", "demo", "--steps", "1"], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stdout + r.stderr  # 1: one step learns little
    work = re.search(r"tbljax demo in (\S+) \(a temporary folder, deleted at the end "
                     r"\(--workdir DIR keeps the files\);", r.stdout).group(1)
    assert work.startswith(str(tmp_path)) and not os.path.exists(work)
    assert r.stdout.strip().splitlines()[-1] == f"deleted {work} (pass --workdir DIR to keep the files)"

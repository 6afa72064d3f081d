"""The README's main job, `tbljax demo`, runs end to end and learns its task."""
from __future__ import annotations

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
    assert re.search(r"throughput: \d+ img/s", out)
    assert (tmp_path / "train.tbl").exists() and (tmp_path / "eval.tbl").exists()

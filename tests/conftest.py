"""Shared test fixtures: where the real photos are, and small datasets made from code."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


# Tests run in a scratch directory: a child `python -c`/`-m` must import the installed tbljax,
# not the source folder that the repository root would put first on its path. Relative
# PYTHONPATH entries (a developer's `PYTHONPATH=.`) are made absolute so they still hold.
if os.environ.get("PYTHONPATH"):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)


@pytest.fixture(autouse=True)
def _run_in_scratch_dir(tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def shared_dir(name: str) -> Path:
    """../shared/data/<name>, or skip the test with the reason."""
    d = SHARED_DATA / name
    if not d.is_dir():
        pytest.skip(f"real photos not available: {d} is absent (it ships beside the repo, not in it)")
    return d


@pytest.fixture
def caltech101() -> Path:
    return shared_dir("caltech101")


@pytest.fixture
def kodak() -> Path:
    return shared_dir("kodak")

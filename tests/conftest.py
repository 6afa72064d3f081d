"""Shared test fixtures: where the real photos are, and small datasets made from code."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


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

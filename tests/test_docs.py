"""Every ```python block of README.md and docs/reference.md runs as written, so a doc can no
longer drift from the code. The blocks of one file run in order in one namespace (as a reader
pastes them into one session), in a folder holding small data made here under the names the
docs use; the only other names provided are the ones a block expects from the user
(`user_names`: a training step, a model's state and parameters, ...; each block says in a
comment which it assumes). A loop that would run forever ends when the stand-in step has run a
few times."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

import tbljax

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/reference.md"]
SHARDS, PER_SHARD, SIDE = 100, 11, 24  # 1,100 photos-like JPEGs: enough for batch_size=1024


class _Enough(Exception):
    """Raised by the stand-in training step once a block has shown it works."""


def blocks(doc: str) -> list[tuple[int, str]]:
    text = (REPO / doc).read_text()
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def _jpeg(rng) -> bytes:
    from PIL import Image

    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    img = np.stack(
        [(xx * 10 + rng.integers(0, 50)) % 256, (yy * 10) % 256, np.full_like(xx, rng.integers(0, 256))], -1
    ).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """train-000.tar .. train-099.tar: WebDataset shards of small JPEGs with integer labels."""
    pytest.importorskip("PIL", reason="Pillow makes the JPEGs (pip install pillow)")
    d = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    for s in range(SHARDS):
        with tarfile.open(d / f"train-{s:03d}.tar", "w") as tar:
            for k in range(PER_SHARD):
                key = f"{s:03d}_{k:02d}"
                for ext, data in (("jpg", _jpeg(rng)), ("cls", str((s + k) % 5).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return d


def _coco(d: Path, n: int = 40) -> None:
    """instances_train2017.json + train2017/: the detection recipe's COCO, n photos-like JPEGs
    with 1-3 boxes each (COCO's xywh, category ids 1-3)."""
    import json

    rng = np.random.default_rng(1)
    (d / "train2017").mkdir()
    images, annotations = [], []
    for i in range(n):
        (d / "train2017" / f"{i:012d}.jpg").write_bytes(_jpeg(rng))
        images.append({"id": i, "file_name": f"{i:012d}.jpg", "height": SIDE, "width": SIDE})
        for _ in range(rng.integers(1, 4)):
            x, y = rng.uniform(0, SIDE / 2, 2)
            w, h = rng.uniform(4, SIDE / 2, 2)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i,
                    "category_id": int(rng.integers(1, 4)),
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    categories = [{"id": k, "name": f"c{k}"} for k in (1, 2, 3)]
    (d / "instances_train2017.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )


def _folder(shards: Path, tmp_path: Path, *, converted: bool) -> Path:
    for p in shards.iterdir():
        (tmp_path / p.name).symlink_to(p)
    _coco(tmp_path)
    pattern = str(tmp_path / "train-{000..099}.tar")
    for i in range(16):  # what the README's cluster conversion (a bash block) leaves behind
        tbljax.convert(pattern, str(tmp_path / "train-{shard}.tbl"), image_size=32, shard=(i, 16))
    if converted:  # what the README's quick start leaves behind
        tbljax.convert(pattern, str(tmp_path / "train.tbl"), image_size=32)
    return tmp_path


def user_names(tmp_path: Path) -> dict:
    """What a reader's own program would define before pasting a block."""
    import jax.numpy as jnp

    calls = []

    def train_step(state, images, labels):
        assert images.shape[0] == labels.shape[0] > 0
        calls.append(1)
        if len(calls) >= 3:
            raise _Enough
        return state, 0.0

    return {
        "train_step": train_step,
        "state": None,
        "update": lambda state, images, labels: state,
        "num_steps": 2,
        "start_epoch": 0,
        "num_epochs": 1,
        "device": "cpu",
        "images": np.zeros((4, 8, 8, 3), np.uint8),
        "labels": [0, 1, 0, 1],
        "params": {"w": jnp.zeros(3)},
        "step": 0,
    }


@pytest.mark.parametrize("doc", DOCS)
def test_every_python_block_runs_as_written(doc, shards, tmp_path, monkeypatch):
    pytest.importorskip("orbax.checkpoint", reason="the README's checkpoint block needs orbax")
    pytest.importorskip("torch", reason="the reference's torch block needs torch")
    found = blocks(doc)
    assert found, f"{doc} has no python block"
    monkeypatch.chdir(_folder(shards, tmp_path, converted=doc != "README.md"))
    namespace = {"__name__": "__doc_block__", **user_names(tmp_path)}
    for line, code in found:
        try:
            exec(compile(code, f"{doc}:{line}", "exec"), namespace)  # noqa: S102 - the docs
        except _Enough:
            pass
        finally:
            ld = namespace.get("loader")
            if hasattr(ld, "close"):
                ld.close()

"""The examples in examples/ run, each in its own process on a tiny dataset made here: they
finish, print what they should, and a run stopped and resumed from its checkpoint prints the
same steps as the uninterrupted run. The three training examples print per-step checksums of
the samples they trained on, equal to those computed from tbljax.order: one order, whatever the
framework."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import _loader_testing as T

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """64 training and 24 evaluation images of 16x16 px, 4 classes (brightness levels)."""
    d = tmp_path_factory.mktemp("examples")
    rng = np.random.default_rng(0)
    out = {}
    for name, n in (("train", 64), ("val", 24)):
        labels = np.arange(n) % 4
        imgs = np.clip(rng.normal(40 + 50 * labels[:, None, None, None], 20, (n, 16, 16, 3)), 0, 255).astype(np.uint8)
        out[name] = T.write_tbl(d / f"{name}.tbl", imgs, labels)
    out["dir"] = d
    return out


def start(script, *args, cwd, **env):
    # The example imports the installed tbljax (or the developer's absolute PYTHONPATH, see
    # conftest.py), as a user's script would.
    # The caller's XLA flags (conftest compiles the other tests unoptimized): the examples train.
    full_env = {**os.environ, "XLA_FLAGS": os.environ.get("TBLJAX_TESTS_USER_XLA_FLAGS", ""), **env}
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *map(str, args)],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(p, expect=0):
    try:
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == expect, f"exit {p.returncode}\n{out}\n{err[-4000:]}"
    return out


def run(script, *args, cwd, expect=0, **env):
    return finish(start(script, *args, cwd=cwd, **env), expect)


def steps(out):
    """{step: (loss, checksum)} from the per-step lines."""
    found = re.findall(r"step (\d+) loss (\S+) indices-crc (\w+)", out)
    return {int(s): (loss, crc) for s, loss, crc in found}


def check_resume(script, tiny, extra, total, stop, ckpt_name, **env):
    common = ["--train", tiny["train"], "--val", tiny["val"], "--batch-size", 16, "--log-every", 1, *extra]
    cwd = tiny["dir"]
    ckpt = tiny["dir"] / ckpt_name
    # The uninterrupted run and the one that stops run side by side (two cores).
    procs = [
        start(script, *common, cwd=cwd, **env),
        start(script, *common, "--checkpoint", ckpt, "--stop-at", stop, cwd=cwd, **env),
    ]
    full, stopped = [finish(p) for p in procs]
    assert re.search(r"eval accuracy [\d.]+ on 24 images", full), full
    assert f"stopping at step {stop}" in stopped and ckpt.exists()
    resumed = run(script, *common, "--checkpoint", ckpt, "--resume", cwd=cwd, **env)
    assert f"resumed at step {stop}" in resumed
    a, b = steps(full), steps(resumed)
    assert sorted(a) == list(range(1, total + 1)) and sorted(b) == list(range(stop + 1, total + 1))
    for s in b:  # same batches, same parameters: the very same lines
        assert b[s] == a[s], (s, a[s], b[s])
    return a


def expected_checksums(steps, n=64, batch=16, seed=0):
    """CRC-32 of each step's int32 sample indices, straight from tbljax.order."""
    from tbljax import order

    per_epoch, out = n // batch, []
    for s in range(steps):
        epoch, k = divmod(s, per_epoch)
        idx = order.permute(k * batch + np.arange(batch), n, seed, epoch).astype(np.int32)
        out.append(f"{zlib.crc32(idx.tobytes()):08x}")
    return out


def test_train_jax_on_two_devices_resumes_the_stream(tiny):
    got = check_resume(
        "train_jax.py",
        tiny,
        ["--steps", 6, "--ckpt-every", 3],
        6,
        3,
        "jax.ckpt",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    )
    assert [got[s][1] for s in sorted(got)] == expected_checksums(6)


@pytest.mark.slow  # 5 runs of the example (20+ s); the default run trains it in test_train_jax_on_two_devices_*
def test_train_jax_standard_recipe_on_full_aspect_records(tmp_path):
    """--recipe standard makes records of several aspect ratios, trains with RRC + flip under
    a size schedule (24 px in epoch 0, 32 px from epoch 1), evaluates every record once on
    the center crop, and a run stopped before the size change resumes across it exactly."""
    import tbljax

    work = tmp_path / "data"
    common = [
        "--recipe",
        "standard",
        "--batch-size",
        16,
        "--log-every",
        1,
        "--steps",
        8,
        "--size-schedule",
        "0:24,1:32",
    ]
    two = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    full = run("train_jax.py", *common, "--synthetic", 64, "--workdir", work, cwd=tmp_path, **two)
    train = tbljax.open(work / "train.tbl")
    shapes = {train.read(i).shape for i in range(len(train))}
    assert train.image_shape is None and len(shapes) >= 4, shapes
    assert max(max(s[:2]) for s in shapes) == 40  # resize="max_side": longer side 40
    assert "training on 24x24 crops from step 1" in full
    assert "training on 32x32 crops from step 5" in full  # 4 steps per epoch of 64 images
    val = tbljax.open(work / "val.tbl")
    assert re.search(rf"eval accuracy [\d.]+ on {len(val)} images", full), full
    a = steps(full)
    assert [a[s][1] for s in sorted(a)] == expected_checksums(8)

    data = ["--train", work / "train.tbl", "--val", work / "val.tbl"]
    ckpt = tmp_path / "std.ckpt"
    stopped = run(
        "train_jax.py", *common, *data, "--checkpoint", ckpt, "--ckpt-every", 3, "--stop-at", 3, cwd=tmp_path, **two
    )
    assert "stopping at step 3" in stopped
    resumed = run("train_jax.py", *common, *data, "--checkpoint", ckpt, "--resume", cwd=tmp_path, **two)
    assert "resumed at step 3" in resumed and "training on 32x32 crops from step 5" in resumed
    b = steps(resumed)
    assert sorted(b) == list(range(4, 9))
    for s in b:  # the same batches, the same losses
        assert b[s] == a[s], (s, a[s], b[s])


@pytest.mark.slow  # 3 torch processes (20+ s); test_torch.py covers the adapter and its resume in the default run
def test_train_torch_resumes_the_stream(tiny):
    pytest.importorskip("torch")
    got = check_resume("train_torch.py", tiny, ["--epochs", 2, "--threads", 1], 8, 5, "t.pt")
    assert [got[s][1] for s in sorted(got)] == expected_checksums(8)


def test_train_mlx_resumes_the_stream(tiny):
    pytest.importorskip("mlx.core")
    got = check_resume("train_mlx.py", tiny, ["--epochs", 2], 8, 5, "m.pkl")
    assert [got[s][1] for s in sorted(got)] == expected_checksums(8)


def _jpeg(rng, value):
    from tbljax import _core

    img = np.clip(rng.normal(value, 10, (40, 48, 3)), 0, 255).astype(np.uint8)
    return _core.encode_jpeg(img, quality=90)


def test_convert_imagenet_folder_skips_bad_files_and_reports_them(tmp_path):
    rng = np.random.default_rng(1)
    root = tmp_path / "train"
    for k, wnid in enumerate(["n01440764", "n01443537"]):
        (root / wnid).mkdir(parents=True)
        for j in range(3):
            (root / wnid / f"{wnid}_{j}.JPEG").write_bytes(_jpeg(rng, 60 + 100 * k))
    good = (root / "n01443537" / "n01443537_0.JPEG").read_bytes()
    (root / "n01443537" / "broken.JPEG").write_bytes(good[: len(good) // 3])  # truncated
    out = tmp_path / "train-24.tbl"
    text = run(
        "convert_imagenet.py",
        root,
        out,
        "--image-size",
        24,
        "--threads",
        2,
        "--max-skipped-fraction",
        0.5,
        "--verify",
        cwd=tmp_path,
    )
    assert "wrote 6 records" in text and "skipped 1 of 7 items" in text, text
    # 40x48 photos at max side 24: 20x24 records (all one size: a uniform RAW file)
    assert "image_shape (20, 24), 2 classes" in text and "all checksums match" in text
    assert "(1.000 of RAW); for 1,281,167 images about" in text, text
    listed = json.loads((tmp_path / "train-24.tbl.skipped.json").read_text())
    assert [s["key"] for s in listed] == ["n01443537/broken"] or [Path(s["source"]).name for s in listed] == [
        "broken.JPEG"
    ], listed
    import tbljax

    ds = tbljax.open(out)
    assert ds.classes == ["n01440764", "n01443537"] and ds.labels.tolist() == [0] * 3 + [1] * 3
    assert {ds.read(i).shape for i in range(len(ds))} == {(20, 24, 3)}
    # Too many bad items fail the run (exit 1), after writing the file and the list.
    text = run(
        "convert_imagenet.py",
        root,
        out,
        "--image-size",
        24,
        "--overwrite",
        "--max-skipped-fraction",
        0.01,
        cwd=tmp_path,
        expect=1,
    )


def test_convert_imagenet_webdataset_shards_read_as_one(tmp_path):
    import tbljax
    from tbljax._src.tools import demo

    pattern = demo.write_shards(tmp_path / "wds", 24, 3, seed=0)
    for shard in ("0/2", "1/2"):
        text = run(
            "convert_imagenet.py",
            pattern,
            "part-{shard}.tbl",
            "--image-size",
            16,
            "--format",
            "compact",
            "--shard",
            shard,
            cwd=tmp_path,
        )
        assert re.search(r"skipped 0 of \d+ items: no list written", text), text
    assert not list(tmp_path.glob("*.skipped.json"))  # nothing skipped: no file holding []
    run("convert_imagenet.py", pattern, "whole.tbl", "--image-size", 16, "--format", "compact", cwd=tmp_path)
    parts = tbljax.open(sorted(str(p) for p in tmp_path.glob("part-*-of-00002.tbl")))
    whole = tbljax.open(tmp_path / "whole.tbl")
    assert len(parts) == len(whole) == 24 and parts.record_format == "jpeg"
    assert parts.keys == whole.keys and parts.labels.tolist() == whole.labels.tolist()
    assert parts.fingerprint == whole.fingerprint  # a loader state moves between them


def test_convert_imagenet_help_is_whole_sentences():
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "convert_imagenet.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    description = r.stdout.split("\n\n")[1]  # after the usage lines
    assert description == (
        "Convert ImageNet (or any dataset laid out like it) to TBL once with the standard "
        "recipe, check what was skipped, and print the disk it took."
    ), r.stdout
    assert "The standard recipe" in r.stdout and "--max-skipped-fraction" in r.stdout


@pytest.mark.parametrize("source", ["photos", "synthetic"])
def test_train_contrastive_loss_falls(tmp_path, source):
    """The SigLIP-style example: captions stored as a str field, tokenized in field_fn; on the
    real photos beside the repo when they are there (else that case is skipped), and on
    generated images."""
    photos = REPO.parent / "shared" / "data" / "caltech101" / "images"
    if source == "photos" and not photos.is_dir():
        pytest.skip(f"no photos at {photos}")
    extra = ["--photos", photos, "--classes", 8, "--per-class", 10] if source == "photos" else ["--synthetic", 128]
    out = run("train_contrastive.py", *extra, "--steps", 80, "--batch-size", 32, cwd=tmp_path)
    assert "fields {'caption': 'str'}" in out and "e.g. 'a photo of a " in out, out
    assert re.search(r"step 80 loss [\d.]+", out), out
    assert "loss fell from" in out, out


@pytest.mark.parametrize("source", ["photos", "synthetic", "lengths", "pack"])
def test_train_naflex_loss_falls(tmp_path, source):
    """The SigLIP 2-style NaFlex example: records at their own aspect, served as patch sequences
    with the caption; on the real photos beside the repo (else that case is skipped), on
    generated images, with timm's length schedule (one shape a length) and packed."""
    photos = REPO.parent / "shared" / "data" / "caltech101" / "images"
    if source == "photos" and not photos.is_dir():
        pytest.skip(f"no photos at {photos}")
    extra = ["--photos", photos, "--classes", 8, "--per-class", 10] if source == "photos" else ["--synthetic", 128]
    if source in ("lengths", "pack"):
        extra += ["--lengths", "16,36,64"] if source == "lengths" else ["--pack"]
    out = run("train_naflex.py", *extra, "--steps", 40, cwd=tmp_path)
    sizes = int(re.search(r"records of (\d+) sizes", out).group(1))
    assert sizes > 10 and "e.g. 'a photo of a " in out, out  # many aspects, captions
    shapes = set(re.findall(r"step \d+ (\(\d+, \d+, 192\))", out))
    if source == "lengths":  # each length's rows: 2048 tokens a step (the epoch's batches drew two lengths here)
        assert len(shapes) > 1 and shapes <= {"(128, 16, 192)", "(56, 36, 192)", "(32, 64, 192)"}, shapes
    else:  # 32 tokens a row, or 8 sequences of 128 holding up to 4 images each
        assert shapes == {"(8, 128, 192)" if source == "pack" else "(32, 32, 192)"}, shapes
    assert re.search(r"step 40 \(.*\) loss [\d.]+", out), out
    assert "loss fell from" in out, out


@pytest.mark.parametrize("source", ["photos", "synthetic"])
def test_train_vit_deit_recipe_loss_falls(tmp_path, source):
    """The ViT example with the DeiT recipe (RandAugment rand-m9-mstd0.5-inc1, erasing 0.25,
    repeats=3 in the loader; Mixup/CutMix in the jitted step): on the real photos beside the repo
    when they are there (else that case is skipped), and on generated images; the loss falls."""
    photos = REPO.parent / "shared" / "data" / "caltech101" / "images"
    if source == "photos" and not photos.is_dir():
        pytest.skip(f"no photos at {photos}")
    extra = ["--photos", photos] if source == "photos" else ["--synthetic", 256]
    out = run("train_vit.py", *extra, "--steps", 40, cwd=tmp_path)
    assert re.search(r"step 40 loss [\d.]+", out), out
    assert "loss fell from" in out, out


@pytest.mark.parametrize("source", ["photos", "synthetic"])
def test_train_segmentation_loss_falls(tmp_path, source):
    """The segmentation example: masks made from each photo's colours at conversion, served
    through the image's crop and flip as a Mask field; on the kodak photos beside the repo when
    they are there (else that case is skipped), and on generated images. The loss falls, and
    the center-crop mean IoU is far above a constant prediction's (a mask that did not follow
    its image would not be learned)."""
    photos = REPO.parent / "shared" / "data" / "kodak" / "images"
    if source == "photos" and not photos.is_dir():
        pytest.skip(f"no photos at {photos}")
    # The photos' colours are harder to learn than the generated images': more steps.
    extra, steps = (["--photos", photos, "--count", 16], 80) if source == "photos" else (["--synthetic", 32], 30)
    out = run("train_segmentation.py", *extra, "--steps", steps, "--image-size", 32, cwd=tmp_path)
    assert "fields ['seg']" in out, out
    assert re.search(rf"step {steps} loss [\d.]+", out), out
    assert "loss fell from" in out, out
    # A constant prediction's mean IoU is at most 1/4 over four classes.
    assert float(re.search(r"mean IoU ([\d.]+)", out).group(1)) > 0.4, out

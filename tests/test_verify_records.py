"""`verify_records=True`: each served record's CRC-16 checked before its batch is handed out.

Opening a file checks its header and index, not every record's payload; the kernel reads RAW
and compact records straight from the memory map. One flipped payload byte is then served
silently (a RAW pixel off, a compact record decoded a little differently) unless the loader
checks the record's checksum, as `verify()` does, which this option makes every front end do.
"""

from __future__ import annotations

import importlib
import shutil

import numpy as np
import pytest

import tbljax

N, BAD = 24, 5  # records; the damaged one


@pytest.fixture(scope="module")
def intact(tmp_path_factory):
    """{"raw": path, "compact": path} of the same synthetic photos."""
    d = tmp_path_factory.mktemp("verify_records")
    rng = np.random.default_rng(3)
    # Smooth pictures (a gradient and a little noise): a q90 JPEG of them decodes after one
    # flipped byte, as photos do, instead of failing as a DecodeError.
    y, x = np.mgrid[:48, :48]
    images = np.stack(
        [np.stack([(x * (k + 1) + y * 3) % 256, (y * 5 + k * 9) % 256, (x + y + 20 * k) % 256], -1) for k in range(N)]
    )
    images = np.clip(images + rng.integers(0, 8, images.shape), 0, 255).astype(np.uint8)
    labels = np.arange(N) % 3
    paths = {"raw": d / "raw.tbl", "compact": d / "compact.tbl"}
    tbljax.convert((images, labels), paths["raw"], image_size=40, progress=False)
    tbljax.convert((images, labels), paths["compact"], image_size=40, format="jpeg", quality=90, progress=False)
    assert tbljax.open(paths["raw"]).record_format == "raw"
    assert tbljax.open(paths["compact"]).compact
    return {k: str(v) for k, v in paths.items()}


def damage(src, dst, record=BAD):
    """A copy of `src` with one bit flipped in `record`'s payload: in the middle of a RAW
    record; in a compact record, in the middle of its entropy-coded data (a byte that stays
    no marker), where a decoder does not notice it."""
    shutil.copy(src, dst)
    info = tbljax.open(src).info(record)
    with open(dst, "r+b") as f:
        f.seek(info.offset)
        payload = f.read(info.size)
        at = info.size // 2
        if info.format == "JPEG":
            scan = payload.index(b"\xff\xda") + 2 + int.from_bytes(payload[payload.index(b"\xff\xda") + 2 :][:2], "big")
            at = (scan + info.size) // 2
            while payload[at] in (0xFF, 0xFE) or payload[at - 1] == 0xFF:
                at += 1
        f.seek(info.offset + at)
        f.write(bytes([payload[at] ^ 0x01]))
    return str(dst)


def serve(path, front="jax", **kw):
    """Every batch of one epoch in file order, as NumPy uint8 images."""
    kw = dict(shuffle=False, dtype="uint8", **kw)
    if front == "jax":
        return [np.asarray(b["image"]) for b in tbljax.loader(path, 8, num_epochs=1, **kw)]
    if front == "host":
        opts = tbljax.LoaderOptions(batch_size=8, num_epochs=1, **kw)
        return [np.array(b.image) for b in tbljax.HostLoader(tbljax.open(path), opts)]
    if front == "torch":
        torch_loader = importlib.import_module("tbljax.torch").loader
        return [x.numpy().copy() for x, _ in torch_loader(path, 8, layout="NHWC", **kw)]
    mlx_loader = importlib.import_module("tbljax.mlx").loader
    return [np.array(x) for x, _ in mlx_loader(path, 8, **kw)]


@pytest.fixture(params=["raw", "compact"])
def damaged(request, intact, tmp_path):
    return request.param, damage(intact[request.param], tmp_path / "bad.tbl")


def test_open_info_and_the_loader_do_not_notice_a_flipped_payload_byte(damaged, intact):
    kind, bad = damaged
    ds = tbljax.open(bad)  # the header and the index are intact
    assert len(ds) == N
    got, want = serve(bad), serve(intact[kind])
    # Without the option the behaviour is what it was: the record is served, and differs.
    assert [b.shape for b in got] == [b.shape for b in want]
    differs = [k for k in range(N) if not np.array_equal(got[k // 8][k % 8], want[k // 8][k % 8])]
    assert differs == [BAD]
    # verify() checks the checksum, and read() of a compact record; they always did.
    assert [(i, "checksum mismatch" in m) for _, i, m in ds.verify()] == [(BAD, True)]
    if kind == "compact":
        with pytest.raises(tbljax.CorruptFileError, match="checksum mismatch"):
            ds.read(BAD)


@pytest.mark.parametrize("front", ["jax", "host", "torch", "mlx"])
def test_verify_records_raises_naming_file_record_and_check(damaged, front):
    if front in ("torch", "mlx"):
        pytest.importorskip("torch" if front == "torch" else "mlx.core")
    kind, bad = damaged
    batches = []
    with pytest.raises(
        tbljax.CorruptFileError,
        match=rf"bad\.tbl: record {BAD}: checksum mismatch \(CRC-16 of the "
        r"payload differs from the index; verify_records=True\)",
    ):
        if front in ("jax", "host"):  # the batches before the damaged one are handed out
            kw = dict(shuffle=False, dtype="uint8", verify_records=True)
            it = (
                tbljax.loader(bad, 2, num_epochs=1, **kw)
                if front == "jax"
                else tbljax.HostLoader(tbljax.open(bad), tbljax.LoaderOptions(batch_size=2, num_epochs=1, **kw))
            )
            for b in it:
                batches.append(b)
        else:
            serve(bad, front, verify_records=True)
    if front in ("jax", "host"):
        assert len(batches) == BAD // 2  # never the batch holding record BAD


@pytest.mark.parametrize("kind", ["raw", "compact"])
def test_verify_records_serves_an_intact_file_unchanged(intact, kind):
    aug = tbljax.Augment(size=(24, 24))
    for kw in ({}, {"augment": aug, "seed": 4}):
        want = serve(intact[kind], **kw)
        got = serve(intact[kind], verify_records=True, **kw)
        assert len(got) == len(want) == N // 8
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_verify_records_in_a_mixture_names_the_damaged_source(intact, tmp_path):
    bad = damage(intact["compact"], tmp_path / "bad.tbl")
    mix = tbljax.mix({"raw": intact["raw"], "bad": bad}, {"raw": 1, "bad": 1}, epoch_of="bad")
    ld = tbljax.loader(mix, 8, num_epochs=1, dtype="uint8", verify_records=True)
    with pytest.raises(tbljax.CorruptFileError, match=rf"bad\.tbl: record {BAD}: checksum mismatch"):
        for _ in ld:
            pass
    # The same mixture without the damage serves every step.
    ok = tbljax.mix({"raw": intact["raw"], "c": intact["compact"]}, {"raw": 1, "c": 1}, epoch_of="c")
    assert len(list(tbljax.loader(ok, 8, num_epochs=1, verify_records=True))) == len(tbljax.loader(ok, 8, num_epochs=1))


def test_verify_records_of_shard_files_names_the_shard(intact, tmp_path):
    bad = damage(intact["raw"], tmp_path / "bad.tbl", record=2)
    with pytest.raises(tbljax.CorruptFileError, match=r"bad\.tbl: record 2: checksum mismatch .* \(record 26 of "):
        serve([intact["raw"], bad], verify_records=True)


def test_verify_records_must_be_a_bool():
    with pytest.raises(ValueError, match="verify_records must be True or False, got 'yes'"):
        tbljax.LoaderOptions(batch_size=4, verify_records="yes")

"""tbljax.torch against the JAX loader and plain NumPy, with real (CPU) torch: the same order
and pixels as `tbljax.loader`, images that share memory with the ring and are never overwritten
while held, every dtype and layout, resume from state_dict (also with another world size),
rank splits that cover an epoch exactly once, rank and world size read from torch.distributed
(in-process and two gloo processes), the pinned-memory path with CUDA faked, and a small
nn.Module that learns."""

from __future__ import annotations

import gc
import json
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tbljax  # noqa: E402
import tbljax.torch  # noqa: E402
from tbljax._src.rules import order  # noqa: E402

import _loader_testing as T  # noqa: E402

N, H, W, B = 37, 6, 5, 4
MEAN, STD = tbljax.IMAGENET_MEAN, tbljax.IMAGENET_STD


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("torch")
    imgs = T.images(N, H, W)
    labels = (np.arange(N) * 7) % 10
    return imgs, labels, T.write_tbl(d / "a.tbl", imgs, labels)


def bits(t):
    """A tensor as NumPy, bfloat16 as its raw 16 bits (exact comparison)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    return t.numpy()


def jax_batches(path, g, **kw):
    return [{k: np.asarray(v) for k, v in b.items()} for b in tbljax.loader(path, g, num_epochs=1, **kw)]


@pytest.mark.parametrize(
    "dtype,layout", [("float32", "NCHW"), ("float32", "NHWC"), (torch.bfloat16, "NCHW"), (torch.uint8, "NHWC")]
)
def test_same_order_and_pixels_as_the_jax_loader_and_numpy(data, dtype, layout):
    imgs, labels, path = data
    name = {torch.bfloat16: "bfloat16", torch.uint8: "uint8"}.get(dtype, dtype)
    ld = tbljax.torch.loader(path, B, seed=5, dtype=dtype, layout=layout, augment="flip")
    want = jax_batches(path, B, seed=5, dtype=name, layout=layout, augment="flip")
    got = list(ld)
    assert len(got) == len(ld) == len(want) == N // B
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "uint8": torch.uint8}[name]
    for s, (batch, w) in enumerate(zip(got, want)):
        x, y = batch
        assert x.dtype == tdtype and y.dtype == torch.int64 and batch.valid is None
        assert x.shape == ((B, 3, H, W) if layout == "NCHW" else (B, H, W, 3))
        idx = order.permute(s * B + np.arange(B), N, 5, 0)
        np.testing.assert_array_equal(batch.index.numpy(), idx)
        np.testing.assert_array_equal(y.numpy(), labels[idx])
        np.testing.assert_array_equal(bits(x), w["image"].view(bits(x).dtype))
        if name == "float32":  # and against NumPy directly (flip from tbljax.augment)
            flip = tbljax.augment.flips(idx, seed=5, epoch=0)
            src = np.where(flip[:, None, None, None], imgs[idx][:, :, ::-1], imgs[idx])
            np.testing.assert_array_equal(x.numpy(), T.normalize(src, MEAN, STD, layout=layout))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_pixel_value_normalizes_by_the_contract(tmp_path, dtype):
    """All 256 values in every channel: equal to tbljax.kernels.normalize_table."""
    import ml_dtypes

    from tbljax._src.engine import kernels

    v = np.arange(256, dtype=np.uint8).reshape(16, 16)
    img = np.stack([v, v[::-1], v.T], axis=-1)[None]
    path = T.write_tbl(tmp_path / "v.tbl", img, [0])
    x, _ = next(iter(tbljax.torch.loader(path, 1, dtype=dtype, layout="NHWC")))
    table = kernels.normalize_table(MEAN, STD, np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    want = table[np.arange(3), img[0]]
    np.testing.assert_array_equal(bits(x)[0], want.view(bits(x).dtype))


def ring_pointers(ld):
    return {s.views()[0].ctypes.data for s in ld.ring.slots}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8"])
def test_images_share_memory_with_the_ring(data, dtype):
    _, _, path = data
    ld = tbljax.torch.loader(path, B, seed=1, prefetch=1, dtype=dtype)
    seen = []
    for x, _ in ld:
        seen.append(x.data_ptr())
        del x  # the last reference: the slot is free again (no cycle holds a batch)
    assert all(p % 4096 == 0 for p in seen)
    assert ld.metrics()["slots_replaced"] == 0
    assert set(seen) <= ring_pointers(ld)  # no copy: the tensor is the ring's memory
    assert len(set(seen)) < len(seen)  # and the ring is recycled
    x, _ = next(iter(ld))
    held = [s for s in ld.ring.slots if s.views()[0].ctypes.data == x.data_ptr()]
    assert len(held) == 1 and held[0].in_use()  # the slot knows the tensor still reads it
    ld.close()
    del x
    gc.collect()
    assert not held[0].in_use()


def test_held_tensors_are_never_overwritten(data):
    imgs, _, path = data
    ld = tbljax.torch.loader(path, B, seed=2, prefetch=1)
    kept = []
    for _epoch in range(3):
        for x, _y in ld:
            kept.append((x, ld.state_dict()))
    assert ld.metrics()["slots_replaced"] > 0
    ld = tbljax.torch.loader(path, B, seed=2, prefetch=1)
    slices = []  # only a derived view survives: it keeps the slot too
    for batch in ld:
        x, _ = batch
        slices.append((x[1:3].permute(0, 2, 3, 1), batch.index[1:3].numpy()))
        del x, batch
    for s, idx in slices:
        np.testing.assert_array_equal(s.numpy(), T.normalize(imgs[idx], MEAN, STD))
    for step, (x, _) in enumerate(kept):
        e, s = divmod(step, N // B)
        idx = order.permute(s * B + np.arange(B), N, 2, e)
        np.testing.assert_array_equal(x.numpy(), T.normalize(imgs[idx], MEAN, STD, layout="NCHW"))


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_get_the_jax_process_rows_and_cover_an_epoch_once(data, world_size):
    _, labels, path = data
    per_rank = [
        list(tbljax.torch.loader(path, B, seed=4, rank=r, world_size=world_size, drop_remainder=False))
        for r in range(world_size)
    ]
    want = jax_batches(path, B * world_size, seed=4, drop_remainder=False)
    assert [len(p) for p in per_rank] == [len(want)] * world_size  # same steps on every rank
    served = []
    for s, w in enumerate(want):
        for r in range(world_size):
            batch = per_rank[r][s]
            rows = slice(r * B, (r + 1) * B)
            np.testing.assert_array_equal(batch[0].numpy(), w["image"][rows].transpose(0, 3, 1, 2))
            np.testing.assert_array_equal(batch.index.numpy(), w["index"][rows])
            np.testing.assert_array_equal(batch.valid.numpy(), w["valid"][rows])
            np.testing.assert_array_equal(batch[1].numpy(), w["label"][rows])
            served += batch.index[batch.valid].tolist()
    assert sorted(served) == list(range(N))
    np.testing.assert_array_equal(labels[served], [labels[i] for i in served])


def stream(ld, epochs, start_epoch=0, stop_after=None):
    out = []
    for epoch in range(start_epoch, epochs):
        ld.set_epoch(epoch)
        for x, _y in ld:
            out.append(x.numpy().copy())
            if stop_after is not None and len(out) == stop_after:
                return out
    return out


def test_state_dict_resumes_the_identical_stream(data):
    _, _, path = data
    kw = dict(seed=3, augment="rrc_flip")
    full = stream(tbljax.torch.loader(path, B, **kw), 3)
    first = tbljax.torch.loader(path, B, **kw)
    head = stream(first, 3, stop_after=13)  # 9 steps per epoch: inside epoch 1
    state = first.state_dict()
    assert (state["epoch"], state["position"]) == (1, 4 * B)
    second = tbljax.torch.loader(path, B, **kw)
    second.load_state_dict(json.loads(json.dumps(state)))
    tail = stream(second, 3, start_epoch=state["epoch"])  # the usual resume loop
    assert len(head) + len(tail) == len(full) == 27
    for a, b in zip(head + tail, full):
        np.testing.assert_array_equal(a, b)
    # Another world size resumes from the same global position: nothing repeated or skipped.
    ranks = [tbljax.torch.loader(path, B // 2, rank=r, world_size=2, **kw) for r in range(2)]
    for ld in ranks:
        ld.load_state_dict(state)
    pairs = zip(*(next(iter(ld)) for ld in ranks))
    images = torch.cat(next(pairs))
    np.testing.assert_array_equal(images.numpy(), full[13])
    # And a state saved here resumes the JAX loader (one format).
    jl = tbljax.loader(path, B, num_epochs=3, dtype="float32", layout="NCHW", **kw)
    jl.load_state_dict(state)
    np.testing.assert_array_equal(np.asarray(next(iter(jl))["image"]), full[13])


def test_set_epoch_len_and_dataloader_attributes(data):
    _, _, path = data
    ld = tbljax.torch.loader(path, B, seed=6)
    assert len(ld) == N // B and ld.batch_size == B and ld.drop_last is True
    assert ld.rank == 0 and ld.world_size == 1 and not ld.pin_memory
    assert len(list(ld)) == len(ld) and ld.state_dict()["epoch"] == 1  # one epoch per pass
    assert len(list(ld)) == len(ld) and ld.state_dict()["epoch"] == 2  # passes move on
    ld.set_epoch(0)
    for step, _batch in enumerate(ld):
        if step == 2:
            break
    ld.set_epoch(0)  # the cursor is inside epoch 0: continue there
    rest = list(ld)
    assert len(rest) == len(ld) - 3
    np.testing.assert_array_equal(rest[0].index.numpy(), order.permute(3 * B + np.arange(B), N, 6, 0))
    ld.set_epoch(5)
    np.testing.assert_array_equal(next(iter(ld)).index.numpy(), order.permute(np.arange(B), N, 6, 5))
    assert len(tbljax.torch.loader(path, B, drop_remainder=False)) == -(-N // B)
    assert "rank 0 of 1" in repr(ld)


def test_arguments_are_checked(data):
    _, _, path = data
    cases = [
        (dict(rank=1), "both rank and world_size"),
        (dict(rank=2, world_size=2), r"rank must be an integer in \[0, 2\), got 2"),
        (dict(rank=0, world_size=0), "world_size must be an integer >= 1, got 0"),
        (dict(dtype=torch.float16), "dtype must be one of torch.uint8, torch.float32, torch.bfloat16"),
        (dict(layout="CHW"), "layout must be one of"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            tbljax.torch.loader(path, B, **kw)
    with pytest.raises(ValueError, match=r"batch_size \(per rank\) must be .* got 0"):
        tbljax.torch.loader(path, 0)
    with pytest.raises(ValueError, match="batch_size 40 is larger than the dataset"):
        tbljax.torch.loader(path, 20, rank=0, world_size=2)


def test_without_torch_the_error_says_what_to_install(data, monkeypatch):
    _, _, path = data
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(ImportError, match=r"pip install 'tbljax\[torch\]'"):
        tbljax.torch.loader(path, B)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rank_and_world_size_come_from_torch_distributed(data):
    _, _, path = data
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        ld = tbljax.torch.loader(path, B, seed=1)
        assert (ld.rank, ld.world_size) == (dist.get_rank(), dist.get_world_size()) == (0, 1)
        ld2 = tbljax.torch.loader(path, B, rank=1, world_size=2)  # explicit arguments win
        assert (ld2.rank, ld2.world_size) == (1, 2)
    finally:
        dist.destroy_process_group()


GLOO_CHILD = r"""
import json, sys
import torch, torch.distributed as dist
import tbljax.torch
rank, port, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
ld = tbljax.torch.loader(path, 4, seed=9, drop_remainder=False)
counts = torch.zeros(ld.num_samples, dtype=torch.int64)
for b in ld:
    x, y = b
    got = [torch.zeros_like(x) for _ in range(2)]
    dist.all_gather(got, x)                          # the batch travels through gloo intact
    assert torch.equal(got[rank], x)
    counts[b.index[b.valid]] += 1
dist.all_reduce(counts)                              # samples served, summed over ranks
print(json.dumps({"rank": ld.rank, "world": ld.world_size, "steps": len(ld),
                  "counts": counts.tolist()}), flush=True)
dist.destroy_process_group()
"""


def test_two_gloo_processes_split_an_epoch(data):
    _, _, path = data
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GLOO_CHILD, str(r), port, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-4000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sorted(o["rank"] for o in outs) == [0, 1] and {o["world"] for o in outs} == {2}
    assert {o["steps"] for o in outs} == {-(-N // 8)}
    for o in outs:
        assert o["counts"] == [1] * N  # every sample exactly once over both ranks


GLOO_PARTS_CHILD = r"""
import json, sys
import numpy as np, torch.distributed as dist
import tbljax.torch
rank, world, port, spec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
imgs, labels = np.load(spec["images"]), np.load(spec["labels"])
ld = tbljax.torch.loader(spec["paths"][rank], 2, seed=9, dtype="uint8", layout="NHWC",
                         drop_remainder=False, partition="host")
epochs = []
for epoch in range(2):
    ld.set_epoch(epoch)
    served = []
    for b in ld:
        x, idx, valid = b.images.numpy(), b.index.numpy(), b.valid.numpy()
        assert np.array_equal(x[valid], imgs[idx[valid]]) and not x[~valid].any()
        assert np.array_equal(b.labels.numpy()[valid], labels[idx[valid]])
        served += idx[valid].tolist()
    epochs.append(served)
print(json.dumps({"steps": len(ld), "batch": ld.batch_size, "epochs": epochs,
                  "state": ld.state_dict()}), flush=True)
dist.destroy_process_group()
"""
PART_FILES = [5, 9, 4, 11, 7]  # records of each shard file: uneven parts


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_ranks_read_only_their_host_parts(tmp_path, world):
    """partition="host" over torch.distributed: rank r holds only its shard files (the others
    are absent from its folder), reads them alone, and over all ranks every record is served
    once an epoch, each from the rank whose files hold it; every rank runs the same steps."""
    n = sum(PART_FILES)
    imgs, labels = T.images(n, H, W, seed=4), np.arange(n) % 9
    np.save(tmp_path / "images.npy", imgs)
    np.save(tmp_path / "labels.npy", labels)
    starts = np.concatenate([[0], np.cumsum(PART_FILES)]).tolist()
    f = len(PART_FILES)
    files_of = [range(r * f // world, (r + 1) * f // world) for r in range(world)]  # by hand
    paths = []
    for r in range(world):
        (tmp_path / f"rank{r}").mkdir()
        for k in files_of[r]:
            T.write_tbl(
                tmp_path / f"rank{r}" / f"s{k}.tbl", imgs[starts[k] : starts[k + 1]], labels[starts[k] : starts[k + 1]]
            )
        paths.append([str(tmp_path / f"rank{r}" / f"s{k}.tbl") for k in range(f)])
    spec = json.dumps({"images": str(tmp_path / "images.npy"), "labels": str(tmp_path / "labels.npy"), "paths": paths})
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GLOO_PARTS_CHILD, str(r), str(world), port, spec],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-4000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    parts = [range(starts[fs.start], starts[fs.stop]) for fs in files_of]
    assert {o["steps"] for o in outs} == {max(-(-len(p) // 2) for p in parts)}
    assert {o["batch"] for o in outs} == {2}
    for e in range(2):
        for r, o in enumerate(outs):
            assert sorted(o["epochs"][e]) == list(parts[r])
        assert sorted(i for o in outs for i in o["epochs"][e]) == list(range(n))
    assert all(o["epochs"][0] != o["epochs"][1] for o in outs)  # reshuffled every epoch
    assert all(o["state"] == dict(outs[0]["state"]) for o in outs)
    assert outs[0]["state"]["partition"] == "host" and outs[0]["state"]["processes"] == world


def test_host_partition_without_its_ranks_is_refused(data):
    _, _, path = data
    one = tbljax.torch.loader([path], B, seed=1, partition="host")  # one rank: the whole part
    assert one.num_samples == N and len(one) == N // B
    with pytest.raises(
        ValueError,
        match=r"partition='host' on rank 1 of 2: .*torch.distributed.*"
        "not initialized",
    ):
        tbljax.torch.loader([path, path], B, rank=1, world_size=2, partition="host")
    with pytest.raises(ValueError, match="partition must be None .* or 'host'"):
        tbljax.torch.loader(path, B, partition=(0, 1))


def test_the_cuda_path_with_cuda_faked(data, monkeypatch):
    """Without a GPU here: pinned allocation (torch-owned memory seen from NumPy) and the wait
    before a slot is rewritten, with torch.cuda replaced by stand-ins that record calls."""
    imgs, _, path = data
    syncs, real_empty = [], torch.empty

    def empty(*args, pin_memory=False, **kw):
        assert pin_memory
        return real_empty(*args, **kw)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch, "empty", empty)
    ld = tbljax.torch.loader(path, B, seed=3, prefetch=1)
    assert ld.pin_memory
    slot = ld.ring.slots[0]
    assert isinstance(slot.owner.base, torch.Tensor)  # the ring's memory is torch's
    kept = [b for _, b in zip(range(3), ld)]
    dropped = 0
    for _x, _ in ld:
        dropped += 1
    assert syncs and set(syncs) == {0}
    for b in kept:  # held ones intact (their slots were replaced, not rewritten)
        np.testing.assert_array_equal(b[0].numpy(), T.normalize(imgs[b.index.numpy()], MEAN, STD, layout="NCHW"))


def test_a_small_module_trains(tmp_path):
    # Two classes a small conv net tells apart at once: dark and bright images.
    rng = np.random.default_rng(0)
    labels = np.arange(64) % 2
    imgs = np.clip(rng.normal(70 + 110 * labels[:, None, None, None], 25, (64, 8, 8, 3)), 0, 255).astype(np.uint8)
    path = T.write_tbl(tmp_path / "t.tbl", imgs, labels)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 2),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ld = tbljax.torch.loader(path, 16, seed=0, augment="flip")
    losses = []
    for epoch in range(4):
        ld.set_epoch(epoch)
        for x, y in ld:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert len(losses) == 16
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4]), losses

"""tbljax.loader against plain NumPy: every batch equals the NumPy normalization of
data[index], labels equal labels[index]; epochs are permutations; padding covers every sample
once; resume (also with another batch size or process count) repeats and skips nothing;
augmentation depends only on (seed, epoch, index); host buffers alias jax.Arrays without being
overwritten; threads always stop. Multi-device and multi-process cases run in subprocesses."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import tbljax
from tbljax import order
from tbljax._src.engine import kernels
from tbljax._src.jax import loader as jax_loader  # noqa: E402
from tbljax._src.rules import augment
from tbljax._src.rules.augment import Augment

import _loader_testing as T

N, H, W, G = 37, 6, 5, 8
MEAN, STD = tbljax.IMAGENET_MEAN, tbljax.IMAGENET_STD
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("loader")
    imgs = T.images(N, H, W)
    labels = (np.arange(N) * 7) % 10
    path = T.write_tbl(d / "a.tbl", imgs, labels)
    return imgs, labels, path


def run(ld, steps=None):
    """Batches as dicts of NumPy arrays (single process: every array is fully addressable)."""
    out = []
    for b in ld:
        out.append({k: np.asarray(v) for k, v in b.items()})
        if steps is not None and len(out) == steps:
            break
    return out


def valid_stream(batches):
    return np.concatenate([b["index"][b["valid"]] if "valid" in b else b["index"] for b in batches]).tolist()


def loader_threads():
    return [t for t in threading.enumerate() if t.name == "tbljax-loader"]


@pytest.mark.parametrize(
    "dtype,layout", [("float32", "NHWC"), ("float32", "NCHW"), ("bfloat16", "NHWC"), ("uint8", "NCHW")]
)
def test_batches_equal_numpy_reference(data, dtype, layout):
    imgs, labels, path = data
    ld = tbljax.loader(path, G, seed=5, num_epochs=1, dtype=dtype, layout=layout)
    assert len(ld) == N // G
    batches = run(ld)
    assert len(batches) == N // G
    np_dtype = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(jax.numpy.bfloat16), "uint8": np.dtype(np.uint8)}[
        dtype
    ]
    for s, b in enumerate(batches):
        idx = b["index"]
        assert set(b) == {"image", "label", "index"}
        assert b["image"].dtype == np_dtype and b["index"].dtype == np.int32
        np.testing.assert_array_equal(idx, order.permute(s * G + np.arange(G), N, 5, 0))
        np.testing.assert_array_equal(b["label"], labels[idx])
        if dtype == "uint8":
            ref = imgs[idx].transpose(0, 3, 1, 2) if layout == "NCHW" else imgs[idx]
        else:
            ref = T.normalize(imgs[idx], MEAN, STD, np_dtype, layout)
        np.testing.assert_array_equal(b["image"], ref)


def test_padding_serves_every_sample_exactly_once(data):
    imgs, labels, path = data
    ld = tbljax.loader(path, G, seed=1, num_epochs=1, drop_remainder=False)
    assert len(ld) == -(-N // G) == 5
    batches = run(ld)
    assert len(batches) == 5
    for b in batches:  # one static shape for every step
        assert b["image"].shape == (G, H, W, 3) and b["valid"].shape == (G,)
    assert sorted(valid_stream(batches)) == list(range(N))
    last = batches[-1]
    assert last["valid"].tolist() == [True] * (N % G) + [False] * (G - N % G)
    pad = ~last["valid"]
    assert (last["index"][pad] == -1).all() and (last["label"][pad] == -1).all()
    assert not last["image"][pad].any()
    ok = last["valid"]
    np.testing.assert_array_equal(last["image"][ok], T.normalize(imgs[last["index"][ok]], MEAN, STD))


def test_shuffle_off_and_epochs_seeds_differ(data):
    _, _, path = data
    plain = run(tbljax.loader(path, G, shuffle=False, num_epochs=1))
    assert valid_stream(plain) == list(range(N // G * G))
    a = valid_stream(run(tbljax.loader(path, G, seed=0, num_epochs=2)))
    b = valid_stream(run(tbljax.loader(path, G, seed=1, num_epochs=2)))
    epoch_len = N // G * G
    assert a[:epoch_len] != a[epoch_len:] and a != b
    assert len(set(a[:epoch_len])) == epoch_len


def test_resume_mid_epoch_gives_the_identical_stream(data):
    _, _, path = data
    full = run(tbljax.loader(path, G, seed=2, num_epochs=3, augment="flip"))
    first = tbljax.loader(path, G, seed=2, num_epochs=3, augment="flip")
    head = run(first, steps=6)  # 4 steps per epoch: stops inside epoch 1
    state = first.state_dict()  # counts batches handed out, not those prefetched
    assert state == {"version": 1, "seed": 2, "epoch": 1, "position": 16, "fingerprint": tbljax.open(path).fingerprint}
    second = tbljax.loader(path, G, seed=2, num_epochs=3, augment="flip")
    second.load_state_dict(json.loads(json.dumps(state)))  # survives a JSON round trip
    tail = run(second)
    assert len(head) + len(tail) == len(full) == 12
    for got, want in zip(head + tail, full):
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_resume_with_another_batch_size_repeats_and_skips_nothing(data, drop_remainder):
    _, _, path = data
    first = tbljax.loader(path, G, seed=4, num_epochs=2, drop_remainder=drop_remainder)
    head = valid_stream(run(first, steps=2))
    state = first.state_dict()
    assert (state["epoch"], state["position"]) == (0, 16)
    for g in (3, 5, 16):
        ld = tbljax.loader(path, g, seed=4, num_epochs=2, drop_remainder=drop_remainder)
        ld.load_state_dict(state)
        tail = valid_stream(run(ld))
        perm0 = order.permute(np.arange(N), N, 4, 0).tolist()
        perm1 = order.permute(np.arange(N), N, 4, 1).tolist()
        assert head == perm0[:16]
        if drop_remainder:  # each epoch ends at its last full batch of the new size
            rest0 = (N - 16) // g * g
            assert tail == perm0[16 : 16 + rest0] + perm1[: N // g * g], g
        else:
            assert tail == perm0[16:] + perm1, g


def test_len_set_epoch_and_iterating_again(data):
    _, _, path = data
    ld = tbljax.loader(path, G, seed=6, num_epochs=2)
    assert len(ld) == 4
    ld.set_epoch(1)
    first = run(ld, steps=1)[0]
    np.testing.assert_array_equal(first["index"], order.permute(np.arange(G), N, 6, 1))
    ld.set_epoch(0)
    everything = run(ld)
    assert len(everything) == 8 and ld.state_dict()["epoch"] == 2
    again = run(ld)  # after the end, a new pass starts over at epoch 0
    assert valid_stream(again) == valid_stream(everything)
    restored = tbljax.loader(path, G, seed=6, num_epochs=2)
    restored.load_state_dict(ld.state_dict())  # a finished run, resumed: nothing left
    assert run(restored) == []
    with pytest.raises(ValueError, match="epoch must be .* got -1"):
        ld.set_epoch(-1)


def test_flip_matches_numpy(data):
    imgs, _, path = data
    for b in run(tbljax.loader(path, G, seed=8, num_epochs=1, augment="flip", dtype="uint8")):
        idx = b["index"]
        f = augment.flips(idx, seed=8, epoch=0)
        ref = np.where(f[:, None, None, None], imgs[idx][:, :, ::-1], imgs[idx])
        np.testing.assert_array_equal(b["image"], ref)


def test_crop_depends_only_on_seed_epoch_and_index(data):
    imgs, _, path = data
    aug = Augment(size=(4, 3))
    by_key = {}  # (epoch, index) -> images served for it, one per batch size
    for g in (G, 4, 1):
        ld = tbljax.loader(path, g, seed=9, num_epochs=2, augment=aug, dtype="uint8")
        for step, b in enumerate(run(ld)):
            assert b["image"].shape == (g, 4, 3, 3)
            for row, i in enumerate(b["index"]):
                by_key.setdefault((step // len(ld), int(i)), []).append(b["image"][row])
    for (e, i), ims in by_key.items():
        for im in ims[1:]:
            np.testing.assert_array_equal(im, ims[0])
        if i < 10:  # the kernel fed with this sample's own box and flip, alone
            box = augment.crop_boxes(np.array([i]), height=H, width=W, seed=9, epoch=e)
            flip = augment.flips(np.array([i]), seed=9, epoch=e)
            ref = kernels.gather(imgs, np.array([i]), np.empty((1, 4, 3, 3), np.uint8), crop=box, flip=flip)
            np.testing.assert_array_equal(ims[0], ref[0])
    served_by_all = [k for k, ims in by_key.items() if len(ims) == 3]
    assert len(served_by_all) >= 2 * (N // G * G) - 2 * G
    differ = [
        not np.array_equal(by_key[(0, i)][0], by_key[(1, i)][0])
        for i in range(N)
        if (0, i) in by_key and (1, i) in by_key
    ]
    assert np.mean(differ) > 0.7  # another epoch, another crop


def test_state_errors_name_the_mismatch(data, tmp_path):
    imgs, labels, path = data
    other = T.write_tbl(tmp_path / "b.tbl", imgs[:20], labels[:20])
    ld = tbljax.loader(path, G, seed=1)
    state = ld.state_dict()
    ld2 = tbljax.loader(other, 4, seed=1)
    with pytest.raises(ValueError, match="state is for dataset '37-.*' but this loader reads dataset '20-"):
        ld2.load_state_dict(state)
    with pytest.raises(ValueError, match="version 2 is not supported"):
        ld.load_state_dict({**state, "version": 2})
    with pytest.raises(ValueError, match="seed=1 but this loader has seed=2"):
        tbljax.loader(path, G, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"\[0, 37\], got 40"):
        ld.load_state_dict({**state, "position": 40})


def test_options_are_validated_with_the_value_received(data):
    _, _, path = data
    cases = [
        (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
        (dict(batch_size=64), "batch_size 64 is larger than the dataset \\(37 samples\\)"),
        (dict(dtype="float16"), "dtype must be one of .* got 'float16'"),
        (dict(layout="HWC"), "layout must be one of .* got 'HWC'"),
        (dict(mean=(0.5, 0.5)), "mean must have 3 values"),
        (dict(std=(1, 0, 1)), r"std\[1\] = 0.0 must be a finite number > 0"),
        (dict(prefetch=0), "prefetch must be an integer >= 1, got 0"),
        (dict(augment="rrc"), "augment must be None, 'rrc_flip', 'flip' or an Augment, got 'rrc'"),
        (dict(num_epochs=0), "num_epochs must be None .* got 0"),
        (dict(seed=-3), "seed must be an integer in \\[0, 2\\*\\*64\\), got -3"),
    ]
    for kw, msg in cases:
        kw = {"batch_size": G, **kw}
        with pytest.raises(ValueError, match=msg):
            tbljax.loader(path, kw.pop("batch_size"), **kw)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("batch",))
    with pytest.raises(ValueError, match="only the batch .* got spec"):
        tbljax.loader(path, G, sharding=NamedSharding(mesh, PartitionSpec(None, "batch")))
    with pytest.raises(TypeError, match="got str"):
        tbljax.loader(path, G, sharding="batch")
    with pytest.raises(dataclasses_frozen_error()):
        tbljax.loader(path, G).options.seed = 3


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_ring_memory_is_aliased_by_jax_without_a_copy():
    from tbljax._src.engine import ring
    from tbljax._src.jax import sharding
    from tbljax._src.jax.arrays import to_global

    rows = sharding.row_layout(sharding.batch_sharding(None), 4)
    slot = ring.Slot(rows, (5, 7, 3), np.float32)
    views = slot.views()
    assert all(v.ctypes.data % ring.ALIGN == 0 for v in views)
    arr = to_global(rows, views, (5, 7, 3))
    assert [s.data.unsafe_buffer_pointer() for s in arr.addressable_shards] == [v.ctypes.data for v in views]
    del views
    assert slot.in_use()  # the jax.Array still reads the slot
    held = np.asarray(arr)  # so does a NumPy view of it
    del arr
    gc.collect()
    assert slot.in_use()
    del held
    gc.collect()
    assert not slot.in_use()


def test_dropped_batches_recycle_the_ring_and_held_ones_stay_intact(data):
    imgs, _, path = data
    cpu = jax.devices()[0].platform == "cpu"
    ld = tbljax.loader(path, G, seed=3, num_epochs=4, prefetch=2)
    pointers = []
    for b in ld:
        pointers.append(b["image"].addressable_shards[0].data.unsafe_buffer_pointer())
        del b
        gc.collect()
    second_pass = [b["image"].addressable_shards[0].data.unsafe_buffer_pointer() for b in ld]
    if cpu:
        assert all(p % 4096 == 0 for p in pointers)  # served from the aligned ring
        assert len(set(pointers)) <= 2 + 3 < len(pointers)  # prefetch + 3 slots, reused
        assert set(second_pass) <= set(pointers)  # also by the next pass
    # Holding every batch: none of them is overwritten by later steps.
    ld = tbljax.loader(path, G, seed=3, num_epochs=4, prefetch=2)
    held = list(ld)
    assert len(held) == 16
    for b in held:
        idx = np.asarray(b["index"])
        np.testing.assert_array_equal(np.asarray(b["image"]), T.normalize(imgs[idx], MEAN, STD))
    if cpu:
        assert ld.metrics()["slots_replaced"] > 0
    m = ld.metrics()
    assert m["steps"] == 16 and m["images"] == 16 * G and m["produced_img_per_s"] > 0
    assert m["wait_seconds"] >= m["last_wait_seconds"] >= 0


def test_shutdown_is_clean_on_break_error_del_and_close(data):
    _, _, path = data
    before = len(loader_threads())
    ld = tbljax.loader(path, G, prefetch=2)  # endless
    per_pass = 3  # a pipelined pass: the drawer, the builder and the finisher (engine/producer.py)
    for i, _ in enumerate(ld):
        if i == 2:
            break
    assert len(loader_threads()) == before
    with pytest.raises(ZeroDivisionError):
        for _ in ld:
            raise ZeroDivisionError
    assert len(loader_threads()) == before
    it = iter(ld)
    next(it)
    assert len(loader_threads()) == before + per_pass
    del it
    gc.collect()
    assert len(loader_threads()) == before
    it = iter(ld)
    next(it)
    it2 = iter(ld)  # a new pass stops the previous one
    next(it2)
    assert len(loader_threads()) == before + per_pass
    with pytest.raises(StopIteration):
        next(it)
    ld.load_state_dict(ld.state_dict())  # changing the cursor stops the running pass too
    assert len(loader_threads()) == before
    del it, it2
    it = iter(ld)
    next(it)
    del ld  # the iterator keeps what it needs; dropping it last stops the thread
    gc.collect()
    assert len(loader_threads()) == before + per_pass
    it.close()
    assert len(loader_threads()) == before


def test_ctrl_c_while_a_pass_closes_still_stops_its_threads(data, monkeypatch):
    """A Ctrl-C (a real SIGINT) landing while close() waits for a producer inside a slow step:
    the KeyboardInterrupt comes out once the threads have stopped, none is left behind."""
    _, _, path = data
    real = kernels.prepare_gather

    def slow(*args, **kw):
        time.sleep(0.4)
        return real(*args, **kw)

    before = len(loader_threads())
    it = iter(tbljax.loader(path, G, prefetch=2))
    monkeypatch.setattr(kernels, "prepare_gather", slow)
    for _ in range(4):  # past the prefetched batches: the producer is now inside a slow step
        next(it)
    # A shell that started pytest in the background ignores SIGINT: handle it as Python does.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        press = threading.Timer(0.1, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
        press.start()
        with pytest.raises(KeyboardInterrupt):
            it.close()
            time.sleep(5)  # close() returned before the press: it lands here
        press.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(loader_threads()) == before


def test_a_ctrl_c_that_breaks_a_threading_lock_is_still_a_keyboard_interrupt(data, monkeypatch):
    """CPython 3.11: a Ctrl-C landing while Condition.wait takes its lock back surfaces as
    "RuntimeError: release unlocked lock" with the KeyboardInterrupt as its context (seen in
    Thread.start, test_interrupt's mixture child). The loader raises the interrupt, and leaves
    no thread behind."""
    _, _, path = data
    real_start, calls = threading.Thread.start, []

    def start(self):
        calls.append(self)
        if len(calls) == 2:
            real_start(self)
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise RuntimeError("release unlocked lock")  # noqa: B904 - its context is the point
        return real_start(self)

    before = len(loader_threads())
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(KeyboardInterrupt):
        iter(tbljax.loader(path, G, prefetch=2))
    monkeypatch.undo()
    assert len(loader_threads()) == before


def test_producer_errors_reach_the_consumer(data, monkeypatch):
    _, _, path = data
    real, calls = kernels.prepare_gather, []

    def failing(*args, **kw):  # the loader checks a batch, then makes the native call
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("disk on fire")
        return real(*args, **kw)

    monkeypatch.setattr(kernels, "prepare_gather", failing)
    before = len(loader_threads())
    got = []
    with pytest.raises(ValueError, match="disk on fire"):
        for b in tbljax.loader(path, G):
            got.append(b)
    assert len(got) == 2 and len(loader_threads()) == before
    # A failure in the second stage (making the jax.Arrays) reaches the consumer too, after
    # the batches before it, and stops both threads.
    monkeypatch.setattr(kernels, "prepare_gather", real)
    real_to_jax, finished = jax_loader.to_jax, []

    def failing_to_jax(*args, **kw):
        finished.append(1)
        if len(finished) == 4:
            raise RuntimeError("device lost")
        return real_to_jax(*args, **kw)

    monkeypatch.setattr(jax_loader, "to_jax", failing_to_jax)
    for consumer_pause in (0.0, 0.05):  # a slow consumer: the queue is full when it fails
        finished.clear()
        got = []
        with pytest.raises(RuntimeError, match="device lost"):
            for b in tbljax.loader(path, G, prefetch=3):
                time.sleep(consumer_pause)
                got.append(b)
        assert len(got) == 3 and len(loader_threads()) == before


def test_shard_files_serve_the_same_batches_as_one_file(data, tmp_path):
    imgs, labels, path = data
    parts = [
        T.write_tbl(tmp_path / f"p{k}.tbl", imgs[a:b], labels[a:b])
        for k, (a, b) in enumerate([(0, 10), (10, 11), (11, N)])
    ]
    want = run(tbljax.loader(path, G, seed=7, num_epochs=1, augment="rrc_flip"))
    got = run(tbljax.loader([str(p) for p in parts], G, seed=7, num_epochs=1, augment="rrc_flip"))
    for a, b in zip(got, want):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_lz4_records_serve_like_raw(tmp_path):
    """Non-RAW records go through Dataset.read_into, then the same kernel."""
    imgs = np.repeat(T.images(21, 1, 8, seed=3), 8, axis=1)  # repeated rows: LZ4 shrinks them
    labels = np.arange(21) % 4
    raw, lz4 = T.write_tbl(tmp_path / "raw.tbl", imgs, labels), tmp_path / "lz4.tbl"
    with tbljax.Writer(lz4, len(imgs)) as w:
        for im in imgs:
            w.add_raw(im, lz4=True)
        w.set_metadata(labels=labels)
    assert tbljax.open(lz4).record_format == "lz4"
    want = run(tbljax.loader(raw, 4, seed=1, num_epochs=1, drop_remainder=False, threads=1))
    got = run(tbljax.loader(lz4, 4, seed=1, num_epochs=1, drop_remainder=False, threads=1))
    assert len(got) == len(want) == 6
    for a, b in zip(got, want):
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])


def _env(**extra):
    env = dict(os.environ)
    # The installed tbljax (or the developer's absolute PYTHONPATH), plus the test helpers.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(TESTS), env.get("PYTHONPATH", "")] if p)
    env.update(extra)
    return env


INTERRUPT_CHILD = r"""
import os, signal, sys, threading, time
# A shell that started pytest in the background ignores SIGINT, and children inherit that:
# restore Python's Ctrl-C handler, which is what this test is about.
signal.signal(signal.SIGINT, signal.default_int_handler)
import tbljax
ld = tbljax.loader(sys.argv[1], 4, prefetch=2)  # endless
try:
    for i, b in enumerate(ld):
        if i == 3:
            raise KeyboardInterrupt
except KeyboardInterrupt:
    pass
print("threads after caught interrupt:",
      sum(t.name == "tbljax-loader" for t in threading.enumerate()), flush=True)
for i, b in enumerate(ld):
    if i == 3:
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, not caught this time
    time.sleep(0.01)
"""


def test_keyboard_interrupt_exits_promptly(data):
    _, _, path = data
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", INTERRUPT_CHILD, str(path)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert "threads after caught interrupt: 0" in p.stdout, p.stdout + p.stderr
    assert p.returncode != 0 and "KeyboardInterrupt" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 60


EXIT_CHILD = r"""
import sys
import tbljax
it = iter(tbljax.loader(sys.argv[1], 4, prefetch=2))  # endless, left running at exit
next(it)
print("leaving", flush=True)
"""


def test_interpreter_exit_with_a_running_loader_does_not_hang(data):
    _, _, path = data
    p = subprocess.run(
        [sys.executable, "-c", EXIT_CHILD, str(path)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0 and "leaving" in p.stdout, p.stderr


EIGHT_DEVICES_CHILD = r"""
import sys
import numpy as np, jax
import _loader_testing as T
import tbljax
from tbljax import order
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
assert len(jax.devices()) == 8
ds = tbljax.open(sys.argv[1]); data, labels, n = ds.view(), ds.labels, len(ds)
mean, std = tbljax.IMAGENET_MEAN, tbljax.IMAGENET_STD

def check(ld, g, per_device):
    for s, b in enumerate(ld):
        idx = order.permute(s * g + np.arange(g), n, 0, 0)
        for shard in b["image"].addressable_shards:
            assert shard.data.shape[0] == per_device, shard.data.shape
            r = shard.index[0]
            np.testing.assert_array_equal(np.asarray(shard.data),
                                          T.normalize(data[idx[r]], mean, std))
        np.testing.assert_array_equal(np.asarray(b["index"]), idx)
        np.testing.assert_array_equal(np.asarray(b["label"]), labels[idx])
        assert b["image"].sharding.is_equivalent_to(b["label"].sharding, 1)

check(tbljax.loader(ds, 16, num_epochs=1), 16, 2)              # default: batch over all 8
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
ld = tbljax.loader(ds, 8, num_epochs=1, sharding=NamedSharding(mesh, P("data")))
check(ld, 8, 4)                                                 # replicated over "model"
assert ld.rows.ranges == ((0, 4), (4, 8))                    # each row range built once
check(tbljax.loader(ds, 8, num_epochs=1, sharding=mesh), 8, 1)  # a Mesh: batch over both axes
try:
    tbljax.loader(ds, 12)
except ValueError as e:
    assert "global batch 12 does not split evenly over the 8 batch shards" in str(e), e
else:
    raise AssertionError("no error for a batch that does not split")
print("ok", flush=True)
"""


def test_eight_devices_in_one_process(data):
    _, _, path = data
    p = subprocess.run(
        [sys.executable, "-c", EIGHT_DEVICES_CHILD, str(path)],
        env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=8"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes(data, tmp_path):
    """Two real JAX processes on localhost (2 CPU devices each) share one padded epoch."""
    _, _, path = data
    port = _free_port()
    env = _env(XLA_FLAGS="--xla_force_host_platform_device_count=2")
    outs = [tmp_path / f"p{i}.json" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(TESTS / "_multihost_worker.py"), str(i), str(port), str(path), str(outs[i])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n---\n".join(logs)[-6000:]
    res = [json.loads(o.read_text()) for o in outs]
    perm = order.permute(np.arange(N), N, 3, 0).tolist()
    for r in res:
        # Each process gave its kernel exactly the indices of its own rows, nothing else.
        assert r["kernel_indices"] == r["local_indices"]
        assert r["stream"] == perm and r["steps"] == 5
    k0, k1 = (set(r["kernel_indices"]) for r in res)
    assert not k0 & k1 and k0 | k1 == set(range(N))
    assert len(res[0]["kernel_indices"]) + len(res[1]["kernel_indices"]) == N
    # Resume the two-process run's state in this single process, with another batch size.
    state = res[0]["state_after_2"]
    assert state == res[1]["state_after_2"] and state["position"] == 16
    ld = tbljax.loader(path, 5, seed=3, num_epochs=1, drop_remainder=False)
    ld.load_state_dict(state)
    assert valid_stream(run(ld)) == perm[16:]


def test_jitted_steps_read_their_own_batch_under_async_dispatch(data):
    """Steps are dispatched without waiting, so XLA may still read a batch when the loader
    wants its slot back: the slot must not be rewritten before that computation is done."""
    imgs, _, path = data
    jnp = jax.numpy

    @jax.jit
    def step(x):
        w = jnp.full((256, 256), 1.0 / 256)
        for _ in range(6):  # some work first, so the batch is read late
            w = w @ w + 1.0 / 256
        one = w[0, 0] / w[0, 0]  # 1.0, but only once the work is done
        return (x.astype(jnp.float32) ** 2 * one).sum(axis=(1, 2, 3))

    ld = tbljax.loader(path, G, seed=12, num_epochs=6, prefetch=1, dtype="uint8")
    pending = [(step(b["image"]), np.asarray(b["index"])) for b in ld]  # no blocking here
    for out, idx in pending:
        want = (imgs[idx].astype(np.float32) ** 2).sum(axis=(1, 2, 3))
        np.testing.assert_array_equal(np.asarray(out), want)
    # Only queued computations held the slots: the producer waited for them (back-pressure)
    # instead of faulting in fresh memory per step.
    assert ld.metrics()["slots_replaced"] == 0


def test_wait_seconds_counts_a_slow_producer(data, monkeypatch):
    # The other side of the back-pressure rule: a producer slower than the consumer is what
    # wait_seconds is for (tbljax bench and the demo report it).
    _, _, path = data
    real = kernels.prepare_gather

    def slow(*args, **kw):
        time.sleep(0.02)
        return real(*args, **kw)

    monkeypatch.setattr(kernels, "prepare_gather", slow)
    ld = tbljax.loader(path, G, seed=1, num_epochs=2)
    steps = sum(1 for _ in ld)
    m = ld.metrics()
    assert m["slot_wait_seconds"] == 0
    assert m["wait_seconds"] > 0.5 * steps * 0.02


def test_ring_waits_for_slots_in_flight_and_not_for_kept_batches(data):
    imgs, _, path = data
    from tbljax import HostLoader, LoaderOptions

    # Each batch's pixels stay referenced 30 ms after the consumer drops it (as by a copy or
    # a computation in flight): the ring waits for them and never allocates a new slot.
    opts = LoaderOptions(batch_size=G, seed=4, num_epochs=3, dtype="uint8", prefetch=1)
    ld = HostLoader(tbljax.open(path), opts)
    readers = []
    for hb in ld:
        np.testing.assert_array_equal(hb.image, imgs[hb.index])
        # Its own view of the slot, dropped when the thread ends (Thread drops its args).
        t = threading.Thread(target=lambda v: (time.sleep(0.03), v.sum()), args=(hb.image[...],))
        t.start()
        readers.append(t)
        del hb, t
    for t in readers:
        t.join()
    m = ld.metrics()
    assert m["slots_replaced"] == 0 and m["slot_wait_seconds"] > 0
    # The consumer then waited on its own earlier batches, not on data: not counted as such.
    assert m["wait_seconds"] < 0.5 * m["slot_wait_seconds"]
    # A batch the consumer keeps is replaced at once: no waiting for what will never be
    # released (the training-loop pattern `first = next(it)` kept for the whole run).
    ld = HostLoader(tbljax.open(path), opts)
    it = iter(ld)
    first = next(it)
    rest = [hb.index.copy() for hb in it]
    assert len(rest) == 3 * len(ld) - 1
    m = ld.metrics()
    assert m["slots_replaced"] >= 1 and m["slot_wait_seconds"] < 0.5
    np.testing.assert_array_equal(first.image, imgs[first.index])


def test_a_layer_on_top_plugs_in_through_the_public_seams(data):
    """A framework layer is a HostLoader subclass overriding finisher / pass_bounds /
    pass_ended, reading cursor, layout and row_shape: what Loader and the adapters do."""
    imgs, labels, path = data
    from tbljax import HostLoader, LoaderOptions

    class Copies(HostLoader):
        ended = 0

        def finisher(self):
            # Copies: nothing handed out views the slot, so the ring never waits or replaces.
            return lambda hb: ((hb.index.copy(), hb.image.copy()), [])

        def pass_bounds(self):
            return self.cursor, self.cursor[0] + 1  # one epoch per pass

        def pass_ended(self):
            type(self).ended += 1

    ld = Copies(tbljax.open(path), LoaderOptions(batch_size=G, seed=2, dtype="uint8"))
    assert ld.row_shape == (*imgs.shape[1:3], 3) and ld.rows.global_batch == G
    first = [b for b in ld]
    assert ld.cursor == (1, 0) and Copies.ended == 1 and len(first) == len(ld)
    second = [b for b in ld]  # the next pass serves the next epoch, as its bounds say
    assert ld.cursor == (2, 0) and Copies.ended == 2
    for (idx, img), want in zip(
        first + second, [order.permute(np.arange(s * G, (s + 1) * G), N, 2, e) for e in (0, 1) for s in range(len(ld))]
    ):
        np.testing.assert_array_equal(idx, want)
        np.testing.assert_array_equal(img, imgs[idx])
    assert ld.metrics()["slots_replaced"] == 0

    class Views(HostLoader):
        def finisher(self):
            return lambda hb: (hb.image, [hb.image])  # hands out a view of the slot

    ld = Views(tbljax.open(path), LoaderOptions(batch_size=G, seed=2, dtype="uint8", num_epochs=2, prefetch=1))
    kept = list(ld)  # every view kept: each slot is replaced, never overwritten
    assert ld.metrics()["slots_replaced"] >= 1
    ref = order.permute(np.arange(G), N, 2, 0)
    np.testing.assert_array_equal(kept[0], imgs[ref])

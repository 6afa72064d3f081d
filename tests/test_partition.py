"""Host-local reading: ``tbljax.loader(paths, ..., partition="host")``. Real JAX processes on
localhost (tests/_partition_worker.py) each read only their own part of uneven shard files
(the other parts' files do not exist on their "host"), and this test checks what they served
against plain arithmetic and the NumPy pixels: every record once an epoch, each process's rows
from its part, the same steps everywhere, the global arrays in process order, a new order each
epoch, exact resume, the rule for another process count, and a single file split by records."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tbljax
from tbljax import order

import _loader_testing as T

TESTS = Path(__file__).resolve().parent
FILES = [5, 9, 4, 11, 7]  # records of each shard file: parts of uneven sizes
N = sum(FILES)
SINGLE = 23  # records of the single-file dataset (the first 23 images)
G, SEED, EPOCHS = 8, 5, 2


def _parts_of_files(processes):
    """The global record ranges of every process's part: whole files, contiguous blocks of
    them (process p of P: files [p*F//P, (p+1)*F//P)), written out here as plain arithmetic."""
    starts = np.concatenate([[0], np.cumsum(FILES)])
    f = len(FILES)
    return [range(int(starts[p * f // processes]), int(starts[(p + 1) * f // processes])) for p in range(processes)]


def _parts_of_records(n, processes):
    return [range(p * n // processes, (p + 1) * n // processes) for p in range(processes)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("parts")
    imgs = T.images(N, seed=11)
    labels = (np.arange(N) * 7 + 3) % 10
    np.save(d / "images.npy", imgs)
    np.save(d / "labels.npy", labels)
    starts = np.concatenate([[0], np.cumsum(FILES)])
    shards = [
        T.write_tbl(d / f"s{k}.tbl", imgs[starts[k] : starts[k + 1]], labels[starts[k] : starts[k + 1]])
        for k in range(len(FILES))
    ]
    single = T.write_tbl(d / "single.tbl", imgs[:SINGLE], labels[:SINGLE])
    return d, imgs, labels, shards, single


def _staged(d, shards, processes):
    """Per process, the full list of shard paths in its own folder, where only the files of
    its part exist (what staging a host's part leaves)."""
    f = len(shards)
    lists = []
    for p in range(processes):
        host = d / f"host{processes}-{p}"
        host.mkdir(exist_ok=True)
        for k in range(p * f // processes, (p + 1) * f // processes):
            if not (host / shards[k].name).exists():
                os.link(shards[k], host / shards[k].name)
        lists.append([str(host / s.name) for s in shards])
    return lists


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(d, processes, devices, runs, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"images": str(d / "images.npy"), "labels": str(d / "labels.npy"), "runs": runs}))
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(TESTS), env.get("PYTHONPATH", "")] if p)
    port = _free_port()
    outs = [tmp_path / f"p{i}.json" for i in range(processes)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(TESTS / "_partition_worker.py"),
                str(i),
                str(processes),
                str(port),
                str(spec),
                str(outs[i]),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(processes)
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
    assert all(p.returncode == 0 for p in procs), "\n---\n".join(logs)[-8000:]
    return [json.loads(o.read_text()) for o in outs]


def _epoch_of(step):
    """The epoch a step belongs to, from the cursor just after it (position 0: it ended one)."""
    epoch, position = step["cursor"]
    return epoch if position else epoch - 1


def _check_run(runs, parts, local_batch, *, drop):
    """What every process served in one run (``runs[p]``: process p's), checked across
    processes. Returns {(process, epoch): valid sample indices in step order}."""
    sizes = [len(p) for p in parts]
    per_epoch = min(n // local_batch for n in sizes) if drop else max(-(-n // local_batch) for n in sizes)
    served = {}
    for p, run in enumerate(runs):
        assert run["len"] == per_epoch  # every process runs the same number of steps
        for step in run["steps"]:
            valid = [i for i, v in zip(step["local"], step["valid"]) if v]
            assert all(i in parts[p] for i in valid), (p, valid, parts[p])
            served.setdefault((p, _epoch_of(step)), []).extend(valid)
    assert len({len(run["steps"]) for run in runs}) == 1
    for k in range(len(runs[0]["steps"])):  # the global array: the processes' rows in order
        glob = runs[0]["steps"][k]["global"]
        assert all(r["steps"][k]["global"] == glob for r in runs)
        assert glob == [i for r in runs for i in r["steps"][k]["local"]]
    return served


def _check_epochs(served, parts, local_batch, *, drop, epochs=EPOCHS):
    processes = len(parts)
    for e in range(epochs):
        got = [served.get((p, e), []) for p in range(processes)]
        if drop:
            per_epoch = min(len(p) for p in parts) // local_batch
            # Each part serves the same number of rows, each record at most once.
            assert all(len(g) == per_epoch * local_batch == len(set(g)) for g in got)
        else:  # exactly once over all hosts
            assert sorted(i for g in got for i in g) == sorted(i for p in parts for i in p)
    for p in range(processes):  # each part is reshuffled every epoch
        assert served[(p, 0)] != served[(p, 1)]


def _flips_of_global_loader(path_or_paths, epochs, imgs):
    """{(epoch, sample): flipped} from the global order (partition=None, one process)."""
    ld = tbljax.loader(
        path_or_paths, 4, seed=SEED, num_epochs=epochs, dtype="uint8", augment="flip", drop_remainder=False
    )
    flips = {}
    for b in ld:
        epoch = ld.cursor[0] if ld.cursor[1] else ld.cursor[0] - 1
        for i, v, im in zip(np.asarray(b["index"]), np.asarray(b["valid"]), np.asarray(b["image"])):
            if v:
                flips[(epoch, int(i))] = not np.array_equal(im, imgs[i])
    return flips


def _check_flips(res, name, flips):
    """A sample's flip depends on (seed, epoch, sample), not on the host it is served by."""
    checked = 0
    for r in res:
        for step in r[name]["steps"]:
            for i, v, f in zip(step["local"], step["valid"], step["flips"]):
                if v:
                    assert f == flips[(_epoch_of(step), i)]
                    checked += 1
    assert checked


@pytest.mark.parametrize("processes,devices", [(2, 2), (4, 1)])
def test_processes_read_only_their_parts(data, tmp_path, processes, devices):
    d, imgs, labels, shards, single = data
    b = G // processes
    per_epoch = max(-(-len(p) // b) for p in _parts_of_files(processes))
    paths = _staged(d, shards, processes)
    runs = {
        "files": {
            "paths": paths,
            "batch": G,
            "seed": SEED,
            "epochs": EPOCHS,
            "drop": False,
            "save_after": [1, per_epoch - 1],
            "resume": [[1, G], [1, G // 2]],
        },
        "dropped": {"paths": paths, "batch": G, "seed": SEED, "epochs": EPOCHS, "drop": True},
        "single": {"paths": str(single), "batch": G, "seed": SEED, "epochs": EPOCHS, "drop": False},
    }
    if processes == 2:  # process 1's own file is missing: every process fails, none hangs
        missing = [paths[0], [str(tmp_path / "nowhere" / s.name) for s in shards]]
        runs["missing"] = {"paths": missing, "batch": G, "seed": SEED, "epochs": 1, "drop": False}
    else:  # fewer files than processes
        runs["too_few"] = {"paths": [p[:3] for p in paths], "batch": G, "seed": SEED, "epochs": 1, "drop": False}
    res = _launch(d, processes, devices, runs, tmp_path)

    parts = _parts_of_files(processes)
    assert all(r["files"]["num_samples"] == N for r in res)
    assert all(len(r[name]["steps"]) == EPOCHS * r[name]["len"] for r in res for name in ("files", "dropped", "single"))
    served = _check_run([r["files"] for r in res], parts, b, drop=False)
    _check_epochs(served, parts, b, drop=False)
    _check_flips(res, "files", _flips_of_global_loader([str(s) for s in shards], EPOCHS, imgs))
    _check_epochs(_check_run([r["dropped"] for r in res], parts, b, drop=True), parts, b, drop=True)
    one = _parts_of_records(SINGLE, processes)
    _check_epochs(_check_run([r["single"] for r in res], one, b, drop=False), one, b, drop=False)
    _check_flips(res, "single", _flips_of_global_loader(str(single), EPOCHS, imgs))

    # The state is the same on every process and says how it was made.
    states = [r["files"]["states"] for r in res]
    assert all(s == states[0] for s in states)
    mid, boundary = states[0]["1"], states[0][str(per_epoch - 1)]
    assert mid["partition"] == "host" and mid["processes"] == processes
    assert (mid["epoch"], mid["position"]) == (0, 2 * b) and (boundary["epoch"], boundary["position"]) == (1, 0)
    # Resumed at the same process count and batch: exactly the rest of the uninterrupted run.
    for r in res:
        assert r["files"][f"resumed_1_{G}"]["steps"] == r["files"]["steps"][2:]
    # Resumed with another batch size: the rest of epoch 0 and then epoch 1, each record once.
    resumed = _check_run([r["files"][f"resumed_1_{G // 2}"] for r in res], parts, b // 2, drop=False)
    for p in range(processes):
        resumed[(p, 0)] = served[(p, 0)][: 2 * b] + resumed.get((p, 0), [])
    _check_epochs(resumed, parts, b // 2, drop=False)

    if processes == 2:
        errors = [r["missing"]["error"] for r in res]
        assert errors[1].startswith("FileNotFoundError") and "nowhere" in errors[1], errors
        assert errors[0].startswith("RuntimeError") and "processes [1]" in errors[0], errors
    else:
        assert all("3 shard files cannot be split over 4 processes" in r["too_few"]["error"] for r in res), [
            r["too_few"]["error"] for r in res
        ]

    # Another process count (this test process is a 1-process job): mid-epoch refused with
    # the way out; at an epoch boundary, exact.
    ld = tbljax.loader(
        [str(s) for s in shards], 4, seed=SEED, num_epochs=EPOCHS, dtype="uint8", partition="host", drop_remainder=False
    )
    with pytest.raises(
        ValueError,
        match=rf"mid-epoch .* by {processes} processes.*"
        r"set_epoch\(1\) skips.*set_epoch\(0\) serves",
    ):
        ld.load_state_dict(mid)
    ld.load_state_dict(boundary)
    after = [int(i) for b_ in ld for i, v in zip(np.asarray(b_["index"]), np.asarray(b_["valid"])) if v]
    assert sorted(after) == list(range(N))
    fresh = tbljax.loader(
        [str(s) for s in shards], 4, seed=SEED, num_epochs=EPOCHS, dtype="uint8", partition="host", drop_remainder=False
    )
    fresh.set_epoch(1)
    assert after == [int(i) for b_ in fresh for i, v in zip(np.asarray(b_["index"]), np.asarray(b_["valid"])) if v]


def test_one_process_serves_the_whole_dataset(data):
    """partition="host" in a one-process job: the one part is everything, served once per
    epoch with the right pixels and labels, and its state resumes exactly."""
    _, imgs, labels, shards, _ = data
    paths = [str(s) for s in shards]
    ld = tbljax.loader(paths, 6, seed=SEED, num_epochs=2, dtype="uint8", partition="host", drop_remainder=False)
    assert len(ld) == -(-N // 6) and ld.num_samples == N
    stream, state = [], None
    for k, b in enumerate(ld):
        idx, val = np.asarray(b["index"]), np.asarray(b["valid"])
        np.testing.assert_array_equal(np.asarray(b["image"])[val], imgs[idx[val]])
        np.testing.assert_array_equal(np.asarray(b["label"])[val], labels[idx[val]])
        assert (idx[~val] == -1).all() and not np.asarray(b["image"])[~val].any()
        stream.append(idx[val].tolist())
        if k == 2:
            state = ld.state_dict()
    per_epoch = len(ld)
    for e in range(2):
        assert sorted(sum(stream[e * per_epoch : (e + 1) * per_epoch], [])) == list(range(N))
    again = tbljax.loader(paths, 6, seed=SEED, num_epochs=2, dtype="uint8", partition="host", drop_remainder=False)
    again.load_state_dict(state)
    assert [np.asarray(b["index"])[np.asarray(b["valid"])].tolist() for b in again] == stream[3:]


def test_states_of_the_two_modes_do_not_mix(data):
    _, _, _, shards, _ = data
    paths = [str(s) for s in shards]
    host = tbljax.loader(paths, 4, seed=SEED, partition="host")
    plain = tbljax.loader(paths, 4, seed=SEED)
    assert "partition" not in plain.state_dict()  # the default keeps today's state
    with pytest.raises(ValueError, match="partition='host' but this loader has partition=None"):
        plain.load_state_dict(host.state_dict())
    with pytest.raises(ValueError, match="partition=None but this loader has partition='host'"):
        host.load_state_dict(plain.state_dict())
    other = tbljax.loader(paths[::-1], 4, seed=SEED, partition="host")  # other record order
    with pytest.raises(ValueError, match="state is for dataset"):
        other.load_state_dict(host.state_dict())
    with pytest.raises(ValueError, match="partition must be None .* or 'host'"):
        tbljax.loader(paths, 4, partition="hosts")
    with pytest.raises(TypeError, match="partition='host' takes a TBL path or the list"):
        tbljax.loader(tbljax.open(paths), 4, partition="host")


def test_parts_arithmetic():
    """Steps and cursors over parts, against numbers worked out by hand."""
    parts = order.Parts((5, 9, 4), index=2)
    assert (parts.start, parts.n) == (14, 4)
    assert parts.steps(2, drop_remainder=True) == 2  # the smallest part fills 2 steps
    assert parts.steps(2, drop_remainder=False) == 5  # the largest needs 5
    assert parts.steps(2, drop_remainder=False, start=6) == 2
    assert parts.advance(0, 8, 2, drop_remainder=False) == (0, 8)
    assert parts.advance(0, 10, 2, drop_remainder=False) == (1, 0)
    assert parts.advance(3, 4, 2, drop_remainder=True) == (4, 0)
    assert order.Parts.whole(10).steps(4, drop_remainder=False) == 3
    with pytest.raises(ValueError, match=r"processes \[1\] hold no records"):
        order.Parts((3, 0, 2))


def test_each_process_fills_its_share_of_the_batch():
    """A process's rows of the global batch become a local batch of G/P rows from 0; a batch
    that does not divide by P, or rows that are not one contiguous block, are refused."""
    from tbljax import RowLayout

    two_devices = RowLayout(None, 8, ((4, 6), (6, 8)), ())  # process 1 of 2, two devices
    assert two_devices.process_local(2) == RowLayout(None, 4, ((0, 2), (2, 4)), ())
    with pytest.raises(ValueError, match="global batch 8 does not split evenly over 3 processes"):
        RowLayout.for_rank(8, 0, 1).process_local(3)
    with pytest.raises(ValueError, match=r"G/P = 2 contiguous rows .* rows \[\(0, 1\), \(4, 5\)\]"):
        RowLayout(None, 8, ((0, 1), (4, 5)), ()).process_local(4)

"""The pod workflow end to end, with real processes: a localhost HTTP server serves uneven TBL
shard files; 2 and 4 JAX processes (tests/_pod_worker.py) each stage their part into their
own cache with ``tbljax.stage(..., partition="host")`` and read it with ``tbljax.loader(<the
list stage returned>, partition="host")``. Checked against plain arithmetic and the files'
bytes: each cache holds exactly its part, byte for byte; every process runs the same steps;
over all processes every record is served once per epoch, from the part that holds it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import _loader_testing as T

pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (pip install 'tbljax[http]')")

from _http_testing import Server  # noqa: E402 - after the skip

TESTS = Path(__file__).resolve().parent
FILES = [5, 9, 4, 11, 7]  # records of each shard file: parts of uneven sizes
N = sum(FILES)
NAMES = [f"train-{k:02d}.tbl" for k in range(len(FILES))]
G, SEED, EPOCHS = 8, 3, 2


def _files_of(p, processes):
    """Process p's shard files: the block [p*F//P, (p+1)*F//P), worked out here by hand."""
    f = len(FILES)
    return list(range(p * f // processes, (p + 1) * f // processes))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The HTTP server over the shard files, and the pixels and labels they hold."""
    root = tmp_path_factory.mktemp("pod")
    www = root / "www"
    www.mkdir()
    imgs = T.images(N, seed=21)
    labels = (np.arange(N) * 3 + 1) % 7
    np.save(root / "images.npy", imgs)
    np.save(root / "labels.npy", labels)
    starts = np.concatenate([[0], np.cumsum(FILES)])
    for k, name in enumerate(NAMES):
        T.write_tbl(www / name, imgs[starts[k] : starts[k + 1]], labels[starts[k] : starts[k + 1]])
    server = Server(www)
    yield root, www, server
    server.close()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(procs, timeout=240):
    """Waits for every process; returns their outputs; fails with the logs if any failed."""
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n---\n".join(logs)[-8000:]
    return logs


def _env(**extra):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(TESTS), env.get("PYTHONPATH", "")] if p)
    return env


@pytest.mark.parametrize("processes", [2, 4])
def test_stage_then_read_host_parts(served, tmp_path, processes):
    root, www, server = served
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "url": f"{server.url}/train-{{00..{len(FILES) - 1:02d}}}.tbl",
                "caches": str(tmp_path),
                "images": str(root / "images.npy"),
                "labels": str(root / "labels.npy"),
                "batch": G,
                "seed": SEED,
                "epochs": EPOCHS,
            }
        )
    )
    port, outs = _free_port(), [tmp_path / f"p{i}.json" for i in range(processes)]
    _run(
        [
            subprocess.Popen(
                [
                    sys.executable,
                    str(TESTS / "_pod_worker.py"),
                    str(i),
                    str(processes),
                    str(port),
                    str(spec),
                    str(outs[i]),
                ],
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(processes)
        ]
    )
    res = [json.loads(o.read_text()) for o in outs]

    starts = np.concatenate([[0], np.cumsum(FILES)])
    b = G // processes
    parts = [
        range(int(starts[fs[0]]), int(starts[fs[-1] + 1])) for fs in (_files_of(p, processes) for p in range(processes))
    ]
    steps_per_epoch = max(-(-len(part) // b) for part in parts)
    for p, r in enumerate(res):
        cache = tmp_path / f"host{p}"
        # stage returned every file's local path, in the global order; only its part is here.
        assert r["paths"] == [str(cache / name) for name in NAMES]
        mine = [NAMES[k] for k in _files_of(p, processes)]
        assert r["cache"] == mine
        for name in mine:
            assert (cache / name).read_bytes() == (www / name).read_bytes(), (p, name)
        assert r["len"] == steps_per_epoch and len(r["steps"]) == EPOCHS * steps_per_epoch
        assert r["num_samples"] == N
    for k in range(EPOCHS * steps_per_epoch):
        glob = res[0]["steps"][k]["global"]
        assert all(r["steps"][k]["global"] == glob for r in res)  # one global batch
        for p, r in enumerate(res):
            assert r["steps"][k]["rows"] == list(range(p * b, (p + 1) * b))  # its G/P rows
    got = {
        (p, e): [i for s in r["steps"] if s["epoch"] == e for i in s["valid"]]
        for p, r in enumerate(res)
        for e in range(EPOCHS)
    }
    for e in range(EPOCHS):
        for p in range(processes):
            assert sorted(got[p, e]) == list(parts[p]), (e, p)  # its whole part, each record once
        assert sorted(i for p in range(processes) for i in got[p, e]) == list(range(N))
    assert all(got[p, 0] != got[p, 1] for p in range(processes))  # reshuffled every epoch


def test_stage_cli_finds_its_part_in_the_job(served, tmp_path):
    """`tbljax stage --partition host` on every task of a Slurm job step (the variables Slurm
    sets, here for 2 tasks on this machine): each joins the job through JAX's own Slurm
    detection, stages its part and prints every file's local path in the global order."""
    _, www, server = served
    url, port = f"{server.url}/train-{{00..{len(FILES) - 1:02d}}}.tbl", _free_port()
    slurm = dict(SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="2", JAX_COORDINATOR_PORT=str(port))
    logs = _run(
        [
            subprocess.Popen(
                [sys.executable, "-m", "tbljax", "stage", url, str(tmp_path / f"host{i}"), "--partition", "host"],
                env=_env(SLURM_PROCID=str(i), SLURM_LOCALID=str(i), **slurm),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(2)
        ]
    )
    for i, log in enumerate(logs):
        cache = tmp_path / f"host{i}"
        assert [str(cache / name) in log.splitlines() for name in NAMES] == [True] * len(NAMES), log
        mine = [NAMES[k] for k in _files_of(i, 2)]
        assert sorted(os.listdir(cache)) == mine
        assert all((cache / n).read_bytes() == (www / n).read_bytes() for n in mine)
        assert f"tbljax stage: {len(mine)} of {len(NAMES)} files" in log


def test_stage_cli_host_outside_a_job_says_what_to_do(served, tmp_path):
    _, _, server = served
    env = {k: v for k, v in _env().items() if not k.startswith(("SLURM_", "OMPI_", "JAX_COORD"))}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tbljax",
            "stage",
            f"{server.url}/train-00.tbl",
            str(tmp_path / "c"),
            "--partition",
            "host",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "could not join a JAX job" in run.stderr, run.stderr
    assert "--partition I/N" in run.stderr and not (tmp_path / "c").exists()

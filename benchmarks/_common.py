"""Shared by the benchmarks: run each configuration in its own process, several rounds
interleaved, and report medians. A worker prints one JSON line as its last output."""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def kodak_photos() -> list[Path]:
    """The 312 kodak photos (long side 500, median 95 KB: ImageNet-val-like geometry); exits
    with the reason where they are absent."""
    found = sorted((SHARED_DATA / "kodak" / "images").rglob("*.jpg"))
    if not found:
        sys.exit(f"needs the real photos in {SHARED_DATA}/kodak/images")
    return found


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def run_worker(
    script: Path, args: list[str], env: dict[str, str] | None = None, timeout: float = 900, python: str | None = None
) -> dict:
    """Runs `python script --worker args...` in a fresh process; returns its JSON result.
    python: the interpreter (default this one), e.g. a peer library's own venv."""
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run(
        [python or sys.executable, str(script), "--worker", *args],
        capture_output=True,
        text=True,
        env=e,
        timeout=timeout,
    )
    if r.returncode != 0:
        how = f"killed by {signal.Signals(-r.returncode).name}" if r.returncode < 0 else f"exit status {r.returncode}"
        raise RuntimeError(f"worker {args} failed ({how}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def rounds(
    script: Path,
    configs: dict[str, list[str]],
    n: int,
    env: dict[str, dict[str, str]] | None = None,
    python: dict[str, str] | None = None,
    keep_going: bool = False,
) -> dict[str, list[dict]]:
    """Runs every config n times, interleaved round by round so drift hits all alike.
    python: {config: interpreter} for configs that run elsewhere than this interpreter.
    keep_going: a worker that fails gives an {"error": message} entry for that round and the
    run goes on (default: the failure is raised)."""
    out: dict[str, list[dict]] = {k: [] for k in configs}
    for r in range(n):
        for name, args in configs.items():
            try:
                res = run_worker(script, args, (env or {}).get(name), python=(python or {}).get(name))
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as err:
                if not keep_going:
                    raise
                lines = str(err).strip().splitlines()
                why = lines[0].split("] failed ", 1)[-1] + (": " + lines[-1][:300] if len(lines) > 1 else "")
                out[name].append({"error": why})
                print(f"  round {r + 1}/{n} {name}: FAILED: {err}", file=sys.stderr, flush=True)
                continue
            out[name].append(res)
            print(f"  round {r + 1}/{n} {name}: {json.dumps(res)}", file=sys.stderr, flush=True)
    return out


def median(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def torchvision_schemas() -> None:
    """Defines the two operator schemas torchvision registers at import, so that its Python v2
    transforms import beside the CPU-only torch here (its compiled ops library does not load)."""
    import torch

    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        torchvision_schemas.lib = lib  # kept alive: the schemas go with it
    except RuntimeError:
        pass  # defined already

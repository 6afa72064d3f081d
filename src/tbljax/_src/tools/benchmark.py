"""`tbljax bench`: is the input pipeline the bottleneck? Measures the loader alone (produce and
consumed img/s) on the user's file and settings and, given the user's step function, the step
on one resident batch (the floor) against the same step fed by the loader; then says whether
training is input-bound, by how much, and which knob to turn."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tbljax._src.engine.host_loader import RING_EXTRA

INPUT_BOUND_OVERHEAD = 0.10  # fed step slower than the floor by more than this: input-bound


@dataclasses.dataclass
class BenchReport:
    """Numbers and the verdict; `asdict()` for --json."""

    path: str
    batch_size: int
    settings: dict[str, Any]
    produce_img_s: float
    consumed_img_s: float
    step_floor_ms: float | None = None  # step alone on one resident batch
    step_fed_ms: float | None = None  # the same step fed by the loader
    loader_wait_ms: float | None = None  # mean time the fed step waited for a batch
    input_bound: bool | None = None
    overhead: float | None = None  # fed / floor - 1
    advice: list[str] = dataclasses.field(default_factory=list)

    def asdict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        b = self.batch_size
        lines = [
            f"tbljax bench {self.path} (batch {b}, {self.settings})",
            f"  loader alone: {self.produce_img_s:,.0f} img/s produced, {self.consumed_img_s:,.0f} img/s "
            f"when every byte is read",
        ]
        if self.step_floor_ms is not None:
            floor, fed = b / self.step_floor_ms * 1e3, b / self.step_fed_ms * 1e3
            lines += [
                f"  step on a resident batch (floor): {self.step_floor_ms:.2f} ms = {floor:,.0f} img/s",
                f"  step fed by the loader:           {self.step_fed_ms:.2f} ms = {fed:,.0f} img/s "
                f"(waited {self.loader_wait_ms:.2f} ms/step for data)",
            ]
            verdict = "INPUT-BOUND" if self.input_bound else "not input-bound"
            lines.append(
                f"  verdict: {verdict}: the fed step is {100 * self.overhead:+.1f}% vs the floor "
                f"(threshold {100 * INPUT_BOUND_OVERHEAD:.0f}%)"
            )
        for a in self.advice:
            lines.append(f"  - {a}")
        return "\n".join(lines)


def load_step(spec: str) -> Callable[[dict], Any]:
    """'package.module:function' -> the function (the current directory is importable)."""
    mod, sep, fn = spec.partition(":")
    if not sep or not mod or not fn:
        raise ValueError(f"step must be 'module:function', got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        f = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load step function {spec!r}: {e}") from None
    if not callable(f):
        raise ValueError(f"{spec!r} is not callable")
    return f


def advise(report: BenchReport, *, threads: int, cpus: int, dtype: str, prefetch: int, dataset_bytes: int) -> list[str]:
    """Which knob to turn, from the measured numbers (a pure function, tested on its own)."""
    out: list[str] = []
    need = None
    if report.step_floor_ms:
        need = report.batch_size / report.step_floor_ms * 1e3  # img/s the step could take
    bound = report.input_bound if report.input_bound is not None else False
    if report.input_bound is None:
        out.append("give --step module:function to compare your training step with and without the loader")
    if not bound and report.input_bound is not None:
        out.append("the loader keeps up: nothing to change")
        return out
    if threads < cpus:
        out.append(f"threads: use all {cpus} CPUs (now {threads}): threads=None")
    if (
        report.loader_wait_ms
        and report.step_fed_ms
        and report.loader_wait_ms > 0.5 * report.step_fed_ms
        and prefetch < 4
    ):
        out.append(f"prefetch: raise it from {prefetch} to absorb uneven steps (prefetch=4)")
    if dtype != "uint8":
        out.append(
            "dtype='uint8' and normalize on device (tbljax.ops.gather_normalize or a multiply-add in "
            "the step): 4x fewer bytes to produce and move"
        )
    if need is not None and report.produce_img_s < need:
        out.append(
            f"the step can take {need:,.0f} img/s but the loader makes {report.produce_img_s:,.0f}: "
            f"if the uint8 dataset ({dataset_bytes / 2**30:.2f} GiB) fits device memory, "
            "tbljax.ResidentDataset draws batches inside the jitted step"
        )
    return out


def _take(batch: dict, consume: bool) -> None:
    x = np.asarray(batch["image"])
    if consume:
        x.sum(dtype=np.float64 if x.dtype.kind == "f" else np.uint64)
    else:
        x.reshape(-1)[0].item()


def _time_loader(ld: Any, steps: int, consume: bool) -> float:
    """img/s over `steps` batches, after a warm-up that fills every ring slot once (a fresh
    slot's first touch faults its pages in: not the steady state)."""
    it = iter(ld)
    for _ in range(ld.options.prefetch + RING_EXTRA + 1):
        _take(next(it), consume)
    t0 = time.perf_counter()
    for _ in range(steps):
        _take(next(it), consume)
    return steps * ld.options.batch_size / (time.perf_counter() - t0)


def bench(
    path: Any,
    *,
    batch_size: int = 256,
    step: str | Callable[[dict], Any] | None = None,
    steps: int = 30,
    dtype: str = "float32",
    layout: str = "NHWC",
    augment: Any = None,
    threads: int | None = None,
    prefetch: int = 2,
    seed: int = 0,
    fields: Any = "all",
    field_fn: dict | None = None,
    pad: dict | None = None,
) -> BenchReport:
    """Measures the loader on `path` with these settings and, with `step`, the training step
    with and without it; `fields`/`field_fn`/`pad` as `tbljax.loader` takes them (the record
    fields served beside the image). See `tbljax bench --help`.

    >>> print(tbljax.bench("train.tbl", batch_size=256, step="mytrain:train_step"))
    """
    import jax

    from tbljax._src.datasets import reader
    from tbljax._src.jax import loader as jax_loader

    ds = reader.as_dataset(path)
    kw = dict(
        seed=seed,
        dtype=dtype,
        layout=layout,
        augment=augment,
        threads=threads,
        prefetch=prefetch,
        fields=fields,
        field_fn=field_fn,
        pad=pad,
    )

    def make() -> Any:
        return jax_loader.loader(ds, batch_size, **kw)

    rates = {}
    # The first round is thrown away: it faults in the file's pages that the timed rounds read
    # (same seed, same batches), which a first run after idle otherwise pays in the first
    # figure only (13.5k img/s produced beside 20.5k consumed; 41-57k once warm).
    for name, consume in (("warm-up", False), ("produced", False), ("consumed", True)):
        ld = make()
        try:
            rates[name] = _time_loader(ld, steps, consume)
        finally:
            ld.close()
    settings = {"dtype": dtype, "layout": layout, "augment": str(augment), "threads": threads, "prefetch": prefetch}
    report = BenchReport(
        path=",".join(ds.paths),
        batch_size=batch_size,
        settings=settings,
        produce_img_s=rates["produced"],
        consumed_img_s=rates["consumed"],
    )
    if step is not None:
        fn = load_step(step) if isinstance(step, str) else step
        ld = make()
        try:
            it = iter(ld)
            resident = next(it)
            jax.block_until_ready(fn(resident))  # compile
            t0 = time.perf_counter()
            for _ in range(steps):
                out = fn(resident)
            jax.block_until_ready(out)
            floor = (time.perf_counter() - t0) / steps
            wait0 = ld.metrics()["wait_seconds"]
            t0 = time.perf_counter()
            for _ in range(steps):
                out = fn(next(it))
            jax.block_until_ready(out)
            fed = (time.perf_counter() - t0) / steps
            wait = (ld.metrics()["wait_seconds"] - wait0) / steps
        finally:
            ld.close()
        report.step_floor_ms, report.step_fed_ms, report.loader_wait_ms = floor * 1e3, fed * 1e3, wait * 1e3
        report.overhead = fed / floor - 1
        report.input_bound = report.overhead > INPUT_BOUND_OVERHEAD
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    nbytes = ds.served_bytes()  # the decoded dataset: what would have to fit in RAM
    report.advice = advise(
        report, threads=threads or cpus, cpus=cpus, dtype=dtype, prefetch=prefetch, dataset_bytes=nbytes
    )
    return report

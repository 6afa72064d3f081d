"""Conversion progress on stderr, in the form that suits where it goes: a tqdm bar in Jupyter,
one line redrawn on a terminal, or a line every interval in a log (Slurm, CI, files)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Progress", "in_notebook", "progress_mode"]


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (whose stderr is no terminal, yet is watched)."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def progress_mode(progress: bool | None) -> str | None:
    """How `progress` (None or True: report; False: silent) reports here: None (off),
    'notebook' (a tqdm.auto bar), 'tty' (one line redrawn in place) or 'log' (a line every
    interval: Slurm logs, CI, files)."""
    if progress is False:
        return None
    if in_notebook():
        try:
            import tqdm.auto  # noqa: F401 - optional

            return "notebook"
        except ImportError:
            return "tty"  # Jupyter renders carriage returns
    try:
        return "tty" if sys.stderr.isatty() else "log"
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return "log"


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


class Progress:
    """Conversion progress on stderr in the form that suits where it goes (`progress_mode`):
    count, percentage, rate, skipped items, elapsed time and ETA. `interval` is the time
    between reports (default 0.5 s redrawn on a terminal, 10 s as lines in a log)."""

    def __init__(
        self,
        total: int,
        mode: str | None,
        interval: float | None,
        clock: Callable[[], float] = time.monotonic,
        stream: Any = None,
    ):
        self.total, self.mode, self.clock = total, mode, clock
        self.interval = interval if interval is not None else (10.0 if mode == "log" else 0.5)
        self.stream = stream
        self.t0 = self.last = clock()
        self.width = 0
        self.bar: Any = None
        if mode == "notebook":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="img", desc="convert", smoothing=0.1)

    def _write(self, text: str, final: bool = False) -> None:
        out = self.stream or sys.stderr
        if self.mode == "log":
            out.write(text + "\n")
        else:
            out.write("\r" + text.ljust(self.width) + ("\n" if final else ""))
            self.width = 0 if final else len(text)
        out.flush()

    def counting(self, done: int, shards: int) -> None:
        """Reports the pass that counts the images of compressed TAR shards."""
        now = self.clock()
        if self.mode is None or (now - self.last < self.interval and done < shards):
            return
        self.last = now
        self._write(
            f"convert: counting images in compressed TAR shards: {done}/{shards} shards, {_duration(now - self.t0)}",
            final=done == shards and self.mode != "log",
        )

    def start(self, total: int) -> None:
        """Conversion proper starts (after any counting pass)."""
        self.total = total
        self.t0 = self.last = self.clock()
        if self.bar is not None:
            self.bar.reset(total=total)

    def update(self, done: int, skipped: int, final: bool = False) -> None:
        if self.mode is None:
            return
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix(skipped=skipped, refresh=False)
            if final:
                self.bar.close()
            return
        now = self.clock()
        if not final and now - self.last < self.interval:
            return
        self.last = now
        elapsed = now - self.t0
        rate = done / elapsed if elapsed > 0 else 0.0
        total = max(self.total, done)  # the count bounds images; samples without one count too
        pct = 100.0 * done / total if total else 100.0
        text = (
            f"convert: {done}/{total} ({pct:.0f}%), {rate:.0f} img/s, {skipped} skipped, {_duration(elapsed)} elapsed"
        )
        if final:
            text += ", done"
        else:
            left = total - done
            text += f", ETA {_duration(left / rate)}" if rate > 0 else ", ETA ?"
        self._write(text, final)

"""Progress bars for long operator work (verify, recover, stats, dump of large files).

A :class:`Progress` draws one line on a terminal (``\\r``-rewritten, at most 10 times a second)
and is silent when its stream is not a terminal (output piped or redirected, CI logs) or when
the caller asks for quiet. Library code never prints: the CLI creates a Progress and passes it
down; everything else gets :data:`SILENT`.

Thread-safety: not thread-safe; one Progress per operation.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "SILENT"]


class Progress:
    """``with Progress("verify", total_bytes) as p: ... p.advance(n)``."""

    def __init__(self, label: str = "", total: int = 0, *, stream: TextIO | None = None,
                 enabled: bool | None = None, unit: str = "B") -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.label = label
        self.total = total
        self.done = 0
        self.unit = unit
        self._last_draw = 0.0
        self._started = time.monotonic()
        self._drawn = False

    def start(self, label: str, total: int) -> None:
        """Begin (or begin again) with a new label and total."""
        self.finish()
        self.label, self.total, self.done = label, total, 0
        self._started = time.monotonic()

    def advance(self, amount: int) -> None:
        """Record ``amount`` more units done and redraw when due."""
        self.done += amount
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_draw >= 0.1 or self.done >= self.total:
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        width = 30
        fraction = min(1.0, self.done / self.total) if self.total else 0.0
        bar = "#" * int(width * fraction) + "-" * (width - int(width * fraction))
        rate = self.done / max(now - self._started, 1e-9)
        self.stream.write(f"\r{self.label[:40]:<40} [{bar}] {fraction * 100:5.1f}% {_human(rate)}{self.unit}/s ")
        self.stream.flush()
        self._drawn = True

    def finish(self) -> None:
        """End the line (only if something was drawn)."""
        if self.enabled and self._drawn:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def _human(value: float) -> str:
    for unit in ("", "K", "M", "G"):
        if value < 1000:
            return f"{value:.1f}{unit}"
        value /= 1000
    return f"{value:.1f}T"


#: A Progress that never draws (the default of every library function taking one).
SILENT = Progress(enabled=False)

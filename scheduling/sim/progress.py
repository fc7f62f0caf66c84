"""A plain text progress bar on stderr (no dependency), redrawn at most a few times a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``bar(done, total)`` redraws ``label [#####.....] 42% 1050/2500 12.3s``; ``close()`` ends it.

    Drawing is throttled to every ``every_s`` seconds of wall time so that calling it once per
    simulated event costs next to nothing. Nothing is drawn when ``stream`` is None.
    """

    def __init__(
        self, label: str, stream: TextIO | None = sys.stderr, width: int = 30, every_s: float = 0.2
    ) -> None:
        self.label, self.stream, self.width, self.every_s = label, stream, width, every_s
        self.start = time.monotonic()
        self._last = 0.0
        self._drawn = False
        self._final_drawn = False

    def __call__(self, done: float, total: float) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        final = done >= total
        if (now - self._last < self.every_s and not final) or (final and self._final_drawn):
            return
        self._final_drawn = final
        self._last = now
        frac = 0.0 if total <= 0 else min(1.0, max(0.0, done / total))
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = now - self.start
        self.stream.write(f"\r{self.label} [{bar}] {frac * 100:3.0f}% {done:g}/{total:g} {elapsed:.1f}s")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.stream is not None and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

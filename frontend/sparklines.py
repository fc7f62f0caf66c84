"""Per-GPU utilisation sparklines for the job page: server-rendered SVG (no script, no inline
style: the portal's CSP), from the same per-step maxima the adjustment pass reads."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from monitoring.adjust import JobUtilisation

WIDTH, HEIGHT = 240.0, 40.0


@dataclass(frozen=True)
class Sparkline:
    gpu: str
    points: str  # the SVG polyline's points
    threshold_y: float
    latest_pct: float | None
    max_pct: float
    idle_min: float
    idle: bool  # under the threshold for at least the first warning's time

    @property
    def label(self) -> str:
        latest = "no recent point" if self.latest_pct is None else f"now {self.latest_pct:.0f}%"
        idle = f", idle for {self.idle_min:.0f} min" if self.idle_min >= 1 else ""
        return f"GPU {self.gpu}: {latest}, highest {self.max_pct:.0f}%{idle}"


def sparklines(found: JobUtilisation, now: float | None = None) -> list[Sparkline]:
    """One sparkline per GPU: the window from left to right, 0..100% bottom to top."""
    now = time.time() if now is None else now
    body: dict[str, Any] = found.as_json(now)
    start = now - found.window_s
    warn = found.policy.warn_after_s[0] if found.policy.warn_after_s else found.policy.act_after_s
    out = []
    for gpu in body["gpus"]:
        xy = [
            f"{(t - start) / found.window_s * WIDTH:.1f},{HEIGHT - min(1.0, v) * HEIGHT:.1f}"
            for t, v in gpu["points"]
        ]
        latest = gpu["latest"]
        out.append(
            Sparkline(
                gpu=gpu["gpu"],
                points=" ".join(xy),
                threshold_y=round(HEIGHT - found.policy.threshold * HEIGHT, 1),
                latest_pct=None if latest is None else latest * 100,
                max_pct=gpu["max_util"] * 100,
                idle_min=gpu["idle_s"] / 60,
                idle=gpu["idle_s"] >= warn,
            )
        )
    return out

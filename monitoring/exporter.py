"""The control plane's own Prometheus metrics.

Gauges are computed at scrape time from PostgreSQL (a custom collector), so every web process
reports the same truth; the pass-duration histogram is observed where passes run.
"""

from __future__ import annotations

from prometheus_client import Histogram

PASS_SECONDS = Histogram(
    "tessera_scheduling_pass_seconds",
    "Duration of scheduling passes (snapshot, decide, apply).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)


def observe_pass(seconds: float) -> None:
    PASS_SECONDS.observe(seconds)

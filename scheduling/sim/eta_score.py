"""How good were the start estimates? Scored on the estimate each job got at the first pass that
left it pending (what its user saw first), against when it really started.

Of the jobs that waited more than a minute for their first start: ``eta_coverage``, the share that
had an estimate; of those, ``eta_within_band``, the share that started inside their band
(``earliest`` to ``latest``, a second's slack); ``eta_median_error_s``, the median of
|estimate − start|; ``eta_median_band_s``, the median band width; and ``median_wait_s``, the
median wait, the yardstick for both.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from scheduling.engine.types import Estimate

WAITED_S = 60.0
ETA_KEYS = ("eta_coverage", "eta_within_band", "eta_median_error_s", "eta_median_band_s", "median_wait_s")


def submits_and_starts(events: Iterable[Mapping[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """Each job's submit time and its first start time, from a replay's events."""
    submitted: dict[str, float] = {}
    started: dict[str, float] = {}
    for e in events:
        if e["event"] == "submit":
            submitted[e["job"]] = e["t"]
        elif e["event"] == "start":
            started.setdefault(e["job"], e["t"])
    return submitted, started


def score(
    events: Iterable[Mapping[str, Any]], first: Mapping[str, Estimate | None]
) -> dict[str, float | None]:
    submitted, started = submits_and_starts(events)
    waited = [j for j, t in started.items() if t - submitted.get(j, t) > WAITED_S]
    have = [j for j in waited if first.get(j) is not None]
    est = {j: first[j] for j in have}
    inside = [j for j in have if est[j].earliest - 1 <= started[j] <= est[j].latest + 1]  # type: ignore[union-attr]

    def median(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 1) if xs else None

    return {
        "eta_coverage": round(len(have) / len(waited), 4) if waited else None,
        "eta_within_band": round(len(inside) / len(have), 4) if have else None,
        "eta_median_error_s": median([abs(est[j].start - started[j]) for j in have]),  # type: ignore[union-attr]
        "eta_median_band_s": median([est[j].latest - est[j].earliest for j in have]),  # type: ignore[union-attr]
        "median_wait_s": median([started[j] - submitted[j] for j in waited]),
    }


Goal = tuple[str, str, bool]  # (goal, measured, met)


def eta_goals(s: Mapping[str, Any]) -> list[Goal]:
    """The estimate goals (docs/evaluation.md) on one replay's summary; none if not scored."""
    if s.get("eta_coverage") is None or not s.get("median_wait_s"):
        return []
    wait = s["median_wait_s"]
    band, error = s["eta_median_band_s"] / wait, s["eta_median_error_s"] / wait
    return [
        (
            "jobs waiting > 60 s with an estimate ≥ 90%",
            f"{100 * s['eta_coverage']:.0f}%",
            s["eta_coverage"] >= 0.9,
        ),
        (
            "started inside their band ≥ 80%",
            f"{100 * s['eta_within_band']:.0f}%",
            s["eta_within_band"] >= 0.8,
        ),
        ("median band ≤ median wait", f"{band:.2f} × {wait:.0f} s", band <= 1.0),
        ("median |estimate − start| ≤ 25% of median wait", f"{error:.2f} × {wait:.0f} s", error <= 0.25),
    ]


def eta_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The goals of the policies whose estimates were scored, as a markdown table ('' if none)."""
    lines = []
    for policy, s in summaries.items():
        for goal, measured, met in eta_goals(s):
            lines.append(f"| {policy} | {goal} | {measured} | {'yes' if met else '**no**'} |")
    if not lines:
        return ""
    head = ["Start estimates (`replay --eta`, the estimate at the first pass after submit):\n",
            "| policy | goal | measured | met |", "| --- | --- | --- | --- |"]  # fmt: skip
    return "\n".join([*head, *lines]) + "\n"

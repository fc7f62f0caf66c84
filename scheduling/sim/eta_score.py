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


def score(
    events: Iterable[Mapping[str, Any]], first: Mapping[str, Estimate | None]
) -> dict[str, float | None]:
    submitted: dict[str, float] = {}
    started: dict[str, float] = {}
    for e in events:
        if e["event"] == "submit":
            submitted[e["job"]] = e["t"]
        elif e["event"] == "start":
            started.setdefault(e["job"], e["t"])
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

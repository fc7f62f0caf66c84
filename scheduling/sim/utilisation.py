"""How busy simulated jobs keep their GPUs (docs/formats.md, "Utilisation and ``--adjust``").

Each job runs a utilisation profile: its JOBS.csv ``util_profile``, else one drawn from its id and
kind (:func:`draw`). The profiles are the agent's (``agent/profiles.py``, pure functions of the
profile, the job id, the minute and the GPU's rank), read here by minute of the job's *work*, so a
job looks the same however it is scheduled, slowed or restarted. A job's *demand* at a minute is
the sum of its GPUs' utilisation (0..1, a fractional job's scaled by its share): on ``k`` GPUs it
progresses at ``min(1, k / demand)`` of real time (``--adjust on``), and it keeps ``rate × demand``
GPUs busy, so the busy GPU-seconds of a stretch of work are the integral of its demand over that
work, whatever the rate.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

from agent import profiles
from scheduling.sim.traces import TraceJob

#: Drawn profiles by kind: (profile, share). ``idle-after`` and ``half-idle-after`` go idle
#: (wholly, or on their odd-ranked GPUs) after a drawn 20–80% of their work.
DRAWS: dict[str, tuple[tuple[str, float], ...]] = {
    "inference": (("serving", 1.0),),
    "training": (("busy", 0.40), ("bursty", 0.20), ("stalling", 0.15), ("idle-after", 0.15),
                 ("half-idle-after", 0.10)),
    "finetune": (("busy", 0.40), ("bursty", 0.20), ("stalling", 0.15), ("idle-after", 0.15),
                 ("half-idle-after", 0.10)),
    "batch": (("busy", 0.50), ("bursty", 0.20), ("stalling", 0.10), ("idle-after", 0.15),
              ("idle", 0.05)),
}  # fmt: skip
WHOLLY_IDLE = ("idle", "idle-after")  # profiles that leave every GPU of the job idle for good


def _unit(job_id: str, what: str) -> float:
    """A stable number in [0, 1) for (job, what)."""
    return (zlib.crc32(f"{job_id}:{what}".encode()) % 1_000_003) / 1_000_003


def can_idle_safely(tj: TraceJob) -> bool:
    """Whether a wholly idle profile is safe to give the job: requeuing it for idleness loses
    nothing (it checkpoints), or nothing requeues it (not preemptible, no opt-in). A job that
    cannot checkpoint would restart from nothing into the same idle spell, and never finish."""
    req = tj.request
    return bool(req.checkpoint_s) or (not req.preemptible and tj.idle_reclaim != "allow")


def draw(tj: TraceJob) -> str:
    """The job's profile when JOBS.csv gives none: a pure function of its id, kind and work."""
    req = tj.request
    x = _unit(req.id, "profile")
    table = DRAWS.get(req.kind, DRAWS["batch"])
    name = table[-1][0]
    for candidate, share in table:
        if x < share:
            name = candidate
            break
        x -= share
    if name == "half-idle-after" and req.gpus < 2:
        name = "idle-after"
    if name in WHOLLY_IDLE and not can_idle_safely(tj):
        name = "stalling"
    if name.endswith("-after"):
        minutes = (tj.duration_s or 0.0) / 60
        after = max(1, int(minutes * (0.2 + 0.6 * _unit(req.id, "after"))))
        name = f"{name}-{after}"
    return name


def profile_of(tj: TraceJob) -> str:
    return tj.util_profile or draw(tj)


def wholly_idle(name: str) -> bool:
    return name == "idle" or name.startswith("idle-after-")


class Demand:
    """One job's GPUs' utilisation by minute of its work, per GPU rank and summed."""

    __slots__ = ("name", "job_id", "ranks", "weight", "_minute", "_total")

    def __init__(self, name: str, job_id: str, gpus: float) -> None:
        self.name, self.job_id = name, job_id
        self.ranks = int(gpus) if gpus >= 1 else (1 if gpus > 0 else 0)
        self.weight = 1.0 if gpus >= 1 else gpus  # a fractional job's share of its one GPU
        self._minute, self._total = -1, 0.0

    def gpu(self, rank: int, work_s: float) -> float:
        """Utilisation (0..1) of the job's GPU ``rank`` at ``work_s`` seconds of its work."""
        return profiles.util(self.name, self.job_id, work_s / 60, rank) / 100

    def total(self, minute: int) -> float:
        """The job's demand (busy GPUs) in minute ``minute`` of its work."""
        if minute != self._minute:
            self._minute = minute
            self._total = (
                self.weight
                * sum(profiles.util(self.name, self.job_id, minute, r) for r in range(self.ranks))
                / 100
            )
        return self._total

    def busy(self, w0: float, w1: float) -> float:
        """Busy GPU-seconds of the work from ``w0`` to ``w1`` (seconds of work)."""
        out = 0.0
        w = w0
        while w < w1:
            minute = int(w // 60)
            end = min(w1, (minute + 1) * 60.0)
            out += self.total(minute) * (end - w)
            w = end
        return out


def busy_ceiling(jobs: Sequence[TraceJob], demands: dict[str, Demand], capacity: float) -> float | None:
    """An upper bound on ``busy_utilisation``: every job's busy work from its submit to the last
    submit, as if each ran at once, at full speed, on a cluster without limits."""
    if not jobs:
        return None
    t0 = min(tj.submit_s for tj in jobs)
    t1 = max(tj.submit_s for tj in jobs)
    if t1 <= t0 or capacity <= 0:
        return None
    total = 0.0
    for tj in jobs:
        work = min(tj.duration_s or 0.0, t1 - tj.submit_s, tj.request.time_limit_s or math.inf)
        total += demands[tj.request.id].busy(0.0, max(0.0, work))
    return total / (capacity * (t1 - t0))

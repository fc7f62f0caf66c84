"""Start estimates' bands widened to how the engine's own past estimates turned out.

The queue played forward (:mod:`.eta`) misses in known directions: it sees no job submitted
later, so a job that needs a whole node or a gang is overtaken and starts later than played, and
a short wait is overestimated from spread runtimes. Each job's *first* estimate is kept (when it
was made, the wait it played, its class); when the job is seen running, the ratio of the wait it
had to the wait played is learnt, ``ln((actual + 60 s) / (played + 60 s))``, the latest
:data:`KEEP` of its class (ratios to four decimals, played waits to a tenth of a second: the
memory stays small). A class is the job's shape (one replica of less than a node, a whole node,
a gang) and the played wait's order (under 8 min, under about an hour, longer).

Once :data:`MIN_SEEN` ratios of its class (else of all classes) are known, a new estimate's
band reaches at least as late as the played wait times their :data:`LATEST_Q` quantile (the
jobs of the class still waiting counted as having at least the ratio reached so far:
:func:`latest_ratio`): the band is meant to hold the start about four times in five (its
earliest end, the start if everything ahead runs short, is rarely passed), and what the play
cannot see (later submissions going ahead, preemptions) makes the played latest start too early
for a quarter to a third of the jobs that wait. The estimate itself stays the played one
(scaled by the median ratio, it came no closer on workloads kept back: docs/benchmarks/eta.md,
2026-12-03). With too few ratios the played band stands.

The simulator's long-lived engine keeps this in itself; the live pass carries it from pass to
pass in the engine's memory (:mod:`.memory`, ``eta_first`` and ``eta_seen``), so both learn the
same. Method and numbers: docs/benchmarks/eta.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Container, Iterable, Mapping
from dataclasses import replace

from .types import Estimate

KEEP = 200  # ratios kept per class
MIN_SEEN = 20  # ratios needed before a class (else all of them) widens a band
LATEST_Q = 0.9  # the band's latest start: at least the played wait times this quantile of the ratios
OFFSET_S = 60.0  # added to both waits, so that a wait played as "now" still has a ratio
ALL = "all"
First = tuple[str, float, float, str]  # (job, made at, played wait, class)


def class_of(replicas: int, whole_node: bool, played_wait: float) -> str:
    """The class whose ratios widen a job's band: its shape and its played wait's order."""
    shape = "gang" if replicas > 1 else "node" if whole_node else "part"
    order = min(int(math.log2(max(played_wait, OFFSET_S) / OFFSET_S)) // 3, 2)
    return f"{shape}/{order}"


def latest_ratio(seen: Iterable[float], waiting: Iterable[float], q: float = LATEST_Q) -> float:
    """The ``q`` quantile of the ratios, the jobs still waiting counted as at least what they
    have waited so far (right-censored: the Kaplan-Meier estimate). Without them, a queue that
    grows would be judged only by the jobs that started soon, and its bands would fall short of
    the rest. Where the quantile is past every start seen (more than ``1 - q`` of the jobs still
    waiting beyond the largest ratio a start had), the largest ratio known, started or waiting:
    a lower bound of it."""
    points = sorted([(r, 0) for r in seen] + [(r, 1) for r in waiting])  # a start before a wait
    at_risk, survive, i = len(points), 1.0, 0
    while i < len(points):
        value, starts, j = points[i][0], 0, i
        while j < len(points) and points[j][0] == value:
            starts += points[j][1] == 0
            j += 1
        if starts:
            survive *= 1.0 - starts / at_risk
            if survive < 1.0 - q - 1e-9:  # past it (as the sorted list's int(q n)-th, untied)
                return value
        at_risk -= j - i
        i = j
    return points[-1][0]


class Learnt:
    """The first estimate of each job still waiting, and the ratios learnt per class."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[float, float, str]] = {}  # job -> (made at, played wait, class)
        self.seen: dict[str, deque[float]] = {}  # class -> the latest ratios, oldest first
        # (class, now) -> (its ratio, jobs waiting); the waits so far depend on ``now``
        self._quantiles: dict[tuple[str, float], tuple[float, int]] = {}

    def observe(self, pending: Container[str], started: Mapping[str, float]) -> None:
        """Learn from the jobs whose first estimate is kept and that have started since (their
        start in ``started``); forget those neither waiting nor started (cancelled, or gone
        before a pass saw them running)."""
        self._quantiles.clear()
        for job_id, (made_at, played, cls) in list(self.first.items()):
            at = started.get(job_id)
            if at is not None and at >= made_at:
                ratio = round(math.log((at - made_at + OFFSET_S) / (played + OFFSET_S)), 4)
                for key in (cls, ALL):
                    q = self.seen.setdefault(key, deque(maxlen=KEEP))
                    q.append(ratio)
                del self.first[job_id]
            elif job_id not in pending:
                del self.first[job_id]

    def widen(self, job_id: str, cls: str, est: Estimate, now: float) -> Estimate:
        """Remember ``est`` if it is the job's first, and widen its band by what was learnt."""
        played = round(max(0.0, est.start - now), 1)
        self.first.setdefault(job_id, (now, played, cls))
        key = cls if len(self.seen.get(cls, ())) >= MIN_SEEN else ALL
        seen = self.seen.get(key, ())
        if len(seen) < MIN_SEEN:
            return est
        got = self._quantiles.get((key, now))
        if got is None:
            waiting = self._waiting(key, now)
            got = self._quantiles[(key, now)] = (latest_ratio(seen, waiting), len(waiting))
        ratio, waits = got
        latest = now + max(0.0, (played + OFFSET_S) * math.exp(ratio) - OFFSET_S)
        if latest <= est.latest:
            return est
        why = f"{est.basis}; the latest start from how the last {len(seen)} such estimates turned out"
        if waits:
            why += f" and how long {waits} still waiting have waited"
        return replace(est, latest=latest, basis=why)

    def _waiting(self, key: str, now: float) -> list[float]:
        """The ratios the jobs of class ``key`` (every class: :data:`ALL`) still waiting since
        an earlier pass have so far: each a lower bound of the ratio it will have."""
        return [
            math.log((now - made_at + OFFSET_S) / (played + OFFSET_S))
            for made_at, played, cls in self.first.values()
            if made_at < now and (key == ALL or cls == key)
        ]

    # -- as plain data, for the engine's memory ------------------------------------------------
    def to_data(self) -> tuple[tuple[First, ...], tuple[tuple[str, tuple[float, ...]], ...]]:
        """(job, made at, played wait, class) per kept first estimate; (class, ratios) per class."""
        first = tuple((j, t, w, c) for j, (t, w, c) in self.first.items())
        seen = tuple((c, tuple(q)) for c, q in self.seen.items())
        return first, seen

    @classmethod
    def of(
        cls,
        first: Iterable[First],
        seen: Iterable[tuple[str, Iterable[float]]],
    ) -> Learnt:
        out = cls()
        out.first = {j: (t, w, c) for j, t, w, c in first}
        out.seen = {c: deque(q, maxlen=KEEP) for c, q in seen}
        return out

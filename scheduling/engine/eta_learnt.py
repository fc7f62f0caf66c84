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
band reaches at least as late as the played wait times their :data:`LATEST_Q` quantile: the band
is meant to hold the start about four times in five (its earliest end, the start if everything
ahead runs short, is rarely passed), and what the play cannot see (later submissions going
ahead, preemptions) makes the played latest start too early for a quarter to a third of the
jobs that wait. The estimate itself stays the played one (scaled by the median ratio, it came
no closer on workloads kept back: docs/benchmarks/eta.md, 2026-12-03). With too few ratios the
played band stands.

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


class Learnt:
    """The first estimate of each job still waiting, and the ratios learnt per class."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[float, float, str]] = {}  # job -> (made at, played wait, class)
        self.seen: dict[str, deque[float]] = {}  # class -> the latest ratios, oldest first
        self._sorted: dict[str, list[float]] = {}

    def observe(self, pending: Container[str], started: Mapping[str, float]) -> None:
        """Learn from the jobs whose first estimate is kept and that have started since (their
        start in ``started``); forget those neither waiting nor started (cancelled, or gone
        before a pass saw them running)."""
        self._sorted.clear()
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
        if len(self.seen.get(key, ())) < MIN_SEEN:
            return est
        ordered = self._sorted.get(key)
        if ordered is None:
            ordered = self._sorted[key] = sorted(self.seen[key])
        ratio = ordered[min(len(ordered) - 1, int(LATEST_Q * len(ordered)))]
        latest = now + max(0.0, (played + OFFSET_S) * math.exp(ratio) - OFFSET_S)
        if latest <= est.latest:
            return est
        why = f"{est.basis}; the latest start from how the last {len(ordered)} such estimates turned out"
        return replace(est, latest=latest, basis=why)

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

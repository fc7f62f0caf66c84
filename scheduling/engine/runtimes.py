"""How long will a job run? Low, typical and high runtimes for start estimates, from history.

The runs that ended on their own (succeeded, failed) are kept, the latest :data:`KEEP` of each
(user, name) and of each (tenant, kind). A job is predicted from, in order:

1. the runs of the same name by the same user (a rerun: its runtimes follow its earlier ones),
   once there are :data:`MIN_NAMED` of them;
2. the runs of its tenant's jobs of its kind, once there are :data:`MIN_KIND` of them;
3. its time limit (a tenth, half and all of it: users' limits are mostly far too long);
4. the default runtime.

From history, the typical runtime is the median run, the low and high ones the quarter and nine
tenths quantiles, widened to at least :data:`SPREAD` times below and above the median (a few
runs say little about the spread). A time limit is an upper bound on all three: an attempt never
runs past it.

The same runs give the same predictions whether they were recorded one by one (the simulator's
long-lived engine) or read at once from the database (the live pass): both keep the latest runs
of a key by (end, job id), and the live read asks for as many (``services/snapshot.py``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from .types import PREDICTED_OUTCOMES, FinishedRun, JobRequest

KEEP = 20  # runs kept per (user, name) and per (tenant, kind)
MIN_NAMED = 2
MIN_KIND = 3
SPREAD = 1.5  # the low and high runtimes from history: at least this factor off the median
MIN_RUNTIME_S = 60.0
WHICH = ("low", "typical", "high")
_QUANTILE = {"low": 0.25, "typical": 0.5, "high": 0.9}
_LIMIT_SHARE = {"low": 0.1, "typical": 0.5, "high": 1.0}


class RecentRuns:
    """The latest :data:`KEEP` runs per (user, name) and per (tenant, kind)."""

    def __init__(self) -> None:
        self.named: dict[tuple[str, str], list[tuple[float, str, float]]] = {}  # (end, job, runtime)
        self.kinds: dict[tuple[str, str], list[tuple[float, str, float]]] = {}

    @classmethod
    def of(cls, runs: Iterable[FinishedRun]) -> RecentRuns:
        """The same as :meth:`add` of each run in turn (the latest :data:`KEEP` distinct runs of
        each key), each key's runs sorted once: a pass builds this from its whole history read."""
        named: dict[tuple[str, str], set[tuple[float, str, float]]] = {}
        kinds: dict[tuple[str, str], set[tuple[float, str, float]]] = {}
        for r in runs:
            if r.outcome in PREDICTED_OUTCOMES:
                entry = (r.ended_at, r.job_id, max(0.0, r.runtime_s))
                kinds.setdefault((r.tenant, r.kind), set()).add(entry)
                if r.user and r.name:
                    named.setdefault((r.user, r.name), set()).add(entry)
        out = cls()
        out.named = {key: sorted(q)[-KEEP:] for key, q in named.items()}
        out.kinds = {key: sorted(q)[-KEEP:] for key, q in kinds.items()}
        return out

    def copy(self) -> RecentRuns:
        out = RecentRuns()
        out.named = {key: list(q) for key, q in self.named.items()}
        out.kinds = {key: list(q) for key, q in self.kinds.items()}
        return out

    def record(self, job: JobRequest, runtime: float, ended_at: float) -> None:
        self.add(job.tenant, job.kind, job.user, job.name, job.id, runtime, ended_at)

    def add(
        self, tenant: str, kind: str, user: str, name: str, job_id: str, runtime: float, ended_at: float
    ) -> None:
        entry = (ended_at, job_id, max(0.0, runtime))
        keys = [(self.kinds, (tenant, kind))]
        if user and name:
            keys.append((self.named, (user, name)))
        for table, key in keys:
            q = table.setdefault(key, [])
            if entry in q:
                continue  # the same run read twice (a live read overlapping what was recorded)
            bisect.insort(q, entry)
            if len(q) > KEEP:
                del q[0]


@dataclass(frozen=True, slots=True)
class Prediction:
    low: float
    typical: float
    high: float
    basis: str  # words: what it rests on

    def of(self, which: str) -> float:
        return self.low if which == "low" else self.high if which == "high" else self.typical


class Predictor:
    """Runtimes of jobs from :class:`RecentRuns` (the module's rules), cached per job."""

    def __init__(self, recent: RecentRuns, default_s: float) -> None:
        self.recent = recent
        self.default_s = default_s
        self._sorted: dict[tuple[int, tuple[str, str]], list[float]] = {}
        self._cache: dict[str, Prediction] = {}

    def runs(self, job: JobRequest) -> tuple[list[float], str]:
        """The runtimes the job is predicted from (sorted; empty: none enough) and their words."""
        if job.user and job.name:
            named = self._runs(0, self.recent.named, (job.user, job.name))
            if len(named) >= MIN_NAMED:
                return named, f"{len(named)} earlier runs of {job.name!r} by the same user"
        kind = self._runs(1, self.recent.kinds, (job.tenant, job.kind))
        if len(kind) >= MIN_KIND:
            return kind, f"{len(kind)} recent {job.kind} runs of {job.tenant}"
        return [], ""

    def _runs(
        self,
        table_no: int,
        table: dict[tuple[str, str], list[tuple[float, str, float]]],
        key: tuple[str, str],
    ) -> list[float]:
        got = self._sorted.get((table_no, key))
        if got is None:
            got = self._sorted[(table_no, key)] = sorted(r for _, _, r in table.get(key, ()))
        return got

    def predict(self, job: JobRequest) -> Prediction:
        got = self._cache.get(job.id)
        if got is not None:
            return got
        runs, basis = self.runs(job)
        limit = job.time_limit_s
        if runs:
            mid = _quantile(runs, _QUANTILE["typical"])
            low = min(_quantile(runs, _QUANTILE["low"]), mid / SPREAD)
            high = max(_quantile(runs, _QUANTILE["high"]), mid * SPREAD)
            if limit:
                basis += f", at most its time limit of {_duration(limit)}"
        elif limit:
            low, mid, high = (limit * _LIMIT_SHARE[w] for w in WHICH)
            basis = f"its time limit of {_duration(limit)} (no history yet)"
        else:
            low, mid, high = self.default_s / 2, self.default_s, 2 * self.default_s
            basis = f"the default runtime of {_duration(self.default_s)} (no history or time limit)"
        if limit:
            low, mid, high = min(low, limit), min(mid, limit), min(high, limit)
        got = self._cache[job.id] = Prediction(
            max(MIN_RUNTIME_S, low), max(MIN_RUNTIME_S, mid), max(MIN_RUNTIME_S, high), basis
        )
        return got

    def remaining_end(self, job: JobRequest, started_at: float, now: float, which: str) -> float:
        """When a job running since ``started_at`` is expected to end, for ``which`` runtime.
        Past its prediction, the typical and high ends are those of the runs that lasted longer
        (else the rest of its time limit, else as long again as it has run, twice for the high
        one); the low one is "any moment". A time limit caps them."""
        ran = now - started_at
        p = self.predict(job)
        value = p.of(which)
        if value > ran:
            return started_at + value
        if which == "low":
            return now
        runs, _ = self.runs(job)
        longer = runs[bisect.bisect_right(runs, ran) :]
        limit = job.time_limit_s
        if longer:
            value = _quantile(longer, _QUANTILE[which])
        elif limit and limit > ran:
            value = ran + _LIMIT_SHARE[which] * (limit - ran)
        else:
            value = ran + ran * (2 * _LIMIT_SHARE[which])
        if limit:
            value = min(value, limit)
        return max(now, started_at + value)


def _quantile(runs: list[float], q: float) -> float:
    return runs[min(len(runs) - 1, int(q * len(runs)))]


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{max(1, round(seconds / 60))} min"

"""When will each pending job start? A forward plan of the queue, with a band.

After a pass, every pending job gets an :class:`Estimate`: a start, the earliest and latest it is
likely to be, what the estimate rests on, and its place in the queue. The plan:

1. Runtimes. A job's runtime is predicted three ways — low, typical, high — from the runs of its
   tenant and kind that ended on their own (a quarter, half and nine tenths of the way through
   them, once there are three), else from its time limit (a tenth, half and all of it: users'
   limits are mostly far too long), else from the default runtime. A time limit caps all three.
2. Room over time. Each accelerator model's GPUs, each tenant's quota row (up to its limit) and its
   non-preemptible part (up to its guarantee) are timelines of use: the running jobs hold theirs
   until their start plus their predicted runtime; once past it, the typical and high runtimes
   are those of the runs that lasted longer (else the rest of the time limit, else as long again
   as it has run), the low one "any moment".
3. The queue in the pass's order: each job takes, on the first model it accepts where it comes
   soonest, the earliest time from which its GPUs and its quota are free for its whole predicted
   runtime, and holds them for that long — so a job ahead of it delays it, as in the pass. The
   pass has just left every one of them waiting, so none starts before GPUs of its model are next
   freed (or its retry backoff ends), even where the whole-model count says there is room now.

The typical runtimes give the estimate; the low and high ones its band. Whole GPUs of a model are
counted together (not node by node), so a gang's topology and fragmentation can make the real
start later than the plan; the band is widened by nothing to hide it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .types import MILLI, Decisions, Estimate, JobRequest, NodeSpec

if TYPE_CHECKING:
    from .policy import TesseraScheduler

SPREAD = {"low": (0.25, 0.1), "typical": (0.5, 0.5), "high": (0.9, 1.0)}  # history quantile, share of limit
MIN_HISTORY = 3
MIN_RUNTIME_S = 60.0


@dataclass(frozen=True, slots=True)
class Holding:
    """What a running job holds: GPUs per model, and its charge per quota row."""

    job: JobRequest
    started_at: float
    gpus: tuple[tuple[str, float], ...]  # (model, GPUs)
    rows: tuple[tuple[tuple[str, str], float], ...]  # (quota row, GPUs)


@dataclass(frozen=True, slots=True)
class Want:
    """What a pending job needs: GPUs on one of ``models``, charged to ``rows[model]``."""

    job: JobRequest
    gpus: float
    models: tuple[str, ...]
    rows: dict[str, tuple[str, str] | None]
    earliest: float  # not before (a retry's backoff)


class Timeline:
    """Use of one capacity over time: piecewise constant, starting at ``now``."""

    def __init__(self, cap: float, now: float) -> None:
        self.cap = cap
        self.ts = [now]
        self.us = [0.0]

    def _cut(self, t: float) -> int:
        i = bisect.bisect_right(self.ts, t) - 1
        if self.ts[i] != t:
            self.ts.insert(i + 1, t)
            self.us.insert(i + 1, self.us[i])
            i += 1
        return i

    def add(self, t0: float, t1: float, amount: float) -> None:
        if t1 <= t0 or amount == 0:
            return
        i, j = self._cut(t0), self._cut(t1)
        for k in range(i, j):
            self.us[k] += amount

    def next_freed(self, t: float) -> float:
        """The first time after ``t`` at which some of the capacity is freed (inf: never)."""
        for i in range(bisect.bisect_right(self.ts, t), len(self.ts)):
            if self.us[i] < self.us[i - 1]:
                return self.ts[i]
        return math.inf

    def earliest(self, t: float, length: float, need: float) -> float:
        """The earliest time from ``t`` on at which ``need`` is free for ``length`` (inf: never)."""
        if need > self.cap + 1e-9:
            return math.inf
        room = self.cap - need + 1e-9
        i = max(0, bisect.bisect_right(self.ts, t) - 1)
        start = t
        while i < len(self.us):
            j = i
            while j < len(self.us) and self.ts[j] < start + length:
                if self.us[j] > room:
                    break
                j += 1
            else:
                return start
            if j >= len(self.us) or self.ts[j] >= start + length:
                return start
            i = j + 1  # segment j is too full: start after it
            if i >= len(self.us):
                return math.inf
            start = self.ts[i]
        return math.inf


class Runtimes:
    """Low, typical and high runtime of a job (step 1)."""

    def __init__(self, history: dict[tuple[str, str], list[float]], default_s: float) -> None:
        self.history = {k: sorted(v) for k, v in history.items()}
        self.default_s = default_s

    def of(self, job: JobRequest, which: str) -> float:
        q, share = SPREAD[which]
        runs = self.history.get((job.tenant, job.kind), [])
        if len(runs) >= MIN_HISTORY:
            value = runs[min(len(runs) - 1, int(q * len(runs)))]
        elif job.time_limit_s:
            value = job.time_limit_s * share
        else:
            value = self.default_s * (2 * share if which != "typical" else 1.0)
        if job.time_limit_s:
            value = min(value, job.time_limit_s)
        return max(MIN_RUNTIME_S, value)

    def after(self, job: JobRequest, which: str, ran: float) -> float:
        """Typical or high runtime of a job that has run ``ran`` seconds so far, once past its
        unconditional one: the quantile of the runs longer than that, else of the rest of its
        time limit, else as long again as it has run (twice for the high one); the time limit
        caps it. The low one stays :meth:`of` (it may end any moment)."""
        q, share = SPREAD[which]
        value = self.of(job, which)
        if value > ran or which == "low":  # the low one: it may end any moment once past it
            return value
        runs = self.history.get((job.tenant, job.kind), [])
        longer = [r for r in runs if r > ran] if len(runs) >= MIN_HISTORY else []
        if longer:
            value = longer[min(len(longer) - 1, int(q * len(longer)))]
        elif job.time_limit_s and job.time_limit_s > ran:
            value = ran + share * (job.time_limit_s - ran)
        else:
            value = ran + ran * (2 * share)
        if job.time_limit_s:
            value = min(value, job.time_limit_s)
        return value

    def basis(self, job: JobRequest) -> str:
        runs = self.history.get((job.tenant, job.kind), [])
        if len(runs) >= MIN_HISTORY:
            return f"{len(runs)} finished runs of {job.tenant}'s {job.kind} jobs"
        if job.time_limit_s:
            return "time limits (no history yet)"
        return f"the default runtime of {self.default_s / 3600:g} h (no history or time limit)"


def plan(
    nodes: Sequence[NodeSpec],
    holdings: Iterable[Holding],
    queue: Sequence[Want],
    quota_caps: dict[tuple[str, str], tuple[float, float]],  # row -> (limit, guaranteed) in GPUs
    runtimes: Runtimes,
    now: float,
) -> dict[str, Estimate]:
    """Step 2 and 3 for each of low, typical and high runtimes; the estimates by job id."""
    holdings = list(holdings)
    starts = {which: _plan_once(nodes, holdings, queue, quota_caps, runtimes, now, which) for which in SPREAD}
    out: dict[str, Estimate] = {}
    for position, want in enumerate(queue, 1):
        start = starts["typical"].get(want.job.id, math.inf)
        if math.isinf(start):
            continue
        lo = min(start, starts["low"].get(want.job.id, start))
        hi = max(start, starts["high"].get(want.job.id, start))
        basis = (
            f"{position - 1} job(s) ahead of it in the queue; runtimes from {runtimes.basis(want.job)} "
            "and of the running jobs' history and time limits"
        )
        out[want.job.id] = Estimate(start, lo, hi, basis, position, position - 1)
    return out


def _plan_once(
    nodes: Sequence[NodeSpec],
    holdings: list[Holding],
    queue: Sequence[Want],
    quota_caps: dict[tuple[str, str], tuple[float, float]],
    runtimes: Runtimes,
    now: float,
    which: str,
) -> dict[str, float]:
    caps: dict[str, float] = {}
    for n in nodes:
        if n.schedulable and n.gpus:
            caps[n.model] = caps.get(n.model, 0.0) + n.gpus - len(n.unhealthy_gpus)
    room = {m: Timeline(c, now) for m, c in caps.items()}
    limit = {row: Timeline(c[0], now) for row, c in quota_caps.items()}
    steady = {row: Timeline(c[1], now) for row, c in quota_caps.items()}
    for h in holdings:
        end = max(now + MIN_RUNTIME_S, h.started_at + runtimes.after(h.job, which, now - h.started_at))
        for model, gpus in h.gpus:
            if model in room:
                room[model].add(now, end, gpus)
        for row, gpus in h.rows:
            if row in limit:
                limit[row].add(now, end, gpus)
                if not h.job.preemptible:
                    steady[row].add(now, end, gpus)
    out: dict[str, float] = {}
    for want in queue:
        length = runtimes.of(want.job, which)
        best, best_model = math.inf, ""
        for model in want.models:
            if model not in room:
                continue
            quota_row = want.rows.get(model)
            lines = [room[model]]
            if quota_row is not None:
                lines.append(limit[quota_row])
                if not want.job.preemptible:
                    lines.append(steady[quota_row])
            # the pass has just left it waiting: not before GPUs of the model are next freed
            t0 = want.earliest if want.earliest > now else room[model].next_freed(now)
            t = _together(lines, t0, length, want.gpus) if not math.isinf(t0) else t0
            if t < best:
                best, best_model = t, model
        if math.isinf(best):
            continue
        out[want.job.id] = best
        room[best_model].add(best, best + length, want.gpus)
        quota_row = want.rows.get(best_model)
        if quota_row is not None:
            limit[quota_row].add(best, best + length, want.gpus)
            if not want.job.preemptible:
                steady[quota_row].add(best, best + length, want.gpus)
    return out


def _together(lines: list[Timeline], t: float, length: float, need: float) -> float:
    """The earliest time from ``t`` on at which every timeline has ``need`` free for ``length``."""
    for _ in range(1000):
        moved = t
        for line in lines:
            moved = line.earliest(moved, length, need)
            if math.isinf(moved):
                return math.inf
        if moved == t:
            return t
        t = moved
    return math.inf


def estimate(
    s: TesseraScheduler, d: Decisions, now: float, wanted: Collection[str] | None = None
) -> dict[str, Estimate]:
    """Estimates for the jobs ``d`` left pending (GPU jobs, not held), in the pass's order, the
    first ``config.eta_max_jobs`` of them, over the cluster ``s`` keeps.

    ``wanted``: only these jobs' estimates are needed. A job's estimate depends only on the jobs
    ahead of it, so the queue is planned up to the last of them and no further (a replay that
    asks only about the jobs new since the last pass plans a short head of the queue)."""
    quotas = s.quotas
    holdings = []
    for run in s.running.values():
        by_model: dict[str, float] = {}
        for model, milli in run.charged:
            by_model[model] = by_model.get(model, 0.0) + milli / MILLI
        rows = tuple(
            (quotas.row_key(run.job.tenant, m), g)
            for m, g in by_model.items()
            if quotas.row(run.job.tenant, m)
        )
        holdings.append(Holding(run.job, run.started_at, tuple(by_model.items()), rows))
    queue = []
    for job_id, reason in d.pending.items():
        job = s.pending.get(job_id)
        if job is None or job.held or reason.code == "held" or job.gpus <= 0:
            continue
        geo = s.geo(job)
        models, _ = s.models_for(job)
        by_model_row = {
            m: quotas.row_key(job.tenant, m) if quotas.row(job.tenant, m) else None for m in models
        }
        queue.append(Want(job, geo.charge * geo.need / MILLI, tuple(models), by_model_row, job.not_before))
        if len(queue) >= s.config.eta_max_jobs:
            break
    if wanted is not None:
        last = max((i for i, w in enumerate(queue) if w.job.id in wanted), default=-1)
        del queue[last + 1 :]
        if not queue:
            return {}
    caps = {(t, m): (q.limit, q.guaranteed) for t, rows in quotas.rows.items() for m, q in rows.items()}
    history = {key: [r for _, _, r in runs] for key, runs in s.history.runs.items()}
    runtimes = Runtimes(history, s.config.default_runtime_s)
    return plan(s.nodes, holdings, queue, caps if quotas.enabled else {}, runtimes, now)

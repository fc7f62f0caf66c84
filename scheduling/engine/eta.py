"""When will each pending job start? A forward plan of the queue, with a band.

After a pass, every pending GPU job (up to ``config.eta_max_jobs``, in the pass's order) gets an
:class:`~.types.Estimate`: a start, the earliest and latest it is likely to be, what the estimate
rests on, and its place in the queue. The plan:

1. Runtimes: low, typical and high, from history (:mod:`.runtimes`: the user's runs of the same
   name, then the tenant's runs of the kind; time limits bound them), for the running jobs (how
   long they still hold their GPUs) and the waiting ones.
2. Room over time, node by node: each node's GPUs, each tenant's quota row (up to its limit) and
   its non-preemptible part (up to its guarantee) are timelines of use. A running job holds its
   GPUs on its nodes until its predicted end.
3. The queue in the pass's order, once, with three sets of timelines (low, typical, high
   runtimes) side by side. Each job takes the earliest time from which enough of the nodes it may
   use each hold a replica (all on one node for a ``node``/``nvlink`` gang, in one rack for a
   ``rack`` gang) and its quota row has room, for its whole runtime, and holds them that long —
   so a job ahead of it delays it, as in the pass. A job the pass reserved nodes for plans on
   those nodes only: its start is when they free. The pass has just left every job waiting, so
   none starts before some GPUs of its model next free (or its retry backoff ends).

The typical runtimes give the estimate; the low and high ones its band. What the plan does not
see (jobs submitted later that go ahead, preemptions, GPU-level fragmentation inside a node) is
what falls outside the band.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .backfill import gang_shape
from .runtimes import MIN_RUNTIME_S, WHICH, Predictor, RecentRuns
from .types import MILLI, Decisions, Estimate, JobRequest, NodeSpec

if TYPE_CHECKING:
    from .policy import TesseraScheduler

Row = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Holding:
    """What a running job holds: GPUs per node, and its charge per quota row."""

    job: JobRequest
    started_at: float
    nodes: tuple[tuple[int, float], ...]  # (node index, GPUs)
    rows: tuple[tuple[Row, float], ...]  # (quota row, GPUs)


@dataclass(frozen=True, slots=True)
class Want:
    """What a pending job needs: ``replicas`` × ``per`` GPUs, each replica on one node of one of
    ``models`` (``rack``: all in one rack), charged ``charge`` GPUs to ``rows[model]``."""

    job: JobRequest
    per: float
    replicas: int
    rack: bool
    charge: float
    models: tuple[str, ...]
    rows: dict[str, Row | None]
    earliest: float  # not before (a retry's backoff)
    reserved: tuple[int, ...] = ()  # the nodes the pass reserved for it


class Timeline:
    """Use of one capacity over time: piecewise constant, starting at ``now``."""

    __slots__ = ("cap", "memo", "ts", "us")

    def __init__(self, cap: float, now: float) -> None:
        self.cap = cap
        self.ts = [now]
        self.us = [0.0]
        # (need, length) -> (from, answer) of the last query since the last change: the answer
        # holds for any later query from a time between the two (nothing fits before it)
        self.memo: dict[tuple[float, float], tuple[float, float]] = {}

    def held_until(self, ends: list[tuple[float, float]]) -> None:
        """Held from ``now``: ``(end, amount)`` each; on an empty timeline, in one go."""
        assert len(self.ts) == 1 and self.us[0] == 0.0
        ends = sorted(e for e in ends if e[1])
        used = sum(a for _, a in ends)
        self.us[0] = used
        for end, amount in ends:
            used -= amount
            if end <= self.ts[-1]:
                self.us[-1] = used
            else:
                self.ts.append(end)
                self.us.append(used)

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
        self.memo.clear()
        i = self._cut(t0)
        j = self._cut(t1) if not math.isinf(t1) else len(self.ts)
        for k in range(i, j):
            self.us[k] += amount

    def earliest(self, t: float, length: float, need: float) -> float:
        """The earliest time from ``t`` on at which ``need`` is free for ``length`` (inf: never)."""
        if need > self.cap + 1e-9:
            return math.inf
        hit = self.memo.get((need, length))
        if hit is not None and hit[0] <= t <= hit[1]:
            return hit[1]
        got = self._earliest(t, length, need)
        self.memo[(need, length)] = (t, got)
        return got

    def _earliest(self, t: float, length: float, need: float) -> float:
        room = self.cap - need + 1e-9
        us, ts = self.us, self.ts
        n = len(us)
        i = max(0, bisect.bisect_right(ts, t) - 1)
        start = t
        while True:
            j = i
            while j < n and (j == i or ts[j] < start + length):
                if us[j] > room:
                    break
                j += 1
            else:
                return start
            i = j + 1  # segment j is too full: start after it
            if i >= n:
                return math.inf
            start = ts[i]


class Plan:
    """The plan's timelines for one of the low, typical and high runtimes."""

    def __init__(self, caps: Sequence[float], quota_caps: dict[Row, tuple[float, float]], now: float):
        self.nodes = [Timeline(c, now) for c in caps]
        self.limit = {row: Timeline(c[0], now) for row, c in quota_caps.items()}
        self.steady = {row: Timeline(c[1], now) for row, c in quota_caps.items()}

    def held(self, holdings: Sequence[tuple[Holding, float]]) -> None:
        """The running jobs hold their GPUs and quota from now until their ends."""
        on_node: dict[int, list[tuple[float, float]]] = {}
        on_limit: dict[Row, list[tuple[float, float]]] = {}
        on_steady: dict[Row, list[tuple[float, float]]] = {}
        for h, end in holdings:
            for i, gpus in h.nodes:
                on_node.setdefault(i, []).append((end, gpus))
            for row, gpus in h.rows:
                if row in self.limit:
                    on_limit.setdefault(row, []).append((end, gpus))
                    if not h.job.preemptible:
                        on_steady.setdefault(row, []).append((end, gpus))
        for i, held in on_node.items():
            self.nodes[i].held_until(held)
        for row, held in on_limit.items():
            self.limit[row].held_until(held)
        for row, held in on_steady.items():
            self.steady[row].held_until(held)

    def hold(
        self,
        nodes: Sequence[tuple[int, float]],
        rows: Sequence[tuple[Row, float]],
        preemptible: bool,
        t0: float,
        t1: float,
    ) -> None:
        for i, gpus in nodes:
            self.nodes[i].add(t0, t1, gpus)
        for row, gpus in rows:
            if row in self.limit:
                self.limit[row].add(t0, t1, gpus)
                if not preemptible:
                    self.steady[row].add(t0, t1, gpus)

    def quota_lines(self, want: Want, model: str) -> list[Timeline]:
        row = want.rows.get(model)
        if row is None or row not in self.limit:
            return []
        return [self.limit[row], self.steady[row]] if not want.job.preemptible else [self.limit[row]]

    def place(
        self, want: Want, candidates: dict[str, list[list[int]]], t0: dict[str, float], length: float
    ) -> tuple[float, str, list[int]]:
        """The earliest start of ``want`` on its candidate node groups, and where."""
        best: tuple[float, str, list[int]] = (math.inf, "", [])
        for model in want.models:
            groups = candidates.get(model)
            start = t0.get(model, math.inf)
            if not groups or math.isinf(start):
                continue
            quota = self.quota_lines(want, model)
            for _ in range(50):
                if start >= best[0]:
                    break
                at, nodes = self._nodes_free(groups, want, start, length)
                for line in quota:
                    at = line.earliest(at, length, want.charge) if not math.isinf(at) else at
                if math.isinf(at):
                    break
                if at == start:
                    if at < best[0]:
                        best = (at, model, nodes)
                    break
                start = at
        return best

    def _nodes_free(
        self, groups: list[list[int]], want: Want, t: float, length: float
    ) -> tuple[float, list[int]]:
        """The earliest time from ``t`` on at which ``want.replicas`` nodes of one group each
        hold a replica for ``length``, and those nodes (the first found where several tie)."""
        best: tuple[float, list[int]] = (math.inf, [])
        need, per, timelines = want.replicas, want.per, self.nodes
        for group in groups:
            if len(group) < need:
                continue
            ready: list[tuple[float, int]] = []
            now_ready: list[int] = []
            for i in group:
                at = timelines[i].earliest(t, length, per)
                if at <= t:
                    now_ready.append(i)
                    if len(now_ready) == need:  # nothing can be earlier than t
                        return t, now_ready
                elif at < best[0]:
                    ready.append((at, i))
            ready.extend((t, i) for i in now_ready)
            if len(ready) < need:
                continue
            ready.sort()
            at = ready[need - 1][0]
            if at < best[0]:
                best = (at, [i for _, i in ready[:need]])
        return best


def plan(
    nodes: Sequence[NodeSpec],
    holdings: Sequence[Holding],
    queue: Sequence[Want],
    quota_caps: dict[Row, tuple[float, float]],  # row -> (limit, guaranteed) in GPUs
    predictor: Predictor,
    now: float,
) -> dict[str, Estimate]:
    """Steps 2 and 3, one sweep of the queue with three sets of timelines; estimates by job id."""
    caps = [float(n.gpus - len(n.unhealthy_gpus)) if n.schedulable else 0.0 for n in nodes]
    by_model: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        if caps[i] > 0:
            by_model.setdefault(n.model, []).append(i)
    plans = {which: Plan(caps, quota_caps, now) for which in WHICH}
    freed: dict[str, dict[str, float]] = {which: {} for which in WHICH}  # model -> next end
    ends: dict[str, list[tuple[Holding, float]]] = {}
    for which in WHICH:
        held = []
        for h in holdings:
            end = max(now + MIN_RUNTIME_S, predictor.remaining_end(h.job, h.started_at, now, which))
            held.append((h, end))
            for i, _ in h.nodes:
                model = nodes[i].model
                freed[which][model] = min(freed[which].get(model, math.inf), end)
        plans[which].held(held)
        if which == "typical":
            ends[""] = held
    out: dict[str, Estimate] = {}
    shapes: dict[tuple[object, ...], dict[str, list[list[int]]]] = {}
    for position, want in enumerate(queue, 1):
        job = want.job
        shape = (want.models, job.node_selector, job.tolerations, want.rack, want.reserved)
        candidates = shapes.get(shape)
        if candidates is None:
            candidates = shapes[shape] = _candidates(nodes, by_model, want)
        length = {which: predictor.predict(want.job).of(which) for which in WHICH}
        starts: dict[str, float] = {}
        where: list[int] = []
        for which in WHICH:
            t0 = {
                m: want.earliest if want.earliest > now else freed[which].get(m, math.inf)
                for m in want.models
            }
            p = plans[which]
            start, model, chosen = p.place(want, candidates, t0, length[which])
            starts[which] = start
            if math.isinf(start):
                continue
            if which == "typical":
                where = chosen
            p.hold(
                [(i, want.per) for i in chosen],
                _rows(want, model),
                want.job.preemptible,
                start,
                start + length[which],
            )
        start = starts["typical"]
        if math.isinf(start):
            continue
        lo, hi = min(start, starts["low"]), max(start, starts["high"])
        basis = _basis(want, predictor, position - 1, start, where, ends.get("", []), nodes)
        out[want.job.id] = Estimate(start, lo, hi, basis, position, position - 1)
    return out


def _rows(want: Want, model: str) -> list[tuple[Row, float]]:
    row = want.rows.get(model)
    return [(row, want.charge)] if row is not None else []


def _candidates(
    nodes: Sequence[NodeSpec], by_model: dict[str, list[int]], want: Want
) -> dict[str, list[list[int]]]:
    """Per model, the groups of nodes one job's replicas may share (a rack gang: one rack)."""
    job = want.job
    out: dict[str, list[list[int]]] = {}
    pool = want.reserved
    for model in want.models:
        ids = [i for i in pool if nodes[i].model == model] if pool else by_model.get(model, [])
        if job.node_selector or any(nodes[i].taints for i in ids):
            ids = [i for i in ids if _allowed(nodes[i], job)]
        if not ids:
            continue
        if want.rack and not pool:
            racks: dict[str, list[int]] = {}
            for i in ids:
                racks.setdefault(nodes[i].rack, []).append(i)
            out[model] = list(racks.values())
        else:
            out[model] = [ids]
    return out


def _allowed(node: NodeSpec, job: JobRequest) -> bool:
    labels = dict(node.labels)
    return all(labels.get(k) == v for k, v in job.node_selector) and all(
        t in job.tolerations for t in node.taints
    )


def _basis(
    want: Want,
    predictor: Predictor,
    ahead: int,
    start: float,
    where: list[int],
    ends: list[tuple[Holding, float]],
    nodes: Sequence[NodeSpec],
) -> str:
    """Words: what the estimate rests on."""
    runtime = predictor.predict(want.job).basis
    if want.reserved:
        on = set(want.reserved)
        last = [
            (end, h.job.id, h) for h, end in ends if end <= start + 1 and any(i in on for i, _ in h.nodes)
        ]
        if last:
            _, _, h = max(last, key=lambda e: e[:2])
            why = predictor.predict(h.job).basis
            return (
                f"nodes reserved for it free when job {h.job.id} ends (its runtime from {why}); "
                f"its own from {runtime}"
            )
        return f"nodes reserved for it; its runtime from {runtime}"
    return f"{ahead} job(s) ahead of it and the running jobs' predicted ends; its runtime from {runtime}"


def estimate(
    s: TesseraScheduler, d: Decisions, now: float, wanted: Collection[str] | None = None
) -> dict[str, Estimate]:
    """Estimates for the jobs ``d`` left pending (GPU jobs, not held), in the pass's order, the
    first ``config.eta_max_jobs`` of them, over the cluster ``s`` keeps.

    ``wanted``: only these jobs' estimates are needed. A job's estimate depends only on the jobs
    ahead of it, so the queue is planned up to the last of them and no further (a replay that
    asks only about the jobs new since the last pass plans a short head of the queue)."""
    quotas = s.quotas
    state_nodes = s.state.nodes
    holdings = []
    for job_id, run in s.running.items():
        per_node: dict[int, float] = {}
        for a in s.state.allocs.get(job_id, ()):
            per_node[a.node] = per_node.get(a.node, 0.0) + len(a.gpus) * a.milli / MILLI
        by_model: dict[str, float] = {}
        for model, milli in run.charged:
            by_model[model] = by_model.get(model, 0.0) + milli / MILLI
        rows = tuple(
            (quotas.row_key(run.job.tenant, m), g)
            for m, g in by_model.items()
            if quotas.row(run.job.tenant, m)
        )
        holdings.append(Holding(run.job, run.started_at, tuple(per_node.items()), rows))
    reserved = {r.job_id: tuple(r.nodes) for r in s.last_reservations}
    queue = []
    for job_id, reason in d.pending.items():
        job = s.pending.get(job_id)
        if job is None or job.held or reason.code == "held" or job.gpus <= 0:
            continue
        geo = s.geo(job)
        models, _ = s.models_for(job)
        req, replicas = gang_shape(geo.req, geo.need, job.topology)
        per = req.count if req.milli >= MILLI else req.milli / MILLI
        charged = {m: quotas.row_key(job.tenant, m) if quotas.row(job.tenant, m) else None for m in models}
        queue.append(
            Want(
                job, float(per), replicas, job.topology == "rack" and replicas > 1,
                geo.charge * geo.need / MILLI, tuple(models), charged, job.not_before,
                reserved.get(job_id, ()),
            )
        )  # fmt: skip
        if len(queue) >= s.config.eta_max_jobs:
            break
    if wanted is not None:
        last = max((i for i, w in enumerate(queue) if w.job.id in wanted), default=-1)
        del queue[last + 1 :]
        if not queue:
            return {}
    caps = {(t, m): (q.limit, q.guaranteed) for t, rows in quotas.rows.items() for m, q in rows.items()}
    predictor = Predictor(s.recent_runs, s.config.default_runtime_s)
    specs = [n.spec for n in state_nodes]
    return plan(specs, holdings, queue, caps if quotas.enabled else {}, predictor, now)


__all__ = ["Holding", "Plan", "RecentRuns", "Timeline", "Want", "estimate", "plan"]

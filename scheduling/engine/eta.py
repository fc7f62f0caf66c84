"""When will each pending job start? The queue played forward, with a band.

After a pass, every pending GPU job (up to ``config.eta_max_jobs``, in the pass's order) gets an
:class:`~.types.Estimate`: a start, the earliest and latest it is likely to be, what the estimate
rests on, and its place in the queue. The estimate:

1. Runtimes: low, typical and high, from history (:mod:`.runtimes`: the user's runs of the same
   name, then the tenant's runs of the kind; time limits bound them), for the running jobs (how
   long they still hold their GPUs) and the waiting ones.
2. The queue played forward (:mod:`.forward`) from the running jobs' predicted ends: at each
   time GPUs free, the waiting jobs in the pass's order, each starting once its replicas fit on
   the nodes it may use and its quota row has room. A job that does not fit holds back no one
   behind it unless it holds a reservation (the pass's, or the one it gets on ageing once its
   quota admits it, within the pass's number of reservations), as in the pass: a small job
   behind a large gang starts in the first gap, the gang waits. A job the pass kept off its
   quota row for its tenant's aged job starts no earlier than that job.

Played with the typical runtimes it gives the estimate; with the low and high ones, the band.
What it does not see (jobs submitted later that go ahead, preemptions and reclaims, GPU-level
fragmentation inside a node) is what falls outside the band.

3. The band's latest start moved as late as the engine's own first estimates of jobs like it
   turned out (:mod:`.eta_learnt`), once enough of them have started.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import forward
from .backfill import gang_shape
from .eta_learnt import class_of
from .placement import selects
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
    after: str | None = None  # the aged job whose quota hold keeps it waiting (Decisions.held_for)
    starves_at: float = math.inf  # past the starvation bound: no hold keeps it off its row then
    owed_bound: bool = False  # the pass refused it as a borrower of a model owed to others


def plan(
    nodes: Sequence[NodeSpec],
    holdings: Sequence[Holding],
    queue: Sequence[Want],
    quota_caps: dict[Row, tuple[float, float]],  # row -> (limit, guaranteed) in GPUs
    predictor: Predictor,
    now: float,
    aging_s: float = 0.0,
    owed_to: dict[str, list[str]] | None = None,  # model -> tenants the pass found it owed to
    max_reservations: int | None = None,  # the most jobs holding reserved nodes at once
) -> dict[str, Estimate]:
    """Step 2, played with the low, typical and high runtimes; estimates by job id."""
    caps = [float(n.gpus - len(n.unhealthy_gpus)) if n.schedulable else 0.0 for n in nodes]
    by_model: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        if caps[i] > 0:
            by_model.setdefault(n.model, []).append(i)
    model_of = [n.model for n in nodes]
    ends: list[tuple[Holding, float]] = []
    shapes: dict[tuple[object, ...], dict[str, list[list[int]]]] = {}
    groups = []
    for want in queue:
        job = want.job
        shape = (want.models, job.node_selector, job.tolerations, want.rack, want.reserved)
        candidates = shapes.get(shape)
        if candidates is None:
            candidates = shapes[shape] = _candidates(nodes, by_model, want)
        groups.append(candidates)
    index = {want.job.id: k for k, want in enumerate(queue)}
    after = [index.get(want.after, -1) if want.after is not None else -1 for want in queue]
    owed: dict[str, list[int]] = {}
    if any(want.owed_bound for want in queue):  # only the jobs the pass refused by the rule ask
        for m, tenants in (owed_to or {}).items():
            ks = [k for k, want in enumerate(queue) if want.job.tenant in tenants and m in want.models]
            owed[m] = sorted(ks, key=lambda k: queue[k].per * queue[k].replicas)
    starts: dict[str, list[float]] = {}
    where: list[list[int]] = []
    for which in WHICH:
        running = []
        for h in holdings:
            end = max(now + MIN_RUNTIME_S, predictor.remaining_end(h.job, h.started_at, now, which))
            running.append((end, h.nodes, h.rows, h.job.preemptible))
            if which == "typical":
                ends.append((h, end))
        jobs = [
            forward.Job(
                want.per, want.replicas, want.charge, want.job.preemptible, groups[k], want.rows,
                predictor.predict(want.job).of(which), want.earliest,
                math.inf if want.reserved or aging_s <= 0 else want.job.submitted_at + aging_s,
                want.reserved, after[k], want.starves_at, want.owed_bound,
            )
            for k, want in enumerate(queue)
        ]  # fmt: skip
        forward.play(
            caps, model_of, running, jobs, quota_caps, now, owed=owed, max_reservations=max_reservations
        )
        starts[which] = [j.start for j in jobs]
        if which == "typical":
            where = [j.nodes for j in jobs]
    out: dict[str, Estimate] = {}
    for k, want in enumerate(queue):
        start = starts["typical"][k]
        if math.isinf(start):
            continue
        lo, hi = min(start, starts["low"][k]), max(start, starts["high"][k])
        basis = _basis(want, predictor, k, start, where[k], ends, nodes)
        out[want.job.id] = Estimate(start, lo, hi, basis, k + 1, k)
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
            ids = [i for i in ids if selects(nodes[i], job)]
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
            if h.job.tenant != want.job.tenant:  # neither its id nor its history: not theirs to see
                return (
                    "nodes reserved for it free when another tenant's job ends; "
                    f"its own runtime from {runtime}"
                )
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

    ``wanted``: only these jobs' estimates are needed (none of them waiting: no estimates). The
    whole queue is played all the same: a job behind may take a gap before one ahead of it."""
    quotas = s.quotas
    state_nodes = s.state.nodes
    s.eta_learnt.observe(s.pending, {job_id: run.started_at for job_id, run in s.running.items()})
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
    starve = s.config.starve_s  # 0: no job ever starves
    for job_id, reason in d.pending.items():
        job = s.pending.get(job_id)
        if job is None or job.held or reason.code == "held" or job.gpus <= 0:
            continue
        geo = s.geo(job)
        models, _ = s.models_for(job)
        req, replicas = gang_shape(geo.req, geo.need, job.topology)
        per = req.count if req.milli >= MILLI else req.milli / MILLI
        charged = {m: quotas.row_key(job.tenant, m) if quotas.row(job.tenant, m) else None for m in models}
        holder = d.held_for.get(job_id)
        starves_at = job.submitted_at + starve if starve > 0 else math.inf
        queue.append(
            Want(
                job, float(per), replicas, job.topology == "rack" and replicas > 1,
                geo.charge * geo.need / MILLI, tuple(models), charged, job.not_before,
                reserved.get(job_id, ()), holder, starves_at,
                reason.code == "borrow-limit" and job.preemptible,
            )
        )  # fmt: skip
        if len(queue) >= s.config.eta_max_jobs:
            break
    if wanted is not None and not any(w.job.id in wanted for w in queue):
        return {}
    caps = {(t, m): (q.limit, q.guaranteed) for t, rows in quotas.rows.items() for m, q in rows.items()}
    predictor = Predictor(s.recent_runs, s.config.default_runtime_s)
    specs = [n.spec for n in state_nodes]
    out = plan(
        specs,
        holdings,
        queue,
        caps if quotas.enabled else {},
        predictor,
        now,
        s.config.aging_s,
        s.owed_to(),
        s.config.max_reservations if s.config.backfill else 0,
    )
    largest: dict[str, float] = {}
    for n in specs:
        largest[n.model] = max(largest.get(n.model, 0.0), float(n.gpus))
    for want in queue:
        est = out.get(want.job.id)
        if est is not None:
            whole = want.per >= max((largest.get(m, 0.0) for m in want.models), default=0.0)
            cls = class_of(want.replicas, whole, est.start - now)
            out[want.job.id] = s.eta_learnt.widen(want.job.id, cls, est, now)
    return out


__all__ = ["Holding", "RecentRuns", "Want", "estimate", "plan"]

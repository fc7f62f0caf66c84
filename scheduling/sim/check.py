"""The checker: judge an events file against its inputs, trusting nothing the policy says.

``python -m scheduling.sim check NODES.csv JOBS.csv EVENTS.jsonl [QUOTAS.csv]`` reads only those
files, walks the events in order, and reports every violation of the invariants (docs/architecture.md):

- time going backwards; an event for a job not in JOBS.csv; a job started while already running;
- a GPU over-committed at any moment (shares sum > 1), a node's CPUs or memory over-committed;
- a job on a model or a node its ``model`` or ``node_selector`` excludes; an unknown node or GPU;
- a replica across nodes; topology broken (``nvlink``: one island ``[k·d, (k+1)·d)`` of one node,
  ``node``: one node, ``rack``: one rack); a replica with the wrong number of GPUs;
- a gang started with fewer than ``min_available`` replicas; an elastic job outside its range;
- a non-preemptible job preempted;
- a job finishing before its work is done — work accrues at k/g on k of g GPUs, stops at the
  stop signal (``grace_s`` before the ``preempt``), and a preempted job keeps only the work of
  its last checkpoint (every ``checkpoint_s`` of work), none of it when its next ``start`` has a
  ``reason`` that begins ``starts from the beginning`` (a live export's: its checkpoint was out
  of its new nodes' reach);
- a ``time-limit`` failure before the limit; a job that never ends (but one still pending that
  the empty cluster could never hold: the policies keep it with a ``capacity`` reason, as live);
- with ``adjust`` (a ``replay --adjust on`` run): work accrues at up to real time on any GPUs
  (``min(1, k / demand)`` is at most 1), an ``idle-reclaim`` preemption keeps the work done at its
  stop signal when the job checkpoints (checkpoint-now), a non-preemptible job may be reclaimed
  only with ``idle_reclaim`` ``allow``; an ``idle-warning`` of a job that is not running;
- a reject of a job the empty cluster (and, with QUOTAS.csv, its quota) could hold;
- with QUOTAS.csv: a tenant above its limit on a model, or using a model it has no row for
  (fractions count as their share);
- with ``exclusive_gpu_shares`` (``check --exclusive-gpu-shares``): a GPU holding fractions of
  two tenants at once.

Beside the violations it measures each job's avoidable wait (``scheduling/sim/avoidable.py``):
time spent pending while the free GPUs and the quota rules would have let it start at once.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduling.engine.types import JobRequest, NodeSpec, QuotaSpec
from scheduling.sim.avoidable import AvoidableWait, FreeView
from scheduling.sim.feasible import could_hold, eligible, min_replicas, quota_row
from scheduling.sim.traces import START_FROM_SCRATCH, TraceJob

EPS = 1e-6


@dataclass
class CheckReport:
    violations: list[str] = field(default_factory=list)
    jobs: int = 0
    events: int = 0
    # Seconds each job waited while it could have started at once, and their totals.
    avoidable_s: dict[str, float] = field(default_factory=dict)
    avoidable: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


class _JobState:
    __slots__ = (
        "tj", "state", "allocs", "work", "rate", "since", "attempt_start", "capacity", "saved", "saved_now",
    )  # fmt: skip

    def __init__(self, tj: TraceJob) -> None:
        self.tj = tj
        self.state = "new"  # new | pending | running | ended
        self.allocs: list[dict[str, Any]] = []
        self.work = 0.0
        self.rate = 0.0
        self.since = 0.0
        self.attempt_start = 0.0
        self.capacity = 0.0
        self.saved: float | None = None  # work at its last reported checkpoint (None: none reported)
        self.saved_now = 0.0  # work saved by the last checkpoint-now (an idle reclaim's)


class Checker:
    """Walk events one at a time (:meth:`feed`), then :meth:`finish`; violations accumulate."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        jobs: Sequence[TraceJob],
        quotas: Sequence[QuotaSpec] | None = None,
        adjust: bool = False,
        exclusive_gpu_shares: bool = False,
    ) -> None:
        self.adjust = adjust
        self.exclusive_gpu_shares = exclusive_gpu_shares
        self.nodes = {n.name: n for n in nodes}
        self.node_list = list(nodes)
        self.jobs = {tj.request.id: _JobState(tj) for tj in jobs}
        # No rows is no quotas, as the engine reads them (quota.Quotas.enabled): every tenant
        # unlimited, not every use of a GPU "without a quota row".
        self.quotas = list(quotas) if quotas else None
        self.report = CheckReport(jobs=len(self.jobs))
        self.gpu: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
        self.cpu: dict[str, float] = defaultdict(float)
        self.mem: dict[str, float] = defaultdict(float)
        self.usage: dict[tuple[str, str], float] = defaultdict(float)  # (tenant, row model)
        self.last_t = -math.inf
        self.avoidable = AvoidableWait(FreeView(self.node_list, self.gpu, self.cpu, self.mem), self.quotas)

    def _fail(self, where: str, why: str) -> None:
        self.report.violations.append(f"{where}: {why}")

    # -- the walk -----------------------------------------------------------------------------

    def feed(self, lineno: int, ev: dict[str, Any]) -> None:
        self.report.events += 1
        t, kind, job_id = float(ev["t"]), ev["event"], ev["job"]
        where = f"line {lineno} (t={t:g}, {kind} {job_id})"
        if t < self.last_t - EPS:
            self._fail(where, f"time goes backwards (after t={self.last_t:g})")
        self.last_t = max(self.last_t, t)
        self.avoidable.advance(self.last_t)
        js = self.jobs.get(job_id)
        if js is None:
            self._fail(where, f"event for unknown job {job_id!r} (not in JOBS.csv)")
            return
        handler = getattr(self, f"_on_{kind.replace('-', '_')}")
        handler(where, t, js, ev)

    def _on_submit(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        if js.state != "new":
            self._fail(where, "submitted twice")
            return
        if t < js.tj.submit_s - EPS:
            self._fail(where, f"submitted before its submit_s {js.tj.submit_s:g}")
        js.state = "pending"
        self.avoidable.pending[js.tj.request.id] = js.tj.request

    def _on_start(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        if js.state == "running":
            self._fail(where, "start of a job already running")
            return
        if js.state != "pending":
            self._fail(where, f"start of a job that is {'not submitted' if js.state == 'new' else 'over'}")
            return
        allocs = ev.get("allocations", [])
        self._check_shape(where, js, allocs, starting=True)
        js.state = "running"
        js.attempt_start = t
        if str(ev.get("reason", "")).startswith(START_FROM_SCRATCH):  # its checkpoint out of reach
            js.work, js.saved, js.saved_now = 0.0, 0.0, 0.0
        self.avoidable.pending.pop(js.tj.request.id, None)
        self._take(where, t, js, allocs)

    def _on_resize(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        if js.state != "running":
            self._fail(where, "resize of a job that is not running")
            return
        allocs = ev.get("allocations", [])
        self._check_shape(where, js, allocs, starting=False)
        self._release(t, js)
        self._take(where, t, js, allocs)

    def _on_finish(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        if js.state != "running":
            self._fail(where, "finish of a job that is not running")
            js.state = "ended"
            return
        self._advance(js, t)
        need = js.tj.duration_s
        if need is not None and js.work < need - EPS * max(1.0, need) - 1e-3:
            self._fail(where, f"finished before its work was done ({js.work:.1f} of {need:g} s of work)")
        self._release(t, js)
        js.state = "ended"

    def _on_preempt(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        req = js.tj.request
        if js.state != "running":
            self._fail(where, "preempt of a job that is not running")
            return
        # A live export's retry after a failed attempt, or requeue after a lost node, also
        # releases and requeues (scheduling/services/export.py): not a preemption.
        reason = str(ev.get("reason", ""))
        requeue = reason.startswith(("retry", "node-lost"))
        reclaim = self.adjust and reason.startswith("idle-reclaim")
        if not req.preemptible and not requeue and not (reclaim and js.tj.idle_reclaim == "allow"):
            self._fail(where, "a non-preemptible job was preempted")
        self._advance(js, max(js.since, t - req.grace_s))
        js.rate = 0.0  # no work after the stop signal, though the GPUs are held until now
        interval = req.checkpoint_s or 0.0
        saved = math.floor(js.work / interval + EPS) * interval if interval > 0 else 0.0
        if interval > 0 and reclaim:
            js.saved_now = js.work  # checkpoint-now at the stop signal
        saved = max(saved, min(js.saved_now, js.work))
        if js.saved is not None:  # a live export's reported checkpoints: the real ones
            saved = js.saved
        js.work = min(js.work, saved)
        self._release(t, js)
        js.state = "pending"
        self.avoidable.pending[req.id] = req

    def _on_checkpoint(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        """A live job reported a checkpoint: a preemption from now on loses only later work."""
        if js.state != "running":
            self._fail(where, "checkpoint of a job that is not running")
            return
        self._advance(js, t)
        js.saved = js.work

    def _on_idle_warning(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        if js.state != "running":
            self._fail(where, "idle warning of a job that is not running")

    def _on_fail(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        limit = js.tj.request.time_limit_s
        if js.state == "running" and ev.get("reason") == "time-limit":
            if limit is None:
                self._fail(where, "failed for time-limit but the job has no time_limit_s")
            elif t < js.attempt_start + limit - 1e-3:
                self._fail(where, f"failed for time-limit before its limit of {limit:g} s")
        self._end(where, t, js)

    def _on_cancel(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        self._end(where, t, js)

    def _on_reject(self, where: str, t: float, js: _JobState, ev: dict[str, Any]) -> None:
        if js.state != "pending":
            self._fail(where, "reject of a job that is not pending")
        elif could_hold(js.tj.request, self.node_list, self.quotas):
            scope = "cluster and its quota" if self.quotas is not None else "cluster"
            self._fail(where, f"rejected but the empty {scope} could hold it")
        js.state = "ended"
        self.avoidable.pending.pop(js.tj.request.id, None)

    def _end(self, where: str, t: float, js: _JobState) -> None:
        if js.state == "ended":
            self._fail(where, "the job had already ended")
            return
        if js.state == "running":
            self._release(t, js)
        js.state = "ended"
        self.avoidable.pending.pop(js.tj.request.id, None)

    def finish(self, unfinished_ok: bool = False) -> CheckReport:
        """``unfinished_ok``: the events are a live cluster's history so far (``export_trace`` of a
        cluster still at work): a job still pending or running after the last event is no fault."""
        for job_id, js in self.jobs.items():
            if unfinished_ok and js.state in ("pending", "running"):
                continue
            if js.state == "pending" and not could_hold(js.tj.request, self.node_list, self.quotas):
                continue  # what the empty cluster never holds may wait for nodes, as live: no fault
            if js.state != "ended":
                what = "never submitted" if js.state == "new" else f"still {js.state}"
                self._fail(f"job {job_id}", f"never ends ({what} after the last event)")
        self.report.avoidable_s = {k: v for k, v in sorted(self.avoidable.seconds.items()) if v > 0}
        kinds = {job_id: js.tj.request.kind for job_id, js in self.jobs.items()}
        self.report.avoidable = self.avoidable.summary(kinds)
        return self.report

    # -- accounting ---------------------------------------------------------------------------

    def _advance(self, js: _JobState, t: float) -> None:
        if t > js.since:
            js.work += js.rate * (t - js.since)
            js.since = t

    def _take(self, where: str, t: float, js: _JobState, allocs: list[dict[str, Any]]) -> None:
        req = js.tj.request
        self._advance(js, t)
        js.since = t
        js.allocs = allocs
        r = max(1, req.replicas)
        capacity = 0.0
        grown: set[tuple[str, str]] = set()
        for a in allocs:
            node = self.nodes.get(a["node"])
            if node is None:
                continue
            share = float(a.get("share", 1.0))
            for g in a.get("gpus", []):
                holders = self.gpu[(node.name, g)]
                holders[req.id] = holders.get(req.id, 0.0) + share
                total = sum(holders.values())
                if total > 1 + EPS:
                    jobs = ", ".join(sorted(holders))
                    self._fail(
                        where,
                        f"GPU {node.name}:{g} over-committed: shares sum to {total:g} ({jobs})",
                    )
                if self.exclusive_gpu_shares and share < 1:
                    self._check_tenants(where, node.name, g, holders)
            capacity += share * len(a.get("gpus", []))
            self.avoidable.touch(node.name)
            self.cpu[node.name] += req.cpus / r
            self.mem[node.name] += req.memory_gib / r
            if node.cpus and self.cpu[node.name] > node.cpus + EPS:
                self._fail(
                    where, f"node {node.name} CPUs over-committed ({self.cpu[node.name]:g} > {node.cpus:g})"
                )
            if node.memory_gib and self.mem[node.name] > node.memory_gib + EPS:
                self._fail(where, f"node {node.name} memory over-committed")
            if self.quotas is not None and a.get("gpus"):
                row = quota_row(self.quotas, req.tenant, node.model)
                if row is None:
                    self._fail(where, f"tenant {req.tenant} uses {node.model} without a quota row")
                else:
                    self.usage[(req.tenant, row.model)] += share * len(a["gpus"])
                    self.avoidable.charge(req, (req.tenant, row.model), share * len(a["gpus"]))
                    grown.add((req.tenant, row.model))
        for key in grown:
            row = quota_row(self.quotas or (), key[0], key[1])
            if row is not None and self.usage[key] > row.limit + EPS:
                self._fail(
                    where,
                    f"tenant {key[0]} above its limit on {key[1]}: {self.usage[key]:g} > {row.limit:g} GPUs",
                )
        js.capacity = capacity
        if self.adjust:  # min(1, k / demand): at most real time, on any GPUs
            js.rate = 1.0 if req.gpus <= 0 or capacity > 0 else 0.0
        else:
            js.rate = 1.0 if req.gpus <= 0 else min(1.0, capacity / req.gpus)

    def _check_tenants(self, where: str, node: str, g: int, holders: dict[str, float]) -> None:
        """Exclusive GPU shares: the fractions on one GPU are all one tenant's."""
        tenants = {self.jobs[j].tj.request.tenant for j, s in holders.items() if s < 1 - EPS}
        if len(tenants) > 1:
            self._fail(
                where,
                f"GPU {node}:{g} holds fractions of tenants {', '.join(sorted(tenants))} (exclusive shares)",
            )

    def _release(self, t: float, js: _JobState) -> None:
        req = js.tj.request
        self._advance(js, t)
        r = max(1, req.replicas)
        for a in js.allocs:
            node = self.nodes.get(a["node"])
            if node is None:
                continue
            share = float(a.get("share", 1.0))
            for g in a.get("gpus", []):
                holders = self.gpu[(node.name, g)]
                left = holders.get(req.id, 0.0) - share
                if left > EPS:
                    holders[req.id] = left
                else:
                    holders.pop(req.id, None)
            self.avoidable.touch(node.name)
            self.cpu[node.name] -= req.cpus / r
            self.mem[node.name] -= req.memory_gib / r
            if self.quotas is not None and a.get("gpus"):
                row = quota_row(self.quotas, req.tenant, node.model)
                if row is not None:
                    self.usage[(req.tenant, row.model)] -= share * len(a["gpus"])
                    self.avoidable.charge(req, (req.tenant, row.model), -share * len(a["gpus"]))
        js.allocs, js.rate, js.capacity = [], 0.0, 0.0

    # -- the shape of one allocation set ------------------------------------------------------

    def _check_shape(self, where: str, js: _JobState, allocs: list[dict[str, Any]], starting: bool) -> None:
        req: JobRequest = js.tj.request
        per = req.gpus / max(1, req.replicas)
        replica_nodes: dict[int, set[str]] = defaultdict(set)
        replica_gpus: dict[int, int] = defaultdict(int)
        for a in allocs:
            node = self.nodes.get(a["node"])
            if node is None:
                self._fail(where, f"unknown node {a['node']!r}")
                continue
            replica_nodes[a.get("replica", 0)].add(node.name)
            replica_gpus[a.get("replica", 0)] += len(a.get("gpus", []))
            bad = [g for g in a.get("gpus", []) if not 0 <= g < node.gpus]
            if bad or len(set(a.get("gpus", []))) != len(a.get("gpus", [])):
                self._fail(where, f"GPUs {a.get('gpus')} do not exist (once each) on {node.name}")
            share = float(a.get("share", 1.0))
            if not 0 < share <= 1 + EPS:
                self._fail(where, f"share {share:g} is not in (0, 1]")
            if 0 < req.gpus < 1 and abs(share - req.gpus) > EPS:
                self._fail(where, f"share {share:g} is not the {req.gpus:g} the job asked for")
            if req.accelerators and node.model not in req.accelerators:
                self._fail(where, f"runs on excluded model {node.model} on {node.name} "
                           f"(accepts {'|'.join(req.accelerators)})")  # fmt: skip
            elif not eligible(req, node):
                self._fail(where, f"runs on {node.name}, which its node_selector excludes")
        for replica, names in replica_nodes.items():
            if len(names) > 1:
                self._fail(where, f"replica {replica} spans nodes {', '.join(sorted(names))}")
            if per >= 1 and replica_gpus[replica] != round(per):
                self._fail(where, f"replica {replica} has {replica_gpus[replica]} GPUs, not {per:g}")
        count = len(replica_nodes)
        if req.gpus > 0 or allocs:
            floor = min_replicas(req) if starting else 1
            if count < floor:
                self._fail(where, f"gang started partially: {count} of {req.replicas} replicas "
                           f"(min_available {min_replicas(req)})")  # fmt: skip
            elastic = req.elastic_min_gpus is not None or req.elastic_max_gpus is not None
            total = sum(len(a.get("gpus", [])) for a in allocs) if req.gpus >= 1 else req.gpus
            lo = req.elastic_min_gpus if req.elastic_min_gpus is not None else 0
            hi = req.elastic_max_gpus if req.elastic_max_gpus is not None else req.gpus
            if elastic and not lo - EPS <= total <= hi + EPS:
                self._fail(where, f"elastic job on {total:g} GPUs, outside its elastic range "
                           f"[{lo:g}, {hi:g}]")  # fmt: skip
            elif not elastic and count > req.replicas:
                self._fail(where, f"{count} replicas, more than the {req.replicas} asked")
        self._check_topology(where, req, allocs)

    def _check_topology(self, where: str, req: JobRequest, allocs: list[dict[str, Any]]) -> None:
        placed = [a for a in allocs if a["node"] in self.nodes]
        names = {a["node"] for a in placed}
        if req.topology in ("node", "nvlink") and len(names) > 1:
            self._fail(where, f"topology {req.topology} broken: spread over {', '.join(sorted(names))}")
        elif req.topology == "nvlink" and names:
            node = self.nodes[next(iter(names))]
            islands = {g // node.nvlink_domain for a in placed for g in a.get("gpus", [])}
            if len(islands) > 1:
                self._fail(where, f"topology nvlink broken: GPUs cross NVLink islands of "
                           f"{node.nvlink_domain} on {node.name}")  # fmt: skip
        elif req.topology == "rack":
            racks = {self.nodes[n].rack for n in names}
            if len(racks) > 1:
                self._fail(where, f"topology rack broken: spread over racks {', '.join(sorted(racks))}")


def check(
    nodes: Sequence[NodeSpec],
    jobs: Sequence[TraceJob],
    events: Iterable[tuple[int, dict[str, Any]]],
    quotas: Sequence[QuotaSpec] | None = None,
    unfinished_ok: bool = False,
    adjust: bool = False,
    exclusive_gpu_shares: bool = False,
) -> CheckReport:
    """Check numbered events (as :func:`scheduling.sim.events.read_events` yields them);
    ``unfinished_ok``: see :meth:`Checker.finish`; ``adjust``: the events of a ``replay --adjust
    on`` run; ``exclusive_gpu_shares``: a GPU holding two tenants' fractions is a violation (the
    module's docstring)."""
    checker = Checker(nodes, jobs, quotas, adjust, exclusive_gpu_shares)
    for lineno, ev in events:
        checker.feed(lineno, ev)
    return checker.finish(unfinished_ok)

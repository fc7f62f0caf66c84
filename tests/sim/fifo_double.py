"""A tiny FIFO first-fit :class:`Scheduler` — a test double for the simulator, never a policy.

It honours what the checker checks (models, selectors, CPUs and memory, topology, gangs, elastic
ranges, fractional shares) so that replay's plumbing can be tested without the engine. It can
also preempt on request (``preempt_on_submit``) to exercise grace periods and requeues.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduling.engine.types import (
    Binding,
    Decisions,
    JobRequest,
    NodeSpec,
    Placement,
    Preemption,
    QuotaSpec,
)

MILLI = 1000


class FifoFirstFit:
    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        quotas: Sequence[QuotaSpec] = (),
        seed: int = 0,
        preempt_on_submit: bool = False,
    ) -> None:
        self.nodes = [n for n in nodes if n.schedulable]
        self.free = {n.name: [MILLI] * n.gpus for n in self.nodes}
        self.cpu = {n.name: n.cpus for n in self.nodes}
        self.mem = {n.name: n.memory_gib for n in self.nodes}
        self.queue: list[JobRequest] = []
        self.running: dict[str, tuple[JobRequest, tuple[Placement, ...]]] = {}
        self.preempt_on_submit = preempt_on_submit
        self.to_preempt: list[str] = []

    # -- the protocol -------------------------------------------------------------------------

    def submit(self, job: JobRequest) -> None:
        self.queue.append(job)
        if self.preempt_on_submit:
            self.to_preempt.extend(
                j for j, (r, _) in self.running.items() if r.preemptible and j not in self.to_preempt
            )

    def cancel(self, job_id: str) -> None:
        self.queue = [j for j in self.queue if j.id != job_id]

    def release(self, job_id: str, now: float) -> None:
        job, placements = self.running.pop(job_id)
        self._take(job, placements, -1)

    def requeue(self, job: JobRequest) -> None:
        self.queue.append(job)

    def checkpoint(self, job_id: str, at: float) -> None:
        pass

    def decide(self, now: float) -> Decisions:
        d = Decisions()
        for job_id in self.to_preempt:
            if job_id in self.running:
                d.preemptions.append(Preemption(job_id, "test: preempt on submit"))
        self.to_preempt = []
        left: list[JobRequest] = []
        for job in self.queue:
            if not self._could_ever_fit(job):
                d.rejections[job.id] = "no node can ever hold it"
                continue
            placements = self._place(job)
            if placements is None:
                left.append(job)
                continue
            self._take(job, placements, +1)
            self.running[job.id] = (job, placements)
            d.bindings.append(Binding(job.id, placements))
        self.queue = left
        return d

    # -- placement ----------------------------------------------------------------------------

    def _take(self, job: JobRequest, placements: tuple[Placement, ...], sign: int) -> None:
        per = self._per(job)
        for p in placements:
            for g in p.gpus:
                self.free[p.node][g] -= sign * round(p.share * MILLI)
            self.cpu[p.node] -= sign * per[1]
            self.mem[p.node] -= sign * per[2]

    @staticmethod
    def _per(job: JobRequest) -> tuple[float, float, float]:
        r = max(1, job.replicas)
        return job.gpus / r, job.cpus / r, job.memory_gib / r

    def _eligible(self, job: JobRequest, node: NodeSpec) -> bool:
        if job.accelerators and node.model not in job.accelerators:
            return False
        labels = dict(node.labels)
        return all(labels.get(k) == v for k, v in job.node_selector)

    def _could_ever_fit(self, job: JobRequest) -> bool:
        gpus, cpus, mem = self._per(job)
        need = job.gpus if job.topology in ("nvlink", "node") else gpus
        for n in self.nodes:
            if not self._eligible(job, n):
                continue
            if (n.cpus and cpus > n.cpus) or (n.memory_gib and mem > n.memory_gib):
                continue
            limit = n.nvlink_domain if job.topology == "nvlink" else n.gpus
            if need <= limit:
                return True
        return False

    def _replica_counts(self, job: JobRequest) -> list[int]:
        if job.elastic_min_gpus is not None and job.elastic_max_gpus is not None:
            per = job.gpus / job.replicas
            hi, lo = round(job.elastic_max_gpus / per), round(job.elastic_min_gpus / per)
            return list(range(hi, lo - 1, -1))
        return [job.replicas]

    def _place(self, job: JobRequest) -> tuple[Placement, ...] | None:
        for count in self._replica_counts(job):
            groups: list[list[NodeSpec]] = [[n for n in self.nodes if self._eligible(job, n)]]
            if job.topology == "rack":
                racks: dict[str, list[NodeSpec]] = {}
                for n in groups[0]:
                    racks.setdefault(n.rack, []).append(n)
                groups = list(racks.values())
            for group in groups:
                placed = self._place_in(job, count, group)
                if placed is not None:
                    return placed
        return None

    def _place_in(self, job: JobRequest, count: int, nodes: list[NodeSpec]) -> tuple[Placement, ...] | None:
        gpus, cpus, mem = self._per(job)
        free = {n.name: list(self.free[n.name]) for n in nodes}
        cpu = {n.name: self.cpu[n.name] for n in nodes}
        memory = {n.name: self.mem[n.name] for n in nodes}
        out: list[Placement] = []
        one_node = job.topology in ("node", "nvlink")
        for replica in range(count):
            for n in nodes:
                if one_node and out and n.name != out[0].node:
                    continue
                if (n.cpus and cpu[n.name] < cpus - 1e-9) or (n.memory_gib and memory[n.name] < mem - 1e-9):
                    continue
                got = self._gpus_on(job, n, free[n.name], gpus, out)
                if got is None:
                    continue
                share = gpus if 0 < gpus < 1 else 1.0
                for g in got:
                    free[n.name][g] -= round(share * MILLI)
                cpu[n.name] -= cpus
                memory[n.name] -= mem
                out.append(Placement(replica, n.name, tuple(got), share))
                break
            else:
                return None
        return tuple(out)

    @staticmethod
    def _gpus_on(
        job: JobRequest, n: NodeSpec, free: list[int], gpus: float, out: list[Placement]
    ) -> list[int] | None:
        if gpus <= 0:
            return []
        if gpus < 1:
            need = round(gpus * MILLI)
            return next(([g] for g, f in enumerate(free) if f >= need), None)
        count = int(gpus)
        d = n.nvlink_domain if job.topology == "nvlink" else n.gpus
        islands = range(0, n.gpus, d)
        if job.topology == "nvlink" and out:
            islands = range(out[0].gpus[0] // d * d, out[0].gpus[0] // d * d + 1)
        for start in islands:
            whole = [g for g in range(start, min(start + d, n.gpus)) if free[g] == MILLI]
            if len(whole) >= count:
                return whole[:count]
        return None

"""A tiny test driver: runs a scheduler through steps and checks the invariants of docs/architecture.md."""

from __future__ import annotations

import random

from scheduling.engine.buddy import order_for
from scheduling.engine.types import Decisions, JobRequest, NodeSpec, Placement, QuotaSpec


class World:
    """What a driver knows: who holds which GPUs, and the invariants over it."""

    def __init__(self, nodes: list[NodeSpec], quotas: list[QuotaSpec], jobs: list[JobRequest]):
        self.nodes = {n.name: n for n in nodes}
        self.quotas = quotas
        self.jobs = {j.id: j for j in jobs}
        self.holding: dict[str, tuple[Placement, ...]] = {}
        self.terminating: set[str] = set()
        # Replicas a shrink removed: their GPUs stay held until the driver says they exited.
        self.leaving: dict[str, tuple[Placement, ...]] = {}
        self.log: list[Decisions] = []

    def apply(self, d: Decisions) -> None:
        self.log.append(d)
        for b in d.bindings:
            assert b.job_id not in self.holding, f"{b.job_id} bound twice"
            self.check_binding(self.jobs[b.job_id], b.placements)
            self.holding[b.job_id] = b.placements
        for r in d.resizes:
            assert r.job_id in self.holding
            self.check_binding(self.jobs[r.job_id], r.placements, resize=True)
            kept = {p.replica for p in r.placements}
            gone = tuple(p for p in self.holding[r.job_id] if p.replica not in kept)
            if gone:
                assert r.job_id not in self.leaving, f"{r.job_id} shrunk again before its replicas left"
                self.leaving[r.job_id] = gone
            self.holding[r.job_id] = r.placements
        for p in d.preemptions:
            job = self.jobs[p.job_id]
            assert job.preemptible, f"non-preemptible {job.id} preempted"  # invariant 6
            assert p.job_id in self.holding
            self.terminating.add(p.job_id)
        self.check_gpus()
        self.check_quotas()

    def check_binding(self, job: JobRequest, placements: tuple[Placement, ...], resize: bool = False) -> None:
        replicas = [p.replica for p in placements]
        assert len(set(replicas)) == len(replicas), "a replica placed twice"
        per = job.gpus / job.replicas
        top = job.replicas
        need = job.min_available or job.replicas
        if job.elastic_max_gpus:
            top = int(job.elastic_max_gpus // per)
            if job.min_available is None and job.elastic_min_gpus:
                need = -(-job.elastic_min_gpus // int(per))
        if not resize:
            assert len(placements) >= min(need, top), "gang started partially"  # invariant 2
        assert len(placements) <= top
        racks, nodes, islands = set(), set(), set()
        for p in placements:
            n = self.nodes[p.node]  # invariant 2: one Placement = one node
            gpus_each = 0 if per == 0 else (1 if per < 1 else int(per))
            assert len(p.gpus) == gpus_each
            if per > 0:  # invariant 5
                assert not job.accelerators or n.model in job.accelerators
            labels = dict(n.labels)
            assert all(labels.get(k) == v for k, v in job.node_selector)
            assert all(0 <= g < n.gpus and g not in n.unhealthy_gpus for g in p.gpus)
            racks.add(n.rack)
            nodes.add(n.name)
            for g in p.gpus:
                islands.add((n.name, g // n.nvlink_domain))
            if per >= 1 and job.topology == "nvlink":
                assert len({g // n.nvlink_domain for g in p.gpus}) == 1
        if job.topology == "rack":
            assert len(racks) <= 1
        if job.topology == "node":
            assert len(nodes) <= 1
        if job.topology == "nvlink" and per >= 1:
            assert len(islands) <= 1

    def used(self) -> dict[tuple[str, int], float]:
        out: dict[tuple[str, int], float] = {}
        for placements in [*self.holding.values(), *self.leaving.values()]:
            for p in placements:
                for g in p.gpus:
                    out[(p.node, g)] = out.get((p.node, g), 0.0) + p.share
        return out

    def check_gpus(self) -> None:  # invariant 1
        for key, share in self.used().items():
            assert share <= 1.0 + 1e-9, f"GPU {key} over-committed: {share}"

    def check_quotas(self) -> None:  # invariant 3
        if not self.quotas:
            return
        rows = {(q.tenant, q.model): q for q in self.quotas}
        usage: dict[tuple[str, str], float] = {}
        # a shrink's removed replicas count until they exit: they still hold their GPUs
        held = [*self.holding.items(), *self.leaving.items()]
        for jid, placements in held:
            job = self.jobs[jid]
            for p in placements:
                if not p.gpus:
                    continue
                model = self.nodes[p.node].model
                key = (job.tenant, model) if (job.tenant, model) in rows else (job.tenant, "*")
                assert key in rows, f"{jid} runs on {model} without a quota row"
                charge = p.share if p.share < 1 else float(1 << order_for(len(p.gpus)))
                usage[key] = usage.get(key, 0.0) + charge
        for key, used in usage.items():
            assert used <= rows[key].limit + 1e-9, f"{key} uses {used} > {rows[key].limit}"

    def release(self, sched, job_id: str, now: float) -> None:
        self.holding.pop(job_id, None)
        self.leaving.pop(job_id, None)
        self.terminating.discard(job_id)
        sched.release(job_id, now)

    def leave(self, sched, job_id: str, now: float) -> None:
        """The replicas a shrink removed from ``job_id`` have exited."""
        self.leaving.pop(job_id)
        sched.release_leaving(job_id, now)


def run(
    sched, world: World, jobs: list[JobRequest], steps: int = 8, seed: int = 0, step_s: float = 400.0
) -> World:
    """Submit everything, then alternate decide / finish some / release the preempted."""
    rng = random.Random(seed)
    for j in jobs:
        sched.submit(j)
    now = 0.0
    for _ in range(steps):
        world.apply(sched.decide(now))
        now += step_s
        for jid in sorted(world.leaving):  # a shrink's removed replicas may take passes to exit
            if rng.random() < 0.5:
                world.leave(sched, jid, now)
        for jid in sorted(world.terminating):
            world.release(sched, jid, now)
            sched.requeue(world.jobs[jid])
        for jid in sorted(world.holding):
            if rng.random() < 0.3:
                world.release(sched, jid, now)
    return world


class Recorded:
    """A scheduler whose every decision is written down, in full."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.log: list[tuple] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def decide(self, now: float) -> Decisions:
        d = self.inner.decide(now)
        self.log.append(
            (
                now,
                [(b.job_id, b.placements) for b in d.bindings],
                [(p.job_id, p.reason, p.for_job) for p in d.preemptions],
                [(r.job_id, r.placements) for r in d.resizes],
                sorted(d.rejections.items()),
                sorted((j, r.code, r.message, r.estimated_start) for j, r in d.pending.items()),
            )
        )
        return d

"""First-fit: the foundation's placeholder policy (whole GPUs first-fit, fractions on one GPU).

Replaced by ``policy.TesseraScheduler``; kept only until that lands.
"""

from __future__ import annotations

from scheduling.engine.types import MILLI, Binding, Decisions, PendingReason, Placement, Snapshot


class FirstFit:
    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self.free: dict[str, list[int]] = {}
        for node in snapshot.nodes:
            self.free[node.name] = [0 if i in node.unhealthy_gpus else MILLI for i in range(node.gpus)]
        for running in snapshot.running:
            for p in running.placements:
                for g in p.gpus:
                    self.free[p.node][g] -= round(p.share * MILLI)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, config: object = None) -> FirstFit:
        return cls(snapshot)

    def decide(self, now: float) -> Decisions:
        out = Decisions()
        for job in self.snapshot.pending:
            placements = self._place(job)
            if placements is None:
                out.pending[job.id] = PendingReason("capacity", "no node has room for this job")
            else:
                out.bindings.append(Binding(job.id, placements))
        return out

    def _place(self, job):
        per = job.gpus / job.replicas
        taken: dict[str, list[int]] = {k: list(v) for k, v in self.free.items()}
        placements = []
        for replica in range(job.replicas):
            for node in self.snapshot.nodes:
                if not node.schedulable or (job.accelerators and node.model not in job.accelerators):
                    continue
                free = taken[node.name]
                if 0 < per < 1:
                    need = round(per * MILLI)
                    idx = next((i for i, f in enumerate(free) if f >= need), None)
                    if idx is None:
                        continue
                    free[idx] -= need
                    placements.append(Placement(replica, node.name, (idx,), per))
                    break
                whole = [i for i, f in enumerate(free) if f == MILLI]
                if len(whole) >= per:
                    chosen = tuple(whole[: int(per)])
                    for i in chosen:
                        free[i] = 0
                    placements.append(Placement(replica, node.name, chosen, 1.0))
                    break
            else:
                return None
        self.free = taken
        return tuple(placements)

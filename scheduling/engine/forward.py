"""The queue played forward, as the pass would play it: the start estimates' simulation.

From now on, at each time some GPUs free (a running job's predicted end, or a simulated one's),
the waiting jobs are walked in the pass's order and every one that fits starts there and then
(each replica on one node of one of its models, a ``rack`` gang in one rack, its quota row within
its limit and, if not preemptible, within its guarantee). A job that does not fit does not hold
the jobs behind it back — as in the pass, where only reserved jobs do — unless it holds a
reservation: the pass's own (its reserved nodes are kept for it until it starts), or one it gets
on reaching the aging bound (``aging_s``: the pass reserves for aged jobs), on the nodes of its
models with the most GPUs free then — once its quota admits it (a job waiting for its quota
drains no nodes) and while fewer jobs hold reserved nodes than the pass may reserve for
(``max_reservations``). A job the pass kept off its quota row for an aged job of its
tenant (``after``: the pass's quota hold) starts no earlier than that job, until it starves
itself (``starves_at``), as in the pass. A job the pass refused as a borrower of a model owed
to another tenant (``owed_bound``) does not borrow it while a job of such a tenant still waits
within its guarantee and the model's free GPUs could hold it (:class:`_Owed`). Jobs submitted
later are not in it; a job the pass has just left waiting does not start before some GPUs of one
of its models free (or its retry backoff ends): what the pass saw at ``now`` is what the pass
decided on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

Row = tuple[str, str]
EPS = 1e-9


@dataclass(slots=True)
class Job:
    """A waiting job as the simulation sees it."""

    per: float  # GPUs per replica
    replicas: int
    charge: float  # GPUs charged to its quota row
    preemptible: bool
    groups: dict[str, list[list[int]]]  # model -> node groups its replicas may share
    rows: dict[str, Row | None]  # model -> quota row
    length: float  # runtime
    not_before: float  # retry backoff
    ages_at: float  # when it reaches the aging bound (inf: never, or reserved already)
    reserved: tuple[int, ...] = ()
    after: int = -1  # the job (index) whose quota hold keeps it waiting until that one starts
    starves_at: float = math.inf  # past the starvation bound: no hold keeps it off its row then
    owed_bound: bool = False  # the pass refused it as a borrower of a model owed to others
    start: float = math.inf
    nodes: list[int] = field(default_factory=list)


def play(
    caps: Sequence[float],
    model_of: Sequence[str],
    running: Sequence[tuple[float, Sequence[tuple[int, float]], Sequence[tuple[Row, float]], bool]],
    jobs: Sequence[Job],
    quota_caps: dict[Row, tuple[float, float]],
    now: float,
    limit_events: int = 200_000,
    owed: dict[str, list[int]] | None = None,
    max_reservations: int | None = None,
) -> None:
    """Sets each job's ``start`` (inf: not within the simulation) and ``nodes``.

    ``running``: (predicted end, GPUs per node, charge per quota row, preemptible) each;
    ``owed``: per model, the waiting jobs (indices) of the tenants the pass found it owed to;
    ``max_reservations``: the most jobs holding reserved nodes at once (the pass's bound; None:
    no bound)."""
    free = list(caps)
    limit_used: dict[Row, float] = dict.fromkeys(quota_caps, 0.0)
    steady_used: dict[Row, float] = dict.fromkeys(quota_caps, 0.0)
    events: list[tuple[float, int, int]] = []  # (time, seq, index in ends; -1 - k: wake job k)
    ends: list[tuple[Sequence[tuple[int, float]], Sequence[tuple[Row, float]], bool]] = []
    seq = 0

    def push(t: float, what: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, what))
        seq += 1

    for end, on_nodes, rows, preemptible in running:
        _take(free, limit_used, steady_used, on_nodes, rows, preemptible, -1.0)
        ends.append((on_nodes, rows, preemptible))
        push(max(end, now), len(ends) - 1)
    held: dict[int, int] = {}  # node -> the job whose reservation holds it
    behind: dict[int, list[int]] = {}  # a job -> the jobs its quota hold keeps waiting
    for k, job in enumerate(jobs):
        for i in job.reserved:
            held.setdefault(i, k)
        for at in (job.not_before, job.ages_at, job.starves_at if job.after >= 0 else math.inf):
            if now < at < math.inf:
                push(at, -1 - k)
        if job.after >= 0:
            behind.setdefault(job.after, []).append(k)
    waiting = list(range(len(jobs)))
    holding = sum(1 for job in jobs if job.reserved)  # jobs holding reserved nodes now
    room_for = math.inf if max_reservations is None else max_reservations
    models_of: list[frozenset[str]] = [frozenset(j.groups) for j in jobs]
    rooms = _Rooms(free, held, model_of)
    rule = (
        _Owed(owed, jobs, rooms, limit_used, steady_used, quota_caps) if owed and any(owed.values()) else None
    )
    count = 0
    while events and waiting and count < limit_events:
        t = events[0][0]
        changed: set[str] = set()
        woke: set[int] = set()
        while events and events[0][0] <= t + EPS:
            _, _, what = heapq.heappop(events)
            count += 1
            if what < 0:
                woke.add(-1 - what)
                continue
            on_nodes, rows, preemptible = ends[what]
            _take(free, limit_used, steady_used, on_nodes, rows, preemptible, 1.0)
            changed.update(model_of[i] for i, _ in on_nodes)
        rooms.changed(changed)
        if rule is not None:
            rule.stamp += 1
            rule.now = t
        still: list[int] = []
        for k in waiting:
            job = jobs[k]
            if job.not_before > t + EPS or not (k in woke or changed & models_of[k]):
                still.append(k)
                continue
            if job.after >= 0 and math.isinf(jobs[job.after].start) and job.starves_at > t + EPS:
                still.append(k)  # the hold keeps it off its row until that job starts
                continue
            got = _fit(job, rooms, limit_used, steady_used, quota_caps, model_of, rule)
            if got is None:
                if (
                    job.ages_at <= t + EPS
                    and not job.reserved
                    and holding < room_for
                    and _admitted(job, limit_used, steady_used, quota_caps)
                ):
                    job.reserved = _reserve(job, k, free, held)
                    holding += bool(job.reserved)
                    for i in job.reserved:
                        held.setdefault(i, k)
                    rooms.changed({model_of[i] for i in job.reserved})
                still.append(k)
                continue
            model, nodes = got
            job.start, job.nodes = t, nodes
            on_nodes = [(i, job.per) for i in nodes]
            row = job.rows.get(model)
            rows = [(row, job.charge)] if row is not None and row in quota_caps else []
            _take(free, limit_used, steady_used, on_nodes, rows, job.preemptible, -1.0)
            holding -= bool(job.reserved)
            for i in job.reserved:
                if held.get(i) == k:
                    del held[i]
            rooms.changed({model})
            ends.append((on_nodes, rows, job.preemptible))
            push(t + job.length, len(ends) - 1)
            for h in behind.get(k, ()):
                push(t, -1 - h)  # its hold is over: the jobs it kept waiting may start
            if rule is not None:
                rule.stamp += 1
        waiting = still


def _take(
    free: list[float],
    limit_used: dict[Row, float],
    steady_used: dict[Row, float],
    on_nodes: Sequence[tuple[int, float]],
    rows: Sequence[tuple[Row, float]],
    preemptible: bool,
    sign: float,
) -> None:
    for i, gpus in on_nodes:
        free[i] += sign * gpus
    for row, gpus in rows:
        if row in limit_used:
            limit_used[row] -= sign * gpus
            if not preemptible:
                steady_used[row] -= sign * gpus


class _Rooms:
    """The nodes of a group with room for a replica, fullest first, and the most GPUs free on
    a node of a model, kept until a node of the model changes (most waiting jobs ask again and
    again, and most of them do not fit)."""

    def __init__(self, free: list[float], held: dict[int, int], model_of: Sequence[str]) -> None:
        self.free, self.held = free, held
        self.nodes: dict[str, list[int]] = {}
        for i, m in enumerate(model_of):
            self.nodes.setdefault(m, []).append(i)
        self.version: dict[str, int] = {}
        self.memo: dict[tuple[int, float], tuple[int, list[int]]] = {}
        self.top: dict[str, tuple[int, float, float]] = {}  # model -> (version, most, total)

    def changed(self, models: set[str]) -> None:
        for m in models:
            self.version[m] = self.version.get(m, 0) + 1

    def most(self, model: str) -> float:
        """The most GPUs free on one of the model's nodes that no reservation holds."""
        return self._unheld(model)[0]

    def total(self, model: str) -> float:
        """The GPUs free on the model's nodes that no reservation holds."""
        return self._unheld(model)[1]

    def _unheld(self, model: str) -> tuple[float, float]:
        version = self.version.get(model, 0)
        hit = self.top.get(model)
        if hit is not None and hit[0] == version:
            return hit[1], hit[2]
        free, held = self.free, self.held
        room = [free[i] for i in self.nodes.get(model, ()) if i not in held]
        got = (max(room, default=0.0), sum(room))
        self.top[model] = (version, *got)
        return got

    def of(self, model: str, group: list[int], per: float) -> list[int]:
        version = self.version.get(model, 0)
        key = (id(group), per)
        hit = self.memo.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        free, held = self.free, self.held
        room = [(free[i], i) for i in group if free[i] >= per and i not in held]
        room.sort()
        got = [i for _, i in room]
        self.memo[key] = (version, got)
        return got


class _Owed:
    """The pass's owed rule (``TesseraScheduler.refusal``) in the play: a borrower (above its
    tenant's guarantee on a model, not starving) does not start there while one of the jobs the
    model was owed to at the pass (``owed``, per model smallest first) is of another tenant,
    still waits, would stay within its tenant's guarantee and has the model's free GPUs (held
    nodes aside) to start on (``TesseraScheduler.note_owed``), at the play's time ``now``. Who
    the model is owed to is found once per model until the cluster changes (``stamp``: a time's
    ends, or a start)."""

    def __init__(
        self,
        owed: dict[str, list[int]],
        jobs: Sequence[Job],
        rooms: _Rooms,
        limit_used: dict[Row, float],
        steady_used: dict[Row, float],
        quota_caps: dict[Row, tuple[float, float]],
    ) -> None:
        self.owed, self.jobs, self.rooms = owed, jobs, rooms
        self.limit_used, self.steady_used, self.quota_caps = limit_used, steady_used, quota_caps
        self.stamp = 0
        self.now = 0.0
        self.seen: dict[str, tuple[int, set[str]]] = {}

    def tenants(self, model: str) -> set[str]:
        hit = self.seen.get(model)
        if hit is not None and hit[0] == self.stamp:
            return hit[1]
        free = self.rooms.total(model) + EPS
        got: set[str] = set()
        for k in self.owed.get(model, ()):
            other = self.jobs[k]
            if other.per * other.replicas > free:
                break
            row = other.rows.get(model)
            if not math.isinf(other.start) or row is None or row not in self.quota_caps:
                continue
            if other.not_before > self.now + EPS or row[0] in got:
                continue
            spent = self.limit_used[row] if other.preemptible else self.steady_used[row]
            if spent + other.charge <= self.quota_caps[row][1] + EPS:
                got.add(row[0])
        self.seen[model] = (self.stamp, got)
        return got

    def keeps_off(self, job: Job, model: str, row: Row, used: float, guaranteed: float) -> bool:
        if used + job.charge <= guaranteed + EPS or job.starves_at <= self.now + EPS:
            return False
        owners = self.tenants(model)
        return bool(owners) and (len(owners) > 1 or row[0] not in owners)


def _fit(
    job: Job,
    rooms: _Rooms,
    limit_used: dict[Row, float],
    steady_used: dict[Row, float],
    quota_caps: dict[Row, tuple[float, float]],
    model_of: Sequence[str],
    owed: _Owed | None = None,
) -> tuple[str, list[int]] | None:
    """Where the job starts now, if it fits: its reserved nodes once each has room for a replica
    (if it holds a reservation), else its first model with room, the fullest nodes; ``owed``: the
    pass's rule for borrowers while a model is owed to others."""
    need, per = job.replicas, job.per - EPS
    if job.reserved:
        at = list(job.reserved[:need])
        if len(at) < need or any(rooms.free[i] < per for i in at):
            return None
        models = {model_of[at[0]]: job.groups.get(model_of[at[0]], [])}
    else:
        models = job.groups
    for model, groups in models.items():
        row = job.rows.get(model)
        if row is not None and row in quota_caps:
            if not _row_admits(job, row, limit_used, steady_used, quota_caps):
                continue
            if (
                job.owed_bound
                and owed is not None
                and owed.keeps_off(job, model, row, limit_used[row], quota_caps[row][1])
            ):
                continue
        if job.reserved:
            return model, list(job.reserved[:need])
        if per > rooms.most(model):
            continue
        for group in groups:
            room = rooms.of(model, group, per)
            if len(room) >= need:
                return model, room[:need]
    return None


def _admitted(
    job: Job,
    limit_used: dict[Row, float],
    steady_used: dict[Row, float],
    quota_caps: dict[Row, tuple[float, float]],
) -> bool:
    """Does the quota of one of its models admit the job now? (The pass drains no nodes for a
    job its quota refuses while that lasts: it waits for its quota, not for nodes.)"""
    for model in job.groups:
        row = job.rows.get(model)
        if row is None or row not in quota_caps:
            return True
        if _row_admits(job, row, limit_used, steady_used, quota_caps):
            return True
    return False


def _row_admits(
    job: Job,
    row: Row,
    limit_used: dict[Row, float],
    steady_used: dict[Row, float],
    quota_caps: dict[Row, tuple[float, float]],
) -> bool:
    """Within the row's limit, and within its guarantee if not preemptible."""
    limit, steady = quota_caps[row]
    if limit_used[row] + job.charge > limit + EPS:
        return False
    return job.preemptible or steady_used[row] + job.charge <= steady + EPS


def _reserve(job: Job, k: int, free: list[float], held: dict[int, int]) -> tuple[int, ...]:
    """The nodes an aged job holds until it starts: of its first model's groups, the one whose
    ``replicas`` emptiest free nodes hold the most GPUs, those nodes."""
    best: tuple[float, tuple[int, ...]] = (-1.0, ())
    for groups in job.groups.values():
        for group in groups:
            room = sorted((-free[i], i) for i in group if held.get(i, k) == k)[: job.replicas]
            if len(room) < job.replicas:
                continue
            got = -sum(f for f, _ in room)
            if got > best[0]:
                best = (got, tuple(i for _, i in room))
        if best[1]:
            break
    return best[1]

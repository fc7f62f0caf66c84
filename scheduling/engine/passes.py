"""Steps 2-6 of a pass (see :mod:`.policy`), kept apart so each part stays readable."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import queues
from .backfill import Reservation, Reservations
from .preference import wait_for_preferred
from .types import MILLI, Deadline, Decisions, PendingReason, Preemption, Resize

if TYPE_CHECKING:
    from .policy import TesseraScheduler


def _minutes(seconds: float) -> str:
    return f"~{max(1, round(seconds / 60))} min"


def run_pass(s: TesseraScheduler, now: float, deadline: Deadline | None = None) -> Decisions:
    from .policy import diagnose_job, placements_of

    cfg = s.config
    d = Decisions()
    res = Reservations()
    starts = 0
    blocked_seen = False
    to_diagnose: list = []
    quota_blocked: list = []
    held_rows: dict[tuple[str, str], str] = {}  # quota rows held for an aged job
    hypo = None
    attempts = 0
    s.begin_pass(now)
    s.note_owed(now)
    # quota room claimed this pass (tenant, model, milli, preemptible), undone at the end
    claimed: list[tuple[str, str, int, bool]] = []
    s.quotas.frozen = {}
    # Nodes reserved last pass: no preemption is planned on another job's (see _plan).
    s.prev_reserved = {i: r.job_id for r in s.last_reservations for i in r.nodes}
    for jid, (nodes, until) in list(s.room.items()):  # room preemptions freed, held for its job
        if jid in s.pending and now <= until:
            res.add(Reservation(jid, nodes, now))
        else:
            del s.room[jid]
    # Last pass's reservations hold from the start of this one, so even a job that comes first
    # (inference, say) backfills them only if it ends before their start.
    for r in s.last_reservations:
        if r.job_id in s.pending and r.job_id not in s.room:
            res.add(r)
    hold: list = []  # an aged job that quotas admit but nodes do not: its quota, held below
    reached: set[str] = set()  # with a deadline: the jobs this pass has looked at
    for job in _in_turn(s, now, cfg, deadline):
        if deadline is not None:
            # Out of time (once at least one job was decided): what was decided stands; the
            # jobs not reached are decided first by the next pass (the driver asks for it).
            if deadline.passed() and reached:
                _not_reached(s, reached, d)
                break
            reached.add(job.id)
        if hold:
            # What the aged job before this one needs stays charged to its tenant for the rest
            # of the pass, so its tenant's later jobs cannot take the quota it will start on
            # (they could, and a 64-GPU job near its tenant's limit never started).
            _hold_quota(s, *hold.pop(), claimed)
        if job.held:
            d.pending[job.id] = PendingReason("held", "held: released by its owner or an operator")
            continue
        if job.not_before > now:
            d.pending[job.id] = PendingReason(
                "backoff", f"backoff: retrying in {_minutes(job.not_before - now)}", job.not_before
            )
            continue
        geo = s.geo(job)
        static = s._static_check(job, geo)
        if static is not None:
            if static[0] == "reject" or cfg.reject_over_capacity:
                d.rejections[job.id] = static[1]
                s.pending.pop(job.id, None)
            else:
                d.pending[job.id] = PendingReason("capacity", static[1])
            continue
        if starts >= cfg.max_starts_per_pass:
            d.pending[job.id] = PendingReason(
                "priority",
                f"priority: this pass started its limit of {cfg.max_starts_per_pass} jobs; next pass",
            )
            continue
        rows = _rows(s, job, geo)
        holder = next((held_rows[r] for r in rows if r in held_rows), None)
        if holder is not None and rows and all(r in held_rows for r in rows):
            d.pending[job.id] = PendingReason(
                "quota", f"quota: {job.tenant}'s quota is held for its job {holder}, which has waited longest"
            )
            continue
        runtime = s.history.predict(job)
        node_ok = None
        who = _removable(s, job)
        if res.items:

            def node_ok(i: int, runtime=runtime, jid=job.id, who=who) -> bool:
                return res.allows(i, now, runtime, jid, *who)

        allocs = refusal = None
        if s.clear_racks and not job.preemptible and geo.req.count:
            # non-preemptible work goes off the racks kept clear for rack gangs if it fits there
            allocs, refusal = s._try_place(job, geo, _off_clear(s, node_ok))
        if not allocs and refusal is None:
            allocs, refusal = s._try_place(
                job, geo, node_ok, token=(len(res.items), runtime, job.id if job.id in s.room else None, who)
            )
        if allocs:
            wait = wait_for_preferred(s, job, geo, allocs, now)  # gamma: a better model soon?
            if wait is not None:
                d.pending[job.id] = wait
                continue
            s._bind(job, geo, allocs, now, d)
            starts += 1
            continue
        if refusal is not None:
            left = cfg.max_preemptions_per_pass - len(d.preemptions)
            own = s.quota_victims(job, geo, left) if cfg.preemption and left > 0 else None
            if own is not None:
                # The room being freed is this job's: later jobs of its tenant see it as used
                # (a second waiting job makes its own room) and may not grow the row meanwhile.
                m = s.quota_room_model
                if m is not None:
                    s.quotas.add(job.tenant, m, geo.charge * geo.need, job.preemptible)
                    claimed.append((job.tenant, m, geo.charge * geo.need, job.preemptible))
                    s.quota_token = (*s.quota_token, job.id)
                    s.quotas.frozen.setdefault(s.quotas._row_key(job.tenant, m), job.id)
                for v in own:
                    s.running[v.job_id].terminating = True
                    d.preemptions.append(
                        Preemption(v.job_id, f"quota: {job.tenant} needs the room for job {job.id}", job.id)
                    )
                d.pending[job.id] = PendingReason(
                    "reserved",
                    f"reserved: preempting {len(own)} of {job.tenant}'s own jobs to "
                    "make quota room; starts when they exit"
                    if own
                    else f"reserved: waiting for {job.tenant}'s terminating jobs to exit",
                    now + max((s.running[v.job_id].job.grace_s for v in own), default=0.0),
                )
                continue
            quota_blocked.append((job, geo))  # worded at the end, on the final usage
            if queues.is_aged(job, now, cfg):  # its tenant's later jobs must not overtake it
                for r in rows:
                    held_rows.setdefault(r, job.id)
                # and its nodes keep draining while its quota frees, so it starts once both have
                if cfg.backfill and len(res.items) < cfg.max_reservations:
                    r = s.reserve_for(job, geo, res, now)
                    if r is not None:
                        res.add(r)
            continue
        if s.quotas.enabled and geo.req.count and queues.is_aged(job, now, cfg):
            hold.append((job, geo))
        if node_ok is not None:  # does it fit without the reservations? then they hold it back
            probe, _ = s._try_place(job, geo, None)
            if probe:
                for a in probe:
                    s.state.release_replica(job.id, a)
                owner = next((r for r in res.items), None)
                d.pending[job.id] = PendingReason(
                    "reserved",
                    f"reserved: the free room is held for job {owner.job_id}, expected to start "
                    f"in {_minutes(owner.start - now)}"
                    if owner
                    else "reserved",
                )
                if cfg.level_of(job.kind) not in cfg.preemptor_levels:
                    continue
                # a job that may preempt (inference) makes its room off the reserved nodes
        # 4. shrink elastic jobs, else preempt, else reserve
        budget = attempts < cfg.max_preemption_attempts and len(d.preemptions) < cfg.max_preemptions_per_pass
        if geo.req.count and cfg.preemption and budget:
            if cfg.resizes and _shrink_for(s, job, geo, now, d):
                continue
            if hypo is None:
                hypo = s.new_hypo()
            plan = None
            fail_key = (
                geo,
                job.accelerators,
                job.node_selector,
                job.tolerations,
                job.topology,
                queues.rank(job, cfg),
                queues.is_aged(job, now, cfg),
                job.tenant,
                len(res.items),
                runtime,
            )
            victims = s.victims(job, geo, now) if fail_key not in s._preempt_fail else {}
            if victims or (hypo.terminating and fail_key not in s._preempt_fail):
                attempts += 1
                from .placement import Constraints

                models, _ranked = s._models_for(job)
                c = Constraints(models, job.node_selector, job.tolerations, True)
                plan = _plan(s, hypo, job, geo, c, victims, node_ok)
                if plan is None:
                    s._preempt_fail.add(fail_key)
            if plan is not None:
                may_rank = cfg.level_of(job.kind) in cfg.preemptor_levels
                for v in plan:
                    s.running[v.job_id].terminating = True
                    d.preemptions.append(Preemption(v.job_id, _why(s, job, v.job_id, may_rank, now), job.id))
                waiting = f"preempting {len(plan)} job(s)" if plan else "waiting for terminating jobs"
                grace = max((s.running[v.job_id].job.grace_s for v in plan), default=0.0)
                if plan and hypo.last_nodes:
                    s.room[job.id] = (hypo.last_nodes, now + grace + cfg.room_hold_s)
                    res.add(Reservation(job.id, hypo.last_nodes, now))
                d.pending[job.id] = PendingReason(
                    "reserved",
                    f"reserved: {waiting} to make room; starts when they exit",
                    now + grace if plan else None,
                )
                continue
        aged = queues.is_aged(job, now, cfg)
        if cfg.backfill and len(res.items) < cfg.max_reservations and (aged or not blocked_seen):
            blocked_seen = True
            r = s.reserve_for(job, geo, res, now)
            if r is not None:
                res.add(r)
                d.pending[job.id] = PendingReason(
                    "reserved",
                    f"reserved: {len(r.nodes)} node(s) held for it, expected to start "
                    f"in {_minutes(r.start - now)}",
                    r.start,
                )
                continue
        to_diagnose.append((job, geo))
    if cfg.resizes:
        _grow(s, now, d, res)
    s.last_reservations = list(res.items)
    held = {r.job_id for r in res.items}
    for jid in [j for j in s.sticky if j not in held]:
        del s.sticky[jid]
    for job, geo in quota_blocked:
        refusal = s.quota_refusal(job, geo)
        if refusal is not None:
            d.pending[job.id] = PendingReason(*refusal)
        else:
            to_diagnose.append((job, geo))
    for tenant, m, milli, preemptible in claimed:  # worded above with the claims; give back
        s.quotas.add(tenant, m, -milli, preemptible)
    s.quotas.frozen = {}
    cache: dict = {}
    summaries: dict = {}
    quota_cache: dict = {}
    for job, geo in to_diagnose:
        qkey = (
            geo,
            job.accelerators,
            job.node_selector,
            job.tolerations,
            job.topology,
            job.tenant,
            job.preemptible,
        )
        if qkey not in quota_cache:
            quota_cache[qkey] = _quota_instead(s, job, geo)
        if quota_cache[qkey] is not None:  # room exists, on a model its quota refuses it
            d.pending[job.id] = quota_cache[qkey]
            continue
        key = (geo, job.accelerators, job.node_selector, job.tolerations, job.topology)
        reason = cache.get(key)
        if reason is None:
            reason = cache[key] = diagnose_job(s, job, geo, summaries)
        d.pending[job.id] = reason
    del placements_of
    s.last_codes = {jid: r.code for jid, r in d.pending.items()}
    return d


def _in_turn(s: TesseraScheduler, now: float, cfg, deadline: Deadline | None):
    """Queue order; with a deadline that names the jobs the last pass did not reach, those
    first (in queue order), then the others (in queue order)."""
    jobs = list(s.pending.values())
    first = deadline.first if deadline is not None else frozenset()
    if not first:
        yield from queues.order(jobs, now, cfg, s.quotas)
        return
    yield from queues.order([j for j in jobs if j.id in first], now, cfg, s.quotas)
    yield from queues.order([j for j in jobs if j.id not in first], now, cfg, s.quotas)


def _not_reached(s: TesseraScheduler, reached: set[str], d: Decisions) -> None:
    """The pending jobs the pass did not reach before its deadline: each told so."""
    why = PendingReason(
        "priority",
        "priority: the scheduling pass ran out of time before reaching it; the next pass decides it first",
    )
    for jid in s.pending:
        if jid not in reached:
            d.pending[jid] = why
            d.not_reached.append(jid)


def _why(s: TesseraScheduler, job, victim: str, may_rank: bool, now: float) -> str:
    """The reason a victim is given: which of the preemption rules chose it."""
    if may_rank and queues.rank(s.running[victim].job, s.config) > queues.rank(job, s.config):
        return f"priority: for job {job.id}"
    if s.starving(job, now):
        return (
            f"seniority: job {job.id} has waited {(now - job.submitted_at) / 3600:.0f} h (starvation bound)"
        )
    return f"reclaim: {job.tenant} needs its guarantee"


def _quota_instead(s: TesseraScheduler, job, geo) -> PendingReason | None:
    """The quota reason of a job that would fit now on a model its quota refuses (else None):
    the honest answer there is the quota, not the capacity of the models it may use."""
    if not s.quotas.enabled or not geo.req.count:
        return None
    from .placement import Constraints
    from .topology import place_gang

    models, _ = s._models_for(job)
    for m in models:
        why = s._refusal(job, m, geo.charge * geo.need)
        if why is None:
            continue
        c = Constraints((m,), job.node_selector, job.tolerations, True)
        got = place_gang(s.placer, job.id, geo.req, geo.need, geo.need, job.topology, c, None, 0)
        if got:
            for a in got:
                s.state.release_replica(job.id, a)
            return PendingReason(*why)
    return None


def _hold_quota(s: TesseraScheduler, job, geo, claimed: list) -> None:
    """Charge ``job``'s need to its tenant on each model its quota admits it now (undone at the
    end of the pass, with the other claims)."""
    if job.id not in s.pending:
        return  # it started after all (shrinking made room)
    need = geo.charge * geo.need
    models, _ = s._models_for(job)
    for m in models:
        if s.quotas.row(job.tenant, m) is not None and s._admits(job, m, need):
            s.quotas.add(job.tenant, m, need, job.preemptible)
            claimed.append((job.tenant, m, need, job.preemptible))
            s.quota_token = (*s.quota_token, job.id)  # placements failed before it may not now


def _off_clear(s: TesseraScheduler, node_ok):
    """``node_ok`` narrowed to the nodes off the racks kept clear for rack gangs."""

    def ok(i: int) -> bool:
        return s.nodes[i].rack not in s.clear_racks and (node_ok is None or node_ok(i))

    return ok


def _removable(s: TesseraScheduler, job) -> tuple[int | None, bool]:
    """For the backfill rule on a starving job's nodes: the kind level at and above which a
    starving job could preempt ``job`` (None: not preemptible), and whether its runtime is a
    hard time limit."""
    return (s.config.level_of(job.kind) if job.preemptible else None), bool(job.time_limit_s)


def _rows(s: TesseraScheduler, job, geo) -> list[tuple[str, str]]:
    """The quota rows (tenant, row model) a GPU job could be charged to."""
    if not s.quotas.enabled or not geo.req.count:
        return []
    models, _ = s._models_for(job)
    return sorted({s.quotas._row_key(job.tenant, m) for m in models})


def _plan(s: TesseraScheduler, hypo, job, geo, c, victims, node_ok):
    """Victims that make room for ``job`` where its topology allows, off the nodes reserved
    for other jobs — this pass's (``node_ok``) and last pass's, so that even a job ahead of a
    reserved one in the queue makes its room elsewhere: a preemption never delays a
    reservation."""
    from .preemption import choose_victims

    prev = s.prev_reserved

    def allowed(i: int) -> bool:
        return prev.get(i, job.id) == job.id and (node_ok is None or node_ok(i))

    def gone(jid: str) -> bool:
        run = s.running.get(jid)
        return run is None or run.terminating

    ok = allowed if prev or node_ok is not None else None
    urgent = not job.preemptible  # a service: its start waits on its slowest victim's exit
    if s.clear_racks and not job.preemptible:  # off the racks kept clear, if room is there
        plan = choose_victims(
            s.placer, hypo, geo.req, geo.need, c, victims, gone, job.topology, _off_clear(s, ok), urgent
        )
        if plan is not None:
            return plan
    return choose_victims(s.placer, hypo, geo.req, geo.need, c, victims, gone, job.topology, ok, urgent)


def _shrink_for(s: TesseraScheduler, job, geo, now: float, d: Decisions) -> bool:
    """Shrink elastic jobs behind ``job`` (or borrowing) if that alone lets it start."""
    from .policy import placements_of

    elastic = [
        jid
        for _r, jid, run, _v, _m in s._elastic
        if not run.terminating and len(s.state.allocs.get(jid, ())) > run.geo.need
    ]
    if not elastic:
        return False
    eligible = {v.job_id for vs in s.victims(job, geo, now).values() for v in vs}
    shrunk: list[tuple[str, object]] = []
    for jid in sorted(j for j in elastic if j in eligible):
        run = s.running[jid]
        allocs = sorted(s.state.allocs.get(jid, ()), key=lambda a: -a.replica)
        for a in allocs[: max(0, len(allocs) - run.geo.need)]:
            s.state.release_replica(jid, a)
            shrunk.append((jid, a))
    if not shrunk:
        return False
    allocs, _ = s._try_place(job, geo, None)
    if not allocs:
        for jid, a in reversed(shrunk):
            s.state.take(jid, a.node, a.gpus, a.milli, a.cpu, a.mem, a.replica)
        return False
    # keep every shrink made (they are cheap to undo by growing later); the victims changed
    s._victim_memo.clear()
    for jid in dict.fromkeys(j for j, _ in shrunk):
        run = s.running[jid]
        left = s.state.allocs.get(jid, [])
        removed = len([1 for j, _ in shrunk if j == jid])
        for _ in range(removed):
            model, milli = run.charged.pop()
            s.quotas.add(run.job.tenant, model, -milli, run.job.preemptible)
        d.resizes.append(Resize(jid, placements_of(left, s.state)))
    s._bind(job, geo, allocs, now, d)
    return True


def _grow(s: TesseraScheduler, now: float, d: Decisions, res: Reservations) -> None:
    """Step 5: elastic jobs and partially started gangs take more replicas if room is left."""
    from .policy import placements_of

    for jid in sorted(s.running):
        run = s.running[jid]
        if run.terminating or run.cancelled:
            continue
        have = s.state.allocs.get(jid, [])
        if len(have) >= run.geo.replicas or not have:
            continue
        runtime = s.history.predict(run.job)
        used = {a.replica for a in have}
        nxt = max(used) + 1

        topo = run.job.topology
        if topo == "nvlink":
            more = _grow_in_island(
                s, run, have, nxt, res.allows(have[0].node, now, runtime, "", *_removable(s, run.job))
            )
            if more:
                d.resizes.append(Resize(jid, placements_of(s.state.allocs[jid], s.state)))
            continue
        home_nodes = {a.node for a in have}
        home_racks = {s.state.nodes[a.node].spec.rack for a in have}

        who = _removable(s, run.job)

        def node_ok(
            i: int, runtime=runtime, topo=topo, home_nodes=home_nodes, home_racks=home_racks, who=who
        ) -> bool:
            if topo == "node" and i not in home_nodes:
                return False
            if topo == "rack" and s.state.nodes[i].spec.rack not in home_racks:
                return False
            return res.allows(i, now, runtime, "", *who)

        more, _ = s._try_place(
            replace(run.job, topology="any"), run.geo, node_ok, nxt, top=run.geo.replicas - len(have), need=1
        )
        if not more:
            continue
        for a in more:
            s._charge(run, s.nodes[a.node].model, run.geo.charge if a.gpus else 0)
        d.resizes.append(Resize(jid, placements_of(s.state.allocs[jid], s.state)))


def _grow_in_island(s: TesseraScheduler, run, have: list, first_replica: int, allowed: bool) -> list:
    """Grow an ``nvlink`` job with whole free GPUs of the island it runs in (never another
    island, never another node), as many replicas as fit there, its quota admits and the
    reservations allow (``allowed``: the node is not held for another job)."""
    req = run.geo.req
    node = have[0].node
    if not allowed or req.count == 0 or req.milli < MILLI or any(a.node != node or not a.gpus for a in have):
        return []
    n = s.state.nodes[node]
    size = n.islands[0].size
    base = have[0].gpus[0] // size * size
    if any(g // size * size != base for a in have for g in a.gpus):
        return []  # not in one island (adopted from elsewhere): nothing to grow into
    free = [g for g in range(base, min(base + size, len(n.free))) if n.free[g] >= MILLI]
    k = min(run.geo.replicas - len(have), len(free) // req.count)
    if req.cpu:
        k = min(k, n.cpu // req.cpu)
    if req.mem:
        k = min(k, n.mem // req.mem)
    model = s.nodes[node].model
    while k > 0 and not s._admits(run.job, model, run.geo.charge * k):
        k -= 1
    out = []
    for r in range(max(0, k)):
        out.append(
            s.state.take(
                run.job.id,
                node,
                free[r * req.count : (r + 1) * req.count],
                req.milli,
                req.cpu,
                req.mem,
                first_replica + r,
            )
        )
        s._charge(run, model, run.geo.charge)
    return out

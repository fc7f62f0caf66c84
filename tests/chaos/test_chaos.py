"""Chaos, bounded: 200 jobs flow through while processes die; nothing is lost, nothing doubled.

Real PostgreSQL (the test database), and real processes this test starts and always stops:
daphne, a Celery worker, Celery beat (a safety pass every second), three simulated agents, and a
Redis server of its own on a free port (so restarting it touches no one else's Redis). While a
client submits 200 jobs over HTTP (each with an Idempotency-Key, retried until answered), at
seeded random moments (``TESSERA_CHAOS_SEED``; the plan is printed) it:

- SIGKILLs the worker twice (a pass may die mid-way: the advisory lock dies with its connection);
- SIGKILLs one agent once (its jobs die with it; the restarted agent re-registers);
- SIGKILLs the web process once (a submit may die mid-way: the client retries with the same key);
- stops and restarts Redis once (triggers, queued tasks and live updates are lost; PostgreSQL
  keeps the truth and beat's safety pass carries on);

restarting each. At the end every submission maps to exactly one job, every job is in exactly one
terminal state, nothing holds a GPU, and ``export_trace`` judged by the simulator's checker finds
no GPU bound to two jobs and every invariant holding.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support import (
    Processes,
    RedisServer,
    agent_argv,
    agent_env,
    beat_argv,
    database_url_of,
    free_port,
    stack_env,
    wait_until,
    web_answers,
    web_argv,
    worker_argv,
)

SEED = int(os.environ.get("TESSERA_CHAOS_SEED", "20261129"))
JOBS = 200
SUBMIT_SPAN_S = 40.0  # the client spreads its submissions over this
CHAOS_WINDOW = (6.0, 40.0)  # the kills fall in here (seconds after the first submission)
FINISH_DEADLINE_S = 110.0  # after the last submission, every job must have ended by then
AGENTS = 3
TERMINAL = ("succeeded", "failed", "cancelled")

# The issue bounds it at 3 minutes, set-up included: a slower run fails rather than passes late.
pytestmark = [
    pytest.mark.services,
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.postgresql("web, workers and agents are separate processes sharing one database"),
    pytest.mark.redis("a Redis restart is one of the faults"),
]


def chaos_plan(rng: random.Random) -> list[tuple[float, str]]:
    """(seconds after the start, action): the moments, drawn from the seed, in time order."""
    actions = ["kill worker", "kill worker", "kill agent", "kill web", "restart redis"]
    lo, hi = CHAOS_WINDOW
    # Spread them out (one per slice, jittered) so each restart settles before the next blow.
    width = (hi - lo) / len(actions)
    rng.shuffle(actions)
    return [(round(lo + i * width + rng.uniform(0.2, width - 1.5), 2), a) for i, a in enumerate(actions)]


def job_body(i: int, rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    body: dict[str, Any] = {
        "name": f"chaos-{i:03d}",
        "kind": "batch",
        "command": ["sleep", str(rng.choice([0.2, 0.5, 1, 2, 4]))],
    }
    if roll < 0.5:
        body["gpus"] = 1
    elif roll < 0.7:
        body["gpus"] = 0.5
    elif roll < 0.85:
        body.update(gpus=2, replicas=2)
    elif roll < 0.95:
        body.update(gpus=1, command=["sh", "-c", "sleep 0.3; exit 3"], max_retries=1)
    else:
        body.update(gpus=4, topology="node")
    if rng.random() < 0.3:
        body["max_retries"] = 2
    return body


class Submitter(threading.Thread):
    """Sends the 200 jobs over ``SUBMIT_SPAN_S``; retries each (same key) until it is answered."""

    def __init__(self, base: str, tokens: dict[str, str], bodies: list[dict[str, Any]]):
        super().__init__(daemon=True)
        self.base, self.tokens, self.bodies = base, tokens, bodies
        self.ids: dict[int, int] = {}
        self.retries = 0
        self.errors: list[str] = []
        self.started_at = time.monotonic()

    def run(self) -> None:
        session = requests.Session()
        session.trust_env = False
        for i, body in enumerate(self.bodies):
            time.sleep(max(0.0, self.started_at + i * SUBMIT_SPAN_S / len(self.bodies) - time.monotonic()))
            who = "alice" if i % 2 else "bob"
            headers = {"Authorization": f"Token {self.tokens[who]}", "Idempotency-Key": f"chaos-{i}"}
            deadline = time.monotonic() + 60
            while True:
                try:
                    r = session.post(self.base + "/api/v1/jobs/", json=body, headers=headers, timeout=10)
                    if r.status_code in (200, 201):
                        self.ids[i] = r.json()["id"]
                        break
                    if r.status_code < 500:
                        self.errors.append(f"job {i}: HTTP {r.status_code} {r.text[:200]}")
                        break
                except requests.RequestException:
                    pass
                self.retries += 1
                if time.monotonic() > deadline:
                    self.errors.append(f"job {i}: no answer within 60 s")
                    break
                time.sleep(0.3)


@pytest.fixture
def chaos_stack(require_postgres, redis_url, transactional_db, world, settings):
    from scheduling.services.agents import do_create_join_token

    if not shutil.which("redis-server"):
        pytest.fail("redis-server is needed for the chaos test's own Redis")
    _, join_token = do_create_join_token("chaos")
    work = Path(tempfile.mkdtemp(prefix="tessera-chaos-", dir="/tmp"))
    work.chmod(0o711)
    redis = RedisServer(work)
    redis.start()
    port = free_port()
    env = stack_env(
        database_url_of(settings),
        f"redis://127.0.0.1:{redis.port}/0",
        TESSERA_PASS_INTERVAL_S="1",  # beat's safety pass: what carries on when triggers are lost
        TESSERA_HEARTBEAT_TIMEOUT_S="5",
        TESSERA_LEASE_S="10",
        TESSERA_RETRY_BACKOFF_S="0.5",
    )
    procs = Processes(work)
    base = f"http://127.0.0.1:{port}"
    argv = {
        "worker": worker_argv("chaos"),
        "beat": beat_argv(work / "celerybeat-schedule"),
        "web": web_argv(port=port),
    }
    agents_env = agent_env(env, join_token)
    for n in range(AGENTS):
        argv[f"agent{n}"] = agent_argv(
            base,
            f"chaos-{n}",
            f"8xA100,nvlink=4,rack=r{n}",
            work / f"agent{n}",
            "--poll-interval",
            "1",
            "--shutdown-grace",
            "1",
        )
    try:
        for name in ("worker", "beat", "web"):
            procs.start(name, argv[name], env)
        deadline = time.monotonic() + 60
        wait_until("the worker", lambda: " ready." in procs.output("worker"), procs, deadline)
        wait_until("the web server", lambda: web_answers(base), procs, deadline)
        for n in range(AGENTS):
            procs.start(f"agent{n}", argv[f"agent{n}"], agents_env)
        yield {
            "base": base,
            "procs": procs,
            "argv": argv,
            "env": env,
            "agent_env": agents_env,
            "redis": redis,
            "work": work,
        }
    finally:
        procs.stop_all()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


def _blow(action: str, stack: dict[str, Any], rng: random.Random, log: list[str]) -> None:
    procs: Processes = stack["procs"]
    if action == "restart redis":
        stack["redis"].stop()
        time.sleep(1.0)
        stack["redis"].start()
        log.append("redis stopped and started again")
        return
    name = action.split()[1]
    if name == "agent":
        name = f"agent{rng.randrange(AGENTS)}"
    proc = procs.children[name]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    time.sleep(0.5)
    env = stack["agent_env"] if name.startswith("agent") else stack["env"]
    # A new log file each time, so the check for a dead child sees only the current one.
    procs.start(name, stack["argv"][name], env)
    log.append(f"{name} SIGKILLed and restarted")


def test_jobs_survive_killed_workers_agents_web_and_a_redis_restart(chaos_stack, world):
    from scheduling.models import Allocation, IdempotencyKey, Job, JobEvent, Node
    from scheduling.services.export import export_trace
    from scheduling.sim.check import check
    from scheduling.sim.events import read_events
    from scheduling.sim.traces import read_jobs, read_nodes, read_quotas

    procs, base = chaos_stack["procs"], chaos_stack["base"]
    rng = random.Random(SEED)
    plan = chaos_plan(rng)
    bodies = [job_body(i, rng) for i in range(JOBS)]
    happened: list[str] = [f"seed {SEED}, plan {plan}"]
    print(happened[0])
    wait_until(
        f"{AGENTS} agents",
        lambda: Node.objects.filter(devices__isnull=False).distinct().count() == AGENTS,
        procs,
        time.monotonic() + 60,
    )

    submitter = Submitter(base, world.tokens, bodies)
    submitter.start()
    for at, action in plan:
        time.sleep(max(0.0, submitter.started_at + at - time.monotonic()))
        _blow(action, chaos_stack, rng, happened)
        print(f"t={time.monotonic() - submitter.started_at:.1f}s {happened[-1]}")
    submitter.join(SUBMIT_SPAN_S + 90)
    assert not submitter.is_alive() and not submitter.errors, (submitter.errors, happened)
    assert len(submitter.ids) == JOBS

    deadline = time.monotonic() + FINISH_DEADLINE_S
    ids = sorted(submitter.ids.values())

    def all_ended() -> bool:
        return not Job.objects.filter(pk__in=ids).exclude(state__in=TERMINAL).exists()

    while time.monotonic() < deadline and not all_ended():
        for name, proc in list(procs.children.items()):
            assert proc.poll() is None, f"{name} died on its own:\n{procs.output(name)[-3000:]}"
        time.sleep(0.5)
    left = dict(Job.objects.filter(pk__in=ids).exclude(state__in=TERMINAL).values_list("pk", "state"))
    assert not left, f"jobs not ended: {left}\n{happened}\n{procs.report()}"

    # Every submission is exactly one job: a retried submit (the web killed under it) got the
    # first job back, never a second one; and no job was stored half (no event, no key).
    names = list(Job.objects.values_list("name", flat=True))
    assert sorted(names) == sorted(b["name"] for b in bodies)
    assert len(set(submitter.ids.values())) == JOBS
    assert IdempotencyKey.objects.count() == JOBS
    assert JobEvent.objects.filter(type="submitted").count() == JOBS
    # Nothing holds a GPU any more, and no attempt was bound twice (a pass killed mid-way).
    assert not Allocation.objects.filter(released_at__isnull=True).exists()
    for job in Job.objects.all():
        scheduled = job.events.filter(type="scheduled").count()
        assert scheduled <= job.attempts + 1, (job.pk, scheduled, job.attempts)
        assert job.allocations.values("attempt").distinct().count() == scheduled
    assert_no_device_was_over_committed(Allocation)
    states = {s: Job.objects.filter(state=s).count() for s in TERMINAL}
    assert states["succeeded"] > JOBS // 2, states  # the chaos did not just fail everything

    out = chaos_stack["work"] / "trace"
    export_trace(out)
    report = check(
        read_nodes(out / "nodes.csv"),
        read_jobs(out / "jobs.csv"),
        read_events(out / "events.jsonl"),
        read_quotas(out / "quotas.csv"),
    )
    assert report.ok, (report.violations[:20], happened)
    print(f"chaos: {states}, {submitter.retries} client retries; {happened}")


def assert_no_device_was_over_committed(allocation_model) -> None:
    """From the database's own rows: at no instant did a GPU's held shares exceed one GPU."""
    changes: dict[int, list[tuple[float, int]]] = {}
    for device_id, share, created, released in allocation_model.objects.filter(
        device__isnull=False
    ).values_list("device_id", "share_milli", "created_at", "released_at"):
        changes.setdefault(device_id, []).append((created.timestamp(), share))
        changes.setdefault(device_id, []).append((released.timestamp(), -share))
    for device_id, steps in changes.items():
        held = 0
        for _, delta in sorted(steps, key=lambda s: (s[0], s[1])):  # a release before a bind
            held += delta
            assert held <= 1000, f"device {device_id} held {held / 1000:g} GPUs at once"

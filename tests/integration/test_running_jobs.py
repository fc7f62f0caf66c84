"""Running jobs that change, end to end with real agents: a lost node, checkpoints, rendezvous,
live resizes.

Real PostgreSQL (the test database), real Redis, and real processes: daphne, a Celery worker and
Celery beat (the node-health sweep and the safety pass), which this module's tests share, and two
simulated agents, ``e2e-a`` and ``e2e-b``, each with 2 A100s, which each test starts and stops
(the rendezvous test's two, ``gang-a`` and ``gang-b``, run each in a network namespace of its own).
The leases are short (3 s, a 1 s fencing margin) so that a lost node's jobs are requeued within
seconds. Jobs are alice's, submitted over HTTP, as a user submits them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests import netns
from tests.support import (
    Processes,
    SharedServers,
    agent_argv,
    agent_env,
    database_url_of,
    need_service,
    stack_env,
    wait_until,
    web_answers,
    web_argv,
)

DEADLINE_S = 75
TERMINAL = ("succeeded", "failed", "cancelled")

pytestmark = [
    pytest.mark.services,
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.postgresql("web, Celery worker, beat and agents are separate processes sharing one database"),
    pytest.mark.redis("the Celery broker and the channel layer between the processes"),
]


class Stack:
    def __init__(self, base: str, procs: Processes, work: Path, env: dict[str, str], token: str, alice):
        self.base, self.procs, self.work, self.env, self.token = base, procs, work, env, token
        self.alice = alice
        self.deadline = time.monotonic() + DEADLINE_S

    def start_agent(self, name: str, *extra: str) -> None:
        spec = f"2xA100,nvlink=2,rack=r1,labels=host:{name}"
        argv = agent_argv(
            self.base,
            name,
            spec,
            self.work / name,
            "--poll-interval",
            "0.3",
            "--checkpoint-root",
            str(self.work / "shared"),
            *extra,
        )
        self.procs.start(name, argv, agent_env(self.env, self.token))

    def kill(self, name: str) -> None:
        """SIGKILL a process of the stack (and its group), as a machine that dies."""
        proc = self.procs.children.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def wait(self, what: str, check) -> Any:
        return wait_until(what, check, self.procs, self.deadline)

    def submit(self, **body: Any) -> int:
        answer = self.alice.post(self.base + "/api/v1/jobs/", json=body, timeout=10)
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def job(self, job_id: int) -> dict[str, Any]:
        return self.alice.get(f"{self.base}/api/v1/jobs/{job_id}/", timeout=10).json()

    def events(self, job_id: int) -> list[dict[str, Any]]:
        events = self.alice.get(f"{self.base}/api/v1/jobs/{job_id}/events/", timeout=10).json()
        return events["results"] if isinstance(events, dict) else events

    def logs(self, job_id: int, replica: int = 0) -> str:
        url = f"{self.base}/api/v1/jobs/{job_id}/logs/?replica={replica}"
        return self.alice.get(url, timeout=10).json()["data"]

    def finished(self, job_id: int) -> dict[str, Any]:
        return self.wait(f"job {job_id} to end", lambda: (j := self.job(job_id))["state"] in TERMINAL and j)

    def running_on(self, job_id: int) -> str:
        def where() -> str | None:
            job = self.job(job_id)
            return job["allocations"][0]["node"] if job["state"] == "running" else None

        return self.wait(f"job {job_id} to run", where)


@pytest.fixture(scope="module")
def servers(django_db_setup, django_db_blocker) -> Iterator[SharedServers]:
    """daphne, a Celery worker and beat with short leases, shared by this module's tests (each
    starts its own agents on the rows it made)."""
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        need_service("PostgreSQL (set DATABASE_URL): web, worker, beat and agents share one database")
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url:
        need_service("Redis (set REDIS_URL): the Celery broker and the channel layer")
    work = Path(tempfile.mkdtemp(prefix="tessera-running-", dir="/tmp"))
    work.chmod(0o711)  # the job user must reach the agents' job directories below it
    env = stack_env(
        database_url_of(settings),
        redis_url,
        TESSERA_REDIS_BROKER_DB=str(8 + os.getpid() % 8),
        TESSERA_LEASE_S="3",
        TESSERA_FENCE_MARGIN_S="1",
        TESSERA_HEARTBEAT_TIMEOUT_S="2",
        TESSERA_PASS_INTERVAL_S="2",
        TESSERA_ENGINE_PREEMPT_MIN_RUN_S="0",
    )
    shared = None
    try:
        shared = SharedServers(work, env, "running", beat=True, timeout=DEADLINE_S)
        yield shared
    finally:
        if shared is not None:
            shared.procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def stack(servers, require_postgres, redis_url, transactional_db, world) -> Iterator[Stack]:
    from scheduling.services import redis_flags
    from scheduling.services.agents import do_create_join_token
    from scheduling.services.triggers import QUEUED_FLAG

    _, join_token = do_create_join_token("e2e", max_nodes=None)
    work = Path(tempfile.mkdtemp(prefix="test-", dir=servers.work))
    work.chmod(0o711)
    (work / "shared").mkdir(mode=0o711)  # the checkpoint root both agents mount (as over NFS)
    alice = requests.Session()
    alice.headers["Authorization"] = f"Token {world.tokens['alice']}"
    s = Stack(servers.base, servers.procs, work, servers.env, join_token, alice)
    # A "pass already queued" flag an earlier test left would swallow this test's triggers.
    redis_flags.client().delete(redis_flags.key(QUEUED_FLAG))
    try:
        for name in ("e2e-a", "e2e-b"):
            s.start_agent(name)
        s.wait("both agents to register", lambda: _registered("e2e-a", "e2e-b"))
        yield s
    finally:
        for name in ("e2e-a", "e2e-b"):
            if name in servers.procs.children:
                servers.procs.stop(name)


def _registered(*names: str) -> bool:
    from scheduling.models import Node

    return Node.objects.filter(name__in=names, devices__isnull=False).distinct().count() == len(names)


def test_a_job_without_retries_whose_node_dies_is_requeued_and_succeeds_elsewhere(stack):
    # The first attempt sleeps until its node dies; the next one ends at once.
    command = ["python", "-c", "import os, time; int(os.environ['TESSERA_ATTEMPT']) or time.sleep(300)"]
    job_id = stack.submit(name="outlives-its-node", kind="training", command=command, gpus=2, max_retries=0)
    first = stack.running_on(job_id)
    stack.kill(first)  # the node dies, its job with it

    job = stack.finished(job_id)
    assert job["state"] == "succeeded", f"{job}\n{stack.procs.report()}"
    assert job["attempts"] == 1 and job["node_losses"] == 1
    (other,) = {"e2e-a", "e2e-b"} - {first}
    assert job["allocations"] == [] and job["placements"][-1]["allocations"][0]["node"] == other
    types = [(e["type"], e["reason"]) for e in stack.events(job_id)]
    assert ("requeued", "node-lost") in types and not any(t == "retrying" for t, _ in types), types
    assert types[-1] == ("succeeded", None)


TRAINER = """
import os, signal, sys, time
state = os.path.join(os.environ["TESSERA_CHECKPOINT_DIR"], "step")
marker = os.environ["TESSERA_CHECKPOINT_MARKER"]
step = int(open(state).read()) if os.path.exists(state) else 0
print(f"resumed at step {step}", flush=True)
asked = False
def save():
    with open(state + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(state + ".tmp", state)  # durable first, then the marker line
    with open(marker, "a") as f:
        f.write(f"step {step}\\n")
def ask(*_):
    global asked
    asked = True
def term(*_):
    print(f"stopped at step {step}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGUSR1, ask)
signal.signal(signal.SIGTERM, term)
while step < 60:
    time.sleep(0.2)
    step += 1
    if step % 10 == 0 or asked:
        save()
    while asked:  # checkpointed because a stop is coming: wait for it, doing no work to lose
        time.sleep(0.05)
print("done", flush=True)
"""


def test_a_preempted_job_resumes_on_another_node_from_its_last_checkpoint_losing_nothing(stack):
    # Node b is busy for a while; the trainer starts on node a and checkpoints every 10 steps.
    filler = ["python", "-c", "import time; time.sleep(14)"]
    filler_id = stack.submit(
        name="filler",
        kind="batch",
        command=filler,
        gpus=2,
        preemptible=False,
        node_selector={"host": "e2e-b"},
    )
    stack.wait("the filler to run", lambda: stack.job(filler_id)["state"] == "running")
    trainer = stack.submit(
        name="trainer", kind="training", command=["python", "-c", TRAINER], gpus=2, grace_seconds=20
    )
    first = stack.running_on(trainer)
    assert first == "e2e-a"
    stack.wait("a checkpoint report", lambda: stack.job(trainer)["last_checkpoint_at"])
    # An inference service wants node a: the trainer is preempted (asked to checkpoint first)
    server = ["python", "-c", "import time; time.sleep(120)"]
    stack.submit(name="server", kind="inference", command=server, gpus=2, node_selector={"host": "e2e-a"})

    job = stack.finished(trainer)
    assert job["state"] == "succeeded", f"{job}\n{stack.procs.report()}"
    assert [p["allocations"][0]["node"] for p in job["placements"]] == ["e2e-a", "e2e-b"]
    log = stack.logs(trainer)
    stopped = int(log.split("stopped at step ")[1].split()[0])
    resumed = int(log.split("resumed at step ")[2].split()[0])  # the second attempt's
    events = stack.events(trainer)
    preempted = next(i for i, e in enumerate(events) if e["type"] == "preempted")
    steps = [int(e["reason"].split()[1]) for e in events[:preempted] if e["type"] == "checkpointed"]
    assert steps[-1] == resumed, (steps, log)  # resumed from the last checkpoint it reported
    assert stopped == resumed, log  # checkpoint now: no work lost
    assert "checkpoint written: SIGTERM" in log, log
    types = [(e["type"], e["reason"]) for e in events]
    requeued = "from its last checkpoint if its next nodes can reach it, else from the start"
    assert ("requeued", requeued) in types and types[-1] == ("succeeded", None), types
    # The binding on node b says it reaches the checkpoint: both agents share that root.
    again = [e["reason"] for e in events if e["type"] == "scheduled"][-1]
    assert again.startswith(f"resumes from its last checkpoint (step {resumed}, at "), again
    assert again.endswith(f"): on checkpoint root '{(stack.work / 'shared').resolve()}'"), again


MEET = """
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
print(f"rank {rank} of {world}, local rank {os.environ['LOCAL_RANK']}, master {where}", flush=True)
if rank == 0:
    with socket.create_server(("", where[1])) as server:
        conn, _ = server.accept()
        print("got:", conn.recv(100).decode(), flush=True)
else:
    for _ in range(100):
        try:
            with socket.create_connection(where, timeout=2) as conn:
                conn.sendall(f"hello from rank {rank}".encode())
                break
        except OSError:
            time.sleep(0.1)
"""


@pytest.fixture
def machines(
    servers, require_postgres, redis_url, transactional_db, world
) -> Iterator[tuple[Stack, netns.Network]]:
    """Two agents, ``gang-a`` and ``gang-b``, each in a network namespace of its own with its own
    address (tests/netns.py), isolated as on a real node (a uid per job, the loopback rules), and a
    web server of the stack listening where they reach it. Fails rather than skips in CI."""
    from scheduling.services import redis_flags
    from scheduling.services.agents import do_create_join_token
    from scheduling.services.triggers import QUEUED_FLAG

    try:
        net = netns.Network.create(("gang-a", "gang-b"))
    except netns.Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs as root: network namespaces must work there: {exc}")
        pytest.skip(f"network namespaces not available: {exc}")
    names = ("web-net", "agent-gang-a", "agent-gang-b")
    try:
        with socket.create_server((net.server_address, 0)) as listener:
            env = {**servers.env, "TESSERA_ALLOWED_HOSTS": net.server_address}
            servers.procs.start("web-net", web_argv(fd=listener.fileno()), env, (listener.fileno(),))
            base = f"http://{net.server_address}:{listener.getsockname()[1]}"
        _, join_token = do_create_join_token("e2e", max_nodes=None)
        work = Path(tempfile.mkdtemp(prefix="test-", dir=servers.work))
        work.chmod(0o711)
        alice = requests.Session()
        alice.headers["Authorization"] = f"Token {world.tokens['alice']}"
        s = Stack(servers.base, servers.procs, work, servers.env, join_token, alice)
        redis_flags.client().delete(redis_flags.key(QUEUED_FLAG))
        s.wait("the web server the agents reach", lambda: web_answers(base))
        for name in ("gang-a", "gang-b"):
            spec = f"2xA100,nvlink=2,rack=r1,labels=host:{name}"
            argv = agent_argv(base, name, spec, work / name, "--poll-interval", "0.3")
            servers.procs.start(f"agent-{name}", net.argv(name, argv), agent_env(servers.env, join_token))
        s.wait("both agents to register", lambda: _registered("gang-a", "gang-b"))
        yield s, net
    finally:
        for name in names:
            if name in servers.procs.children:
                servers.procs.stop(name)
        net.close()


def test_a_two_node_gangs_replicas_exchange_a_message_through_the_rendezvous_address(machines):
    from scheduling.models import Node

    machines, net = machines
    addresses = dict(Node.objects.filter(name__in=net.addresses).values_list("name", "address"))
    assert addresses == net.addresses  # each registered its own namespace's address
    for name in net.addresses:  # the loopback rules are in place, in each namespace
        assert "jobs reach the node's loopback only for their own processes" in machines.procs.output(
            f"agent-{name}"
        ), machines.procs.report()
    job_id = machines.submit(name="meet", kind="training", command=["python", "-c", MEET], gpus=4, replicas=2)
    job = machines.finished(job_id)
    assert job["state"] == "succeeded", f"{job}\n{machines.procs.report()}"
    placed = {a["replica"]: a for a in job["placements"][0]["allocations"]}
    assert {a["node"] for a in placed.values()} == {"gang-a", "gang-b"}  # one replica a node
    first, second = machines.logs(job_id, 0), machines.logs(job_id, 1)
    assert "rank 0 of 2, local rank 0" in first and "rank 1 of 2, local rank 0" in second
    master = (net.addresses[placed[0]["node"]], 29500 + placed[0]["gpus"][0])
    assert f"master {master}" in first and f"master {master}" in second, (first, second)
    assert "got: hello from rank 1" in first, first


WORLDS = """
import json, os, sys, time, signal
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
path, seen, want = os.environ["TESSERA_WORLD_FILE"], [], [int(n) for n in sys.argv[1].split(",")]
print(f"replica {os.environ['TESSERA_REPLICA']} starts, WORLD_SIZE {os.environ['WORLD_SIZE']}", flush=True)
end = time.time() + 90
while time.time() < end:
    try:
        size = json.load(open(path))["world_size"]
    except (OSError, ValueError):
        size = None
    if size is not None and (not seen or seen[-1] != size):
        seen.append(size)
        print(f"world {size}", flush=True)
    if seen[-len(want):] == want:
        time.sleep(float(sys.argv[2]))  # the removed replicas' exits are recorded meanwhile
        sys.exit(0)
    time.sleep(0.1)
sys.exit(1)
"""


def _filler(stack: Stack, seconds: float) -> int:
    """A job on node b's two GPUs for ``seconds``, which nothing may preempt."""
    command = ["python", "-c", f"import time; time.sleep({seconds})"]
    job_id = stack.submit(
        name="filler",
        kind="batch",
        command=command,
        gpus=2,
        preemptible=False,
        node_selector={"host": "e2e-b"},
    )
    stack.wait("the filler to run", lambda: stack.job(job_id)["state"] == "running")
    return job_id


def _sizes(stack: Stack, job_id: int) -> list[tuple[str, int, int]]:
    return [
        (e["reason"].split()[0], e["details"]["from_replicas"], e["details"]["to_replicas"])
        for e in stack.events(job_id)
        if e["type"] == "resized"
    ]


def test_an_elastic_job_grows_when_capacity_frees_and_shrinks_instead_of_being_preempted(stack):
    _filler(stack, 6)
    # Four one-GPU replicas, at least two: it starts with node a's two GPUs
    command = ["python", "-c", WORLDS, "2,4,2", "4"]
    body = {"kind": "training", "command": command, "gpus": 4, "replicas": 4, "grace_seconds": 10}
    elastic = stack.submit(name="elastic", elastic={"min_gpus": 2, "max_gpus": 4}, **body)
    stack.wait("it to run", lambda: stack.job(elastic)["state"] == "running")
    assert stack.job(elastic)["size_reason"].startswith("elastic: 2 of at most 4 GPUs"), stack.job(elastic)
    # The filler ends: it grows onto node b, its running replicas told in place
    stack.wait("it to grow", lambda: ("grown", 2, 4) in _sizes(stack, elastic))
    assert stack.job(elastic)["size_reason"] == ""
    # The replicas it grew by start with the new world size (waited for: on a busy machine a
    # replica's interpreter may not have started yet when the service below takes node b back).
    for replica in (2, 3):
        stack.wait(f"replica {replica} to start", lambda r=replica: "WORLD_SIZE 4" in stack.logs(elastic, r))
    # A service wants node b: the elastic job gives its replicas there back, not its run
    server = ["python", "-c", "import time; time.sleep(120)"]
    service = stack.submit(
        name="server", kind="inference", command=server, gpus=2, node_selector={"host": "e2e-b"}
    )
    stack.wait("the service to run", lambda: stack.job(service)["state"] == "running")
    assert _sizes(stack, elastic) == [("grown", 2, 4), ("shrunk", 4, 2)], stack.events(elastic)
    job = stack.finished(elastic)
    assert job["state"] == "succeeded", f"{job}\n{stack.procs.report()}"
    assert job["attempts"] == 0  # never restarted
    events = stack.events(elastic)
    assert not any(e["type"] in ("preempted", "requeued") for e in events), events
    shrink = next(e for e in events if e["type"] == "resized" and e["reason"].startswith("shrunk"))
    assert (
        shrink["details"]["lost_work_s"] == 0
        and f"make room for job {service}" in shrink["details"]["reason"]
    )
    assert [a["replica"] for a in shrink["allocations"]] == [0, 1]
    # The service started only once the removed replicas had exited (their GPUs held until then)
    started = next(e["at"] for e in stack.events(service) if e["type"] == "scheduled")
    assert started >= shrink["at"]
    for replica in (0, 1):
        assert "world 2\nworld 4\nworld 2" in stack.logs(elastic, replica), stack.logs(elastic, replica)
    assert "WORLD_SIZE 4" in stack.logs(elastic, 3)


def test_a_gang_started_with_min_available_replicas_grows_to_full(stack):
    _filler(stack, 5)
    command = ["python", "-c", WORLDS, "4", "0"]
    gang = stack.submit(name="gang", kind="training", command=command, gpus=4, replicas=4, min_available=2)
    stack.wait("it to run", lambda: stack.job(gang)["state"] == "running")
    assert stack.job(gang)["size_reason"].startswith("2 of 4 replicas placed"), stack.job(gang)
    job = stack.finished(gang)
    assert job["state"] == "succeeded", f"{job}\n{stack.procs.report()}"
    assert _sizes(stack, gang) == [("grown", 2, 4)]
    assert {a["replica"] for a in job["placements"][0]["allocations"]} == {0, 1, 2, 3}
    assert "world 2\nworld 4" in stack.logs(gang, 0) and "WORLD_SIZE 4" in stack.logs(gang, 2)

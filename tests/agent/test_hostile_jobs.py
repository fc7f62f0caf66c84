"""Tenants' jobs on one node attack each other through a real agent (``python -m agent``, as root).

alice's job (tenant vision) keeps a secret in its files, its checkpoint and its environment, and
serves a port. bob's job (tenant nlp) and carol's (vision, alice's teammate: the agent gives every
job attempt its own uid, whoever submitted it) try what a hostile tenant would: read her files,
checkpoint and environment, overwrite or plant a checkpoint, signal her process, connect to her
server, to the agent's metrics port, to the control plane and to the node's databases (by port,
and by PostgreSQL's unix socket), and leave a ``setsid`` grandchild behind. Every attempt is
denied, each attacker is recorded succeeded only once its grandchild is dead, and alice's job ends
as it would have alone.

The lower-level tests (tests/agent/test_isolation.py) try the same against the job process alone,
with and without namespaces, and the GPU device files; tests/agent/test_cpu_only.py fills a node
with CPU-only jobs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlparse

import pytest

from agent import sandbox
from scheduling.choices import TERMINAL_STATES, JobState
from scheduling.models import Job
from tests.agent import agent_process as processes
from tests.agent import fakes
from tests.agent import helpers as h
from tests.agent.agent_process import alive

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per job needs an agent running as root"),
]

VICTIM = r"""
import json, os, pathlib, socket
ck, tmp = os.environ["TESSERA_CHECKPOINT_DIR"], os.environ["TMPDIR"]
pathlib.Path("secret.txt").write_text("alice-secret")
pathlib.Path(ck, "model.ckpt").write_text("alice-weights")
pathlib.Path(tmp, "scratch").write_text("alice-scratch")
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
server.settimeout(0.1)
print(json.dumps({"workdir": os.getcwd(), "checkpoint": ck, "tmp": tmp, "pid": os.getpid(),
                  "port": server.getsockname()[1]}), flush=True)
served = 0
while not os.path.exists("done"):
    try:
        conn, _ = server.accept()
    except TimeoutError:
        continue
    conn.sendall(b"alice")
    conn.close()
    served += 1
print(json.dumps({"checkpoint": pathlib.Path(ck, "model.ckpt").read_text(),
                  "files": sorted(os.listdir(ck)), "served": served}), flush=True)
"""

ATTACKER = r"""
import json, os, signal, socket, sys, time
victim, ports, sockets = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])

def attempt(action):
    try:
        action()
    except OSError as exc:
        return type(exc).__name__
    return "succeeded"

def write(path, text):
    with open(path, "w") as f:
        f.write(text)

def connect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
        s.recv(16)

results = {
    "list her working directory": attempt(lambda: os.listdir(victim["workdir"])),
    "read her file": attempt(lambda: open(os.path.join(victim["workdir"], "secret.txt")).read()),
    "read her temporary file": attempt(lambda: open(os.path.join(victim["tmp"], "scratch")).read()),
    "read her checkpoint": attempt(lambda: open(os.path.join(victim["checkpoint"], "model.ckpt")).read()),
    "overwrite her checkpoint": attempt(lambda: write(os.path.join(victim["checkpoint"], "model.ckpt"), "x")),
    "plant a checkpoint": attempt(lambda: write(os.path.join(victim["checkpoint"], "planted.ckpt"), "x")),
    "read her environment": attempt(lambda: open(f"/proc/{victim['pid']}/environ").read()),
    "signal her process": attempt(lambda: os.kill(victim["pid"], signal.SIGTERM)),
    "connect to her server": attempt(lambda: connect(victim["port"])),
}
for name, port in ports.items():
    results[f"connect to {name}"] = attempt(lambda port=port: connect(port))

def connect_unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(1.0)
        s.connect(path)

for path in sockets:
    results[f"connect to {path}"] = attempt(lambda path=path: connect_unix(path))
read_end, write_end = os.pipe()
if os.fork() == 0:  # the escape: a grandchild in a session of its own, left running
    os.setsid()
    grandchild = os.fork()
    if grandchild == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        time.sleep(300)
        os._exit(0)
    os.write(write_end, str(grandchild).encode())
    os._exit(0)
os.wait()
os.close(write_end)
print(json.dumps({"results": results, "grandchild": int(os.read(read_end, 32))}), flush=True)
"""


@pytest.fixture
def state_dir():
    with fakes.job_user_state_dir() as path:
        yield path


def output_of(job: Job) -> str:
    return b"".join(bytes(c.data) for c in Job.objects.get(pk=job.pk).log_chunks.all()).decode()


def state_of(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def test_jobs_of_other_tenants_and_of_the_same_tenant_cannot_reach_alices_job(live_server, world, state_dir):
    token_file = state_dir / "join-token"
    token_file.write_text(h.new_join_token())
    agent = processes.start_agent(live_server.url, state_dir, "--join-token-file", str(token_file))
    try:
        node = processes.registered(state_dir)
        secret = {"WANDB_API_KEY": "alice-api-key"}
        victim = h.bind(
            h.submit(world.alice, world.vision, command=["python", "-c", VICTIM], env=secret, gpus=1),
            "cli-node",
            [0],
        )
        assert fakes.wait_for(lambda: "\n" in output_of(victim), 30), output_of(victim)
        where = json.loads(output_of(victim).splitlines()[0])
        ports = {
            "the agent's metrics port": urlparse(node.metrics_url).port,
            "the control plane": urlparse(live_server.url).port,
            "PostgreSQL": 5432,
            "Redis": 6379,
        }
        # PostgreSQL's own socket, open to all (with "trust" for local users here: the database)
        # (hidden in the job's mount namespace: where the agent may make one, as here and in CI)
        sockets = [p for p in ("/var/run/postgresql/.s.PGSQL.5432",) if os.path.exists(p)]
        if sandbox.namespaces_unavailable() is not None:
            sockets = []
        command = ["python", "-c", ATTACKER, json.dumps(where), json.dumps(ports), json.dumps(sockets)]
        attackers = [
            h.bind(h.submit(user, tenant, command=command, gpus=1), "cli-node", [gpu])
            for user, tenant, gpu in ((world.bob, world.nlp, 1), (world.carol, world.vision, 2))
        ]
        for attacker in attackers:
            assert fakes.wait_for(lambda a=attacker: state_of(a) in TERMINAL_STATES, 60), output_of(attacker)
            assert state_of(attacker) == JobState.SUCCEEDED, output_of(attacker)
            said = json.loads(output_of(attacker).splitlines()[0])
            allowed = {attack: result for attack, result in said["results"].items() if result == "succeeded"}
            assert allowed == {}, f"job {attacker.pk} got through: {allowed}"
            assert said["results"]["signal her process"] == "PermissionError"
            grandchild = said["grandchild"]
            assert not alive(grandchild), f"job {attacker.pk} was recorded succeeded while {grandchild} ran"
            assert "alice-api-key" not in output_of(attacker)
        Path(where["workdir"], "done").touch()
        assert fakes.wait_for(lambda: state_of(victim) in TERMINAL_STATES, 30), output_of(victim)
        assert state_of(victim) == JobState.SUCCEEDED
        assert json.loads(output_of(victim).splitlines()[1]) == {
            "checkpoint": "alice-weights",
            "files": ["model.ckpt"],
            "served": 0,
        }
        # gone with the job: the agent removes it just after its exit report, so wait for that
        assert fakes.wait_for(lambda: not Path(where["workdir"]).exists(), 10), where["workdir"]
    finally:
        processes.stop_agent(agent)

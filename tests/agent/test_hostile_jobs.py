"""Tenants' jobs on one node attack each other through a real agent (``python -m agent``, as root).

alice's job (tenant vision) keeps a secret in its files, its checkpoint and its environment, and
serves a port. bob's job (tenant nlp) and carol's (vision, alice's teammate: the agent gives every
job attempt its own uid, whoever submitted it) try what a hostile tenant would: read her files,
checkpoint and environment, overwrite or plant a checkpoint, signal her process, connect to her
server, to the agent's metrics port, to the control plane and to the node's databases (by port,
and by PostgreSQL's unix socket), connect or send to her abstract unix sockets and connect to a
node service's, and leave a ``setsid`` grandchild behind. Every attempt is denied, each attacker
is recorded succeeded only once its grandchild is dead, and alice's job ends as it would have
alone (her own child reaches her abstract socket).

The lower-level tests (tests/agent/test_isolation.py) try the same against the job process alone,
with and without namespaces, and the GPU device files; tests/agent/test_cpu_only.py fills a node
with CPU-only jobs.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any
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
import json, os, pathlib, select, socket, subprocess, sys
ck, tmp = os.environ["TESSERA_CHECKPOINT_DIR"], os.environ["TMPDIR"]
pathlib.Path("secret.txt").write_text("alice-secret")
pathlib.Path(ck, "model.ckpt").write_text("alice-weights")
pathlib.Path(tmp, "scratch").write_text("alice-scratch")
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
# an abstract unix socket (as NCCL's and torch's IPC ones): no file, no port
ipc, ipc_name = socket.socket(socket.AF_UNIX), f"alice-ipc-{os.getpid()}"
ipc.bind("\0" + ipc_name)
ipc.listen()
dgram, dgram_name = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), f"alice-dgram-{os.getpid()}"
dgram.bind("\0" + dgram_name)
# her own child (a launcher's worker) reaches her abstract socket
own = ("import socket, sys; s = socket.socket(socket.AF_UNIX); "
       "s.connect(chr(0) + sys.argv[1]); print(s.recv(8).decode())")
child = subprocess.Popen([sys.executable, "-c", own, ipc_name],
                         stdout=subprocess.PIPE, text=True)
conn, _ = ipc.accept()
conn.sendall(b"alice")
conn.close()
print(json.dumps({"workdir": os.getcwd(), "checkpoint": ck, "tmp": tmp, "pid": os.getpid(),
                  "port": server.getsockname()[1], "ipc": ipc_name, "dgram": dgram_name,
                  "own child": child.communicate()[0].strip()}),
      flush=True)
served, ipc_served, datagrams = 0, 0, 0
while not os.path.exists("done"):
    for ready in select.select([server, ipc, dgram], [], [], 0.1)[0]:
        if ready is dgram:
            dgram.recv(16)
            datagrams += 1
            continue
        conn, _ = ready.accept()
        conn.sendall(b"alice")
        conn.close()
        if ready is server:
            served += 1
        else:
            ipc_served += 1
print(json.dumps({"checkpoint": pathlib.Path(ck, "model.ckpt").read_text(),
                  "files": sorted(os.listdir(ck)), "served": served, "ipc served": ipc_served,
                  "datagrams": datagrams}), flush=True)
"""

ATTACKER = (
    fakes.ATTEMPT
    + r"""
import json, os, signal, socket, sys, time
victim, ports, sockets, abstracts = (json.loads(arg) for arg in sys.argv[1:5])

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

def send_unix(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", name)

for name, abstract in abstracts.items():  # no file: neither permissions nor mounts guard these
    if name.endswith("datagram socket"):
        results[f"send to {name}"] = attempt(lambda a=abstract: send_unix("\0" + a))
    else:
        results[f"connect to {name}"] = attempt(lambda a=abstract: connect_unix("\0" + a))
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
)


@pytest.fixture
def service():
    """A node service listening on an abstract unix socket, as root (outside every job)."""
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(f"\0tessera-node-service-{os.getpid()}")
        listening.listen()
        yield listening


def test_jobs_of_other_tenants_and_of_the_same_tenant_cannot_reach_alices_job(
    live_server, world, state_dir, service
):
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
        assert fakes.wait_for(lambda: "\n" in h.output_of(victim), 30), h.output_of(victim)
        where = json.loads(h.output_of(victim).splitlines()[0])
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
        # Abstract unix sockets: hers, and a node service's (the agent makes none of its own);
        # out of reach where the kernel has Landlock scopes (Linux 6.12), as here.
        abstracts = {
            "her abstract socket": where["ipc"],
            "her abstract datagram socket": where["dgram"],
            "a node service's abstract socket": service.getsockname()[1:].decode(),
        }
        if sandbox.scope_unavailable() is not None:
            abstracts = {}
        assert where["own child"] == "alice"  # her own processes reach her abstract socket
        command = ["python", "-c", ATTACKER, *map(json.dumps, (where, ports, sockets, abstracts))]
        attackers = [
            h.bind(h.submit(user, tenant, command=command, gpus=1), "cli-node", [gpu])
            for user, tenant, gpu in ((world.bob, world.nlp, 1), (world.carol, world.vision, 2))
        ]
        for attacker in attackers:
            assert fakes.wait_for(lambda a=attacker: h.state_of(a) in TERMINAL_STATES, 60), h.output_of(
                attacker
            )
            assert h.state_of(attacker) == JobState.SUCCEEDED, h.output_of(attacker)
            said = json.loads(h.output_of(attacker).splitlines()[0])
            allowed = {attack: result for attack, result in said["results"].items() if result == "succeeded"}
            assert allowed == {}, f"job {attacker.pk} got through: {allowed}"
            assert said["results"]["signal her process"] == "PermissionError"
            grandchild = said["grandchild"]
            assert not alive(grandchild), f"job {attacker.pk} was recorded succeeded while {grandchild} ran"
            assert "alice-api-key" not in h.output_of(attacker)
        Path(where["workdir"], "done").touch()
        assert fakes.wait_for(lambda: h.state_of(victim) in TERMINAL_STATES, 30), h.output_of(victim)
        assert h.state_of(victim) == JobState.SUCCEEDED
        assert json.loads(h.output_of(victim).splitlines()[1]) == {
            "checkpoint": "alice-weights",
            "files": ["model.ckpt"],
            "served": 0,
            "ipc served": 0,
            "datagrams": 0,
        }
        # gone with the job: the agent removes it just after its exit report, so wait for that
        assert fakes.wait_for(lambda: not Path(where["workdir"]).exists(), 10), where["workdir"]
    finally:
        said = processes.stop_agent(agent)
    if abstracts:  # the start's log says what jobs get
        assert "jobs each get a Landlock domain" in said, said


NEIGHBOUR = r"""
import json, os, pathlib, sys, time
pathlib.Path("keep.bin").write_bytes(b"n" * (4 << 20))  # well inside the bound
with open(sys.argv[1], "rb") as f:  # its own GPU's device file
    gpu = f.read().decode()
while not os.path.exists("done"):
    time.sleep(0.05)
print(json.dumps({"kept": pathlib.Path("keep.bin").stat().st_size, "gpu": gpu}), flush=True)
"""

FILL_DISK = r"""
import os, time
for i in range(64):  # 64 files of 1 MB: each under the file-size bound, together 4x the disk bound
    with open(f"fill-{i}", "wb") as f:
        f.write(os.urandom(1 << 20))
print("filled", flush=True)
time.sleep(120)
"""

OPEN_DEVICES_THEN_FLOOD = r"""
import json, sys
result = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            result[path] = f.read().decode()
    except OSError as exc:
        result[path] = type(exc).__name__
print(json.dumps(result), flush=True)
line = b"x" * 1023 + b"\n"
for _ in range(16 << 10):  # 16 MB of output
    sys.stdout.buffer.write(line)
"""


@pytest.fixture
def fake_gpus(state_dir):
    """Stand-ins for /dev/nvidia0..3, readable by anyone as the real ones are (in the state
    directory, which jobs see through their private /tmp)."""
    path = state_dir / "fake-gpus"
    path.mkdir(mode=0o755)
    for index in range(4):
        (path / f"nvidia{index}").write_text(f"gpu{index}")
        os.chmod(path / f"nvidia{index}", 0o666)
    return path


def test_a_jobs_device_files_disk_processes_and_log_are_bounded_and_its_neighbour_ends_as_alone(
    live_server, world, state_dir, fake_gpus, settings
):
    """Through a real agent (``--job-disk-mb 16 --job-max-tasks 40``, GPUs with stand-in device
    files): bob's jobs open every GPU's device file, fill their disk, fork without end and flood
    their log; each is denied or bounded, and alice's job beside them keeps its file and succeeds."""
    if sandbox.namespaces_unavailable() is not None:
        pytest.skip("hiding other GPUs' device files needs a mount namespace")
    settings.TESSERA = {**settings.TESSERA, "LOG_CAP_BYTES": 64 << 10}
    token_file = state_dir / "join-token"
    token_file.write_text(h.new_join_token())
    spec = f"4xA100,nvlink=2,rack=r9,devices={fake_gpus}"
    limits = ["--job-disk-mb", "16", "--job-max-tasks", "40"]
    agent = processes.start_agent(
        live_server.url, state_dir, "--join-token-file", str(token_file), "--simulate", spec, *limits
    )
    devices = [str(fake_gpus / f"nvidia{i}") for i in range(4)]
    try:
        processes.registered(state_dir)

        def run(user, tenant, gpu: int, script: str, *args: str, **fields) -> Job:
            job = h.submit(user, tenant, command=["python", "-c", script, *args], gpus=1, **fields)
            return h.bind(job, "cli-node", [gpu])

        neighbour = run(world.alice, world.vision, 0, NEIGHBOUR, devices[0])
        prober = run(world.bob, world.nlp, 1, OPEN_DEVICES_THEN_FLOOD, *devices)
        bomb = run(world.bob, world.nlp, 2, fakes.FORK_BOMB)
        filler = run(world.bob, world.nlp, 3, FILL_DISK, max_retries=2)

        def ended(job: Job) -> bool:
            return h.state_of(job) in TERMINAL_STATES

        for job in (prober, bomb, filler):
            assert fakes.wait_for(lambda j=job: ended(j), 60), (job.name, h.output_of(job))
        # another GPU's device file: denied; its own: opened
        assert h.state_of(prober) == JobState.SUCCEEDED
        opened = json.loads(h.output_of(prober).splitlines()[0])
        assert opened == {devices[0]: "PermissionError", devices[1]: "gpu1",
                          devices[2]: "PermissionError", devices[3]: "PermissionError"}  # fmt: skip
        # the log flood: stored up to the cap, the rest dropped, and the cut said in the log
        flooded = Job.objects.get(pk=prober.pk)
        cut = "[tessera] output past the job's log cap of 65536 bytes dropped\n"
        assert flooded.log_truncated and h.output_of(prober).endswith(cut)
        assert len(h.output_of(prober)) <= (64 << 10) + len("\n" + cut)  # on a line of its own
        # the fork bomb: stopped at its uid's limit, its children killed with it
        assert h.state_of(bomb) == JobState.SUCCEEDED, h.output_of(bomb)
        children, error = h.output_of(bomb).splitlines()[0].split()
        assert int(children) < 40 and error == "BlockingIOError"
        # the disk filler: stopped by its agent, failed with disk-limit, not retried
        stopped = Job.objects.get(pk=filler.pk)
        assert stopped.state == JobState.FAILED and stopped.attempts == 0, h.output_of(filler)
        assert stopped.events.filter(type="failed").get().reason == "disk-limit"
        assert "disk limit of 16 MB passed" in h.output_of(filler)
        # alice's job, beside all of it: its file kept, its GPU its own, succeeded
        assert h.state_of(neighbour) == JobState.RUNNING
        (done,) = state_dir.glob(f"jobs/{neighbour.pk}-*")
        (done / "done").touch()
        assert fakes.wait_for(lambda: ended(neighbour), 30), h.output_of(neighbour)
        assert h.state_of(neighbour) == JobState.SUCCEEDED
        assert json.loads(h.output_of(neighbour).splitlines()[0]) == {"kept": 4 << 20, "gpu": "gpu0"}
    finally:
        processes.stop_agent(agent)


def test_forty_cpu_only_jobs_start_only_as_many_as_the_nodes_cpus_and_the_rest_wait_with_a_reason(
    live_server, world, state_dir
):
    """bob submits 40 CPU-only jobs (none saying how many CPUs: each counts as one) to a real
    agent's node of 4 CPUs: 4 start, 36 wait with a reason; alice's GPU job (no time limit)
    still starts and succeeds beside the waiting jobs' reservation."""
    from rest_framework.test import APIClient

    from scheduling.services import passes

    token_file = state_dir / "join-token"
    token_file.write_text(h.new_join_token())
    agent = processes.start_agent(
        live_server.url, state_dir, "--join-token-file", str(token_file), "--simulate", "2xA100,cpus=4"
    )
    try:
        processes.registered(state_dir)
        api = APIClient()
        api.force_authenticate(world.bob)
        body = {"name": "crunch", "kind": "batch", "command": ["sleep", "60"], "gpus": 0, "tenant": "nlp"}
        ids = [api.post("/api/v1/jobs/", body, format="json").data["id"] for _ in range(40)]
        passes.run_pass()
        bobs = Job.objects.filter(pk__in=ids)
        assert fakes.wait_for(lambda: bobs.filter(state=JobState.RUNNING).count() == 4, 30)
        # No time limit: bob's first waiting job holds only the CPUs it needs for when his end
        # (a reservation), not the node's GPUs.
        ok = ["python", "-c", "print('ok')"]
        alices = h.submit(world.alice, world.vision, command=ok, gpus=1)
        passes.run_pass()
        seen = Job.objects.filter(pk=alices.pk).values_list("state", "pending_reason")
        assert fakes.wait_for(lambda: h.state_of(alices) in TERMINAL_STATES, 30), seen[0]
        assert h.state_of(alices) == JobState.SUCCEEDED and h.output_of(alices) == "ok\n"
        passes.run_pass()
        assert bobs.filter(state__in=[JobState.RUNNING, JobState.SCHEDULED]).count() == 4
        waiting = list(bobs.filter(state=JobState.PENDING))
        assert len(waiting) == 36
        codes = sorted(j.pending_code for j in waiting)
        assert codes == ["capacity"] * 35 + ["reserved"]  # the first of them holds the next room
        assert all("lack 1 CPUs" in j.pending_reason for j in waiting if j.pending_code == "capacity")
    finally:
        processes.stop_agent(agent)


TASKS_BOUND = r"""
import os, resource, time
print(resource.getrlimit(resource.RLIMIT_NPROC)[0], flush=True)
while not os.path.exists("done"):
    time.sleep(0.05)
"""


def test_bobs_jobs_filling_a_node_cannot_take_its_pids_together(live_server, world, state_dir):
    """bob fills a real agent's node of 4 GPUs with four one-GPU jobs (each attempt a uid of its
    own, each uid bounded alone): were each allowed a quarter of ``kernel.pid_max`` (the bound of
    a job holding the whole node), four fork bombs together would take every pid of the node —
    alice's next job, and the agent's own spawns, would fail to fork. Each gets its share of the
    node's bound instead (a quarter of it here), and a job holding the whole node all of it."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    whole = sandbox.default_max_tasks()
    bounds, node_wide = bounds_read_by_bobs_jobs(live_server, world, state_dir, TASKS_BOUND)
    assert bounds == [whole // 4] * 4
    assert sum(bounds) <= pid_max // 4  # the node keeps the rest, whatever the four do
    assert node_wide == whole


DISK_BOUND = r"""
import os, resource, time
print(resource.getrlimit(resource.RLIMIT_FSIZE)[0] >> 20, flush=True)
while not os.path.exists("done"):
    time.sleep(0.05)
"""


def test_bobs_jobs_filling_a_node_cannot_fill_its_disk_together(live_server, world, state_dir):
    """With no ``--job-disk-mb`` set, a job's bound was half the state directory's free space:
    two of bob's jobs, each within its own bound, could fill the file system that holds every
    job's working directory and checkpoint (alice's checkpoint would fail with ENOSPC). Four one-GPU
    jobs on a node of 4 GPUs now share half the free space (each its quarter; the bound of one
    file, ``RLIMIT_FSIZE``, and of the sum of its files alike), and a job holding the whole node
    keeps the whole bound."""
    pool = sandbox.disk_pool_mb(state_dir)
    whole = sandbox.default_disk_mb(state_dir)
    bounds, node_wide = bounds_read_by_bobs_jobs(live_server, world, state_dir, DISK_BOUND)
    # (the free space moves a little between the agent's look and the test's)
    assert sum(bounds) <= pool * 1.05, (bounds, pool)
    assert all(b == min(whole, max(sandbox.MIN_DISK_MB, bounds[0])) for b in bounds), bounds
    assert abs(node_wide - whole) <= whole * 0.05


def bounds_read_by_bobs_jobs(
    live_server: Any, world: Any, state_dir: Path, program: str
) -> tuple[list[int], int]:
    """The first number ``program`` prints, in each of four one-GPU jobs of bob's filling a real
    agent's node of 4 GPUs, then in one job holding the whole node (each job runs until its
    working directory holds ``done``)."""
    token_file = state_dir / "join-token"
    token_file.write_text(h.new_join_token())
    agent = processes.start_agent(live_server.url, state_dir, "--join-token-file", str(token_file))

    def read(job: Any) -> int:
        assert fakes.wait_for(lambda: "\n" in h.output_of(job), 30), h.output_of(job)
        return int(h.output_of(job).split()[0])

    def finish(*jobs: Any) -> None:
        for job in jobs:
            (workdir,) = state_dir.glob(f"jobs/{job.pk}-*")
            (workdir / "done").touch()
        for job in jobs:
            assert fakes.wait_for(lambda j=job: h.state_of(j) in TERMINAL_STATES, 30), h.output_of(job)

    try:
        processes.registered(state_dir)
        command = ["python", "-c", program]
        jobs = [
            h.bind(h.submit(world.bob, world.nlp, command=command, gpus=1), "cli-node", [gpu])
            for gpu in range(4)
        ]
        bounds = [read(job) for job in jobs]
        finish(*jobs)
        node_wide = h.bind(h.submit(world.bob, world.nlp, command=command, gpus=4), "cli-node", [0, 1, 2, 3])
        whole = read(node_wide)
        finish(node_wide)
        return bounds, whole
    finally:
        processes.stop_agent(agent)

"""Jobs on one node cannot reach each other: each attack a hostile tenant's job would try, tried.

Real processes under a root agent's isolation (agent/identity.py, agent/sandbox.py): each job
attempt runs as a uid of its own, behind private mounts where the machine allows them. bob's job
attacks alice's (another tenant's, or another of alice's own jobs: the agent gives every job
attempt its own uid whoever submitted it) and fails; alice's job ends as it would have alone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import cgroups, firewall, identity, leftovers, sandbox, state
from agent import process as process_module
from agent.identity import UidPool, UidRange
from agent.process import JobProcess, job_path
from tests.agent import fakes
from tests.agent.agent_process import alive

ROOT = Path(__file__).resolve().parents[2]
MQUEUE = "/dev/mqueue"  # where systemd mounts the node's POSIX message queues

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a uid per job needs an agent running as root")


@pytest.fixture(params=["namespaces", "uid only"])
def node(request):
    """(fake server, state dir, uid pool, sandbox, job PATH): with private mounts, and without
    them (a machine where the agent may not make namespaces: the uid alone must hold)."""
    with fakes.job_user_state_dir() as state_dir:
        pool = identity.UidPool(identity.parse_range(identity.DEFAULT_RANGE))
        path = job_path(state_dir, pool.probe())
        keep = [state_dir, *path.split(":")]  # the state directory is in /tmp: kept visible
        box = sandbox.detect(keep=keep) if request.param == "namespaces" else sandbox.Sandbox(False)
        if request.param == "namespaces" and not box.namespaces:
            pytest.skip("this machine does not let the agent make mount namespaces")
        yield fakes.FakeServer(), state_dir, pool, box, path


def start(node, job_id: int, command: list[str], **binding) -> JobProcess:
    server, state_dir, pool, box, path = node
    process = JobProcess(
        fakes.binding(job_id, command=command, **binding), server, state_dir, pool, path, sandbox=box
    )
    process.start()
    return process


def first_line(server, job_id: int) -> str:
    assert fakes.wait_for(lambda: b"\n" in server.output(job_id), 15), server.output(job_id)
    return server.output(job_id).decode().splitlines()[0]


ALICE = r"""
import os, pathlib, time
ck, tmp = os.environ["TESSERA_CHECKPOINT_DIR"], os.environ["TMPDIR"]
pathlib.Path("secret.txt").write_text("alice-secret")
pathlib.Path(ck, "model.ckpt").write_text("alice-weights")
pathlib.Path(tmp, "scratch").write_text("alice-scratch")
print(os.getcwd(), ck, tmp, os.getpid(), flush=True)
while not os.path.exists("done"):
    time.sleep(0.05)
print(pathlib.Path(ck, "model.ckpt").read_text(), sorted(os.listdir(ck)), flush=True)
"""

BOB = (
    fakes.ATTEMPT
    + r"""
import json, os, signal, sys
workdir, ck, tmp, pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def write(path, text):
    with open(path, "w") as f:
        f.write(text)

print(json.dumps({
    "list her working directory": attempt(lambda: os.listdir(workdir)),
    "read her file": attempt(lambda: open(os.path.join(workdir, "secret.txt")).read()),
    "read her checkpoint": attempt(lambda: open(os.path.join(ck, "model.ckpt")).read()),
    "overwrite her checkpoint": attempt(lambda: write(os.path.join(ck, "model.ckpt"), "bob")),
    "plant a checkpoint": attempt(lambda: write(os.path.join(ck, "planted.ckpt"), "bob")),
    "read her temporary file": attempt(lambda: open(os.path.join(tmp, "scratch")).read()),
    "read her environment": attempt(lambda: open(f"/proc/{pid}/environ").read()),
    "signal her process": attempt(lambda: os.kill(pid, signal.SIGTERM)),
    "list the node's checkpoints": attempt(lambda: os.listdir(os.path.dirname(ck))),
    "list the node's jobs": attempt(lambda: os.listdir(os.path.dirname(workdir))),
}))
"""
)


def test_bobs_job_cannot_read_alices_files_environment_or_checkpoint_nor_signal_or_poison_her_job(node):
    server = node[0]
    alice = start(node, 1, ["python", "-c", ALICE], env={"WANDB_API_KEY": "alice-api-key"})
    workdir, ck, tmp, pid = first_line(server, 1).split()
    bob = start(node, 2, ["python", "-c", BOB, workdir, ck, tmp, pid])
    assert server.exit_of(2)["exit_code"] == 0, server.output(2)
    results = json.loads(server.output(2))
    assert {attack: result for attack, result in results.items() if result == "succeeded"} == {}
    assert results["signal her process"] == "PermissionError"
    assert alice.run_as.uid != bob.run_as.uid
    # alice's job ends as it would have alone: not signalled, its checkpoint its own
    Path(workdir, "done").touch()
    assert server.exit_of(1)["exit_code"] == 0
    assert server.output(1).decode().splitlines()[1] == "alice-weights ['model.ckpt']"
    assert b"alice-api-key" not in server.output(2)


def test_each_job_attempt_runs_as_its_own_uid_and_gid_with_no_other_group_and_a_private_umask(node):
    server, _, pool, box, _ = node
    script = "import os; print(os.getuid(), os.getgid(), os.getgroups(), oct(os.umask(0)), flush=True)"
    for job_id in (3, 4):
        start(node, job_id, ["python", "-c", script])
    ids = []
    for job_id in (3, 4):
        assert server.exit_of(job_id)["exit_code"] == 0
        uid, gid, groups, umask = server.output(job_id).decode().split(" ", 3)
        assert int(uid) in pool.ids and gid == uid and umask.strip() == "0o77"
        assert groups.strip() in ("[]", f"[{gid}]")
        ids.append(int(uid))
    assert ids[0] != ids[1]


TMP_AND_SHM = r"""
import os, pathlib, sys
who = sys.argv[1]
for d in ("/tmp", "/dev/shm", os.environ["TMPDIR"], *sys.argv[2:]):
    print(d, oct(os.stat(d).st_mode & 0o777), sorted(os.listdir(d)))
    pathlib.Path(d, who).write_text(who)
"""


def test_an_agent_installed_under_tmp_still_starts_its_jobs(node, monkeypatch, tmp_path):
    """The chain's own Landlock step (the agent's interpreter and agent/landlock.py) runs inside
    the job's namespace: under a private /tmp (a checkout in /tmp, as a `make demo` there) it
    must stay in sight, or every job fails before its command ('prlimit: failed to execute')."""
    server, state_dir, pool, box, path = node
    if not (box.namespaces and box.scoped):
        pytest.skip("needs a private /tmp and a Landlock domain per job")
    install = Path(tmp_path) / "checkout"
    (install / "bin").mkdir(parents=True)
    (install / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    (install / "agent").mkdir()
    step = install / "agent" / sandbox.LANDLOCK_STEP.name
    step.write_bytes(sandbox.LANDLOCK_STEP.read_bytes())
    monkeypatch.setattr(sandbox.sys, "executable", str(install / "bin" / "python"))
    monkeypatch.setattr(sandbox, "LANDLOCK_STEP", step)
    moved = sandbox.Sandbox(True, keep=[state_dir, *path.split(":")], scoped=True)
    assert str(install / "bin") in moved.keep and str(install / "agent") in moved.keep
    process = JobProcess(
        fakes.binding(31, command=["sh", "-c", "echo started"]), server, state_dir, pool, path, sandbox=moved
    )
    process.start()
    assert server.exit_of(31)["exit_code"] == 0, server.output(31)
    assert server.output(31) == b"started\n"


def test_a_jobs_temporary_directories_are_its_own_and_go_with_it(node):
    server, state_dir, _, box, _ = node
    if not box.namespaces:
        pytest.skip("a private /tmp and /dev/shm need a mount namespace")
    host_tmp = set(os.listdir("/tmp"))
    host_locks = {d: set(os.listdir(d)) for d in box.locks}  # /run/lock, where the node has one
    for job_id, who in ((5, "alice"), (6, "bob")):
        process = start(node, job_id, ["python", "-c", TMP_AND_SHM, who, *box.locks])
        assert server.exit_of(job_id)["exit_code"] == 0
        lines = server.output(job_id).decode().splitlines()
        # each starts empty, 0700: nothing of the job before it, nothing of the host's but what
        # the agent keeps in sight: its state directory, which this test keeps in /tmp, and its
        # own interpreter and Landlock step when this checkout lies in /tmp too
        kept = sorted({Path(k).relative_to("/tmp").parts[0] for k in box.keep if k.startswith("/tmp/")})
        assert state_dir.name in kept
        empty = ["0o700 []"] * (2 + len(box.locks))
        assert [line.split(" ", 1)[1] for line in lines] == [f"0o700 {kept!r}", *empty], lines
        assert fakes.wait_for(lambda process=process: not process.workdir.exists(), 5)
    assert not {"alice", "bob"} & set(os.listdir("/tmp")) - host_tmp
    assert not {"alice", "bob"} & set(os.listdir("/dev/shm"))
    for d, before in host_locks.items():
        assert set(os.listdir(d)) == before, d


FILLS = r"""
import errno, json, os, sys

def fill(directory, files, mb):
    # ``files`` files of ``mb`` MB each, written until an error: the MB written and the error
    written, chunk = 0, b"x" * (1 << 20)
    try:
        for i in range(files):
            fd = os.open(os.path.join(directory, f"fill-{i}"), os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                for _ in range(mb):
                    written += os.write(fd, chunk)
            finally:
                os.close(fd)
    except OSError as exc:
        return [written >> 20, errno.errorcode[exc.errno]]
    finally:
        for i in range(files):
            try:
                os.unlink(os.path.join(directory, f"fill-{i}"))
            except FileNotFoundError:
                pass
    return [written >> 20, "no error"]

said = {"one file of 32 MB": fill(os.environ["TMPDIR"], 1, 32)}
if sys.argv[1] == "namespaces":  # its private tmpfs mounts: 32 files of 1 MB each
    said.update({d: fill(d, 32, 1) for d in ("/tmp", "/dev/shm")})
print(json.dumps(said), flush=True)
"""


@pytest.mark.parametrize("max_tasks", [None, 4096], ids=["bound-by-the-shell", "bound-by-prlimit"])
def test_a_job_filling_its_private_tmp_and_shm_or_writing_one_huge_file_is_stopped_at_its_bound(
    node, max_tasks
):
    """``--job-disk-mb 8``: no file of the job grows past 8 MB (EFBIG), and its private /tmp and
    /dev/shm (tmpfs: the node's memory) fill up at 8 MB each (ENOSPC); the job goes on and ends
    as it would have, and nothing of it is left on the node's own /dev/shm. The file bound is
    set by ``prlimit`` with the process bound, by the job's shell without one."""
    server, state_dir, pool, box, path = node
    bounded = sandbox.Sandbox(box.namespaces, keep=box.keep, disk_mb=8, max_tasks=max_tasks)
    chain = bounded.prefix(identity.RunAs("job", 200001, 200001), [])
    assert any(step.endswith("prlimit") for step in chain) == (max_tasks is not None)
    mode = "namespaces" if box.namespaces else "uid only"
    binding = fakes.binding(26, command=["python", "-c", FILLS, mode])
    host_shm = set(os.listdir("/dev/shm"))
    JobProcess(binding, server, state_dir, pool, path, sandbox=bounded).start()
    assert server.exit_of(26)["exit_code"] == 0, server.output(26)
    said = json.loads(server.output(26).decode().splitlines()[0])
    assert said.pop("one file of 32 MB") == [8, "EFBIG"]
    if box.namespaces:
        for directory, (written, error) in said.items():
            assert error == "ENOSPC" and 6 <= written <= 8, (directory, written, error)
    assert set(os.listdir("/dev/shm")) == host_shm


SPREADS = r"""
import os, time
for d in ("/tmp", "/dev/shm"):  # 5 MB in each: under each one's bound, over the job's together
    with open(os.path.join(d, "fill"), "wb") as f:
        f.write(b"x" * (5 << 20))
print("filled", flush=True)
time.sleep(60)
"""


def test_a_job_spreading_its_fill_over_its_private_tmp_and_shm_is_stopped_at_its_bound(node):
    """``--job-disk-mb`` bounds a job's fill in all: its private tmpfs mounts (the node's memory)
    count with its directories, so 5 MB in /tmp and 5 MB in /dev/shm pass a bound of 8 MB and the
    job is stopped with reason disk-limit, as one that fills its working directory."""
    server, state_dir, pool, box, path = node
    if not box.namespaces:
        pytest.skip("private /tmp and /dev/shm need a mount namespace")
    bounded = sandbox.Sandbox(True, keep=box.keep, disk_mb=8)
    binding = fakes.binding(27, command=["python", "-c", SPREADS])
    JobProcess(binding, server, state_dir, pool, path, sandbox=bounded).start()
    ended = server.exit_of(27, timeout=30)
    assert ended["reason"] == "disk-limit", server.output(27)
    # What it held when the agent looked: past 8 MB, so both mounts counted (5 MB each at most);
    # the second file may still be being written then (seen at 8 MB in a CI run), so not always 10.
    said = re.search(r"disk limit of 8 MB passed \((\d+) MB", server.output(27).decode())
    assert said is not None and 8 <= int(said[1]) <= 10, server.output(27)


EMPTY_FILES = r"""
import json, os, sys, time
made, refused = {}, {}
for d in sys.argv[1:]:
    os.makedirs(d, exist_ok=True)
    made[d] = 0
    try:
        for i in range(3000):  # empty: not one byte of --job-disk-mb, but an inode each
            os.close(os.open(os.path.join(d, str(i)), os.O_CREAT | os.O_WRONLY, 0o600))
            made[d] += 1
    except OSError as exc:
        refused[d] = exc.errno
print(json.dumps({"made": made, "refused": refused}), flush=True)
time.sleep(60)
"""


def test_a_job_making_empty_files_by_the_thousand_is_stopped_at_its_file_bound(node):
    """An empty file holds no block, so ``--job-disk-mb`` never saw a job that fills the node's
    file system's inodes (or a tmpfs's: kernel memory) with empty files: 200,000 of them summed
    to 0 bytes, and at tens of thousands a second a job used up the root file system's inodes,
    the agent's and every job's. ``--job-max-files 2000``: each private tmpfs takes at most 2,000
    (ENOSPC), and a job whose directories and private tmpfs hold more in all is stopped, with
    reason disk-limit."""
    server, state_dir, pool, box, path = node
    bounded = sandbox.Sandbox(box.namespaces, keep=box.keep, disk_mb=64, max_files=2000)
    if box.namespaces:
        binding = fakes.binding(28, command=["python", "-c", EMPTY_FILES, "/dev/shm/many"])
        JobProcess(binding, server, state_dir, pool, path, sandbox=bounded).start()
        said = json.loads(first_line(server, 28))
        assert said["refused"] == {"/dev/shm/many": errno.ENOSPC}, said
        assert 1990 <= said["made"]["/dev/shm/many"] < 2000, said
        ended = server.exit_of(28, timeout=30)
        assert ended["reason"] == "disk-limit", server.output(28)
    # On the node's disk no file is refused: they are counted, and the job stopped. On a loaded
    # host the agent's check may stop it before it prints its counts: its line is not awaited.
    binding = fakes.binding(29, command=["python", "-c", EMPTY_FILES, "a", "b"])
    JobProcess(binding, server, state_dir, pool, path, sandbox=bounded).start()
    ended = server.exit_of(29, timeout=60)
    output = server.output(29).decode()
    assert ended["reason"] == "disk-limit", output
    assert "file limit of 2000 files passed" in output
    said = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert all(line["refused"] == {} and line["made"] == {"a": 3000, "b": 3000} for line in said), said


OOM_RANK = r"""
import json, os, subprocess, sys
def lower(score):
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(score))
        return "succeeded"
    except OSError as exc:
        return type(exc).__name__
agent = int(sys.argv[1])
child = subprocess.run(["cat", "/proc/self/oom_score_adj"], capture_output=True, text=True).stdout
print(json.dumps({"score": open("/proc/self/oom_score_adj").read().strip(), "child": child.strip(),
                  "to the agent's": lower(agent), "below the agent's": lower(agent - 1)}), flush=True)
"""


@pytest.fixture
def agent_oom_score():
    """This process (the agent here) put last in the OOM killer's order, as agent/cli.py does:
    its score then, -999, or its own where it may not lower it (no ``CAP_SYS_RESOURCE``)."""
    before = Path("/proc/self/oom_score_adj").read_text()
    process_module.protect_from_oom()
    yield int(Path("/proc/self/oom_score_adj").read_text())
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text(before)


def test_a_job_comes_before_the_agent_in_the_oom_killers_order_and_cannot_move_itself_back(
    node, agent_oom_score
):
    """A job that fills the node's memory must not get the agent killed (and every job on the
    node with it): the agent runs at oom_score_adj -999, and each job's process, which inherited
    that (and the right to set itself as low), is set to 1000 by the agent before the job runs
    (500 with a memory-bounded cgroup: a job that asked for memory goes after one nothing
    bounds). The job and its children cannot set it below the agent's; where the agent could
    lower its own (root with ``CAP_SYS_RESOURCE``) not even as low."""
    server = node[0]
    start(node, 30, ["python", "-c", OOM_RANK, str(agent_oom_score)])
    assert server.exit_of(30)["exit_code"] == 0, server.output(30)
    said = json.loads(first_line(server, 30))
    protected = agent_oom_score == process_module.AGENT_OOM_SCORE_ADJ
    assert said == {
        "score": "1000",
        "child": "1000",
        "to the agent's": "PermissionError" if protected else "succeeded",
        "below the agent's": "PermissionError",
    }, said


SYSV_IPC = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0o600)  # a MiB of the node's memory
at = libc.shmat(shm, None, 0)
ctypes.memmove(at, b"alice-secret", 12)
libc.shmdt(ctypes.c_void_p(at))  # detached: the segment lives on, its job gone
sem = libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600)
msg = libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)
print(json.dumps({"shm": shm, "sem": sem, "msg": msg, "uid": os.getuid()}), flush=True)
"""


def test_a_jobs_system_v_ipc_objects_go_with_it_never_left_holding_memory_for_the_uids_next_job(node):
    """A shared memory segment outlives its last process until it is removed: a job left a MiB
    (or all the node's memory, segment by segment) of System V shared memory, a semaphore set
    and a message queue behind, holding the node's memory after its end, and the next job given
    its uid could attach the segment and read what it held. Without namespaces (where IPC is the
    node's) they are removed with the uid's processes; with them, the job's IPC namespace takes
    them along, and nothing of the job is in the node's."""
    server = node[0]
    start(node, 31, ["python", "-c", SYSV_IPC])
    assert server.exit_of(31)["exit_code"] == 0, server.output(31)
    made = json.loads(first_line(server, 31))
    assert -1 not in (made["shm"], made["sem"], made["msg"]), made
    left = identity.ipc_of(made["uid"])
    with contextlib.suppress(OSError):  # never leave this machine holding them, whatever happened
        for option, ident in left:
            subprocess.run(["ipcrm", option, str(ident)], check=False, capture_output=True)
    assert left == []


@pytest.fixture
def host_mqueue():
    """The node's POSIX message queue file system on /dev/mqueue, as systemd mounts it (mounted
    here for the test where this machine has none), with a queue a node service left open to
    all (0666) holding a message."""
    made = not os.path.isdir(MQUEUE)
    if made:
        os.mkdir(MQUEUE, 0o1777)
        subprocess.run(["mount", "-t", "mqueue", "mqueue", MQUEUE], check=True)
    queue = Path(MQUEUE, f"tessera-service-{os.getpid()}")
    os.close(os.open(queue, os.O_CREAT | os.O_RDWR, 0o666))
    queue.chmod(0o666)
    try:
        yield queue
    finally:
        with contextlib.suppress(OSError):
            queue.unlink()
        if made:
            subprocess.run(["umount", MQUEUE], check=False)
            with contextlib.suppress(OSError):
                os.rmdir(MQUEUE)


MQUEUES = (
    fakes.ATTEMPT
    + r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
service = sys.argv[1]
def poison():
    fd = os.open(service, os.O_RDWR)  # a descriptor mq_send takes, as mq_open's
    if libc.mq_send(fd, b"bob-was-here", 12, 0) != 0:
        raise OSError(ctypes.get_errno(), "mq_send")
left = os.open(os.path.join("/dev/mqueue", f"left-{os.getuid()}"), os.O_CREAT | os.O_RDWR, 0o600)
print(json.dumps({
    "sees": sorted(os.listdir("/dev/mqueue")),
    "poison the service's queue": attempt(poison),
    "uid": os.getuid(),
}), flush=True)
"""
)


def test_a_jobs_posix_message_queues_are_its_own_and_go_with_it(host_mqueue, node):
    """/dev/mqueue reaches the node's IPC namespace's queues whatever namespace a process is in:
    a job saw every queue there, could send into one a node service left open (0666) and left
    queues of its own behind, holding the node's memory for the uid's next job. In its mount
    namespace /dev/mqueue is its own IPC namespace's; without one, its queues are removed when
    its uid is given back."""
    server, box = node[0], node[3]
    start(node, 35, ["python", "-c", MQUEUES, str(host_mqueue)])
    assert server.exit_of(35)["exit_code"] == 0, server.output(35)
    said = json.loads(first_line(server, 35))
    left = f"left-{said['uid']}"
    assert not os.path.exists(Path(MQUEUE, left))  # gone with the job, either way
    if box.namespaces:
        assert said["sees"] == [left]
        assert said["poison the service's queue"] == "FileNotFoundError"
        assert Path(host_mqueue).read_text().startswith("QSIZE:0 ")


def test_a_node_whose_mqueue_cannot_be_mounted_again_still_gives_jobs_private_mounts(
    host_mqueue, monkeypatch, caplog
):
    """Where mounting the queues' file system again is refused (a container's seccomp profile),
    jobs still get their private mounts, without their own /dev/mqueue; the agent says so."""
    assert sandbox.mqueue_unavailable() is None  # tried for real: this machine allows it
    monkeypatch.setattr(sandbox, "mqueue_unavailable", lambda: "mount -t mqueue failed: refused")
    with caplog.at_level(logging.WARNING, logger="tessera.agent"):
        box = sandbox.detect()
    if not box.namespaces:
        pytest.skip("this machine does not let the agent make mount namespaces")
    assert box.mqueue is None and "mqueue" not in box._script(identity.RunAs("job", 200000, 200000), [])
    assert "POSIX message queues in /dev/mqueue: mount -t mqueue failed: refused" in caplog.text


@pytest.fixture
def crash_dir(monkeypatch):
    """A world-writable directory of the system's on the node's disk, as Ubuntu's /var/crash
    (1777), one of the agent's list."""
    path = Path(f"/var/tessera-crash-{os.getpid()}")
    shared = (*getattr(sandbox, "SYSTEM_SHARED", ()), str(path))
    monkeypatch.setattr(sandbox, "SYSTEM_SHARED", shared, raising=False)
    path.mkdir()
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


FILL_SHARED = (
    fakes.ATTEMPT
    + r"""
import json, os, sys
shared = sys.argv[1]
def fill():
    with open(os.path.join(shared, "core"), "wb") as f:
        for _ in range(16):
            f.write(b"x" * (1 << 20))
def many():
    for n in range(2000):
        open(os.path.join(shared, f"empty-{n}"), "w").close()
print(json.dumps({"fill it": attempt(fill), "empty files": attempt(many)}), flush=True)
"""
)


def test_a_job_fills_no_world_writable_system_directory_nor_leaves_files_there(crash_dir, node):
    """/var/crash (Ubuntu's, 1777) is on the node's disk, outside every bound of the job (its
    directories and private tmpfs are summed, not it): a job filled it, or its inodes, and what
    it wrote stayed, its uid's, for the uid's next job. In its mount namespace such a directory
    of the system's is private, as /run/lock: a small tmpfs, gone with the job."""
    server, box = node[0], node[3]
    if not box.namespaces:
        pytest.skip("a private directory needs a mount namespace")
    start(node, 38, ["python", "-c", FILL_SHARED, str(crash_dir)])
    assert server.exit_of(38)["exit_code"] == 0, server.output(38)
    said = json.loads(first_line(server, 38))
    assert said == {"fill it": "OSError", "empty files": "OSError"}, said
    assert os.listdir(crash_dir) == []


SYSLOG = (
    fakes.ATTEMPT
    + r"""
import json, socket
def forge():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"<34>sshd[1]: Accepted publickey for root from 10.0.0.1", "/dev/log")
print(json.dumps({"forge a syslog line": attempt(forge)}), flush=True)
"""
)


@pytest.fixture
def syslog():
    """A syslog daemon's socket on /dev/log (made here where this machine has none)."""
    if os.path.lexists("/dev/log"):
        pytest.skip("this machine has a syslog of its own on /dev/log")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind("/dev/log")
    os.chmod("/dev/log", 0o666)  # as rsyslog's and journald's
    listener.settimeout(0.5)
    try:
        yield listener
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink("/dev/log")


def test_a_job_cannot_forge_the_nodes_syslog_lines(syslog, node):
    """rsyslog writes the tag a line is sent with: a job wrote `sshd: Accepted publickey for
    root` into the node's logs. In its mount namespace /dev/log is an unreadable file."""
    server, box = node[0], node[3]
    if not box.namespaces:
        pytest.skip("hiding /dev/log needs a mount namespace")
    start(node, 36, ["python", "-c", SYSLOG])
    assert server.exit_of(36)["exit_code"] == 0, server.output(36)
    assert json.loads(first_line(server, 36)) == {"forge a syslog line": "PermissionError"}
    with pytest.raises(TimeoutError):
        syslog.recv(256)


POSIX_SHM = r"""
import json, mmap, os
fd = os.open(f"/dev/shm/psm_{os.getpid()}", os.O_CREAT | os.O_RDWR, 0o600)  # as shm_open
os.ftruncate(fd, 1 << 20)  # a MiB of the node's memory
with mmap.mmap(fd, 1 << 20) as m:
    m[:12] = b"alice-secret"
os.makedirs(f"/dev/shm/cache-{os.getpid()}/deeper")
print(json.dumps({"uid": os.getuid()}), flush=True)
"""


def test_a_jobs_posix_shared_memory_goes_with_it_never_left_holding_memory_for_the_uids_next_job(node):
    """Without mount namespaces a job's /dev/shm is the node's: a POSIX shared memory object (a
    file there, as shm_open makes them; NCCL's and PyTorch's) outlived the job, holding the node's
    memory, and the next job given the uid owned and read it. It is removed with the uid's
    processes; with namespaces the job's private /dev/shm takes it along."""
    server = node[0]
    start(node, 34, ["python", "-c", POSIX_SHM])
    assert server.exit_of(34)["exit_code"] == 0, server.output(34)
    uid = json.loads(first_line(server, 34))["uid"]
    left = [e.path for e in os.scandir("/dev/shm") if e.stat(follow_symlinks=False).st_uid == uid]
    for path in left:  # never leave this machine holding them, whatever happened
        subprocess.run(["rm", "-rf", "--", path], check=False)
    assert left == []


HEADLESS = r"""
import ctypes, os, threading, time
read_end, write_end = os.pipe()
if os.fork() == 0:
    os.setsid()
    def work():  # the job's work, on after its process's first thread is gone
        while True:
            time.sleep(0.1)
    threading.Thread(target=work).start()
    os.write(write_end, f"{os.getpid()}\n".encode())
    ctypes.CDLL(None).pthread_exit(None)  # its pid now reads as a zombie (State: Z)
print(os.read(read_end, 64).decode().strip(), flush=True)
"""


def test_a_job_process_whose_first_thread_exited_is_killed_with_the_job_not_taken_for_a_zombie(node):
    """A process whose first thread calls ``pthread_exit`` while another runs on reads as a
    zombie in ``/proc`` (its state is its first thread's); the agent took it for one, dead: the
    job's exit was reported and its uid given back while it ran on as that uid, its GPU freed for
    another job. It is counted by its threads, and killed with the job's uid."""
    server = node[0]
    start(node, 32, ["python", "-c", HEADLESS])
    assert server.exit_of(32)["exit_code"] == 0, server.output(32)
    pid = int(first_line(server, 32))
    try:
        assert not alive(pid), Path(f"/proc/{pid}/status").read_text()
        assert b"killed 1 process(es) the job left running under its uid" in server.output(32)
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# add_key(2) and request_key(2) (x86_64's, aarch64's numbers: glibc has no wrapper)
KEY_SYSCALLS = {"x86_64": (248, 249), "aarch64": (217, 218)}
KEEPS_A_KEY = r"""
import ctypes, os, sys
add_key, request_key = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
if sys.argv[3] == "add":  # as keyctl add user alice-token ... @u, or a Kerberos KEYRING ccache
    print(libc.syscall(add_key, b"user", b"alice-token", b"alice-secret", 12, -4), os.getuid())
else:
    print(libc.syscall(request_key, b"user", b"alice-token", None, 0), ctypes.get_errno())
"""


def test_a_key_a_job_keeps_in_its_uids_keyring_is_gone_before_the_uid_goes_to_another_job(node):
    """The kernel keeps a uid's user keyring while the machine runs (its persistent keyring for
    days), not while its processes do: a secret a job put there (``keyctl add ... @u``, a
    Kerberos ticket) was found by the next process of that uid, another tenant's job once the
    range came round. The agent empties the uid's keyrings when it gives the uid back."""
    server, _, _, _, path = node
    if os.uname().machine not in KEY_SYSCALLS:
        pytest.skip("add_key's number on this architecture is not in the test")
    numbers = [str(n) for n in KEY_SYSCALLS[os.uname().machine]]
    start(node, 33, ["python", "-c", KEEPS_A_KEY, *numbers, "add"])
    assert server.exit_of(33)["exit_code"] == 0, server.output(33)
    serial, uid = (int(v) for v in first_line(server, 33).split())
    assert serial > 0, server.output(33)
    later = subprocess.run(  # the uid's next process, as the next job given it would be
        ["python", "-c", KEEPS_A_KEY, *numbers, "find"],
        env={"PATH": path},
        cwd="/",
        capture_output=True,
        text=True,
        user=uid,
        group=uid,
        extra_groups=[],
        timeout=30,
    )
    found, error = (int(v) for v in later.stdout.split())
    assert (found, error) == (-1, errno.ENOKEY), later


ESCAPE = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        try:
            print(os.getpid(), flush=True)
        except OSError:  # nobody reads its output any more: it stays all the same
            pass
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        time.sleep(300)
    os._exit(0)
os.wait()
time.sleep(float(sys.argv[1]))  # the main process's own work
"""


class WatchingServer(fakes.FakeServer):
    """Notes, when a job's exit is reported, whether the pid its output named still runs."""

    def __init__(self) -> None:
        super().__init__()
        self.alive_at_exit: dict[int, bool] = {}

    def exited(self, job_id, *args, **kwargs):
        pid = int(self.output(job_id).split()[0])
        self.alive_at_exit[job_id] = alive(pid)
        return super().exited(job_id, *args, **kwargs)


def test_a_double_fork_and_setsid_escape_is_killed_before_the_jobs_exit_is_reported(node):
    _, state_dir, pool, box, path = node
    server = WatchingServer()
    process = JobProcess(
        fakes.binding(7, command=["python", "-c", ESCAPE, "0.2"]), server, state_dir, pool, path, sandbox=box
    )
    process.start()
    assert server.exit_of(7)["exit_code"] == 0
    grandchild = int(server.output(7).split()[0])
    assert server.alive_at_exit == {7: False}
    assert not alive(grandchild)
    assert not identity.processes_of({process.run_as.uid})
    assert leftovers.recorded(state_dir) == {}


AGENT_THEN_KILLED = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from agent import identity, sandbox
from agent.process import JobProcess, job_path
from tests.agent.fakes import FakeServer, binding
state = Path({state!r})
pool = identity.UidPool(identity.parse_range(identity.DEFAULT_RANGE))
path = job_path(state, pool.probe())
box = sandbox.detect(keep=[state, *path.split(":")])
command = ["python", "-c", {escape!r}, "60"]
job = JobProcess(binding(8, command=command), FakeServer(), state, pool, path, sandbox=box)
job.start()
print(job.workdir, flush=True)
time.sleep(60)
"""


def test_a_restarted_agent_kills_what_escaped_its_killed_predecessors_job_and_removes_its_directories(node):
    state_dir = node[1]
    script = AGENT_THEN_KILLED.format(root=str(ROOT), state=str(state_dir), escape=ESCAPE)
    agent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        workdir = Path(agent.stdout.readline().strip())
        records = fakes.wait_for(lambda: leftovers.recorded(state_dir), 10)
        assert records, "the job's session was not recorded"
        (session,) = records.values()
        assert session.uid is not None
        # the job's main process and its escaped grandchild (the middle one exits at once)
        both = fakes.wait_for(lambda: len(identity.processes_of({session.uid}).get(session.uid, [])) >= 2, 10)
        assert both, "the job did not start"
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(10)
        time.sleep(0.3)  # the job's main process dies with the agent; its setsid grandchild not
        assert identity.processes_of({session.uid}), "nothing escaped: the test proves nothing"
        (checkpoint,) = (state_dir / "checkpoints").iterdir()
        assert checkpoint.stat().st_uid == session.uid  # its attempt never ended: still the uid's
        leftovers.kill_leftovers(state_dir, timeout=10)
        state.clean_jobs(state_dir)
        assert identity.processes_of({session.uid}) == {}
        assert leftovers.recorded(state_dir) == {}
        assert not workdir.exists() and os.listdir(state_dir / "jobs") == []
        # kept, but no longer the uid's, which later jobs will get
        assert (checkpoint.stat().st_uid, checkpoint.stat().st_mode & 0o777) == (0, 0o700)
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.stdout.close()


DIES_HOLDING_A_UID = """
import subprocess, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from agent import identity
pool = identity.UidPool(identity.parse_range(identity.DEFAULT_RANGE), lock_dir=Path({locks!r}))
uid = pool.take(9, 0).uid
subprocess.Popen(["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "sleep", "60"],
                 start_new_session=True)
print(uid, flush=True)
time.sleep(60)
"""


STATE_SNOOP = (
    fakes.ATTEMPT
    + r"""
import json, os, sys
agents = sys.argv[1]
print(json.dumps({
    "list the node's agents": attempt(lambda: os.listdir(agents)),
    "list an agent's state": attempt(lambda: os.listdir(os.path.join(agents, "gpu-01"))),
    "read its credential": attempt(lambda: open(os.path.join(agents, "gpu-01", "credential")).read()),
    "read its checkpoint key": attempt(
        lambda: open(os.path.join(agents, "gpu-01", "checkpoint-key"), "rb").read()
    ),
}), flush=True)
"""
)


def test_a_job_can_neither_list_the_agents_state_directories_nor_read_their_credentials(node):
    """The directories the agent makes above its state directory (the demo's ``var/agents``)
    were made at its umask, 0755: every job listed the node's agents. They are 0711, as the
    state directory (the job users reach their own directories through it), whose credential
    and checkpoint key are 0600."""
    server, state_dir = node[0], node[1]
    var = state_dir / "var"
    var.mkdir(mode=0o711)  # as the demo's: traversable, not listable
    before = os.umask(0o022)  # the demo's agents' umask
    try:
        agent_state = state.prepare_state_dir(var / "agents" / "gpu-01")
    finally:
        os.umask(before)
    state.write_credential(agent_state, "tsr_node_credential")
    start(node, 37, ["python", "-c", STATE_SNOOP, str(var / "agents")])
    assert server.exit_of(37)["exit_code"] == 0, server.output(37)
    assert json.loads(first_line(server, 37)) == {
        "list the node's agents": "PermissionError",
        "list an agent's state": "PermissionError",
        "read its credential": "PermissionError",
        "read its checkpoint key": "PermissionError",
    }


def test_a_uid_is_never_handed_out_while_a_process_of_it_runs(tmp_path):
    """An agent dies holding a uid whose job still runs: another agent takes the uid only after
    killing that process; while the first one lived, the uid was not to be had at all."""
    script = DIES_HOLDING_A_UID.format(root=str(ROOT), locks=str(tmp_path))
    agent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    uid = None
    try:
        uid = int(agent.stdout.readline())
        assert fakes.wait_for(lambda: identity.processes_of({uid}), 5)
        lonely = UidPool(UidRange(uid, uid), lock_dir=tmp_path)
        with pytest.raises(identity.UidsExhausted):
            lonely.take(10, 0)  # held by a live agent
        agent.kill()
        agent.wait(5)
        assert identity.processes_of({uid}), "its job runs on after it"
        assert lonely.take(10, 0).uid == uid
        assert identity.processes_of({uid}) == {}  # killed before the uid was handed out
        assert lonely.give_back(10, 0) == 0
        assert (tmp_path / str(uid)).read_text() == ""  # given back clean
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.stdout.close()
        if uid is not None:
            identity.kill_uid(uid)


def test_replicas_of_one_attempt_share_its_uid_which_is_freed_after_the_last(tmp_path):
    pool = UidPool(identity.parse_range(identity.DEFAULT_RANGE), lock_dir=tmp_path)
    a, b = pool.take(11, 0), pool.take(11, 0)
    retry = pool.take(11, 1)
    assert a == b and retry.uid != a.uid
    assert pool.give_back(11, 0) == 0 and pool.uid_of(11, 0) == a.uid
    pool.give_back(11, 0)
    assert pool.uid_of(11, 0) is None


DEVICES = r"""
import json, sys
result = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            result[path] = f.read().decode()
    except OSError as exc:
        result[path] = type(exc).__name__
print(json.dumps(result))
"""


def test_a_job_can_open_only_its_own_gpus_device_files(node):
    server, state_dir, pool, box, path = node
    if not box.namespaces:
        pytest.skip("hiding device files needs a mount namespace")
    devices = {}
    for index in range(4):  # stand-ins for /dev/nvidia0..3: world-readable, as the real ones
        devices[index] = str(state_dir / f"nvidia{index}")
        Path(devices[index]).write_text(f"gpu{index}")
        os.chmod(devices[index], 0o666)
    gpus = sandbox.Sandbox(True, devices, box.keep)
    binding = fakes.binding(12, command=["python", "-c", DEVICES, *devices.values()], gpus=[1, 3])
    JobProcess(binding, server, state_dir, pool, path, sandbox=gpus).start()
    assert server.exit_of(12)["exit_code"] == 0
    opened = json.loads(server.output(12))
    assert opened == {
        devices[0]: "PermissionError",
        devices[1]: "gpu1",
        devices[2]: "PermissionError",
        devices[3]: "gpu3",
    }
    assert all(Path(p).read_text() == f"gpu{i}" for i, p in devices.items())  # the host's untouched


def test_an_agent_without_root_refuses_several_tenants_jobs_saying_why_unless_single_tenant(monkeypatch):
    """Without root (no uid to give each job) the agent runs no job, saying what it lacks and
    that ``--single-tenant`` runs them all as its own user, unsafe for sharing the node."""
    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    with pytest.raises(ValueError) as refused:
        identity.users_for(False, "nobody", identity.DEFAULT_RANGE)
    said = str(refused.value)
    assert "only a root agent" in said and "--single-tenant" in said and "unsafe" in said
    shared = identity.users_for(True, "nobody", identity.DEFAULT_RANGE)
    assert not shared.isolated and shared.take(1, 0) == shared.take(2, 0)


def test_a_range_that_holds_a_user_of_the_machine_is_refused_naming_it():
    nobody = 65534
    with pytest.raises(ValueError, match="nobody"):
        identity.check_range(UidRange(nobody - 10, nobody + 10))
    with pytest.raises(ValueError, match="FIRST-LAST"):
        identity.parse_range("lots")
    with pytest.raises(ValueError, match="within"):
        identity.parse_range("0-70000")
    with pytest.raises(ValueError, match="at most 262144 uids"):
        identity.parse_range("200000-600000")


def test_the_agent_refuses_a_bad_uid_range_before_it_registers(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--server", "http://127.0.0.1:9", "--simulate", "1xT4"]
        + ["--state-dir", str(tmp_path), "--job-uids", "65000-65600"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "nobody (65534)" in done.stderr and "Traceback" not in done.stderr


def test_a_jobs_loader_variables_never_reach_the_programs_that_run_as_root_before_it(node):
    """``LD_PRELOAD`` in a job's ``env`` would load a tenant's library (written by an earlier job of
    theirs) into the spawn chain's root programs: only the job's own command may see it."""
    server = node[0]
    env = {"LD_PRELOAD": "/nonexistent/tessera-evil.so", "LD_LIBRARY_PATH": "/nonexistent"}
    start(node, 13, ["python", "-c", "import os; print(os.environ['LD_PRELOAD'])"], env=env)
    assert server.exit_of(13)["exit_code"] == 0
    output = server.output(13).decode()
    # the loader complains once per program it was given to: the job's python alone
    assert output.count("cannot be preloaded") == 1, output
    assert output.endswith("/nonexistent/tessera-evil.so\n")


RESUME = r"""
import json, os, pathlib
ck = pathlib.Path(os.environ["TESSERA_CHECKPOINT_DIR"])
(ck / "steps").mkdir(exist_ok=True)
previous = sorted(p.name for p in (ck / "steps").iterdir())
(ck / "steps" / os.environ["TESSERA_ATTEMPT"]).write_text("x")
print(json.dumps([os.getuid(), previous]))
"""


def test_a_retry_resumes_from_the_checkpoint_its_earlier_attempt_left_under_another_uid(node):
    server = node[0]
    for attempt in (0, 1):
        start(node, 14, ["python", "-c", RESUME], attempt=attempt, log_offset=1000 * attempt)
        assert fakes.wait_for(lambda n=attempt + 1: len(server.exits) == n, 15)
        assert server.exits[-1]["exit_code"] == 0, server.output(14)
    (first_uid, first_saw), (second_uid, second_saw) = map(json.loads, server.output(14).splitlines())
    assert first_saw == [] and second_saw == ["0"]
    assert first_uid != second_uid  # each attempt its own uid, the checkpoint handed on


@pytest.fixture
def node_file():
    """A file of root's that every user may write (0666), on the file system of the agent's
    state directory (as a node's one disk holds /var/lib/tessera-agent and /etc alike)."""
    path = Path(f"/var/tessera-root-file-{os.getpid()}")
    path.write_text("root's\n")
    path.chmod(0o666)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


LINKS = r"""
import os, sys
try:
    os.link(sys.argv[1], os.path.join(os.environ["TESSERA_CHECKPOINT_DIR"], "model.ckpt"))
    print("linked", flush=True)
except OSError as exc:
    print(type(exc).__name__, flush=True)
"""


def test_a_file_a_job_links_into_its_checkpoint_stays_its_owners_when_the_next_attempt_takes_it(
    node_file, node
):
    """The next attempt of a job is handed its checkpoint (chown -R to its uid): a hard link the
    earlier one made there to a file of another owner that it may write (``protected_hardlinks``
    allows no more) was handed over too, and the file, root's, became the job uid's (which may
    then chmod it, or keep it when the uid goes to another tenant's job). Only what the earlier
    attempt's uid owned changes hands."""
    server = node[0]
    start(node, 15, ["python", "-c", LINKS, str(node_file)])
    assert fakes.wait_for(lambda: len(server.exits) == 1, 15)
    start(node, 15, ["python", "-c", "print('resumed')"], attempt=1, log_offset=1000)
    assert fakes.wait_for(lambda: len(server.exits) == 2, 15)
    assert server.exits[-1]["exit_code"] == 0, server.output(15)
    linked, resumed = server.output(15).decode().splitlines()
    # a mount namespace binds the state directory back (under /tmp here): EXDEV, another mount
    assert linked == ("OSError" if node[3].namespaces else "linked") and resumed == "resumed"
    assert (os.stat(node_file).st_uid, os.stat(node_file).st_gid) == (0, 0)
    assert node_file.read_text() == "root's\n"


KEEPS = r"""
import os, pathlib
pathlib.Path(os.environ["TESSERA_CHECKPOINT_DIR"], "model.ckpt").write_text("alice-weights")
print(os.getuid(), os.environ["TESSERA_CHECKPOINT_DIR"], flush=True)
"""

TAKES_OVER = (
    fakes.ATTEMPT
    + r"""
import json, os, sys
ck = sys.argv[1]

def write(path, text):
    with open(path, "w") as f:
        f.write(text)

print(json.dumps({
    "uid": os.getuid(),
    "list it": attempt(lambda: os.listdir(ck)),
    "read it": attempt(lambda: open(os.path.join(ck, "model.ckpt")).read()),
    "overwrite it": attempt(lambda: write(os.path.join(ck, "model.ckpt"), "poison")),
    "plant a file": attempt(lambda: write(os.path.join(ck, "planted.ckpt"), "poison")),
}))
"""
)


def test_a_later_job_given_the_same_uid_finds_nothing_of_an_ended_jobs_kept_checkpoint(node, tmp_path):
    """A checkpoint outlives its attempt (a week by default), and a uid is handed out again once
    its attempt has ended: the job that gets it next (another tenant's, after the range came
    round) owned alice's checkpoint, and knowing its path (a name no longer secret: a log, a
    shared file system's listing) read her weights and poisoned her next attempt's resume. The
    agent takes the directory back once no process of the uid is left; her retry gets it again."""
    server, state_dir, _, box, path = node
    lonely = UidPool(UidRange(270017, 270017), lock_dir=tmp_path)  # the range comes round at once

    def run(job_id: int, command: list[str], users: UidPool = lonely, **binding) -> None:
        process = JobProcess(
            fakes.binding(job_id, command=command, **binding), server, state_dir, users, path, sandbox=box
        )
        process.start()
        assert fakes.wait_for(process.done.is_set, 20)
        assert server.exits[-1]["exit_code"] == 0, server.output(job_id)

    run(40, ["python", "-c", KEEPS])
    uid, checkpoint = server.output(40).decode().split()
    run(41, ["python", "-c", TAKES_OVER, checkpoint])
    results = json.loads(server.output(41))
    assert results.pop("uid") == int(uid)  # the same uid: the test proves something
    assert {attack: result for attack, result in results.items() if result == "succeeded"} == {}
    run(40, ["python", "-c", RESUME_READS], users=node[2], attempt=1, log_offset=1000)
    assert server.output(40).decode().splitlines()[1] == "alice-weights ['model.ckpt']"


RESUME_READS = r"""
import os, pathlib
ck = pathlib.Path(os.environ["TESSERA_CHECKPOINT_DIR"])
print((ck / "model.ckpt").read_text(), sorted(os.listdir(ck)), flush=True)
"""


CGROUPS = (
    fakes.ATTEMPT
    + r"""
import json, os, sys
root = sys.argv[1]
parents = [os.path.join(root, c, "tessera") for c in ("", "cpu", "memory")]
parents = [p.rstrip("/") for p in parents if os.path.isdir(p)]
seen = {}
def look(parent):
    seen[parent] = {n: open(os.path.join(parent, n, "cgroup.procs")).read().split()
                    for n in os.listdir(parent) if os.path.isdir(os.path.join(parent, n))}
results = {f"list {p}": attempt(lambda p=p: look(p)) for p in parents}
# its own cgroup (a runtime reading its limits) stays in reach: named in /proc/self/cgroup
own = {}
for line in open("/proc/self/cgroup").read().splitlines():
    _, controllers, path = line.split(":", 2)
    for c in (controllers.split(",") if controllers else [""]):
        if path.startswith("/tessera/"):
            own[c] = os.path.exists(os.path.join(root, c, path.lstrip("/"), "cgroup.procs"))
print(json.dumps({"results": results, "seen": seen, "own": own}))
"""
)


def test_a_job_cannot_list_the_nodes_job_cgroups_to_learn_other_jobs_names_and_pids(node):
    """Every replica with limits has a cgroup named after its working directory (the random part
    that keeps the directory's path unguessable), and each cgroup's ``cgroup.procs`` lists its
    pids: readable by all, a job listed every other job's working directory and processes, which
    its private ``/proc`` hides. Now the jobs' cgroups' parent is 0711: a job reaches its own
    cgroup (by the path ``/proc/self/cgroup`` names) and lists none."""
    server, state_dir, pool, box, path = node
    found = cgroups.detect()
    if found is None:
        pytest.skip("no usable cgroups on this machine")

    def run(job_id: int, command: list[str]) -> JobProcess:
        binding = fakes.binding(job_id, command=command, cpus=1, memory_gib=1)
        process = JobProcess(binding, server, state_dir, pool, path, sandbox=box, cgroups=found)
        process.start()
        return process

    alice = run(50, ["python", "-c", ALICE_SERVES])
    first_line(server, 50)
    run(51, ["python", "-c", CGROUPS, str(cgroups.DEFAULT_ROOT)])
    assert server.exit_of(51)["exit_code"] == 0, server.output(51)
    said = json.loads(server.output(51))
    assert said["results"] and set(said["results"].values()) == {"PermissionError"}, said
    assert said["own"] and all(said["own"].values()), said
    Path(alice.workdir, "done").touch()
    assert server.exit_of(50)["exit_code"] == 0


DEEP = r"""
import os
for top in (os.getcwd(), os.environ["TESSERA_CHECKPOINT_DIR"]):
    os.chdir(top)
    for _ in range(3000):  # each mkdir a short path: no limit of the kernel's is near
        os.mkdir("d")
        os.chdir("d")
print("deep", flush=True)
"""


def deep_tree(top: Path, levels: int = 3000) -> None:
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
    finally:
        os.close(fd)


def test_a_tree_thousands_of_levels_deep_is_removed_and_handed_over_like_any_other(node):
    """A job makes a directory tree 3,000 levels deep in its working directory and its checkpoint
    (a loop of mkdir and chdir). The agent's walks recursed once per level: the supervisor died
    of RecursionError removing the working directory (the replica never ended in the agent's
    books, its cgroup and directory stayed), the retry's start raised it out of the agent's main
    loop, and so did the next agent's start cleaning up and the checkpoints' sweep: a node that
    crashes at every start until someone removes the tree by hand."""
    server, state_dir = node[0], node[1]
    first = start(node, 60, ["python", "-c", DEEP])
    assert server.exit_of(60)["exit_code"] == 0, server.output(60)
    assert fakes.wait_for(first.done.is_set, 30), "its supervisor died before the end"
    assert not first.workdir.exists()
    retry = start(node, 60, ["python", "-c", "print('resumed')"], attempt=1, log_offset=1000)
    assert fakes.wait_for(retry.done.is_set, 30)
    assert server.exits[-1]["exit_code"] == 0 and server.output(60).endswith(b"resumed\n")
    # what a killed agent leaves: its next start cleans it up, and the sweep takes the checkpoint
    left = state_dir / "jobs" / "61-0-0-0123456789abcdef"
    left.mkdir()
    deep_tree(left)
    state.clean_jobs(state_dir)
    assert os.listdir(state_dir / "jobs") == []
    old = time.time() - 3 * 3600
    os.utime(retry.checkpoint_dir, (old, old))
    assert state.sweep_checkpoints(state_dir, retention_s=3600, ended={60: old}) == [60]
    assert not retry.checkpoint_dir.exists()


def test_a_retry_whose_checkpoint_is_not_on_its_node_is_told_it_starts_from_the_beginning(node):
    # The earlier attempt checkpointed elsewhere; checkpoints are node-local (no --checkpoint-root)
    server = node[0]
    start(node, 15, ["true"], attempt=1, last_checkpoint_at="2026-12-02T12:00:00+00:00")
    assert fakes.wait_for(lambda: len(server.exits) == 1, 15)
    assert "its checkpoint is not on this node" in server.output(15).decode(), server.output(15)
    assert "this attempt starts from the beginning" in server.output(15).decode()


def test_checkpoints_go_after_their_retention_but_never_while_their_job_runs_here(node):
    server, state_dir = node[0], node[1]
    for job_id in (15, 16, 17):
        start(node, job_id, ["true"])
        assert server.exit_of(job_id)["exit_code"] == 0
    checkpoints = state_dir / "checkpoints"
    assert len(os.listdir(checkpoints)) == 3  # a job's checkpoints outlive its attempt
    old = time.time() - 3 * 3600
    for name in os.listdir(checkpoints):
        if not name.startswith("17-"):
            os.utime(checkpoints / name, (old, old))
    removed = state.sweep_checkpoints(state_dir, retention_s=3600, keep={16})
    assert removed == [15]
    assert sorted(n.split("-")[0] for n in os.listdir(checkpoints)) == ["16", "17"]


NETWORK = r"""
import json, socket, sys, threading

def connect(port):
    s = socket.socket()
    s.settimeout(1.0)
    try:
        s.connect(("127.0.0.1", port))
        return "connected: " + s.recv(64).decode()
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()

own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen()
def serve():
    conn, _ = own.accept()
    conn.sendall(b"me")
    conn.close()
threading.Thread(target=serve, daemon=True).start()
node, alices, allowed = map(int, sys.argv[1:])
print(json.dumps({
    "the node's service": connect(node),
    "alice's job's server": connect(alices),
    "an allowed port": connect(allowed),
    "its own server": connect(own.getsockname()[1]),
}))
"""

ALICE_SERVES = r"""
import os, socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
srv.settimeout(0.1)
print(srv.getsockname()[1], flush=True)
while not os.path.exists("done"):
    try:
        conn, _ = srv.accept()
        conn.sendall(b"alice")
        conn.close()
        print("served someone", flush=True)
    except TimeoutError:
        pass
"""


@pytest.fixture
def root_servers():
    """Two services of the node, listening as root on its loopback; the second one allowed."""
    import socketserver
    import threading

    class Hello(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall(b"node")

    servers = [socketserver.ThreadingTCPServer(("127.0.0.1", 0), Hello) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [server.server_address[1] for server in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def loopback_rules(pool: UidPool, allowed: list[int]):
    """An agent's loopback rules (its chain in the range's table), told of its pool's uids."""
    try:
        rules = firewall.install(pool.ids, allowed)
    except firewall.Unavailable as exc:
        pytest.skip(str(exc))
    pool.watcher = rules
    try:
        yield rules
    finally:
        pool.watcher = None
        rules.close()


def test_a_job_reaches_neither_the_nodes_services_nor_another_jobs_but_its_own_and_allowed_ones(
    node, root_servers
):
    service, allowed = root_servers
    # Another agent of the machine starts after this one, allowing only the service (and the
    # common rules are rewritten): what this agent's jobs may reach does not change.
    with loopback_rules(node[2], [allowed]), loopback_rules(identity.UidPool(node[2].ids), [service]):
        check_what_a_job_reaches(node, service, allowed)


def uids_with_a_rule(ids: UidRange) -> set[int]:
    """The uids the range's table sends to an agent's chain (its map's keys)."""
    listed = subprocess.run(
        ["nft", "-j", "list", "map", "inet", firewall.table_name(ids), "agents"],
        capture_output=True,
        text=True,
        check=True,
    )
    (entry,) = [e["map"] for e in json.loads(listed.stdout)["nftables"] if "map" in e]
    return {key for key, _verdict in entry.get("elem", [])}


FORWARDED = r"""
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from agent import firewall, identity
node, service, port, uid, python, probe = sys.argv[2:]
firewall.install(identity.UidRange(int(uid), int(uid)), [])
# As Docker publishes a container's port (and Kubernetes a hostPort): the node's own address,
# and its loopback (Docker without its userland proxy), forwarded to a service elsewhere.
subprocess.run(["sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1"], check=True)
nat = f'''table ip tessera_test_nat {{
  chain output {{ type nat hook output priority -100;
    ip daddr {node} tcp dport 7001 dnat to {service}:{port}
    ip daddr 127.0.0.1 tcp dport 7002 dnat to {service}:{port}
  }}
  chain postrouting {{ type nat hook postrouting priority 100; ip saddr 127.0.0.0/8 masquerade; }}
}}'''
subprocess.run(["nft", "-f", "-"], input=nat, text=True, check=True)
targets = {"the node's address, forwarded": [node, 7001], "its loopback, forwarded": ["127.0.0.1", 7002],
           "the service's own address": [service, int(port)]}
done = subprocess.run([python, "-c", probe, json.dumps(targets)], capture_output=True, text=True,
                      user=int(uid), group=int(uid), extra_groups=[], timeout=30)
print(done.stdout or done.stderr)
"""

PROBES = r"""
import json, socket, sys
def connect(address, port):
    try:
        with socket.create_connection((address, port), timeout=2.0) as s:
            return "connected: " + s.recv(16).decode()
    except OSError as exc:
        return type(exc).__name__
print(json.dumps({name: connect(*target) for name, target in json.loads(sys.argv[1]).items()}))
"""


def test_a_nodes_port_forwarded_elsewhere_is_as_far_out_of_a_jobs_reach_as_its_loopback():
    """A service published on the node's own addresses by destination NAT (Docker's published
    ports, the control plane's database in a container on a small install; a Kubernetes
    hostPort) was a job's for the asking: the connection to a local address was let through
    (it still leaves on "lo" in the output hook) and its answer, from the service elsewhere,
    never passes there to be judged. Now a job's connection that NAT sent off the node is
    refused; the service's own address is traffic leaving the node, untouched."""
    import socketserver
    import threading

    from tests import netns

    class Hello(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall(b"db")

    try:
        net = netns.Network.create(["node"])
    except netns.Unavailable as exc:
        pytest.skip(str(exc))
    # The container's service: outside the node's namespace, reached over the network.
    db = socketserver.ThreadingTCPServer((net.server_address, 0), Hello)
    threading.Thread(target=db.serve_forever, daemon=True).start()
    service = db.server_address[1]
    try:
        python = shutil.which("python3", path=sandbox.SAFE_PATH)  # one a job's uid can run
        assert python is not None
        helper = [sys.executable, "-c", FORWARDED, str(ROOT), net.addresses["node"], net.server_address]
        helper += [str(service), "270031", python, PROBES]
        done = subprocess.run(net.argv("node", helper), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {
            "the node's address, forwarded": "ConnectionRefusedError",
            "its loopback, forwarded": "ConnectionRefusedError",
            "the service's own address": "connected: db",
        }
    finally:
        db.shutdown()
        db.server_close()
        net.close()


def test_an_agent_allowing_no_port_adds_no_rule_and_clears_a_dead_agents_from_its_uid(tmp_path):
    """A dead agent that allowed a port left its uid pointing at its chain: the next agent that
    claims the uid, allowing none, takes that away (its job must not reach the dead one's port),
    and adds nothing of its own, on that claim or a clean one."""
    ids = UidRange(270001, 270001)  # outside the default range: a table of its own
    try:
        dead = firewall.install(ids, [5999])
    except firewall.Unavailable as exc:
        pytest.skip(str(exc))
    plain = firewall.install(ids, [])
    try:
        dead.claimed(270001, stale=False)
        (tmp_path / "270001").write_text("4242\n")  # its holder died holding it
        assert uids_with_a_rule(ids) == {270001}
        pool = UidPool(ids, lock_dir=tmp_path)
        pool.watcher = plain
        assert pool.take(2, 0).uid == 270001
        assert uids_with_a_rule(ids) == set()
        pool.give_back(2, 0)
        assert pool.take(3, 0).uid == 270001  # a clean claim
        assert uids_with_a_rule(ids) == set()
        pool.give_back(3, 0)
        assert (tmp_path / "270001").read_text() == ""
    finally:
        subprocess.run(["nft", "delete", "table", "inet", firewall.table_name(ids)], check=False)


def check_what_a_job_reaches(node, service: int, allowed: int) -> None:
    server = node[0]
    alice = start(node, 18, ["python", "-c", ALICE_SERVES])
    alices = int(first_line(server, 18))
    start(node, 19, ["python", "-c", NETWORK, str(service), str(alices), str(allowed)])
    assert server.exit_of(19)["exit_code"] == 0, server.output(19)
    assert json.loads(server.output(19)) == {
        "the node's service": "TimeoutError",
        "alice's job's server": "TimeoutError",
        "an allowed port": "connected: node",
        "its own server": "connected: me",
    }
    Path(alice.workdir, "done").touch()
    assert server.exit_of(18)["exit_code"] == 0
    assert b"served someone" not in server.output(18)  # the connection never reached her server


PROBE_FROM_A_PORT = r"""
import json, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.settimeout(1.0)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
    said = "connected"
except OSError as exc:
    said = type(exc).__name__
print(json.dumps({"port": s.getsockname()[1], "said": said}), flush=True)
s.close()
"""


def test_a_jobs_refused_connection_leaves_nothing_that_blocks_the_node_from_its_own_service(
    node, root_servers
):
    """A job's connection to a node service is refused by dropping the answer; the connection's
    kernel record outlived it, still marked as the job's, so the node's own next connection
    from the same port (the kernel hands ports out again; a job may pick one on purpose, and
    a hostile one could cover them all) had its answers dropped too: a minute of timeouts for
    whatever the node runs, PostgreSQL's clients included. Now the first packet another uid
    sends on that record clears the job's mark (and the refusal resets the listener's half-open
    connection): the node's client connects at once."""
    server = node[0]
    service, _allowed = root_servers
    with loopback_rules(node[2], []):
        start(node, 21, ["python", "-c", PROBE_FROM_A_PORT, str(service)])
        assert server.exit_of(21)["exit_code"] == 0, server.output(21)
        probe = json.loads(first_line(server, 21))
        assert probe["said"] == "TimeoutError"  # refused: the job never reached the service
        began = time.monotonic()
        with socket.socket() as own:  # the node's own client (root), from the port the job used
            own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            own.bind(("127.0.0.1", probe["port"]))
            own.settimeout(10.0)
            own.connect(("127.0.0.1", service))
            assert own.recv(64) == b"node"
        assert time.monotonic() - began < 3.0


FLOOD = r"""
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for _ in range(n):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    s.close()
print("tried", n, flush=True)
"""


def table_state(ids: UidRange) -> list[dict]:
    """The range's table as nft lists it (rules, sets and maps with their elements)."""
    listed = subprocess.run(
        ["nft", "-j", "list", "table", "inet", firewall.table_name(ids)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(listed.stdout)["nftables"]


def test_a_jobs_flood_of_refused_connections_leaves_no_state_that_could_fill_up(node, root_servers):
    """Refused connections are judged by their mark alone: nothing per connection is kept in
    the rules, so no number of attempts fills anything that other jobs' connections need (a
    set of pending connections, once full, had every job of the node refused its own)."""
    server = node[0]
    service, allowed = root_servers
    with loopback_rules(node[2], [allowed]):
        before = table_state(node[2].ids)
        start(node, 22, ["python", "-c", FLOOD, str(service), "2000"])
        assert server.exit_of(22)["exit_code"] == 0, server.output(22)
        assert table_state(node[2].ids) == before
        check_what_a_job_reaches(node, service, allowed)


def test_a_fork_bomb_stops_at_its_uids_limit_and_harms_only_its_own_job(node):
    server, state_dir, pool, box, path = node
    bounded = sandbox.Sandbox(box.namespaces, keep=box.keep, max_tasks=30)
    forks = fakes.binding(20, command=["python", "-c", fakes.FORK_BOMB])
    bomb = JobProcess(forks, server, state_dir, pool, path, sandbox=bounded)
    bomb.start()
    assert server.exit_of(20)["exit_code"] == 0, server.output(20)
    children, error = server.output(20).decode().splitlines()[0].split()  # then the agent's note
    assert int(children) < 30 and error == "BlockingIOError"  # EAGAIN: its uid's limit
    # the bomb's children were killed with it; another job forks as it would have alone
    assert identity.processes_of({bomb.run_as.uid}) == {}
    start(node, 21, ["python", "-c", "import subprocess; print(subprocess.run(['true']).returncode)"])
    assert server.exit_of(21)["exit_code"] == 0 and server.output(21) == b"0\n"


OPENS = r"""
import json, os, sys
result = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        result[path] = "opened"
    except OSError as exc:
        result[path] = type(exc).__name__
print(json.dumps(result))
"""


@pytest.mark.gpu
def test_on_a_gpu_node_a_job_opens_only_its_own_gpus_device_files(node):
    """The real ``/dev/nvidiaN`` (N: NVML's minor number): a job given GPU 0 opens that one and no
    other; a CPU-only job opens none. (One GPU is enough for the second half.)"""
    from agent.inventory import ModelMap, NoGPUs, nvml_inventory

    try:
        inventory = nvml_inventory("gpu-check", ModelMap())
    except NoGPUs as exc:
        pytest.skip(str(exc))
    server, state_dir, pool, box, path = node
    if not box.namespaces:
        pytest.skip("hiding device files needs a mount namespace")
    devices = {d.index: d.device_file for d in inventory.devices if d.device_file}
    assert devices, "NVML gave no device file"
    gpus = sandbox.Sandbox(True, devices, box.keep)
    for job_id, mine in ((40, [0]), (41, [])):
        binding = fakes.binding(job_id, command=["python", "-c", OPENS, *devices.values()], gpus=mine)
        JobProcess(binding, server, state_dir, pool, path, sandbox=gpus).start()
        assert server.exit_of(job_id)["exit_code"] == 0, server.output(job_id)
        opened = json.loads(server.output(job_id))
        assert opened == {p: "opened" if i in mine else "PermissionError" for i, p in devices.items()}


RENDEZVOUS = r"""
import os, pathlib, socket, sys, time
port_file = pathlib.Path(sys.argv[1])
if os.environ["TESSERA_REPLICA"] == "0":  # the rendezvous server, as torch.distributed's
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port_file.write_text(str(server.getsockname()[1]))
    conn, _ = server.accept()
    print(conn.recv(16).decode())
else:
    while not port_file.exists() or not port_file.read_text():
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", int(port_file.read_text())), timeout=5) as s:
        s.sendall(b"rank 1 here")
    print("sent")
"""


def test_the_replicas_of_one_attempt_on_a_node_share_its_uid_and_reach_each_other(node):
    server, state_dir, pool, box, path = node
    with loopback_rules(pool, []):
        replicas_meet(node)


def replicas_meet(node) -> None:
    server, state_dir, pool, box, path = node
    shared = state_dir / "rendezvous"  # stands in for the address a launcher would pass
    shared.mkdir()
    replicas = []
    for replica in (0, 1):
        binding = fakes.binding(
            22, command=["python", "-c", RENDEZVOUS, str(shared / "port")], replica=replica
        )
        binding["replicas"] = 2
        replicas.append(JobProcess(binding, server, state_dir, pool, path, sandbox=box))
    os.chmod(shared, 0o777)  # for the test's hand-over only
    for process in replicas:
        process.start()
    assert fakes.wait_for(lambda: len(server.exits) == 2, 20), server.calls
    assert [e["exit_code"] for e in server.exits] == [0, 0]
    assert server.output(22, 0) == b"rank 1 here\n" and server.output(22, 1) == b"sent\n"
    assert replicas[0].run_as == replicas[1].run_as


REPLICA_REACHES = r"""
import json, os, pathlib, signal, socket, sys, time
shared, name = pathlib.Path(sys.argv[1]), "\0tessera-replica-0-of-" + sys.argv[2]
if os.environ["TESSERA_REPLICA"] == "0":
    ipc = socket.socket(socket.AF_UNIX)
    ipc.bind(name)
    ipc.listen()
    (shared / "pid").write_text(str(os.getpid()))
    while not (shared / "done").exists():
        time.sleep(0.05)
    print("alive")
else:
    while not (shared / "pid").exists() or not (shared / "pid").read_text():
        time.sleep(0.05)
    result = {}
    try:
        socket.socket(socket.AF_UNIX).connect(name)
        result["connect to replica 0's abstract socket"] = "succeeded"
    except OSError as exc:
        result["connect to replica 0's abstract socket"] = type(exc).__name__
    try:
        os.kill(int((shared / "pid").read_text()), signal.SIGTERM)
        result["signal replica 0"] = "succeeded"
    except OSError as exc:
        result["signal replica 0"] = type(exc).__name__
    print(json.dumps(result))
    (shared / "done").touch()
"""


def test_replicas_of_one_attempt_on_a_node_share_its_uid_but_not_abstract_sockets_or_signals(node):
    """Each replica is a Landlock domain of its own (as it has its own /dev/shm): replica 1 can
    neither connect to replica 0's abstract unix socket nor signal it, though both run as one uid
    (replicas on one node talk over TCP: the test above)."""
    server, state_dir, pool, box, path = node
    if sandbox.scope_unavailable() is not None:
        pytest.skip(f"no Landlock scopes: {sandbox.scope_unavailable()}")
    scoped = sandbox.Sandbox(box.namespaces, keep=box.keep, scoped=True)
    shared = state_dir / "replicas"
    shared.mkdir()
    os.chmod(shared, 0o777)  # for the test's hand-over only
    replicas = []
    for replica in (0, 1):
        command = ["python", "-c", REPLICA_REACHES, str(shared), str(os.getpid())]
        binding = fakes.binding(25, command=command, replica=replica, replicas=2)
        replicas.append(JobProcess(binding, server, state_dir, pool, path, sandbox=scoped))
    for process in replicas:
        process.start()
    assert fakes.wait_for(lambda: len(server.exits) == 2, 20), server.calls
    assert replicas[0].run_as == replicas[1].run_as
    assert json.loads(server.output(25, 1)) == {
        "connect to replica 0's abstract socket": "PermissionError",
        "signal replica 0": "PermissionError",
    }
    assert [e["exit_code"] for e in server.exits] == [0, 0] and server.output(25, 0) == b"alive\n"


UNIX_CONNECT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
try:
    s.connect(sys.argv[1])
    print("connected:", s.recv(16).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


def test_a_local_services_unix_socket_is_out_of_a_jobs_sight(node):
    """PostgreSQL's socket is open to every user by default; with local "trust" authentication it
    is the whole database. In a job's mount namespace such directories are empty."""
    import socketserver
    import threading

    server, state_dir, pool, box, path = node
    if not box.namespaces:
        pytest.skip("hiding a directory needs a mount namespace")
    services = state_dir / "services"
    services.mkdir(mode=0o755)

    class Hello(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall(b"db")

    service = socketserver.ThreadingUnixStreamServer(str(services / ".s.PGSQL.5432"), Hello)
    os.chmod(services / ".s.PGSQL.5432", 0o777)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    try:
        for job_id, hide in ((23, []), (24, [services])):
            box_ = sandbox.Sandbox(True, keep=box.keep, hide=hide)
            binding = fakes.binding(
                job_id, command=["python", "-c", UNIX_CONNECT, str(services / ".s.PGSQL.5432")]
            )
            JobProcess(binding, server, state_dir, pool, path, sandbox=box_).start()
            assert server.exit_of(job_id)["exit_code"] == 0
        assert server.output(23) == b"connected: db\n"  # without hiding: the test could fail
        assert server.output(24) == b"FileNotFoundError\n"
    finally:
        service.shutdown()
        service.server_close()


def test_a_jobs_command_tells_it_nothing_of_whether_a_path_it_may_not_see_exists(node, tmp_path):
    server = node[0]
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)  # root's, as /root, or another job's private /tmp seen through /proc
    (private / "id_rsa").write_text("secret\n")
    (private / "id_rsa").chmod(0o600)
    start(node, 60, [str(private / "id_rsa")])
    start(node, 61, [str(private / "no-such-file")])
    there, absent = server.exit_of(60), server.exit_of(61)
    assert (there["exit_code"], there["reason"]) == (absent["exit_code"], absent["reason"])
    assert there["reason"] != "spawn-failed"  # its own exec, as its user, said why
    assert b"No such file" not in server.output(61)

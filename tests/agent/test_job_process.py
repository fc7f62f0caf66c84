"""A job's process on the node: environment, user, output with offsets, time limits, stop orders.

These run real processes; only the control plane is replaced by a recording fake (the HTTP edge).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent import process as process_module
from agent import sandbox as sandbox_module
from agent import state as state_module
from agent.identity import RunAs, resolve_run_as
from agent.process import JobProcess, job_path
from tests.agent import fakes
from tests.agent.agent_process import alive


@pytest.fixture(params=["setpriv", "fork"])
def spawn(request, monkeypatch) -> str:
    """Each test runs both ways a job is spawned: behind ``setpriv`` (vfork), and without it (the
    agent forks and sets the parent-death signal itself), as on a machine without ``setpriv``."""
    if request.param == "fork":
        monkeypatch.setattr(sandbox_module, "setpriv", lambda: None)
    elif not sandbox_module.setpriv():
        pytest.skip("no setpriv with --pdeathsig on this machine")
    return request.param


@pytest.fixture
def node(spawn):
    """(fake server, state dir, run-as user, job PATH), with a secret in the agent's environment."""
    os.environ["TESSERA_JOIN_TOKEN"] = "join-secret-never-in-jobs"
    try:
        with fakes.job_user_state_dir() as state_dir:
            (state_dir / "credential").write_text("node-credential-never-in-jobs")
            run_as = resolve_run_as("nobody")
            yield fakes.FakeServer(), state_dir, run_as, job_path(state_dir, run_as)
    finally:
        os.environ.pop("TESSERA_JOIN_TOKEN", None)


def start(node, **binding) -> tuple[JobProcess, object]:
    server, state_dir, run_as, path = node
    process = JobProcess(fakes.binding(**binding), server, state_dir, run_as, path)
    process.start()
    return process, server


def test_the_job_sees_its_gpus_and_ids_but_never_the_agents_secrets(node):
    script = "import os, json; print(json.dumps(dict(os.environ)))"
    process, server = start(
        node,
        job_id=11,
        attempt=2,
        gpus=[3, 5],
        env={"WANDB_MODE": "offline"},
        command=["python", "-c", script],
    )
    assert server.exit_of(11)["exit_code"] == 0

    job_env = json.loads(server.output(11))
    assert job_env["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert (job_env["TESSERA_JOB_ID"], job_env["TESSERA_ATTEMPT"]) == ("11", "2")
    assert re.search(r"/checkpoints/11-[0-9a-f]{32}$", job_env["TESSERA_CHECKPOINT_DIR"])
    assert job_env["WANDB_MODE"] == "offline"
    text = json.dumps(job_env)
    assert "join-secret-never-in-jobs" not in text and "node-credential-never-in-jobs" not in text
    assert not {k for k in job_env if "TOKEN" in k or "CREDENTIAL" in k}
    assert "DJANGO_SETTINGS_MODULE" not in job_env  # a clean environment, not the agent's
    # Its locale is its own environment's (the chain before it runs without one).
    assert job_env["LANG"] == "C.UTF-8" and not {k for k in job_env if k.startswith("LC_")}


def test_an_environment_larger_than_a_pipe_holds_by_default_reaches_the_job_whole(node):
    """Behind the chain it comes through a pipe, written at once: one past 64 KiB too."""
    env = {f"BIG{i}": f"{i}" * 60_000 for i in range(3)}
    process, server = start(node, job_id=19, env=env, command=["sh", "-c", 'echo "$BIG0$BIG1$BIG2" | wc -c'])
    assert server.exit_of(19)["exit_code"] == 0, server.output(19)
    assert server.output(19).strip() == b"180001"


def test_the_job_cannot_override_its_gpus_or_ids(node):
    process, server = start(
        node,
        job_id=12,
        gpus=[1],
        env={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "TESSERA_JOB_ID": "999"},
        command=["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $TESSERA_JOB_ID"'],
    )
    server.exit_of(12)
    assert server.output(12) == b"1 12\n"


ODD_VALUES = {
    "QUOTES": "it's \"quoted\" and '' and '\\''",
    "SHELL": "$HOME ${PATH} $(id) `id` ; exit 3 & | > /tmp/x",
    "LINES": "first\n  second\t\\n\n",
    "TEXT": "héllo ✓",
    "EMPTY": "",
}


def test_the_jobs_own_environment_arrives_as_given_whatever_its_text(node):
    # Behind setpriv the job's shell sources it (agent/sandbox.py, step 5): quoting must keep it.
    names = sorted(ODD_VALUES)
    script = f"import os, json; print(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))"
    process, server = start(node, job_id=19, env=ODD_VALUES, command=["python", "-c", script])
    assert server.exit_of(19)["exit_code"] == 0, server.output(19)
    assert json.loads(server.output(19)) == ODD_VALUES


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs an agent running as root")
def test_a_job_of_a_root_agent_runs_as_an_unprivileged_user(node):
    process, server = start(node, job_id=13, command=["sh", "-c", "id -u; id -g; pwd; touch ok && echo w"])
    assert server.exit_of(13)["exit_code"] == 0
    uid, gid, cwd, wrote = server.output(13).decode().split()
    assert uid != "0" and int(uid) == node[2].uid and gid != "0"
    assert re.search(r"/jobs/13-0-0-[0-9a-f]{16}$", cwd) and wrote == "w"


def test_the_credential_file_is_private_to_the_agent(node):
    from agent.state import read_credential, write_credential

    server, state_dir, run_as, _ = node
    path = write_credential(state_dir, "secret-cred")
    assert path.stat().st_mode & 0o777 == 0o600 and read_credential(state_dir) == "secret-cred"
    process, server = start(node, job_id=14, command=["sh", "-c", f"cat {path} || echo denied"])
    server.exit_of(14)
    if run_as.uid is not None:
        assert b"secret-cred" not in server.output(14) and b"denied" in server.output(14)


def test_output_is_streamed_in_chunks_with_byte_offsets(node):
    script = "import time\nfor i in range(3):\n    print('line', i, flush=True); time.sleep(0.4)"
    process, server = start(node, job_id=15, command=["python", "-c", script], log_offset=100)
    server.exit_of(15)
    chunks = server.chunks[(15, 0)]
    assert len(chunks) >= 2, chunks  # streamed while running, not all at the exit
    offsets = [o for o, _ in chunks]
    assert offsets[0] == 100  # continues where the previous attempt's output ended
    for (offset, data), (next_offset, _) in zip(chunks, chunks[1:], strict=False):
        assert next_offset == offset + len(data)
    assert server.output(15) == b"line 0\nline 1\nline 2\n"
    kinds = [c[0] for c in server.calls]
    assert kinds.index("started") < kinds.index("logs") and kinds[-1] == "exited"


def test_a_nonzero_exit_code_is_reported(node):
    process, server = start(node, job_id=16, command=["sh", "-c", "echo bye >&2; exit 3"])
    reported = server.exit_of(16)
    reported.pop("started_at", None)  # it ended at once: its exit report carried its start
    assert reported == {"job_id": 16, "attempt": 0, "replica": 0, "exit_code": 3, "reason": ""}
    assert server.output(16) == b"bye\n"  # stderr is in the same stream


@pytest.mark.parametrize("command", [["/no/such/program"], ["no-such-program"], ["./missing.sh"]])
def test_a_command_that_cannot_start_is_reported_as_exit_127_with_the_reason_in_its_log(node, command):
    process, server = start(node, job_id=17, command=command)
    reported = server.exit_of(17)
    assert (reported["exit_code"], reported["reason"]) == (127, "spawn-failed")
    assert b"could not start" in server.output(17) and b"No such file or directory" in server.output(17)


def test_a_command_is_found_through_the_jobs_own_path_and_relative_to_its_directory(node, monkeypatch):
    server, state_dir, run_as, path = node
    tools = state_dir / "tools"
    tools.mkdir(mode=0o755)
    (tools / "hello-tessera").write_text("#!/bin/sh\necho from-path\n")
    (tools / "hello-tessera").chmod(0o755)
    start(node, job_id=22, env={"PATH": f"{tools}:{path}"}, command=["hello-tessera"])
    made = process_module._new_workdir

    def with_script(workdir: Path, owner: RunAs) -> None:  # as if the job had put it there
        made(workdir, owner)
        (workdir / "run.sh").write_text("#!/bin/sh\necho from-workdir\n")
        (workdir / "run.sh").chmod(0o755)

    monkeypatch.setattr(process_module, "_new_workdir", with_script)
    process = JobProcess(fakes.binding(23, command=["./run.sh"]), server, state_dir, run_as, path)
    process.start()
    assert server.exit_of(22)["exit_code"] == 0 and server.output(22) == b"from-path\n"
    assert server.exit_of(23)["exit_code"] == 0 and server.output(23) == b"from-workdir\n"


def test_a_job_that_closes_its_output_early_is_still_watched_to_its_exit(node):
    script = "echo early; exec >&- 2>&-; sleep 0.6; exit 4"
    process, server = start(node, job_id=24, command=["sh", "-c", script])
    reported = server.exit_of(24, timeout=10)
    assert (reported["exit_code"], reported["reason"]) == (4, "")
    assert server.output(24) == b"early\n"
    assert [c[0] for c in server.calls].count("started") == 1  # it ran past the quick exit


def test_a_job_whose_escaped_child_keeps_its_output_open_is_reported_after_a_moment(node):
    process, server = start(node, job_id=25, command=["sh", "-c", "setsid sleep 30 & echo $!"])
    pid = int(fakes.wait_for(lambda: server.output(25).strip(), 10) or 0)
    try:
        began = time.monotonic()
        assert server.exit_of(25, timeout=10)["exit_code"] == 0
        assert time.monotonic() - began < 5  # ~2 s: it does not wait for the escaped child
        assert process.done.wait(5)
    finally:
        os.kill(pid, 9)


AGENT_THEN_KILLED = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from agent import sandbox
from agent.identity import RunAs, resolve_run_as
from agent.process import JobProcess, job_path
from tests.agent.fakes import FakeServer, binding
if {fork!r}:
    sandbox.setpriv = lambda: None
state, run_as = Path({state!r}), resolve_run_as("nobody")
job = JobProcess(binding(30, command=["sleep", "60"]), FakeServer(), state, run_as, job_path(state, run_as))
job.start()
print(job.pid, flush=True)
time.sleep(60)
"""


def test_a_job_dies_with_its_agent(node, spawn):
    """SIGKILL the agent (no shutdown of its own): the kernel kills its jobs (PR_SET_PDEATHSIG)."""
    import signal
    import subprocess
    import sys

    state_dir = node[1]
    script = AGENT_THEN_KILLED.format(
        root=str(Path(__file__).resolve().parents[2]), fork=spawn == "fork", state=str(state_dir)
    )
    agent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        pid = int(agent.stdout.readline())
        # Until the command runs, its parent-death signal may not be set yet (with setpriv, or
        # with the agent's own fork alike): the guarantee is for a job that runs.
        assert fakes.wait_for(lambda: _command_of(pid) == b"sleep\x0060\x00", 5), "the job did not start"
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(10)
        assert fakes.wait_for(lambda: not alive(pid), 5), "the job outlived its agent"
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.stdout.close()


def _command_of(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


def test_a_job_past_its_time_limit_is_stopped_and_reported_as_time_limit(node):
    began = time.monotonic()
    process, server = start(node, job_id=18, command=["sleep", "30"], time_limit_seconds=1, grace_seconds=5)
    result = server.exit_of(18, timeout=15)
    assert result["reason"] == "time-limit" and result["exit_code"] == -15
    assert 0.9 <= time.monotonic() - began < 5  # sleep obeys SIGTERM: no need to wait for the kill
    assert b"time limit of 1s reached" in server.output(18)


def test_a_stop_order_sends_sigterm_then_sigkill_after_the_grace(node):
    script = (
        "import signal, sys, time\n"
        "def term(*_):\n    print('got SIGTERM, ignoring it', flush=True)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    process, server = start(node, job_id=19, command=["python", "-c", script])
    assert fakes.wait_for(lambda: b"ready" in server.output(19), 10)
    began = time.monotonic()
    process.stop("cancelled", 1.5)
    result = server.exit_of(19, timeout=15)
    elapsed = time.monotonic() - began
    assert result == {"job_id": 19, "attempt": 0, "replica": 0, "exit_code": -9, "reason": "stopped"}
    assert 1.4 <= elapsed < 5, elapsed
    assert b"got SIGTERM, ignoring it" in server.output(19)


def test_a_stop_reaches_the_jobs_children_too(node):
    process, server = start(node, job_id=20, command=["sh", "-c", "sleep 30 & echo $!; wait"])
    pid = int(fakes.wait_for(lambda: server.output(20).split(b"\n")[0], 10) or 0)
    process.stop("cancelled", 0.5)
    server.exit_of(20, timeout=10)
    assert fakes.wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 5), "the child outlived the stop"


def test_a_start_the_server_refuses_is_stopped_at_once(node):
    server, state_dir, run_as, path = node
    server.refuse_started = True
    process = JobProcess(fakes.binding(job_id=21, command=["sleep", "30"]), server, state_dir, run_as, path)
    process.start()
    assert server.exit_of(21, timeout=10)["reason"] == "stopped"


def test_links_a_job_leaves_in_its_directory_are_removed_not_followed(node):
    """A job owns its working directory: what it leaves there in place of its ``tmp`` and world
    file (links to the node's files) goes with the directory, and what they point at stays."""
    server, state_dir, run_as, path = node
    kept = state_dir / "kept"
    kept.mkdir(mode=0o755)
    (kept / "file").write_text("the node's")
    script = f'rmdir "$TMPDIR" && ln -s {kept} "$TMPDIR" && ln -s {kept}/file "$TESSERA_WORLD_FILE"'
    process, server = start(node, job_id=31, command=["sh", "-c", script])
    assert server.exit_of(31)["exit_code"] == 0, server.output(31)
    assert fakes.wait_for(lambda: not process.workdir.exists(), 5)
    assert (kept / "file").read_text() == "the node's"


MEET = {"master_addr": "127.0.0.1", "master_port": 29511, "world_size": 1, "rank": 0, "local_rank": 0}


def test_only_a_job_that_can_change_size_has_a_world_file(node):
    """A job of fixed size learns its world from its environment alone; one that can change size
    also finds it in ``TESSERA_WORLD_FILE`` from its start (docs/agent.md, "Resizes")."""
    script = 'echo "file=${TESSERA_WORLD_FILE:-none}"; ls -A; cat "${TESSERA_WORLD_FILE:-/dev/null}"'
    fixed, server = start(node, job_id=41, command=["sh", "-c", script], rendezvous=MEET, resizable=False)
    assert server.exit_of(41)["exit_code"] == 0, server.output(41)
    assert server.output(41).decode().split("\n")[:2] == ["file=none", "tmp"]
    fixed.tell_world({**MEET, "world_size": 2})  # a world told anyway (a stale answer) writes nothing
    assert fixed.world == {}

    elastic, server = start(node, job_id=42, command=["sh", "-c", script], rendezvous=MEET, resizable=True)
    assert server.exit_of(42)["exit_code"] == 0, server.output(42)
    lines = server.output(42).decode().split("\n")
    assert lines[0] == f"file={elastic.workdir / 'world.json'}" and lines[1:3] == ["tmp", "world.json"]
    assert json.loads(lines[3]) == MEET


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")
def test_a_checkpoint_directory_is_made_or_taken_over_as_the_job_users_alone(tmp_path):
    owned_dir = process_module._owned_dir
    run_as = RunAs("nobody", 65534, 65533)
    fresh = tmp_path / "fresh"
    assert owned_dir(fresh, run_as) is False  # made now: nothing to resume from
    st = fresh.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o700, 65534, 65533)
    assert owned_dir(fresh, run_as) is True  # there, as it should be

    # Left by an earlier attempt under another uid, opened up: taken back, and what is in it too.
    (fresh / "steps").mkdir()
    (fresh / "steps" / "0").write_text("x")
    (fresh / "link").symlink_to("/etc/passwd")
    os.chmod(fresh, 0o755)
    os.chown(fresh, 270001, 270001)
    assert owned_dir(fresh, run_as) is True
    for path in (fresh, fresh / "steps", fresh / "steps" / "0"):
        assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65533), path
    assert fresh.stat().st_mode & 0o7777 == 0o700
    assert (fresh / "link").lstat().st_uid == 65534 and Path("/etc/passwd").stat().st_uid == 0

    # A shared root not made yet: made with its parents.
    assert owned_dir(tmp_path / "root" / "1-abc", run_as) is False
    assert (tmp_path / "root" / "1-abc").stat().st_uid == 65534
    # Not a directory: refused, as ever.
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        owned_dir(tmp_path / "file", run_as)


SWAPS_A_DIRECTORY_FOR_A_LINK = r"""
import ctypes, os, sys, time
checkpoint, target = sys.argv[1:]
sub, link = os.path.join(checkpoint, "sub"), os.path.join(checkpoint, "sub-was-here")
os.symlink(target, link)
with os.scandir(sub) as entries:  # the order the agent's walk reads them in too
    first = os.path.join(sub, next(entries).name)
mine = os.stat(first).st_uid
print("ready", flush=True)
deadline = time.monotonic() + 20
while os.stat(first).st_uid == mine:  # the agent is handing over what is in "sub"
    if time.monotonic() > deadline:
        sys.exit("the walk never came")
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2  # the two names swapped at once: "sub" is never missing
if libc.renameat2(AT_FDCWD, sub.encode(), AT_FDCWD, link.encode(), RENAME_EXCHANGE) != 0:
    sys.exit(os.strerror(ctypes.get_errno()))
print("swapped", flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")
def test_a_checkpoint_taken_over_while_its_old_uid_swaps_a_directory_for_a_link_gives_away_nothing_else():
    """An earlier attempt's uid still runs while the next attempt takes the checkpoint over (its
    node's agent died and never came back, and the checkpoint lies on a shared root): once the
    agent's walk has begun handing over what is in a directory of it, it puts a link to a
    directory of root's in its place, whose files' names it knows (``/etc``'s). The walk chowned
    by paths, through the link: root's files became the new attempt's uid's (root for the job)."""
    old, new = RunAs("job-270003", 270003, 270003), RunAs("job-270004", 270004, 270004)
    names = [f"conf-{i}" for i in range(3000)]  # a while to hand over: the swap comes within it
    with fakes.job_user_state_dir() as state_dir:
        checkpoint, roots = state_dir / "checkpoints" / "1-abc", state_dir / "roots"
        (checkpoint / "sub").mkdir(parents=True)
        roots.mkdir(mode=0o700)
        for name in names:
            (checkpoint / "sub" / name).write_text("x")
            (roots / name).write_text("root's")
        process_module._owned_dir(checkpoint, old)
        python = shutil.which("python3", path=sandbox_module.SAFE_PATH)  # one the old uid can run
        assert python is not None
        swapper = subprocess.Popen(
            [python, "-c", SWAPS_A_DIRECTORY_FOR_A_LINK, str(checkpoint), str(roots)],
            stdout=subprocess.PIPE,
            text=True,
            user=old.uid,
            group=old.gid,
            extra_groups=[],
        )
        try:
            assert swapper.stdout.readline() == "ready\n"
            assert process_module._owned_dir(checkpoint, new) is True
            assert swapper.wait(20) == 0 and swapper.stdout.read() == "swapped\n"
        finally:
            if swapper.poll() is None:
                swapper.kill()
            swapper.wait()
            swapper.stdout.close()
        assert (checkpoint / "sub").is_symlink()  # the swap came while the agent handed it over
        assert {(roots / name).stat().st_uid for name in names} == {0}
        assert {p.stat().st_uid for p in (checkpoint / "sub-was-here").iterdir()} == {new.uid}


def test_a_jobs_directories_are_summed_by_the_blocks_they_hold_links_not_followed(tmp_path):
    top, outside = tmp_path / "job", tmp_path / "outside"
    (top / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (top / "a" / "b" / "deep").write_bytes(os.urandom(1 << 20))
    with open(top / "sparse", "wb") as sparse:
        sparse.truncate(1 << 30)  # a GiB long, nothing in it
    (outside / "big").write_bytes(os.urandom(4 << 20))
    (top / "to-file").symlink_to(outside / "big")
    (top / "to-dir").symlink_to(outside)
    used = process_module.disk_usage(top).bytes
    assert (1 << 20) <= used < (1 << 20) + (64 << 10), used
    assert process_module.disk_usage(tmp_path / "missing").bytes == 0


def test_a_jobs_directories_count_their_files_empty_ones_too_and_the_walk_stops_past_the_bound(tmp_path):
    """An empty file takes no block but an inode: counted, with the directories and links. Past
    ``most_files`` the walk stops (a directory of millions is listed no further)."""
    top = tmp_path / "job"
    (top / "d").mkdir(parents=True)
    for i in range(500):
        (top / "d" / str(i)).touch()
    (top / "link").symlink_to("/usr")
    assert process_module.disk_usage(top) == (0, 502)
    assert process_module.disk_usage(top, most_files=100).files == 101
    assert process_module.disk_usage(tmp_path / "missing") == (0, 0)


@pytest.mark.parametrize(
    ("levels", "name"), [(40, "d" * 200), (2500, "d")], ids=["walked", "deeper-than-the-walk-holds"]
)
def test_what_a_job_hides_thousands_of_levels_deep_is_summed_too(tmp_path, levels, name):
    """A job's directories are summed against ``--job-disk-mb``; the sum went by paths, and a
    path past the kernel's 4,096 bytes cannot be opened: what a job put 2,500 levels deep (a
    loop of mkdir and chdir, each path short), or 40 levels of long names, was never counted, so
    it filled the node's disk unstopped. The walk holds a descriptor per level up to
    ``MAX_HELD_LEVELS`` (a deeper tree: ``du``). Links stay unfollowed."""
    assert levels * (len(name) + 1) > 4096  # the file's path is too long to open
    top = tmp_path / "job"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            fd, parent = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
        hidden = os.open("hidden", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(hidden, os.urandom(4 << 20))
        os.close(hidden)
        os.symlink("/usr", "to-usr", dir_fd=fd)
    finally:
        os.close(fd)
    try:
        used = process_module.disk_usage(top).bytes
    finally:
        state_module.remove_tree(top)  # pytest's own removal recurses once per level too
    assert (4 << 20) <= used < (4 << 20) + (16 << 20), used

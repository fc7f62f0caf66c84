"""What a job leaves behind is killed: when the job ends, and when an agent (re)starts.

A job's session is recorded while it runs (agent/leftovers.py); its processes that outlive its
main one (forked, moved to another process group, left by an agent that was SIGKILLed) are killed
before its exit is reported, or, after the agent died, before the next agent registers: only then
may the server hand the job's GPUs to another.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.core.signals import request_started

from agent import identity, leftovers
from agent.identity import resolve_run_as
from agent.process import JobProcess, job_path
from scheduling.choices import JobState
from scheduling.models import Job
from tests.agent import agent_process as processes
from tests.agent import fakes
from tests.agent import helpers as h

alive = processes.alive


@pytest.fixture
def spawned():
    """Start processes in sessions of their own, as the agent starts jobs; all killed at the end.

    Each one's whole process group at once (the scripts never leave it), so that a child the shell
    forks while it is being killed dies too: a scan of the session and then a kill miss a child
    forked in between (``sh -c "sleep 300"`` forks its ``sleep``, and a test may end within
    milliseconds of the spawn), which would run on, orphaned, after the suite."""
    started: list[subprocess.Popen] = []

    def spawn(script: str) -> subprocess.Popen:
        proc = subprocess.Popen(["sh", "-c", script], start_new_session=True, stdout=subprocess.PIPE)
        started.append(proc)
        return proc

    yield spawn
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)  # its group: unreaped, the leader's pid is still ours
        proc.wait(5)
        proc.stdout.close()


def children_of(pid: int) -> list[leftovers.Proc]:
    procs = (leftovers.read_proc(int(e)) for e in os.listdir("/proc") if e.isdigit())
    return [p for p in procs if p is not None and p.ppid == pid]


def members_of(sid: int) -> list[int]:
    """The live processes of session ``sid``, looked up directly in /proc."""
    procs = (leftovers.read_proc(int(e)) for e in os.listdir("/proc") if e.isdigit())
    return sorted(p.pid for p in procs if p is not None and p.sid == sid and p.state != "Z")


def test_a_session_record_is_written_whole_private_and_forgotten(state_dir):
    session = leftovers.Session(4242, 1234567, "boot")
    leftovers.record(state_dir, "7-0-1", session)
    directory = Path(leftovers.records_dir(state_dir))
    path = directory / "7-0-1"
    assert json.loads(path.read_text()) == {"sid": 4242, "start": 1234567, "boot_id": "boot"}
    assert path.stat().st_mode & 0o777 == 0o600
    assert directory.stat().st_mode & 0o777 == 0o700  # the agent's alone: a job must not edit it
    assert os.listdir(directory) == ["7-0-1"]  # no temp file left behind
    assert leftovers.recorded(state_dir) == {"7-0-1": session}
    leftovers.forget(state_dir, "7-0-1")
    assert leftovers.recorded(state_dir) == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may write /run/tessera-agent")
def test_a_root_agent_records_in_run_one_directory_per_state_directory(tmp_path):
    """Records last one boot: they go to /run (a tmpfs), not the state directory's file system,
    and two agents whose state directories share a name keep apart."""
    first, second = tmp_path / "a" / "node", tmp_path / "b" / "node"
    for state in (first, second):
        state.mkdir(parents=True)
        leftovers.record(state, "1-0-0", leftovers.Session(os.getpid(), 1, "boot"))
    dirs = {Path(leftovers.records_dir(state)) for state in (first, second)}
    assert len(dirs) == 2
    assert all(d.parent == leftovers.RUN_SESSIONS and d.name.startswith("node-") for d in dirs)
    assert not (first / "sessions").exists()
    leftovers.tidy(first)  # an agent's end leaves a directory with a record in it
    assert all(d.is_dir() for d in dirs)
    for state in (first, second):
        leftovers.forget(state, "1-0-0")
        assert leftovers.recorded(state) == {}
        leftovers.tidy(state)  # and removes it once empty
    assert not any(d.exists() for d in dirs)
    leftovers.record(first, "2-0-0", leftovers.Session(os.getpid(), 1, "boot"))  # made again
    assert list(leftovers.recorded(first)) == ["2-0-0"]
    leftovers.forget(first, "2-0-0")
    leftovers.tidy(first)


def test_an_agent_that_may_not_write_run_records_in_its_state_directory(state_dir, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(leftovers, "RUN_SESSIONS", tmp_path / "a-file" / "sessions")  # cannot be made
    session = leftovers.Session(4242, 1234567, "boot")
    leftovers.record(state_dir, "7-0-1", session)
    assert os.listdir(state_dir / "sessions") == ["7-0-1"]
    assert leftovers.recorded(state_dir) == {"7-0-1": session}
    leftovers.forget(state_dir, "7-0-1")
    assert os.listdir(state_dir / "sessions") == []


def test_a_record_an_earlier_version_left_in_the_state_directory_is_still_killed(state_dir, spawned):
    job = spawned("sleep 300 & echo started; wait")
    job.stdout.readline()
    session = leftovers.session_of(job.pid)
    (state_dir / "sessions").mkdir(mode=0o700, exist_ok=True)
    (state_dir / "sessions" / "5-0-0").write_text(
        json.dumps({"sid": session.sid, "start": session.start, "boot_id": session.boot_id})
    )
    ours = members_of(job.pid)
    assert len(ours) == 2
    assert sorted(p.pid for p in leftovers.kill_leftovers(state_dir)) == ours
    assert leftovers.recorded(state_dir) == {} and os.listdir(state_dir / "sessions") == []


def test_a_starting_agent_kills_every_process_of_a_recorded_session_and_forgets_it(state_dir, spawned):
    job = spawned("sleep 300 & sleep 300 & echo started; wait")
    job.stdout.readline()
    other = spawned("sleep 300 & echo started; wait")  # a session nobody recorded
    other.stdout.readline()  # its sleep has started (the count below raced it under load)
    leftovers.record(state_dir, "1-0-0", leftovers.session_of(job.pid))
    ours = members_of(job.pid)
    assert len(ours) == 3 and len(members_of(other.pid)) == 2

    killed = leftovers.kill_leftovers(state_dir)

    assert sorted(p.pid for p in killed) == ours
    assert not any(alive(pid) for pid in ours)
    assert len(members_of(other.pid)) == 2
    assert leftovers.recorded(state_dir) == {}


def test_a_session_id_that_a_later_process_now_leads_is_left_alone(state_dir, spawned):
    later = spawned("sleep 300")
    real = leftovers.session_of(later.pid)
    # Ours had this id and started earlier; it ended, and the id went to ``later``.
    leftovers.record(state_dir, "2-0-0", leftovers.Session(real.sid, real.start - 1, real.boot_id))
    assert leftovers.kill_leftovers(state_dir) == []
    assert alive(later.pid) and leftovers.recorded(state_dir) == {}


def test_records_from_before_a_reboot_are_dropped_unused(state_dir, spawned):
    job = spawned("sleep 300")
    real = leftovers.session_of(job.pid)
    leftovers.record(state_dir, "3-0-0", leftovers.Session(real.sid, real.start, "another-boot"))
    assert leftovers.kill_leftovers(state_dir) == []
    assert alive(job.pid) and leftovers.recorded(state_dir) == {}


def test_leftovers_that_will_not_die_keep_the_agent_from_registering(state_dir, spawned, monkeypatch):
    job = spawned("sleep 300")
    leftovers.record(state_dir, "4-0-0", leftovers.session_of(job.pid))
    monkeypatch.setattr(leftovers, "_kill", lambda proc, session: None)  # as if stuck in the kernel
    with pytest.raises(leftovers.LeftoversRemain, match=r"leftover process.*sleep, replica 4-0-0"):
        leftovers.kill_leftovers(state_dir, timeout=0.3)
    assert "4-0-0" in leftovers.recorded(state_dir)  # the next start tries again


class ChecksAtExit(fakes.FakeServer):
    """Notes, when a job's exit is reported, whether the child it printed the pid of still runs."""

    def __init__(self) -> None:
        super().__init__()
        self.child_alive_at_exit: bool | None = None

    def exited(self, job_id, *args, **kwargs):
        child = int(self.output(job_id).split()[0])
        self.child_alive_at_exit = alive(child)
        return super().exited(job_id, *args, **kwargs)


def test_a_child_that_left_the_jobs_process_group_is_killed_before_the_exit_is_reported(state_dir):
    server = ChecksAtExit()
    run_as = resolve_run_as("nobody")
    script = (
        "import subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'], process_group=0)\n"  # out of the job's group
        "print(child.pid, flush=True)\n"
        "time.sleep(0.5)\n"
    )
    binding = fakes.binding(job_id=40, command=["python", "-c", script])
    job = JobProcess(binding, server, state_dir, run_as, job_path(state_dir, run_as))
    job.start()
    child = int(fakes.wait_for(lambda: server.output(40).strip(), 10) or 0)
    try:
        assert server.exit_of(40, timeout=15)["exit_code"] == 0
        assert server.child_alive_at_exit is False, "the exit was reported while its child ran on"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_running_jobs_session_is_recorded_until_its_processes_are_gone(state_dir):
    server = fakes.FakeServer()
    run_as = resolve_run_as("nobody")
    binding = fakes.binding(job_id=41, attempt=2, replica=1, command=["sleep", "0.5"])
    job = JobProcess(binding, server, state_dir, run_as, job_path(state_dir, run_as))
    job.start()
    assert fakes.wait_for(lambda: leftovers.recorded(state_dir), 5)  # written by its supervisor
    (session,) = leftovers.recorded(state_dir).values()
    assert list(leftovers.recorded(state_dir)) == ["41-2-1"]
    assert session.sid == job.pid and session == leftovers.session_of(job.pid)
    assert session.boot_id == leftovers.boot_id() != ""
    server.exit_of(41, timeout=10)
    assert job.done.wait(5)
    assert leftovers.recorded(state_dir) == {}


def escaped_sleep() -> int:
    """The pid of ``sleep 301``, the process that left its job's session (``setsid``); 0 if none."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes() == b"sleep\x00301\x00":
                    return int(entry)
            except OSError:
                continue
    return 0


@pytest.mark.slow
def test_a_restarted_agent_kills_what_its_killed_predecessor_left_before_it_registers(
    live_server, world, state_dir
):
    """A real agent is SIGKILLed while its job runs: the job's child in its session and, as root,
    one that left the session (``setsid``) outlive it; the job's uid stays held (its lock names
    the dead agent), and the next agent kills both, by session and by uid, before it registers."""
    token_file = state_dir / "join-token"
    token_file.write_text(h.new_join_token())
    first = processes.start_agent(live_server.url, state_dir, "--join-token-file", str(token_file))
    second = None
    leftover = escapee = 0
    seen: list[tuple[str, bool]] = []  # (path, whether a leftover ran) per request to the server
    by_uid = os.geteuid() == 0  # a uid per job: what left the session is found by it

    def on_request(sender, environ, **kwargs):
        seen.append((environ.get("PATH_INFO", ""), alive(leftover) or (by_uid and alive(escapee))))

    try:
        processes.registered(state_dir)
        command = ["sh", "-c", "setsid sleep 301 & sleep 300 & wait"]
        job = h.bind(h.submit(world.alice, world.vision, command=command), "cli-node", [0])
        assert fakes.wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 20)

        def sleeping() -> int:  # in the session of the job's process, the agent's child
            job = (p.pid for p in children_of(first.pid))
            return next((m for pid in job for m in members_of(pid) if m != pid and _named(m, "sleep")), 0)

        leftover = fakes.wait_for(sleeping, 10)
        leader = leftovers.read_proc(leftover).sid
        escapee = fakes.wait_for(escaped_sleep, 5)
        assert leftover and escapee and leftovers.read_proc(escapee).sid != leader

        os.killpg(first.pid, signal.SIGKILL)  # the agent alone: its jobs have sessions of their own
        first.wait(10)
        assert fakes.wait_for(lambda: not alive(leader), 5), "the parent-death signal did not kill sh"
        time.sleep(0.3)
        assert alive(leftover) and alive(escapee), "nothing outlived the agent: nothing to test"
        if by_uid:  # its uid is still held: its lock names the dead agent, so no agent reuses it
            uid = _uid_of(escapee)
            assert uid in identity.parse_range(identity.DEFAULT_RANGE)
            assert (identity.DEFAULT_LOCK_DIR / str(uid)).read_text().strip()

        request_started.connect(on_request)
        second = processes.start_agent(live_server.url, state_dir)  # its stored credential
        assert fakes.wait_for(lambda: any(path.endswith("/register") for path, _ in seen), 30)
        assert seen[0][0].endswith("/agent/register"), seen
        assert not any(running for _, running in seen), f"a leftover ran when the server heard: {seen}"
        assert not alive(leftover)
        if by_uid:
            assert not alive(escapee)
            assert identity.processes_of({uid}) == {}
            assert (identity.DEFAULT_LOCK_DIR / str(uid)).read_text() == ""  # free again, clean
        assert leftovers.recorded(state_dir) == {}
    finally:
        request_started.disconnect(on_request)
        output = processes.stop_agent(second) if second is not None else ""
        processes.stop_agent(first)
        for pid in (leftover, escapee):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
    said = "killed 1 leftover process(es) of the previous agent run before registering"
    assert f"{said}: {leftover} (sleep" in output, output


def _named(pid: int, name: str) -> bool:
    proc = leftovers.read_proc(pid)
    return proc is not None and proc.name == name


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def test_the_pid_clock_sees_a_wrap_of_the_pid_numbers(monkeypatch):
    looks = iter([500, 900, 30000, 12, 40])  # up, up, then down: the numbers wrapped around
    monkeypatch.setattr(leftovers, "_last_pid", lambda: next(looks))
    clock = leftovers.PidClock(480)
    assert clock.newer_than_leader() == 480  # no wrap yet: only pids from the leader's up are read
    assert clock.newer_than_leader() == 480
    clock.observe()
    assert clock.wrapped and clock.newer_than_leader() is None  # from now on: every process
    monkeypatch.setattr(leftovers, "_last_pid", lambda: None)
    assert leftovers.PidClock(480).newer_than_leader() is None  # unreadable: every process
    monkeypatch.setattr(leftovers, "_last_pid", lambda: 500)
    slow = leftovers.PidClock(480)
    slow.looked -= leftovers.MAX_LOOK_GAP_S + 1  # its last look long ago: a wrap may hide there
    assert slow.newer_than_leader() is None


def test_only_a_wrap_lets_a_sessions_process_have_a_pid_below_its_leaders(spawned, monkeypatch):
    """A process of the session whose pid is below the leader's (possible only after a wrap) is
    found when the clock saw the wrap, and not looked for otherwise."""
    proc = spawned("sleep 300 & echo started; wait")
    proc.stdout.readline()
    session = leftovers.session_of(proc.pid)
    members = lambda floor: {p.pid for p, _ in leftovers._members([session], floor)}  # noqa: E731
    assert members(proc.pid) == members(None) == set(members_of(proc.pid))
    # Pretend the leader's pid were above the child's, as after a wrap: without one seen, the
    # child is not looked for; with one, it is.
    (child,) = [pid for pid in members_of(proc.pid) if pid != proc.pid]
    assert child not in members(child + 1)
    clock = leftovers.PidClock(child + 1)
    clock.wrapped = True
    killed, left = leftovers.end_sessions([session], 5.0, pids=clock)
    assert child in {p.pid for p in killed} and left == []


def test_a_short_sessions_end_reads_its_pids_without_listing_proc(spawned, monkeypatch):
    """Until a wrap, a session's processes have pids from its leader's to the kernel's last: a job
    that ends soon is ended by reading those (a thread counted as its process, as in /proc's
    listing), without listing every process of the node."""
    # This interpreter, not `python3` from PATH: that may be a wrapper script (pyenv's shim)
    # whose own short-lived processes would join the session after the members were counted.
    threads = (
        "import threading, time; threading.Thread(target=time.sleep, args=(300,)).start(); "
        "print('started', flush=True); time.sleep(300)"
    )
    proc = spawned(f'{shlex.quote(sys.executable)} -c "{threads}" & sleep 300 & wait')
    assert proc.stdout.readline() == b"started\n"  # its thread is running
    session = leftovers.session_of(proc.pid)
    assert fakes.wait_for(lambda: len(set(members_of(proc.pid))) == 3, 10), members_of(proc.pid)
    expected = set(members_of(proc.pid))
    clock = leftovers.PidClock(proc.pid)

    def no_listing(path):
        raise AssertionError(f"listed {path}")

    with monkeypatch.context() as patch:
        patch.setattr(leftovers.os, "listdir", no_listing)
        assert {p.pid for p, _ in leftovers._members([session], *clock.span())} == expected
        killed, left = leftovers.end_sessions([session], 5.0, pids=clock)
    assert {p.pid for p in killed} == expected and left == []


def test_pids_handed_out_while_a_span_is_read_are_read_too(monkeypatch):
    monkeypatch.setattr(leftovers, "_listed", lambda floor=None: iter([f"listed from {floor}"]))
    looks = iter([108, 108])  # two pids handed out while 100-105 were read, then none
    monkeypatch.setattr(leftovers, "_last_pid", lambda: next(looks))
    assert list(leftovers._spanned(100, 105)) == list(range(100, 109))
    looks = iter([90])  # wrapped meanwhile: any pid
    assert list(leftovers._spanned(100, 105)) == [*range(100, 106), "listed from None"]
    wide = leftovers.SPAN_MAX
    assert list(leftovers._spanned(100, 100 + wide)) == ["listed from 100"]  # too many: listed


def test_a_pid_read_directly_counts_only_as_a_live_process():
    """A thread's pid (read directly, not listed) is not a process; nor is a pid that ended after
    its ``stat`` was read, as a thread of a process being killed does (it was counted as killed)."""
    ready, stop = threading.Event(), threading.Event()
    tids: list[int] = []

    def run() -> None:
        tids.append(threading.get_native_id())
        ready.set()
        stop.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    ready.wait(10)
    try:
        assert leftovers._leads_its_group(os.getpid())
        assert not leftovers._leads_its_group(tids[0])
    finally:
        stop.set()
        thread.join()
    assert not leftovers._leads_its_group(tids[0])

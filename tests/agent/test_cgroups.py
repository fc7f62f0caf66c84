"""CPU and memory limits: detected where cgroups (v2, or v1) allow them, plainly refused elsewhere.

The cgroup filesystem is the edge: a directory laid out like ``/sys/fs/cgroup`` stands in for
cgroups v2 (this machine has a writable v1 layout instead), and a real job process is moved
"into" its cgroup; the last test uses this machine's own cgroups for real.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from agent import cgroups, sandbox
from agent.identity import resolve_run_as
from agent.inventory import simulated_inventory
from agent.node import Agent
from agent.process import JobProcess, job_path
from agent.spec import parse_spec
from tests.agent import fakes


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    return tmp_path


def test_a_writable_cgroup_v2_root_with_cpu_and_memory_is_usable(fake_root):
    assert cgroups.unavailable_reason(fake_root) is None
    found = cgroups.detect(fake_root)
    assert found is not None
    assert (fake_root / "cgroup.subtree_control").read_text().split() == ["+cpu", "+memory"]
    assert (fake_root / "tessera" / "cgroup.subtree_control").read_text().split() == ["+cpu", "+memory"]


def test_without_cgroups_v2_limits_are_not_enforced_and_the_agent_says_so(tmp_path, caplog):
    (tmp_path / "memory").mkdir()  # a cgroups v1 layout: one directory per controller
    with caplog.at_level(logging.WARNING, logger="tessera.agent"):
        assert cgroups.detect(tmp_path) is None
    assert "NOT enforced" in caplog.text and "not mounted" in caplog.text


def test_a_root_without_the_memory_controller_is_refused_naming_it(fake_root):
    (fake_root / "cgroup.controllers").write_text("cpu io pids\n")
    assert "memory" in cgroups.unavailable_reason(fake_root)


def test_a_replicas_cgroup_carries_its_cpu_and_memory_limits(fake_root):
    cg = cgroups.detect(fake_root)
    path = cg.create("7-0-1", cpus=1.5, memory_gib=2)
    assert (path / "cpu.max").read_text() == "150000 100000\n"
    assert (path / "memory.max").read_text() == f"{2 * 2**30}\n"
    unlimited = cg.create("7-0-2", cpus=0, memory_gib=0)  # nothing asked: a cgroup all the same
    assert unlimited == fake_root / "tessera" / "7-0-2" and unlimited.is_dir()
    assert not (unlimited / "cpu.max").exists() and not (unlimited / "memory.max").exists()


def test_a_replicas_memory_bound_leaves_it_no_swap_where_the_kernel_accounts_swap(fake_root):
    """Past memory.max a job's pages went to the node's swap (memory.swap.max is "max" by
    default): it held what it liked, in the swap every other job counts on."""
    cg = cgroups.detect(fake_root)
    (fake_root / "tessera" / "7-0-3").mkdir()
    (fake_root / "tessera" / "7-0-3" / "memory.swap.max").write_text("max\n")
    path = cg.create("7-0-3", cpus=0, memory_gib=1)
    assert (path / "memory.swap.max").read_text() == "0\n"
    assert not (cg.create("7-0-4", cpus=0, memory_gib=1) / "memory.swap.max").exists()  # no accounting


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are the root agent's")
def test_on_this_machine_a_replicas_memory_bound_holds_its_swap_too():
    cg = cgroups.detect()
    if cg is None:
        pytest.skip("no writable cgroups here: limits are not enforced (and the agent says so)")
    path = cg.create(f"swap-{os.getpid()}", cpus=0, memory_gib=0.25)
    try:
        if isinstance(cg, cgroups.CgroupsV1):
            memory = cg.root / "memory" / "tessera" / path.name
            limits = [memory / "memory.limit_in_bytes", memory / "memory.memsw.limit_in_bytes"]
            if not limits[1].exists():
                pytest.skip("this kernel does not account swap (no memory.memsw)")
            assert [int(f.read_text()) for f in limits] == [2**28, 2**28]
        else:
            if not (path / "memory.swap.max").exists():
                pytest.skip("this kernel does not account swap (no memory.swap.max)")
            assert (path / "memory.swap.max").read_text().strip() == "0"
    finally:
        cg.remove(path)


def test_a_job_with_limits_joins_its_cgroup_before_it_runs_which_goes_away_after_it(fake_root):
    """The agent writes the spawned pid, which becomes the job's, into its cgroup while the chain
    waits for the job's environment: the job is inside before its first instruction."""
    cg = cgroups.detect(fake_root)
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        server = fakes.FakeServer()
        node = Agent(
            server,
            simulated_inventory("cg", parse_spec("2xT4")),
            state_dir,
            run_as,
            job_path(state_dir, run_as),
            poll_interval=0.05,
            cgroups=cg,
        )
        joined: list[tuple[str, int]] = []
        real_remove = cg.remove

        def remove(path: Path) -> None:
            joined.append((path.name, int((path / "cgroup.procs").read_text())))
            for f in path.iterdir():  # a real cgroup empties itself: let rmdir work
                f.unlink()
            real_remove(path)

        cg.remove = remove
        moved: list[tuple[int, str]] = []  # each pid moved, and the program it ran then
        real_add = cg.add

        def add(path: Path, pid: int) -> None:
            moved.append((pid, Path(f"/proc/{pid}/comm").read_text().strip()))
            real_add(path, pid)

        cg.add = add
        node.apply({"start": [fakes.binding(job_id=9, command=["sleep", "0.2"], cpus=2, memory_gib=1)]})
        pid = node.running_reports()[0]["pid"]
        assert server.exit_of(9)["exit_code"] == 0
        assert fakes.wait_for(lambda: joined, 5)
        [(name, member)] = joined
        assert member == pid and name.startswith("9-0-0-")
        [(moved_pid, running)] = moved
        assert moved_pid == pid and running != "sleep"  # still the chain: the job had not begun
        assert not (fake_root / "tessera" / name).exists()
        node.shutdown(0.5)


@pytest.mark.skipif(sandbox.setpriv() is None, reason="without setpriv the agent moves the job from outside")
def test_a_job_whose_cgroup_cannot_be_joined_never_runs_and_its_log_says_why(fake_root):
    cg = cgroups.detect(fake_root)
    real_create = cg.create

    def unjoinable(name: str, cpus: float, memory_gib: float) -> Path | None:
        path = real_create(name, cpus, memory_gib)
        (path / "cgroup.procs").mkdir()  # writing a pid into it fails
        return path

    cg.create = unjoinable
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        server = fakes.FakeServer()
        job = fakes.binding(5, command=["sh", "-c", "echo ran | tr a-z A-Z"], cpus=1)
        JobProcess(job, server, state_dir, run_as, job_path(state_dir, run_as), cg).start()
        assert server.exit_of(5)["reason"] == "spawn-failed"
        assert b"cannot join the job's cgroup" in server.output(5) and b"RAN" not in server.output(5)


def test_this_machines_answer_matches_its_cgroup_filesystem():
    reason = cgroups.unavailable_reason(Path("/sys/fs/cgroup"))
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    writable = os.access("/sys/fs/cgroup", os.W_OK)
    assert (reason is None) == (
        v2
        and writable
        and all(c in Path("/sys/fs/cgroup/cgroup.controllers").read_text().split() for c in ("cpu", "memory"))
    )


def cpu_cgroup(proc_self_cgroup: str) -> str:
    """The cgroup of the cpu controller in ``/proc/self/cgroup``: its v1 hierarchy's, else v2's."""
    entries = [line.split(":", 2) for line in proc_self_cgroup.splitlines() if line.count(":") >= 2]
    v1 = [path for _, controllers, path in entries if "cpu" in controllers.split(",")]
    return v1[0] if v1 else next(path for _, controllers, path in entries if controllers == "")


OWN_CPU_LIMIT = r"""
for line in open("/proc/self/cgroup"):
    _, controllers, path = line.strip().split(":", 2)
    if "cpu" in controllers.split(","):  # v1: its cpu hierarchy
        print(open(f"/sys/fs/cgroup/{controllers}{path}/cpu.cfs_quota_us").read().strip())
    elif controllers == "" and path != "/":  # v2
        print(open(f"/sys/fs/cgroup{path}/cpu.max").read().split()[0])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are the root agent's")
def test_on_this_machine_a_jobs_cpu_and_memory_limits_hold_for_real():
    """With the machine's real cgroups (v2, or v1 as here): a job given a quarter of a CPU runs in
    a cgroup whose quota says so, and one past its memory is killed by the kernel."""
    cg = cgroups.detect()
    if cg is None:
        pytest.skip("no writable cgroups here: limits are not enforced (and the agent says so)")
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        path = job_path(state_dir, run_as)
        server = fakes.FakeServer()
        limited = fakes.binding(31, command=["python", "-c", OWN_CPU_LIMIT], cpus=0.25)
        JobProcess(limited, server, state_dir, run_as, path, cg).start()
        hog = "x = bytearray(400 * 2**20); print('survived')"
        greedy = fakes.binding(32, command=["python", "-c", hog], memory_gib=0.1)
        JobProcess(greedy, server, state_dir, run_as, path, cg).start()
        assert server.exit_of(31)["exit_code"] == 0
        assert server.output(31).split() == [b"25000"], server.output(31)  # 25 ms per 100 ms
        assert server.exit_of(32)["exit_code"] == -9 and b"survived" not in server.output(32)
    gone = [*Path(cg.root).glob("tessera/3[12]-0-0-*"), *Path(cg.root).glob("*/tessera/3[12]-0-0-*")]
    assert gone == []  # their cgroups went with them


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are the root agent's")
def test_on_this_machine_a_job_is_in_its_cgroup_from_its_first_instruction_and_so_are_its_children():
    """``cat`` starts in a millisecond, before an agent moving it from outside could (as it once
    did: a loaded machine lost that race most times); a child forked at once is inside too."""
    cg = cgroups.detect()
    if cg is None:
        pytest.skip("no writable cgroups here: limits are not enforced (and the agent says so)")
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        path = job_path(state_dir, run_as)
        server = fakes.FakeServer()
        jobs = {}
        for job_id in range(41, 49):
            command = (
                ["cat", "/proc/self/cgroup"] if job_id % 2 else ["sh", "-c", "cat /proc/self/cgroup & wait"]
            )
            jobs[job_id] = JobProcess(
                fakes.binding(job_id, command=command, cpus=0.5), server, state_dir, run_as, path, cg
            )
            jobs[job_id].start()
        for job_id, job in jobs.items():
            assert server.exit_of(job_id)["exit_code"] == 0, server.output(job_id)
            assert cpu_cgroup(server.output(job_id).decode()) == f"/tessera/{job.workdir.name}"


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are the root agent's")
def test_on_this_machine_a_job_in_its_cgroup_ends_with_its_leftovers_killed_and_no_process_scan(
    monkeypatch,
):
    """The end of a job spawned into its cgroup: what it left running in its session is killed
    before its exit is reported, found by the scan of the node's processes; a job that left
    nothing is over without that scan (its cgroup is empty: nothing of it can be elsewhere)."""
    cg = cgroups.detect()
    if cg is None:
        pytest.skip("no writable cgroups here: limits are not enforced (and the agent says so)")
    from agent import leftovers

    scans: list[int] = []
    real = leftovers.end_sessions

    def counted(sessions, *args, **kwargs):
        scans.append(len(list(sessions)))
        return real(sessions, *args, **kwargs)

    monkeypatch.setattr(leftovers, "end_sessions", counted)
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        path = job_path(state_dir, run_as)
        server = fakes.FakeServer()
        # Its own process group (the agent's kill of the job's group misses it), output closed
        # (nothing keeps the job's pipe open): only the scan of its session finds it.
        leave = (
            "import subprocess as s; d = s.DEVNULL; "
            "print(s.Popen(['sleep', '300'], stdin=d, stdout=d, stderr=d, process_group=0).pid)"
        )
        left = fakes.binding(51, command=["python", "-c", leave], cpus=0.5)
        JobProcess(left, server, state_dir, run_as, path, cg).start()
        assert server.exit_of(51)["exit_code"] == 0
        child = int(server.output(51).split()[0])
        stat = Path(f"/proc/{child}/stat")
        assert not stat.exists() or stat.read_text().split()[2] == "Z"  # gone, or dead and unreaped
        assert scans == [1]
        clean = fakes.binding(52, command=["true"], cpus=0.5)
        JobProcess(clean, server, state_dir, run_as, path, cg).start()
        assert server.exit_of(52)["exit_code"] == 0
        assert scans == [1]  # no scan for the job that left nothing


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are the root agent's")
def test_on_this_machine_a_job_bounded_by_its_memory_cgroup_goes_after_an_unbounded_one_for_the_oom_killer():
    """The OOM killer's order (agent/process.py): a job whose memory nothing bounds at 1000, one
    with ``memory_gib`` (its cgroup's bound) at 500, one with only ``cpus`` at 1000."""
    cg = cgroups.detect()
    if cg is None:
        pytest.skip("no writable cgroups here: limits are not enforced (and the agent says so)")
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        path = job_path(state_dir, run_as)
        server = fakes.FakeServer()
        asks = {51: {}, 52: {"memory_gib": 0.5}, 53: {"cpus": 0.5}}
        for job_id, ask in asks.items():
            command = ["cat", "/proc/self/oom_score_adj"]
            JobProcess(
                fakes.binding(job_id, command=command, **ask), server, state_dir, run_as, path, cg
            ).start()
        scores = {}
        for job_id in asks:
            assert server.exit_of(job_id)["exit_code"] == 0, server.output(job_id)
            scores[job_id] = server.output(job_id).decode().strip()
        assert scores == {51: "1000", 52: "500", 53: "1000"}


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are the root agent's")
def test_on_this_machine_a_job_that_asks_for_no_cpus_or_memory_still_runs_in_a_cgroup_of_its_own():
    """Not in the agent's: there each of its processes was the agent's equal for the CPU, and a job
    spinning on 300 processes made 5 ms of the agent's work take 0.27 s (1.5 s at worst; at the
    default --job-max-tasks, thousands, its heartbeat outlasted its lease). In a cgroup of its
    own under ``tessera`` the job's processes share one group's part: 9 ms (14 at worst)."""
    cg = cgroups.detect()
    if cg is None:
        pytest.skip("no writable cgroups here: limits are not enforced (and the agent says so)")
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        path = job_path(state_dir, run_as)
        server = fakes.FakeServer()
        command = ["sh", "-c", "cat /proc/self/cgroup & wait"]
        job = JobProcess(fakes.binding(61, command=command), server, state_dir, run_as, path, cg)
        job.start()
        assert server.exit_of(61)["exit_code"] == 0, server.output(61)
        assert cpu_cgroup(server.output(61).decode()) == f"/tessera/{job.workdir.name}"
        assert job.done.wait(10)  # its exit is reported first, then its cgroup removed
        assert not job.cgroup.exists()  # gone with it

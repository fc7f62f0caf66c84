"""The spawn chain's user switch (agent/sandbox.py, step 4): ``setpriv`` is given a user and group
by name where the node's databases hold one standing for exactly those ids (setpriv then does not
look a number up through every source of ``nsswitch.conf``), by number otherwise; the job runs
as exactly those ids either way.
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from agent import sandbox
from agent.identity import RunAs
from tests.agent import fakes

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root"),
    pytest.mark.skipif(sandbox.setpriv() is None, reason="no setpriv with --pdeathsig on this machine"),
]


@pytest.fixture
def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody here")


def behind_the_chain(job: RunAs, command: list[str], stdin: int) -> subprocess.CompletedProcess[str]:
    """``command`` run behind the chain for ``job``, its input (the environment's pipe) ``stdin``."""
    return subprocess.run(
        [*sandbox.Sandbox(False).prefix(job, []), *command],
        stdin=stdin,
        env=sandbox.CHAIN_ENV,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=20,
    )


def ids_behind_the_chain(job: RunAs) -> tuple[list[str], list[str]]:
    """The chain's argv for ``job``, and what ``id`` says behind it (uid, gid, groups)."""
    prefix = sandbox.Sandbox(False).prefix(job, [])
    env_fd = fakes.env_stdin({"PATH": sandbox.SAFE_PATH}, job)
    try:
        done = behind_the_chain(job, ["sh", "-c", "id -u; id -g; id -G"], env_fd)
    finally:
        os.close(env_fd)
    assert done.returncode == 0, done.stderr
    return prefix, done.stdout.split()


def test_a_named_user_and_group_are_switched_to_by_name_and_the_job_runs_as_their_ids(nobody):
    job = RunAs("nobody", nobody.pw_uid, nobody.pw_gid)
    group = grp.getgrgid(nobody.pw_gid).gr_name
    prefix, seen = ids_behind_the_chain(job)
    assert prefix[prefix.index("--reuid") + 1] == "nobody"
    assert prefix[prefix.index("--regid") + 1] == group
    assert seen == [str(nobody.pw_uid), str(nobody.pw_gid), str(nobody.pw_gid)]


def test_an_unnamed_uid_is_switched_to_by_number():
    uid = 270_007
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    prefix, seen = ids_behind_the_chain(RunAs(f"job-{uid}", uid, uid))
    assert prefix[prefix.index("--reuid") + 1] == str(uid)
    assert seen == [str(uid), str(uid), str(uid)]


def test_a_name_that_no_longer_stands_for_its_id_is_never_followed(monkeypatch, nobody):
    """The name an id had when first looked at is checked at every spawn: after the database
    changed (the name now another user's), the number is passed, never the name."""
    job = RunAs("nobody", nobody.pw_uid, nobody.pw_gid)
    ids_behind_the_chain(job)  # the name is known from here on
    by_name, root = pwd.getpwnam, pwd.getpwnam("root")
    monkeypatch.setattr(pwd, "getpwnam", lambda name: root if name == "nobody" else by_name(name))
    prefix, seen = ids_behind_the_chain(job)
    assert prefix[prefix.index("--reuid") + 1] == str(nobody.pw_uid)
    assert seen[0] == str(nobody.pw_uid)


@pytest.mark.parametrize("sent", ["nothing", "its environment without the last line"])
def test_a_chain_whose_environment_never_comes_whole_runs_nothing_of_the_job(nobody, sent):
    """The agent died before or while handing the environment over: its pipe ends early, and the
    job's shell stops there (exit 125, saying so) instead of running the job without it."""
    job = RunAs("nobody", nobody.pw_uid, nobody.pw_gid)
    script = sandbox.env_script({"PATH": sandbox.SAFE_PATH})
    script = b"" if sent == "nothing" else script[: script.rstrip(b"\n").rindex(b"\n") + 1]
    read_end, write_end = sandbox.env_pipe(len(script))
    sandbox.send_env(read_end, write_end, script, job)
    os.close(write_end)
    try:
        done = behind_the_chain(job, ["echo", "RAN"], read_end)
    finally:
        os.close(read_end)
    assert done.returncode == 125 and done.stdout == ""
    assert "environment did not arrive whole" in done.stderr


def test_no_process_of_the_jobs_uid_can_write_into_the_chains_input_before_the_agent_does(nobody):
    """Until the agent hands the environment over (after the chain joined the job's cgroup), the
    pipe the chain waits on is root's: another process of the job's uid cannot open it through
    ``/proc`` to feed the chain a command of its own."""
    job = RunAs("nobody", nobody.pw_uid, nobody.pw_gid)
    script = sandbox.env_script({"PATH": sandbox.SAFE_PATH})
    read_end, write_end = sandbox.env_pipe(len(script))
    chain = subprocess.Popen(
        [*sandbox.Sandbox(False).prefix(job, []), "echo", "RAN"],
        stdin=read_end,
        stdout=subprocess.PIPE,
        env=sandbox.CHAIN_ENV,
        cwd="/",
    )
    try:
        comm = Path(f"/proc/{chain.pid}/comm")
        waiting = fakes.wait_for(lambda: comm.read_text().strip() == "sh", 10)
        assert waiting, "the chain did not reach its last step"
        feed = f"printf '\\nexec echo INJECTED\\n' >/proc/{chain.pid}/fd/0"
        intruder_in = fakes.env_stdin({"PATH": sandbox.SAFE_PATH}, job)
        try:
            intruder = behind_the_chain(job, ["sh", "-c", feed], intruder_in)
        finally:
            os.close(intruder_in)
        assert intruder.returncode != 0 and "Permission denied" in intruder.stderr
        sandbox.send_env(read_end, write_end, script, job)
    finally:
        os.close(read_end)
        os.close(write_end)
    out, _ = chain.communicate(timeout=20)
    assert (chain.returncode, out) == (0, b"RAN\n")

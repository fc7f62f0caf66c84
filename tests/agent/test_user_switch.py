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

import pytest

from agent import sandbox
from agent.identity import RunAs

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


def ids_behind_the_chain(job: RunAs) -> tuple[list[str], list[str]]:
    """The chain's argv for ``job``, and what ``id`` says behind it (uid, gid, groups)."""
    prefix = sandbox.Sandbox(False).prefix(job, [])
    env_fd = sandbox.env_fd({"PATH": sandbox.SAFE_PATH})
    try:
        done = subprocess.run(
            [*prefix, "sh", "-c", "id -u; id -g; id -G"],
            stdin=env_fd,
            env=sandbox.CHAIN_ENV,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=20,
        )
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

"""What a job's spawn chain costs: spawn ``true`` through it, with and without a step, by turns.

Run as root (the chain switches to a job uid, here one outside the agents' range)::

    .venv/bin/python scripts/bench_spawn.py --spawns 30 [--single-tenant]

Prints, for each variant, the median wall time of a spawn (fork to exit), the CPU time its
processes used (children's user + system) and the spawning process's own, per spawn. Variants:
the chain as the agent builds it (private mounts where the machine allows them, a uid, prlimit),
with and without the Landlock step (agent/landlock.py), and the step alone in front of ``true``.

``--single-tenant``: the chain of an agent with ``--single-tenant`` (setpriv, then the job user's
shell that reads the environment) against two ways without that shell, neither used: the job's
environment handed to root's setpriv (as b7f674b did: a tenant's ``LD_PRELOAD`` then runs as
root), and the user switch, parent-death signal and ``no_new_privs`` done by Python's own fork
(``preexec_fn``: a whole fork of the spawning process instead of a ``vfork``). The spawning
process here is smaller than an agent, which a fork copies more of.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import sandbox  # noqa: E402
from agent.identity import RunAs  # noqa: E402

UID = 270002  # outside the default range (200000-265535): no agent hands it to a job
# An environment of the size a job's usually is: what the agent sets and a few of its own.
JOB_ENV = {"PATH": sandbox.SAFE_PATH, **{f"TESSERA_BENCH_{i}": "x" * 24 for i in range(20)}}
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, never in a forked child


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def spawn(
    argv: list[str], stdin: int | None = None, env: dict[str, str] = sandbox.CHAIN_ENV, **popen: Any
) -> tuple[float, float, float]:
    """Wall, children's CPU and the spawner's own CPU seconds of one spawn of ``argv`` to its exit."""
    children, own = _cpu(resource.RUSAGE_CHILDREN), _cpu(resource.RUSAGE_SELF)
    start = time.perf_counter()
    subprocess.run(argv, stdin=stdin, env=env, cwd="/", check=True, **popen)
    wall = time.perf_counter() - start
    return wall, _cpu(resource.RUSAGE_CHILDREN) - children, _cpu(resource.RUSAGE_SELF) - own


def _harden() -> None:
    """``preexec_fn`` of the Python-fork variant: what setpriv's --pdeathsig and --no-new-privs do."""
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    _PRCTL(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def single_tenant(job: RunAs) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """The variants of ``--single-tenant`` (argv, and what else each spawn is given)."""
    true = "/bin/true"
    box = sandbox.Sandbox(False, disk_mb=100 << 10)
    chain = [*box.prefix(job, []), true]
    job_shell = chain[chain.index("-c") + 1]
    tool = chain[0]
    handed = [tool, "--pdeathsig", "SIGKILL", "--reuid", str(UID), "--regid", str(UID)]
    handed += ["--clear-groups", "--no-new-privs", "--", true]
    variants = {
        "single-tenant chain": chain,
        "environment to setpriv": handed,
        "Python fork and switch": ["/bin/sh", "-c", job_shell, "tessera-job", true],
    }
    popen: dict[str, dict[str, Any]] = {
        "single-tenant chain": {"env": box.env},
        "environment to setpriv": {"env": JOB_ENV, "stdin": subprocess.DEVNULL},
        "Python fork and switch": {
            "env": box.env,
            "user": UID,
            "group": UID,
            "extra_groups": [],
            "preexec_fn": _harden,
        },
    }
    return variants, popen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawns", type=int, default=30, help="spawns of each variant (default 30)")
    parser.add_argument(
        "--single-tenant",
        action="store_true",
        help="the --single-tenant chain and two ways without its shell",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the chain switches to a job uid")
    namespaces = sandbox.namespaces_unavailable() is None
    job = RunAs("bench", UID, UID)
    if args.single_tenant:
        variants, popen = single_tenant(job)
    else:
        true = "/bin/true"
        plain, scoped = (sandbox.Sandbox(namespaces, max_tasks=1024, scoped=s) for s in (False, True))
        variants = {
            "true": [true],
            "landlock step + true": [*sandbox.landlock_step(), true],
            "chain": [*plain.prefix(job, []), true],
            "chain + landlock step": [*scoped.prefix(job, []), true],
        }
        popen = {
            "true": {"env": sandbox.CHAIN_ENV},
            "landlock step + true": {"env": sandbox.SCOPED_CHAIN_ENV},
            "chain": {"env": plain.env},
            "chain + landlock step": {"env": scoped.env},
        }
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    for _ in range(args.spawns):
        for name, argv in variants.items():  # by turns, so load changes hit each alike
            script = sandbox.env_script(JOB_ENV)
            fd, write_end = sandbox.env_pipe(len(script))
            sandbox.send_env(fd, write_end, script, job)
            os.close(write_end)
            try:
                samples[name].append(spawn(argv, **{"stdin": fd, **popen[name]}))
            finally:
                os.close(fd)
    print(f"{args.spawns} spawns each; namespaces: {namespaces}; load average: {os.getloadavg()[0]:.1f}")
    for name, runs in samples.items():
        wall, children, own = (statistics.median(r[i] for r in runs) * 1000 for i in range(3))
        print(f"{name:24} wall {wall:6.2f} ms   CPU {children:6.2f} ms   spawner's CPU {own:5.2f} ms")


if __name__ == "__main__":
    main()

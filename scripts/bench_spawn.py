"""What a job's spawn chain costs: spawn ``true`` through it, with and without a step, by turns.

Run as root (the chain switches to a job uid, here one outside the agents' range)::

    .venv/bin/python scripts/bench_spawn.py --spawns 30

Prints, for each variant, the median wall time of a spawn (fork to exit) and the CPU time its
processes used (children's user + system), per spawn. Variants: the chain as the agent builds it
(private mounts where the machine allows them, a uid, prlimit), with and without the Landlock step
(agent/landlock.py), and the step alone in front of ``true``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import sandbox  # noqa: E402
from agent.identity import RunAs  # noqa: E402

UID = 270002  # outside the default range (200000-265535): no agent hands it to a job


def spawn(
    argv: list[str], stdin: int | None = None, env: dict[str, str] = sandbox.CHAIN_ENV
) -> tuple[float, float]:
    """Wall and CPU seconds of one spawn of ``argv`` to its exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, stdin=stdin, env=env, cwd="/", check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawns", type=int, default=30, help="spawns of each variant (default 30)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the chain switches to a job uid")
    namespaces = sandbox.namespaces_unavailable() is None
    true = "/bin/true"
    job = RunAs("bench", UID, UID)
    plain, scoped = (sandbox.Sandbox(namespaces, max_tasks=1024, scoped=s) for s in (False, True))
    variants = {
        "true": [true],
        "landlock step + true": [*sandbox.landlock_step(), true],
        "chain": [*plain.prefix(job, []), true],
        "chain + landlock step": [*scoped.prefix(job, []), true],
    }
    envs = {"true": sandbox.CHAIN_ENV, "chain": plain.env, "chain + landlock step": scoped.env}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.spawns):
        for name, argv in variants.items():  # by turns, so load changes hit each alike
            script = sandbox.env_script({})
            fd, write_end = sandbox.env_pipe(len(script))
            sandbox.send_env(fd, write_end, script, job)
            os.close(write_end)
            try:
                env = sandbox.SCOPED_CHAIN_ENV if name.startswith("landlock") else envs[name]
                samples[name].append(spawn(argv, stdin=fd, env=env))
            finally:
                os.close(fd)
    print(f"{args.spawns} spawns each; namespaces: {namespaces}; load average: {os.getloadavg()[0]:.1f}")
    for name, runs in samples.items():
        wall = statistics.median(w for w, _ in runs) * 1000
        cpu = statistics.median(c for _, c in runs) * 1000
        print(f"{name:24} wall {wall:6.1f} ms   CPU {cpu:6.1f} ms")


if __name__ == "__main__":
    main()

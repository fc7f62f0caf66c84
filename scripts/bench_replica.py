"""What one replica costs the agent: CPU from its binding to its exit report, in process.

Runs the e2e benchmark's job mix (``true``: single GPUs, half GPUs, gangs of two with a world
file) through :class:`agent.process.JobProcess` one replica after another, against a server that
answers at once, and prints the agent process's CPU (its threads) and its children's (the spawn
chain and the job) per replica. The sandbox is the one this machine allows, as the agent would
detect it; ``--single-tenant`` (as ``make bench-e2e`` runs its agents) every job as ``nobody``.
The main thread's share (``JobProcess(...)`` and ``start()``: every replica of an agent starts
there, one after another) is printed as user and system time. ``--pieces`` adds the thread CPU
of the steps, per replica. Run as root; to compare two checkouts, run each with its own code, by
turns::

    PYTHONPATH=<checkout> <checkout>/.venv/bin/python <checkout>/scripts/bench_replica.py --single-tenant
"""

from __future__ import annotations

import argparse
import collections
import functools
import logging
import os
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import cgroups, identity, leftovers, process, sandbox, state  # noqa: E402
from agent.client import AgentClient  # noqa: E402


class Server(AgentClient):
    """Answers every report at once, sending nothing."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9")

    def started(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    def logs(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    def exited(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    def checkpointed(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


def bindings(n: int, rng: random.Random, first_job: int = 1, cpus: float = 0.0) -> list[dict[str, Any]]:
    """``n`` replicas of the e2e benchmark's mix (scripts/bench_e2e.py's ``job_body``), each asking
    for ``cpus`` (a cgroup of its own when more than 0)."""
    out: list[dict[str, Any]] = []
    job = first_job
    while len(out) < n:
        roll = rng.random()
        base = {"job_id": job, "attempt": 1, "command": ["true"], "env": {}, "time_limit_seconds": 3600}
        base["cpus"] = cpus
        job += 1
        if roll < 0.6:
            out.append({**base, "gpus": [0], "share": 1.0})
        elif roll < 0.8:
            out.append({**base, "gpus": [1], "share": 0.5})
        else:
            gpus = [0] if roll < 0.9 else [0, 1, 2, 3]
            for rank in range(2):
                meet: dict[str, Any] = {"world_size": 2, "rank": rank, "local_rank": rank}
                meet |= {"master_addr": "127.0.0.1", "master_port": 29500}
                out.append({**base, "gpus": gpus, "replica": rank, "replicas": 2, "rendezvous": meet})
    return out[:n]


def timed(pieces: dict[str, float], owner: Any, name: str, label: str) -> None:
    """Count the thread CPU of ``owner.name`` into ``pieces[label]``."""
    inner: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            pieces[label] += time.thread_time() - began

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=300, help="replicas measured (default 300)")
    parser.add_argument("--single-tenant", action="store_true", help="every job as nobody, no sandbox")
    parser.add_argument("--pieces", action="store_true", help="the thread CPU of each step too")
    parser.add_argument(
        "--cpus", type=float, default=0.0, help="CPUs each replica asks for: a cgroup each (default 0: none)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root, as the agent runs")
    logging.basicConfig(level=logging.ERROR)
    state_dir = state.prepare_state_dir(Path(tempfile.mkdtemp(prefix="bench-replica-")))
    users: identity.JobUsers = (
        identity.SharedUser(identity.resolve_run_as("nobody"))
        if args.single_tenant
        else identity.UidPool(identity.parse_range("270100-270199"), state_dir / "uid-locks")
    )
    path = process.job_path(state_dir, users.probe())
    box = sandbox.detect({}, users.isolated, [state_dir], None, sandbox.HIDDEN, 1024, None)
    limits = cgroups.detect()
    pieces: dict[str, float] = collections.defaultdict(float)  # label → thread CPU seconds
    if args.pieces:
        steps = ("start", "_spawn", "_supervise", "_watch", "_end_session", "_record_session", "_enforce")
        for name in steps:
            timed(pieces, process.JobProcess, name, f"JobProcess.{name}")
        for name in ("_new_workdir", "_remove_workdir", "_owned_dir", "checkpoint_dir", "write_world"):
            if hasattr(process, name):
                timed(pieces, process, name, name)
        timed(pieces, shutil, "rmtree", "shutil.rmtree")
        timed(pieces, leftovers, "end_sessions", "leftovers.end_sessions")

    starting = [0.0, 0.0]  # the main thread's user and system CPU in JobProcess(...) and start()

    def run(replicas: list[dict[str, Any]]) -> None:
        for binding in replicas:
            before = resource.getrusage(resource.RUSAGE_THREAD)
            job = process.JobProcess(binding, Server(), state_dir, users, path, limits, box)
            job.start()
            after = resource.getrusage(resource.RUSAGE_THREAD)
            starting[0] += after.ru_utime - before.ru_utime
            starting[1] += after.ru_stime - before.ru_stime
            job.done.wait()

    try:
        # Warm: imports, caches, the probes.
        run(bindings(5, random.Random(2), first_job=10**6, cpus=args.cpus))
        pieces.clear()
        starting[:] = [0.0, 0.0]
        replicas = bindings(args.replicas, random.Random(1), cpus=args.cpus)
        own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        began = time.perf_counter()
        run(replicas)
        wall = time.perf_counter() - began
        measured = dict(pieces)  # not the clean-up below
        own_after, children_after = (
            resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        )
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    n = args.replicas

    def ms(before: resource.struct_rusage, after: resource.struct_rusage) -> float:
        return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000 / n

    agent_ms, children_ms = ms(own, own_after), ms(children, children_after)
    print(
        f"{n} replicas; namespaces {box.namespaces}, Landlock {box.scoped}, uid per job {users.isolated}, "
        f"cgroups {limits is not None and args.cpus > 0}; "
        f"load {os.getloadavg()[0]:.1f}; threads {threading.active_count()}"
    )
    print(
        f"per replica: agent {agent_ms:.2f} ms, children {children_ms:.2f} ms, "
        f"total {agent_ms + children_ms:.2f} ms CPU; wall {wall * 1000 / n:.1f} ms"
    )
    user_ms, sys_ms = (t * 1000 / n for t in starting)
    print(f"  of the agent's: its main thread starting it {user_ms:.3f} ms user, {sys_ms:.3f} ms system")
    for label, seconds in sorted(measured.items(), key=lambda kv: -kv[1]):
        print(f"  {label:32} {seconds * 1000 / n:7.3f} ms")


if __name__ == "__main__":
    main()

"""CPU and memory limits for job processes, with cgroups (v2, or v1) where the machine allows it.

Each replica gets its own cgroup,
``<root>/tessera/<job>-<attempt>-<replica>-<random>`` (the random part: several agents on one
machine never share one; ``tessera`` is 0711, so no job lists the others' names and pids), with
``cpu.max`` (``cpus`` × the 100 ms period) when it asks for CPUs and ``memory.max`` (a process
past it is killed by the kernel's OOM killer, and the job fails with its signal) when it asks for
memory, with no swap beside it where the kernel accounts swap (``memory.swap.max`` 0; v1:
``memory.memsw.limit_in_bytes``, memory and swap together, the same bound): else a job pushed
what passed its bound out to the node's swap, and held N times its memory, the node's swap
that every other job and service counts on. One that asks for neither gets its cgroup all the
same: its processes then share the CPU as one group under ``tessera``, beside the agent, instead
of each as the agent's equal in the agent's own cgroup (a job spinning thousands of threads
there left the agent a thousandth of the CPU: a heartbeat's milliseconds of work took seconds,
and its lease ran out). The
cgroup is made before the process is spawned, and the agent writes its pid into ``cgroup.procs``
while its spawn chain waits for the job's environment, before anything of the job runs
(agent/sandbox.py): the job's first instruction, and every process it forks, already run under
its limits. (Only an agent without a usable ``setpriv``, which forks and switches the user itself,
moves a process that already runs the job: one it forks in that first instant may stay outside.)

On a cgroups v1 machine (a hierarchy per controller, writable: a root agent) the same limits go
to ``cpu/tessera/<name>`` (``cpu.cfs_quota_us``) and ``memory/tessera/<name>``
(``memory.limit_in_bytes``). Where neither is usable (an agent that is not root, a container),
limits are **not enforced**: the agent says so once at startup, and jobs run without them.
Fractional GPUs share the GPU's memory without any isolation either way (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger("tessera.agent")

DEFAULT_ROOT = Path(os.environ.get("TESSERA_CGROUP_ROOT", "/sys/fs/cgroup"))
PERIOD_US = 100_000
NEEDED = ("cpu", "memory")


def unavailable_reason(root: Path = DEFAULT_ROOT) -> str | None:
    """None when jobs' limits can be enforced under ``root``; otherwise why not."""
    controllers = root / "cgroup.controllers"
    if not controllers.exists():
        return f"cgroups v2 is not mounted at {root}"
    try:
        have = controllers.read_text().split()
    except OSError as exc:
        return f"cannot read {controllers}: {exc}"
    missing = [c for c in NEEDED if c not in have]
    if missing:
        return f"the cgroup controllers {', '.join(missing)} are not available at {root}"
    if not os.access(root, os.W_OK) or not os.access(root / "cgroup.subtree_control", os.W_OK):
        return f"{root} is not writable by the agent (run it as root, outside a read-only container)"
    return None


class Cgroups:
    """Makes, fills and removes the per-replica cgroups under ``<root>/tessera``."""

    def __init__(self, root: Path = DEFAULT_ROOT):
        self.root = root
        self.parent = root / "tessera"

    def prepare(self) -> None:
        """Delegate cpu and memory to ``tessera`` and below (raises OSError if refused)."""
        _enable(self.root)
        _parent(self.parent)
        _enable(self.parent)

    def create(self, name: str, cpus: float, memory_gib: float) -> Path:
        """The replica's cgroup with its limits (none when it asks for none)."""
        path = self.parent / name
        path.mkdir(exist_ok=True)
        if cpus > 0:
            (path / "cpu.max").write_text(f"{max(1000, round(cpus * PERIOD_US))} {PERIOD_US}\n")
        if memory_gib > 0:
            (path / "memory.max").write_text(f"{int(memory_gib * 2**30)}\n")
            if (path / "memory.swap.max").exists():  # the kernel accounts swap: none for the job
                (path / "memory.swap.max").write_text("0\n")
        return path

    @staticmethod
    def procs(path: Path) -> list[Path]:
        """The files a process joins the replica's cgroup by writing its pid into."""
        return [path / "cgroup.procs"]

    def add(self, path: Path, pid: int) -> None:
        for procs in self.procs(path):
            procs.write_text(f"{pid}\n")

    @staticmethod
    def remove(path: Path) -> None:
        """After the replica's processes are gone (a cgroup with processes cannot be removed)."""
        with contextlib.suppress(OSError):
            path.rmdir()


class CgroupsV1:
    """The same on a cgroups v1 machine (a hierarchy per controller): ``cpu/tessera/<name>``
    with ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, ``memory/tessera/<name>`` with
    ``memory.limit_in_bytes``. A replica's cgroup is named by its ``cpu`` directory's path; the
    ``memory`` one has the same name."""

    def __init__(self, root: Path = DEFAULT_ROOT):
        self.root = root

    def _dirs(self, name: str) -> list[Path]:
        return [self.root / controller / "tessera" / name for controller in NEEDED]

    def prepare(self) -> None:
        for controller in NEEDED:
            _parent(self.root / controller / "tessera")

    def create(self, name: str, cpus: float, memory_gib: float) -> Path:
        cpu, memory = self._dirs(name)
        cpu.mkdir(exist_ok=True)
        memory.mkdir(exist_ok=True)
        if cpus > 0:
            (cpu / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (cpu / "cpu.cfs_quota_us").write_text(f"{max(1000, round(cpus * PERIOD_US))}\n")
        if memory_gib > 0:
            (memory / "memory.limit_in_bytes").write_text(f"{int(memory_gib * 2**30)}\n")
            if (memory / "memory.memsw.limit_in_bytes").exists():  # memory and swap together
                (memory / "memory.memsw.limit_in_bytes").write_text(f"{int(memory_gib * 2**30)}\n")
        return cpu

    def procs(self, path: Path) -> list[Path]:
        return [directory / "cgroup.procs" for directory in self._dirs(path.name)]

    def add(self, path: Path, pid: int) -> None:
        for procs in self.procs(path):
            procs.write_text(f"{pid}\n")

    def remove(self, path: Path) -> None:
        for directory in self._dirs(path.name):
            with contextlib.suppress(OSError):
                directory.rmdir()


def v1_unavailable_reason(root: Path = DEFAULT_ROOT) -> str | None:
    """None when a cgroups v1 layout with writable ``cpu`` and ``memory`` hierarchies is there."""
    for controller, probe in (("cpu", "cpu.cfs_quota_us"), ("memory", "memory.limit_in_bytes")):
        if not (root / controller / probe).exists():
            return f"no cgroups v1 {controller} hierarchy at {root / controller}"
        if not os.access(root / controller, os.W_OK):
            return f"{root / controller} is not writable by the agent"
    return None


AnyCgroups = Cgroups | CgroupsV1


def _parent(path: Path) -> None:
    """The replicas' cgroups' parent, 0711: each is named after its working directory (whose
    random part keeps that path unguessable) and lists its pids (which a job's private ``/proc``
    hides), so no job may list them; a job still reaches its own, by the path
    ``/proc/self/cgroup`` names (a runtime reading its limits)."""
    path.mkdir(exist_ok=True)
    os.chmod(path, 0o711)


def _enable(path: Path) -> None:
    (path / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in NEEDED) + "\n")


def detect(root: Path = DEFAULT_ROOT) -> AnyCgroups | None:
    """Cgroups ready for jobs, or None (logged once: limits are then not enforced)."""
    reason = unavailable_reason(root)
    if reason is None:
        cgroups = Cgroups(root)
        try:
            cgroups.prepare()
        except OSError as exc:
            reason = f"cannot delegate cpu and memory below {root}: {exc}"
        else:
            log.info("CPU and memory limits are enforced with cgroups v2 under %s", cgroups.parent)
            return cgroups
    v1_reason = v1_unavailable_reason(root)
    if v1_reason is None:
        legacy = CgroupsV1(root)
        try:
            legacy.prepare()
        except OSError as exc:
            v1_reason = f"cannot make {root}/cpu/tessera: {exc}"
        else:
            log.info("CPU and memory limits are enforced with cgroups v1 under %s/{cpu,memory}/tessera", root)
            return legacy
    log.warning("CPU and memory limits are NOT enforced: %s; %s", reason, v1_reason)
    return None

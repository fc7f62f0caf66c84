"""CPU and memory limits for job processes, with cgroups v2 where the machine allows it.

Each replica with a ``cpus`` or ``memory_gib`` request gets its own cgroup,
``<root>/tessera/<job>-<attempt>-<replica>``, with ``cpu.max`` (``cpus`` × the 100 ms period)
and ``memory.max`` (a process past it is killed by the kernel's OOM killer, and the job fails with
its signal). The process is moved into it right after it is spawned (from the agent: a job user
cannot write ``cgroup.procs``); a process it forks in that first instant may stay outside.

Where cgroups v2 is not mounted, lacks the ``cpu`` or ``memory`` controller, or is not writable
(an agent that is not root, a container, a cgroups v1 machine), limits are **not enforced**: the
agent says so once at startup, and jobs run without them. Fractional GPUs share the GPU's memory
without any isolation either way (docs/operations.md).
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
        self.parent.mkdir(exist_ok=True)
        _enable(self.parent)

    def create(self, name: str, cpus: float, memory_gib: float) -> Path | None:
        """The replica's cgroup with its limits; None when it asks for neither."""
        if cpus <= 0 and memory_gib <= 0:
            return None
        path = self.parent / name
        path.mkdir(exist_ok=True)
        if cpus > 0:
            (path / "cpu.max").write_text(f"{max(1000, round(cpus * PERIOD_US))} {PERIOD_US}\n")
        if memory_gib > 0:
            (path / "memory.max").write_text(f"{int(memory_gib * 2**30)}\n")
        return path

    @staticmethod
    def add(path: Path, pid: int) -> None:
        (path / "cgroup.procs").write_text(f"{pid}\n")

    @staticmethod
    def remove(path: Path) -> None:
        """After the replica's processes are gone (a cgroup with processes cannot be removed)."""
        with contextlib.suppress(OSError):
            path.rmdir()


def _enable(path: Path) -> None:
    (path / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in NEEDED) + "\n")


def detect(root: Path = DEFAULT_ROOT) -> Cgroups | None:
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
    log.warning("CPU and memory limits are NOT enforced: %s", reason)
    return None

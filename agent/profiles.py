"""Synthetic GPU-utilisation profiles for jobs other than serving pods (the trace has only those).

A profile says how busy (percent) one GPU of a job is ``minute`` minutes into its run. The agent's
simulated GPUs replay them (a job picks one with ``TESSERA_UTIL_PROFILE`` in its env; otherwise
the serving-pod trace, ``agent/metrics.py``), and the simulator (``scheduling/sim``) draws them for
its jobs (docs/metrics.md). Every value is a pure function of (profile, job id, minute, GPU rank):
the same job looks the same on every agent and in every replay.

| profile | shape |
| --- | --- |
| ``busy`` | 80–98% throughout |
| ``bursty`` | 12-minute cycles: 8 min at 70–95%, 4 min at 15–30% (never idle) |
| ``stalling`` | busy, with a 6-minute stall at 0–2% every 25 minutes (input waits, never 15 min idle) |
| ``idle`` | 0–2% throughout (a forgotten allocation) |
| ``idle-after-N`` | busy for N minutes, then 0–2% (finished work, process left running) |
| ``half-idle-after-N`` | the job's even-ranked GPUs busy; the odd-ranked ones 0–2% after N minutes |
"""

from __future__ import annotations

import re
import zlib

FIXED = ("busy", "bursty", "stalling", "idle")
AFTER = re.compile(r"^(idle|half-idle)-after-(\d{1,6})$")


def is_profile(name: str) -> bool:
    return name in FIXED or AFTER.match(name) is not None


def _noise(job_id: int | str, minute: int, rank: int) -> float:
    """A stable pseudo-random number in [0, 1) for (job, minute, GPU)."""
    return (zlib.crc32(f"{job_id}:{minute}:{rank}".encode()) % 10_000) / 10_000


def util(name: str, job_id: int | str, minute: float, rank: int = 0) -> float:
    """Percent busy of the job's GPU ``rank`` (0.. over all its replicas) at ``minute`` of its run."""
    m = int(max(0.0, minute))
    noise = _noise(job_id, m, rank)
    busy = 80 + 18 * noise
    idle = 2 * noise
    if name == "busy":
        return busy
    if name == "idle":
        return idle
    if name == "bursty":
        return 70 + 25 * noise if m % 12 < 8 else 15 + 15 * noise
    if name == "stalling":
        return idle if m % 25 >= 19 else busy
    match = AFTER.match(name)
    if match is None:
        raise ValueError(f"unknown utilisation profile {name!r}")
    after = int(match.group(2))
    if match.group(1) == "half-idle" and rank % 2 == 0:
        return busy
    return busy if m < after else idle

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
| ``serving`` | a serving pod: active minutes at a level, the rest 0–0.2% (``SERVING``, below) |

``serving`` is the parametric stand-in for the serving-pod trace where the trace cannot be read
(the simulator: the product reads no file outside the repository). Its parameters come from
``pod_gpu_util.csv.gz`` (143 pods, a sample a minute): ranked by mean utilisation, the lowest 20%
of pods are nearly never active (mean ≈ 0.2%), the middle 60% are active (≥ 5%) in ~29% of their
minutes at ~20% (mean ≈ 5.8%: the trace's median pod), the next 10% in ~42% at ~20%, the top 10% in
~30% at ~45%. A job's pod class comes from its id; each minute is active or not by a stable draw.
tests/sim/test_utilisation.py checks the model's pod means against the trace.
"""

from __future__ import annotations

import functools
import re
import zlib

FIXED = ("busy", "bursty", "stalling", "idle", "serving")
#: serving-pod classes, by the job's quantile: (up to quantile, active share of minutes, active %)
SERVING = ((0.20, 0.01, 15.0), (0.80, 0.29, 20.0), (0.90, 0.42, 20.0), (1.0, 0.30, 45.0))
NAMES = (*FIXED, "idle-after-N", "half-idle-after-N")  # as a message lists them
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
    if name == "serving":
        return _serving(job_id, m, rank, noise)
    shape, after = _after(name)
    if shape == "half-idle" and rank % 2 == 0:
        return busy
    return busy if m < after else idle


@functools.lru_cache(maxsize=1024)
def _after(name: str) -> tuple[str, int]:
    match = AFTER.match(name)
    if match is None:
        raise ValueError(f"unknown utilisation profile {name!r}")
    return match.group(1), int(match.group(2))


def _serving(job_id: int | str, minute: int, rank: int, noise: float) -> float:
    quantile = _noise(job_id, -1, 0)  # the job's pod class: one draw for the whole job
    _, active, level = next(c for c in SERVING if quantile < c[0])
    if _noise(job_id, minute, rank + 7919) < active:
        return level * (0.6 + 0.8 * noise)  # active: around the class's level
    return 0.2 * noise

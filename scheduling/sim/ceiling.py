"""The most GPU allocation any policy could reach on a workload: an upper bound, from the inputs.

``gpu_allocation_rate_while_arriving`` (docs/formats.md) averages allocation over [first submit,
last submit]. When jobs arrive slower than the cluster could run them — an empty cluster at night,
say — no policy can reach 100%, and the bound below says how far any policy can get, so a measured
rate can be read against what was possible.

The bound relaxes every constraint but two: a job runs only after its submit, and it can hold at
most the GPU-seconds its work needs. For job ``j`` (``g`` GPUs asked, ``g_max`` the most it may
hold — its elastic maximum — ``d`` its work, ``L`` its time limit): within ``[s_j, τ]`` it holds at
most ``min(g·d, g_max·L, g_max·(τ − s_j))`` GPU-seconds (work accrues at ``k/g`` on ``k`` GPUs, so
its total is ``g·d`` whatever its size; a time limit stops it at ``L``). With ``W(τ)`` the sum of
that over all jobs and ``C`` the cluster's GPUs, the allocated GPU-seconds up to ``T`` are at most

    min over τ in [t0, T] of  W(τ) + C·(T − τ)

(what could have run by ``τ``, then everything busy). It is an upper bound, not always reachable:
it ignores GPU models, topology, quotas and fragmentation (each only lowers what is possible), and
holds for a policy that throws no work away (work lost to preemption, and grace periods, are
allocation on top).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduling.sim.traces import TraceJob


def _usable(tj: TraceJob) -> tuple[float, float, float] | None:
    """(submit, the most GPUs it may hold, how long it can hold them) or None if it holds none."""
    req = tj.request
    g = float(req.gpus)
    if g <= 0 or not tj.duration_s or tj.duration_s <= 0:
        return None
    g_max = max(g, float(req.elastic_max_gpus or 0))
    gpu_seconds = g * tj.duration_s
    if req.time_limit_s:
        gpu_seconds = min(gpu_seconds, g_max * req.time_limit_s)
    return tj.submit_s, g_max, gpu_seconds / g_max


def allocation_ceiling(jobs: Sequence[TraceJob], capacity: float, t0: float, t1: float) -> float | None:
    """The highest time-averaged allocation (0..1) any work-conserving policy reaches in [t0, t1]."""
    if capacity <= 0 or t1 <= t0:
        return None
    # W is piecewise linear: each job adds slope g_max from its submit for `length` seconds.
    slope_changes: list[tuple[float, float]] = []
    for tj in jobs:
        usable = _usable(tj)
        if usable is None:
            continue
        start, g_max, length = usable
        start = max(start, t0)
        if start >= t1:
            continue
        slope_changes.append((start, g_max))
        slope_changes.append((start + length, -g_max))
    slope_changes.sort()
    best = capacity * (t1 - t0)  # τ = t0: W(t0) = 0
    w = slope = 0.0
    at = t0
    for t, change in slope_changes:
        if t > t1:
            break
        w += slope * (t - at)
        at = t
        slope += change
        best = min(best, w + capacity * (t1 - t))
    w += slope * (t1 - at)
    best = min(best, w)
    return best / (capacity * (t1 - t0))

"""The adjustment pass's driver: utilisation read from Prometheus, the pass run through the service.

Per GPU, one point per policy step: the highest SM activity in that step
(``max_over_time(DCGM_FI_PROF_SM_ACTIVE[step])`` as a subquery over the policy's window), and
where a GPU has no SM-activity series, its GPU utilisation (percent / 100). A series is matched to
a running job by the agent's ``job`` label (``exported_job`` after a scrape without
``honor_labels``) *and* by the GPU (``Hostname``, ``gpu``) the job holds: utilisation an agent
reports for a job on a GPU the job does not hold is ignored, with a log line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from monitoring import prometheus
from scheduling.engine.adjust import GpuSeries, IdleSettings, idle_span
from scheduling.models import Job
from scheduling.services import idle_policy, utilisation
from scheduling.services.adjust import (
    AdjustResult,
    HeldGpus,
    Reader,
    UtilisationUnavailable,
    held_gpus,
    run_adjust_pass,
)

log = logging.getLogger("tessera.adjust")


def _subquery(metric: str, window_s: float, step_s: float) -> str:
    return f"max_over_time({metric}[{step_s:g}s])[{window_s:g}s:{step_s:g}s]"


def prometheus_reader(url: str | None = None) -> Reader:
    """A reader of per-step utilisation maxima from Prometheus at ``url`` (default: settings)."""

    def read(held: Sequence[HeldGpus], window_s: float, step_s: float) -> dict[int, list[GpuSeries]]:
        owner = {(node, str(index)): h.job_id for h in held for node, index in h.gpus}
        wanted = {str(h.job_id) for h in held}
        points: dict[tuple[str, str], dict[float, float]] = {}
        for metric, scale in ((prometheus.SM_ACTIVE, 1.0), (prometheus.GPU_UTIL, 0.01)):
            seen = set(points)
            try:
                found = prometheus.query_series(_subquery(metric, window_s, step_s), url)
            except prometheus.PrometheusUnavailable as exc:
                raise UtilisationUnavailable(str(exc)) from exc
            for series in found:
                key = (series.labels.get(prometheus.NODE_LABEL, ""), series.labels.get("gpu", ""))
                jobs = set((prometheus.job_of(series) or "").split(",")) & wanted
                if not jobs or key in seen:
                    continue  # an idle GPU, another job's, or already read as SM activity
                if key not in owner or str(owner[key]) not in jobs:
                    log.warning(
                        "ignored: utilisation of job(s) %s reported on %s/%s, a GPU they do not hold",
                        ",".join(sorted(jobs)),
                        *key,
                    )
                    continue
                merged = points.setdefault(key, {})
                for t, v in series.points:
                    merged[t] = max(merged.get(t, 0.0), v * scale)
        out: dict[int, list[GpuSeries]] = {}
        for (node, gpu), merged in sorted(points.items()):
            out.setdefault(owner[(node, gpu)], []).append(
                GpuSeries(f"{node}/{gpu}", tuple(sorted(merged.items())))
            )
        return out

    return read


def reports_reader() -> Reader:
    """A reader of the per-step maxima the agents' own heartbeats reported
    (``scheduling/services/utilisation.py``): the source where no Prometheus is configured."""

    def read(held: Sequence[HeldGpus], window_s: float, step_s: float) -> dict[int, list[GpuSeries]]:
        wanted = [
            (h.job_id, utilisation.gpu_name(node, index), h.started_at)
            for h in held
            for node, index in h.gpus
        ]
        try:
            found = utilisation.read_series(wanted, window_s, step_s)
        except utilisation.UtilisationUnreadable as exc:
            raise UtilisationUnavailable(str(exc)) from exc
        out: dict[int, list[GpuSeries]] = {}
        for (job_id, gpu), points in sorted(found.items()):
            out.setdefault(job_id, []).append(GpuSeries(gpu, tuple(points)))
        return out

    return read


def utilisation_reader() -> Reader:
    """Prometheus when ``PROMETHEUS_URL`` is set, else the agents' reports: one interface, two
    sources."""
    return prometheus_reader() if getattr(settings, "PROMETHEUS_URL", "") else reports_reader()


def adjust_once() -> AdjustResult:
    """One adjustment pass, reading Prometheus when ``PROMETHEUS_URL`` is set, else the agents'
    own reports."""
    return run_adjust_pass(utilisation_reader())


@dataclass(frozen=True)
class JobUtilisation:
    """A running job's per-GPU utilisation over the idle policy's window, for people to read."""

    source: str  # "prometheus" or "agents"
    step_s: float
    window_s: float
    gpus: list[GpuSeries]
    policy: IdleSettings
    problem: str = ""  # why there is nothing to show (the source cannot be read)

    def as_json(self, now: float | None = None) -> dict[str, Any]:
        """The API's body: each GPU's points ``[t, value]`` (0..1), its idle time by its tenant's
        policy, and its highest and latest value."""
        now = time.time() if now is None else now
        gpus = []
        for series in self.gpus:
            evidence = idle_span(series, self.policy, now)
            gpus.append(
                {
                    "gpu": series.gpu,
                    "points": [[t, round(v, 4)] for t, v in series.points],
                    "latest": round(series.points[-1][1], 4) if series.points else None,
                    "max_util": round(evidence.max_util, 4),
                    "idle_s": round(evidence.idle_s, 1),
                }
            )
        return {
            "source": self.source,
            "step_s": self.step_s,
            "window_s": self.window_s,
            "threshold": self.policy.threshold,
            "problem": self.problem,
            "gpus": gpus,
        }


def job_utilisation(job: Job) -> JobUtilisation:
    """``job``'s GPUs' per-step utilisation maxima while it runs (none once it ended)."""
    policy = idle_policy.effective(job.tenant)
    window = policy.act_after_s + policy.step_s
    source = "prometheus" if getattr(settings, "PROMETHEUS_URL", "") else "agents"
    held = held_gpus(job)
    if held is None:
        return JobUtilisation(source, policy.step_s, window, [], policy)
    try:
        found = utilisation_reader()([held], window, policy.step_s)
    except UtilisationUnavailable as exc:
        return JobUtilisation(source, policy.step_s, window, [], policy, str(exc))
    return JobUtilisation(source, policy.step_s, window, found.get(job.pk, []), policy)

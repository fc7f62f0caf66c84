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
from collections.abc import Sequence

from django.conf import settings

from monitoring import prometheus
from scheduling.engine.adjust import GpuSeries
from scheduling.services import utilisation
from scheduling.services.adjust import (
    AdjustResult,
    HeldGpus,
    Reader,
    UtilisationUnavailable,
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

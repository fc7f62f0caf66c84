"""The adjustment pass end to end: a REAL Prometheus scraping a real agent whose simulated GPUs
replay synthetic profiles (one profile minute per second), the pass reading them back, and the
jobs' events. Short windows (conftest ``short_windows``).

alice's jobs (conftest ``IdleJobs``): the elastic one is warned twice, then shrunk to its busy
GPU through the live resize path; the preemptible batch job is warned twice, asked to checkpoint
now and requeued from that checkpoint; the service is warned twice and never touched; the GPUs
freed go to the job waiting for one. Then Prometheus stops and the pass acts on nothing and says
so (its result, its log, ``/metrics``).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.monitoring.agents import NODE


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_idle_jobs_are_warned_then_shrunk_or_requeued_and_an_outage_stops_the_pass(
    idle_jobs: Any, agent: dict[str, Any], prometheus: Any, settings: Any, caplog: Any
) -> None:
    from monitoring.adjust import adjust_once
    from scheduling.models import AdjustmentState

    settings.PROMETHEUS_URL = prometheus({"agents": agent["metrics"]})
    idle_jobs.settle()
    idle_jobs.assert_acted_on(NODE)

    # Prometheus goes away: the pass reads nothing, acts on nothing, and says so.
    jobs = (idle_jobs.elastic, idle_jobs.service)  # (the batch job may checkpoint meanwhile)
    before = {j: len(idle_jobs.events(j)) for j in jobs}
    prometheus.stop()
    with caplog.at_level(logging.WARNING, logger="tessera.adjust"):
        result = adjust_once()
    assert not result.metrics_ok and "cannot be reached" in result.problem and result.actions == []
    assert "adjustment pass acts on nothing" in caplog.text and "cannot be reached" in caplog.text
    assert {j: len(idle_jobs.events(j)) for j in jobs} == before
    assert not AdjustmentState.objects.get(id=1).metrics_ok
    metrics = idle_jobs.world.client(None).get("/metrics").content.decode()
    assert "tessera_adjustment_metrics_available 0.0" in metrics

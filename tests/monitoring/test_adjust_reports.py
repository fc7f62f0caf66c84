"""The adjustment pass with no Prometheus (the embedded default): a real agent whose simulated GPUs
replay synthetic profiles (one profile minute per second) sends its utilisation with its
heartbeats, and the pass reads those reports. Short windows (conftest ``short_windows``).

alice's jobs (conftest ``IdleJobs``): the elastic one is warned twice, then shrunk to its busy
GPU through the live resize path; the preemptible batch job is warned twice, asked to checkpoint
now and requeued from that checkpoint; the service is warned twice and never touched; the GPUs
freed go to the job waiting for one.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.monitoring.agents import NODE


@pytest.fixture
def metrics_source(settings: Any) -> None:
    settings.PROMETHEUS_URL = ""  # the agents' own reports are the source


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_idle_jobs_seen_through_agent_reports_are_warned_then_shrunk_or_requeued(idle_jobs: Any) -> None:
    idle_jobs.settle()
    idle_jobs.assert_acted_on(NODE)

"""The Prometheus reader against a REAL Prometheus server, scraping a real node agent (simulated
GPUs replaying real utilisation profiles) and the control plane's own /metrics.

alice's job runs on the agent's GPU; the reader gets back that GPU's utilisation by job id, and
the control plane's gauges come back through Prometheus too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monitoring import prometheus as reader
from tests.monitoring.agents import NODE, poll, running_agent
from tests.support import free_port


@pytest.fixture
def agent(live_server: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real agent process (2 simulated A100s) registered with the live server."""
    with running_agent(live_server.url, tmp_path) as agent:
        yield agent


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_reader_gets_the_running_jobs_gpu_utilisation_from_a_real_prometheus(
    world: Any, live_server: Any, agent: dict[str, Any], prometheus: Any
) -> None:
    from scheduling.models import Allocation, Job
    from scheduling.services.passes import run_pass

    response = world.client("alice").post(
        "/api/v1/jobs/",
        {"name": "util-watch", "kind": "training", "command": ["sleep", "120"], "gpus": 1},
        format="json",
    )
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    run_pass()  # under pytest no pass loop runs: the test is the trigger
    poll(
        "the agent starting the job",
        lambda: Job.objects.get(pk=job_id).state == "running",
        timeout_s=20,
    )
    device = Allocation.objects.select_related("device").get(job_id=job_id, released_at__isnull=True).device

    host = live_server.url.split("://", 1)[1]
    url = prometheus({"agents": agent["metrics"], "tessera": host + "/metrics"})

    samples = poll("the job's GPU utilisation", lambda: reader.gpu_utilisation(job_id=job_id, url=url))
    assert len(samples) == 1
    (sample,) = samples
    assert sample.labels["UUID"] == device.uuid
    assert sample.labels["Hostname"] == NODE
    assert sample.labels["gpu"] == str(device.index)
    assert 0 <= sample.value <= 100
    assert reader.gpu_utilisation(job_id=job_id + 1000, url=url) == []
    (active,) = reader.sm_active(job_id=job_id, url=url)
    assert active.labels["UUID"] == device.uuid and 0 <= active.value <= 1
    # The node's other GPU is idle: reported, at 0, with no job.
    on_node = reader.gpu_utilisation(node=NODE, url=url)
    assert {s.labels["gpu"] for s in on_node} == {"0", "1"}
    idle = [s for s in on_node if s.labels["gpu"] != str(device.index)]
    assert idle[0].value == 0

    # The control plane's own gauges, scraped from /metrics through the same server.
    allocated = poll(
        "tessera_gpus_allocated", lambda: reader.query('tessera_gpus_allocated{model="A100"}', url)
    )
    assert allocated[0].value == 1
    total = reader.query('tessera_gpus_total{model="A100"}', url)
    assert total[0].value == 2


def test_the_reader_says_clearly_that_prometheus_url_is_unset(settings: Any) -> None:
    settings.PROMETHEUS_URL = ""
    with pytest.raises(reader.PrometheusUnavailable, match="PROMETHEUS_URL is not set"):
        reader.gpu_utilisation()


def test_the_reader_says_clearly_that_prometheus_cannot_be_reached(settings: Any) -> None:
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(reader.PrometheusUnavailable, match="cannot be reached"):
        reader.query("up")
    assert time.monotonic() - started < 10


def test_label_values_are_escaped_so_a_job_id_cannot_inject_promql() -> None:
    assert reader._matchers(job='1"} or up{x="') == 'job="1\\"} or up{x=\\""'


def test_a_metric_name_that_is_not_one_is_refused_before_any_query() -> None:
    with pytest.raises(ValueError):
        reader.gpu_series("up or vector(1)")

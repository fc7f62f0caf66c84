"""Prometheus finds the agents by HTTP service discovery (``GET /metrics/targets``): operators
only, one target group per node advertising a metrics URL; and a REAL Prometheus, given only that
URL and an operator's token, scrapes a real agent it was never told about."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monitoring import prometheus as reader
from scheduling.models import Node
from tests.monitoring.agents import NODE, poll, running_agent


def test_only_operators_get_the_agents_targets(world: Any) -> None:
    Node.objects.create(name="gpu-7", rack="r2", metrics_url="http://10.0.0.7:9400/metrics")
    Node.objects.create(name="gpu-8", rack="r2", metrics_url="https://gpu-8.example:9443/dcgm")
    Node.objects.create(name="cpu-1", rack="r2")  # no metrics URL: not a target
    assert world.client(None).get("/metrics/targets").status_code in (401, 403)
    assert world.client("alice").get("/metrics/targets").status_code == 403
    response = world.client("admin").get("/metrics/targets")
    assert response.status_code == 200
    assert response.json() == [
        {
            "targets": ["10.0.0.7:9400"],
            "labels": {"node": "gpu-7", "rack": "r2", "__scheme__": "http", "__metrics_path__": "/metrics"},
        },
        {
            "targets": ["gpu-8.example:9443"],
            "labels": {"node": "gpu-8", "rack": "r2", "__scheme__": "https", "__metrics_path__": "/dcgm"},
        },
    ]


@pytest.fixture
def agent(live_server: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with running_agent(live_server.url, tmp_path) as agent:
        yield agent


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_prometheus_finds_and_scrapes_an_agent_through_the_targets_url(
    world: Any, live_server: Any, agent: dict[str, Any], prometheus: Any, tmp_path: Path
) -> None:
    token_file = tmp_path / "operator-token"
    token_file.write_text(world.tokens["admin"])
    discovered = "\n".join(
        [
            "  - job_name: tessera-agents",
            "    scrape_interval: 1s",
            "    scrape_timeout: 1s",
            "    http_sd_configs:",
            f"      - url: {live_server.url}/metrics/targets",
            "        refresh_interval: 1s",
            "        authorization:",
            "          type: Token",
            f"          credentials_file: {token_file}",
            "",
        ]
    )
    url = prometheus({}, more_jobs=discovered)
    up = poll(
        "the discovered agent scraped",
        lambda: [s for s in reader.query(f'up{{job="tessera-agents",node="{NODE}"}}', url) if s.value == 1],
    )
    assert up[0].labels["instance"] == agent["metrics"]
    gpus = poll("its GPUs' series", lambda: reader.gpu_utilisation(node=NODE, url=url))
    assert {s.labels["gpu"] for s in gpus} == {"0", "1"}

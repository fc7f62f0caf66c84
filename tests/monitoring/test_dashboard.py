"""The Grafana dashboard (deploy/grafana-dashboard.json): every panel's PromQL, run against a REAL
Prometheus scraping the control plane's /metrics and a real agent with a job on it, finds data."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monitoring import prometheus as reader
from tests.monitoring.agents import ROOT, poll, running_agent

DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"


def panel_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p["targets"]]


def test_the_dashboard_is_valid_json_with_a_query_on_every_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["panels"]
    assert all(p["targets"] and all(t["expr"].strip() for t in p["targets"]) for p in dashboard["panels"])
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


@pytest.fixture
def agent(live_server: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with running_agent(live_server.url, tmp_path) as agent:
        yield agent


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_panel_of_the_dashboard_finds_data_in_a_real_prometheus(
    world: Any, live_server: Any, agent: dict[str, Any], prometheus: Any, settings: Any
) -> None:
    from monitoring.adjust import adjust_once
    from scheduling.models import Job
    from scheduling.services.passes import run_pass

    body = {"name": "watched", "kind": "training", "command": ["sleep", "300"], "gpus": 1}
    response = world.client("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    run_pass()
    poll("the job running", lambda: Job.objects.filter(state="running").exists(), timeout_s=20)
    host = live_server.url.split("://", 1)[1]
    url = prometheus({"agents": agent["metrics"], "tessera": host + "/metrics"})
    settings.PROMETHEUS_URL = url

    def finds(expr: str) -> bool:
        run_pass()  # passes keep happening, as the loop would run them
        adjust_once()
        return any(math.isfinite(s.value) for s in reader.query(expr, url))

    for title, expr in panel_queries():
        poll(f"panel {title!r}: {expr}", lambda expr=expr: finds(expr), timeout_s=45, every_s=1.0)

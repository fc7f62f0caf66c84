"""The adjustment pass end to end: a REAL Prometheus scraping a real agent whose simulated GPUs
replay synthetic profiles (one profile minute per second), the pass reading them back, and the
jobs' events. Short windows: a 2 s step, idle warnings at 6 and 12 s, action at 18 s.

alice runs three jobs: an elastic one whose odd-ranked GPU goes idle (warned twice, then the
shrink it would get recorded), a preemptible one idle from the start (warned twice, then
requeued), a service idle from the start (warned twice, never touched). Then Prometheus stops and
the pass acts on nothing and says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.monitoring.agents import poll, running_agent

IDLE = {"TESSERA_UTIL_PROFILE": "idle"}


@pytest.fixture
def agent(live_server: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with running_agent(live_server.url, tmp_path, gpus=4) as agent:
        yield agent


@pytest.fixture
def short_windows(settings: Any) -> None:
    settings.TESSERA = {
        **settings.TESSERA,
        "IDLE_STEP_S": 2.0,
        "IDLE_EXEMPT_S": 2.0,
        "IDLE_WARN_S": [6.0, 12.0],
        "IDLE_ACT_S": 18.0,
    }


def submit(world: Any, **body: Any) -> int:
    body = {"name": "idle", "command": ["sleep", "600"], **body}
    response = world.client("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def events(world: Any, job_id: int) -> list[dict[str, Any]]:
    body = world.client("alice").get(f"/api/v1/jobs/{job_id}/events/").json()
    return body["results"] if isinstance(body, dict) else body


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_idle_jobs_are_warned_then_shrunk_or_requeued_and_an_outage_stops_the_pass(
    world: Any, live_server: Any, agent: dict[str, Any], prometheus: Any, settings: Any, short_windows: None
) -> None:
    from monitoring.adjust import adjust_once
    from scheduling.models import Job
    from scheduling.services.passes import run_pass

    elastic = submit(
        world,
        kind="training",
        gpus=2,
        replicas=2,
        elastic={"min_gpus": 1, "max_gpus": 2},
        env={"TESSERA_UTIL_PROFILE": "half-idle-after-0"},
    )
    batch = submit(
        world,
        kind="batch",
        gpus=1,
        env=IDLE,
        checkpoint_seconds=60,
        command=["sh", "-c", 'echo step-1 > "$TESSERA_CHECKPOINT_MARKER"; exec sleep 600'],
    )
    service = submit(world, kind="inference", gpus=1, env=IDLE)
    run_pass()
    ids = (elastic, batch, service)
    poll(
        "the agent starting the jobs",
        lambda: Job.objects.filter(pk__in=ids, state="running").count() == 3,
        timeout_s=30,
    )
    settings.PROMETHEUS_URL = prometheus({"agents": agent["metrics"]})

    def types(job_id: int) -> list[str]:
        return [e["type"] for e in events(world, job_id) if e["type"].startswith("idle-")]

    def settled() -> bool:
        adjust_once()
        return types(batch) == ["idle-warning", "idle-warning", "idle-reclaim"] and any(
            e["details"] and e["details"]["action"] == "shrink" for e in events(world, elastic)
        )

    poll("two warnings, then a requeue and a shrink", settled, timeout_s=90, every_s=1.0)
    (reclaim,) = [e for e in events(world, batch) if e["type"] == "idle-reclaim"]
    assert reclaim["details"]["applied"] is True
    (gpu,) = reclaim["details"]["gpus"]
    assert gpu["idle_s"] >= 18 and gpu["max_util"] < 0.05 and gpu["points"] >= 9
    poll(
        "the batch job back in the queue from its checkpoint",
        lambda: "requeued" in [e["type"] for e in events(world, batch)],
        timeout_s=30,
    )
    requeued = [e for e in events(world, batch) if e["type"] == "requeued"]
    assert requeued[-1]["reason"] == "from last checkpoint"

    shrink = [e for e in events(world, elastic) if (e["details"] or {}).get("action") == "shrink"]
    assert shrink[0]["details"]["to_gpus"] == 1 and shrink[0]["details"]["applied"] is False
    assert len(shrink[0]["details"]["release"]) == 1
    assert types(elastic)[:2] == ["idle-warning", "idle-warning"]
    busy = [g for g in shrink[0]["details"]["gpus"] if g["gpu"] not in shrink[0]["details"]["release"]]
    assert busy and busy[0]["max_util"] > 0.5

    assert types(service) == ["idle-warning", "idle-warning"]
    assert Job.objects.get(pk=service).state == "running"

    # Prometheus goes away: the pass reads nothing, acts on nothing, and says so.
    before = {j: len(events(world, j)) for j in (elastic, service)}
    prometheus.stop()
    result = adjust_once()
    assert not result.metrics_ok and "cannot be reached" in result.problem and result.actions == []
    assert {j: len(events(world, j)) for j in (elastic, service)} == before
    metrics = world.client(None).get("/metrics").content.decode()
    assert "tessera_adjustment_metrics_available 0.0" in metrics

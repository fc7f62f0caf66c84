"""The adjustment pass with no Prometheus (the embedded default): a real agent whose simulated GPUs
replay synthetic profiles (one profile minute per second) sends its utilisation with its
heartbeats, and the pass reads those reports. Short windows: a 2 s step, idle warnings at 6 and
12 s, action at 18 s.

alice runs three jobs: an elastic one whose odd-ranked GPU goes idle (warned twice, then the
shrink it would get recorded), a preemptible batch job idle from the start that handles
"checkpoint now" (warned twice, asked to checkpoint, requeued from that checkpoint), a service
idle from the start (warned twice, never touched).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.monitoring.agents import poll, running_agent

IDLE = {"TESSERA_UTIL_PROFILE": "idle"}
# Writes a checkpoint, then on the agent's "checkpoint now" signal writes another and exits.
CHECKPOINTING = (
    "trap 'echo now >> \"$TESSERA_CHECKPOINT_MARKER\"; exit 0' USR1; "
    'echo step-1 > "$TESSERA_CHECKPOINT_MARKER"; while :; do sleep 0.2; done'
)


@pytest.fixture
def agent(live_server: Any, tmp_path: Path, settings: Any) -> Iterator[dict[str, Any]]:
    settings.PROMETHEUS_URL = ""  # the agents' own reports are the source
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
def test_idle_jobs_seen_through_agent_reports_are_warned_then_shrunk_or_requeued(
    world: Any, live_server: Any, short_windows: None, agent: dict[str, Any]
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
        world, kind="batch", gpus=1, env=IDLE, checkpoint_seconds=60, command=["sh", "-c", CHECKPOINTING]
    )
    service = submit(world, kind="inference", gpus=1, env=IDLE)
    run_pass()
    ids = (elastic, batch, service)
    poll(
        "the agent starting the jobs",
        lambda: Job.objects.filter(pk__in=ids, state="running").count() == 3,
        timeout_s=30,
    )

    def types(job_id: int) -> list[str]:
        return [e["type"] for e in events(world, job_id) if e["type"].startswith("idle-")]

    def settled() -> bool:
        result = adjust_once()
        assert result.metrics_ok, result.problem
        return types(batch) == ["idle-warning", "idle-warning", "idle-reclaim"] and any(
            (e["details"] or {}).get("action") == "shrink" for e in events(world, elastic)
        )

    poll("two warnings, then a requeue and a shrink", settled, timeout_s=90, every_s=1.0)
    (reclaim,) = [e for e in events(world, batch) if e["type"] == "idle-reclaim"]
    (gpu,) = reclaim["details"]["gpus"]
    assert gpu["gpu"].startswith("prom-node-1/")  # the reporting node's GPU
    assert gpu["idle_s"] >= 18 and gpu["max_util"] < 0.05 and gpu["points"] >= 9
    poll(
        "the batch job back in the queue from its checkpoint",
        lambda: "requeued" in [e["type"] for e in events(world, batch)],
        timeout_s=30,
    )
    after = [e for e in events(world, batch) if e["at"] >= reclaim["at"]]
    # "Checkpoint now" before the requeue: the job wrote a checkpoint on the agent's signal.
    assert [e["reason"] for e in after if e["type"] == "checkpointed"] == ["now"]
    assert [e for e in after if e["type"] == "requeued"][-1]["reason"] == "from last checkpoint"

    shrink = [e for e in events(world, elastic) if (e["details"] or {}).get("action") == "shrink"]
    assert shrink[0]["details"]["to_gpus"] == 1 and len(shrink[0]["details"]["release"]) == 1
    assert types(elastic)[:2] == ["idle-warning", "idle-warning"]
    busy = [g for g in shrink[0]["details"]["gpus"] if g["gpu"] not in shrink[0]["details"]["release"]]
    assert busy and busy[0]["max_util"] > 0.5

    assert types(service) == ["idle-warning", "idle-warning"]
    assert Job.objects.get(pk=service).state == "running"

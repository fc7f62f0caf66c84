"""A running job's per-GPU utilisation, as its owner's team reads it: the API's
``/api/v1/jobs/{id}/utilisation/`` and the job page's sparklines (server-rendered SVG, no script
or inline style), from the agents' reports (no Prometheus). bob (another tenant) gets 404 for both.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from scheduling.models import Job, Node
from scheduling.services.agents import do_report_started
from scheduling.services.utilisation import GpuReport, do_record_utilisation
from tests.agent import helpers as h

STEP = 15.0


@pytest.fixture
def running(world: Any, settings: Any) -> tuple[Job, str]:
    """alice's 2-GPU job running on a node of its own name, its GPU 0 busy and GPU 1 idle for
    the last ten steps."""
    settings.PROMETHEUS_URL = ""
    settings.TESSERA = {
        **settings.TESSERA,
        "IDLE_STEP_S": STEP,
        "IDLE_WARN_S": [60.0, 120.0],
        "IDLE_ACT_S": 300.0,
    }
    name = f"util-{uuid.uuid4().hex[:8]}"  # Redis may hold an earlier run's values for a job id
    h.register(h.new_join_token(), name, gpus=2)
    node = Node.objects.get(name=name)
    job = h.submit(world.alice, world.vision, gpus=2)
    h.bind(job, name, [0, 1])
    do_report_started(node, job.pk, 0, 0, time.time())
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timezone.timedelta(minutes=10))
    now = math.floor(time.time() / STEP) * STEP
    for k in range(10, 0, -1):
        reports = [GpuReport(0, (job.pk,), 80.0, 0.7), GpuReport(1, (job.pk,), 1.0, 0.01)]
        do_record_utilisation(node, reports, {0: {job.pk}, 1: {job.pk}}, now=now - k * STEP + 1)
    job.refresh_from_db()
    return job, name


def test_alices_team_reads_her_jobs_utilisation_and_bob_gets_404(world: Any, running: Any) -> None:
    job, name = running
    body = world.client("carol").get(f"/api/v1/jobs/{job.pk}/utilisation/").json()
    assert body["source"] == "agents" and body["step_s"] == STEP and body["problem"] == ""
    gpus = {g["gpu"]: g for g in body["gpus"]}
    assert set(gpus) == {f"{name}/0", f"{name}/1"}
    assert len(gpus[f"{name}/0"]["points"]) >= 9 and gpus[f"{name}/0"]["max_util"] == 0.7
    assert gpus[f"{name}/1"]["idle_s"] >= 120 and gpus[f"{name}/0"]["idle_s"] == 0
    assert world.client("bob").get(f"/api/v1/jobs/{job.pk}/utilisation/").status_code == 404


def test_a_job_that_does_not_run_has_no_utilisation(world: Any) -> None:
    job = h.submit(world.alice, world.vision, gpus=1)
    body = world.client("alice").get(f"/api/v1/jobs/{job.pk}/utilisation/").json()
    assert body["gpus"] == []


def test_the_job_page_draws_a_sparkline_per_gpu_and_marks_the_idle_one(world: Any, running: Any) -> None:
    job, name = running
    client = Client()
    client.force_login(world.alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert page.count('<polyline class="spark-line"') == 2
    assert f'aria-label="GPU {name}/1: now 1%, highest 1%, idle for' in page
    assert page.count('class="sparkline sparkline-idle"') == 1  # the idle one, by outline and label
    assert "style=" not in page and "<script>" not in page  # the portal's CSP: nothing inline
    bob = Client()
    bob.force_login(world.bob)
    assert bob.get(f"/jobs/{job.pk}/").status_code == 404

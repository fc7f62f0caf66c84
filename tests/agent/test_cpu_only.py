"""A CPU-only job (``gpus: 0``) reaches its node's agent and runs there without GPUs."""

from __future__ import annotations

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services import passes
from tests.agent import helpers as h


def test_a_cpu_only_job_is_started_by_its_agent_and_succeeds(world, join_token):
    node, _ = h.register(join_token, "cpu-01", gpus=0)
    job = h.submit(world.alice, world.vision, gpus=0, cpus=2)
    passes.run_pass()
    (order,) = h.heartbeat(node)["start"]
    assert order["job_id"] == job.pk and order["gpus"] == []
    assert h.report(node, job.pk, "started", attempt=0, replica=0).status_code == 200
    assert h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=0).status_code == 200
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED

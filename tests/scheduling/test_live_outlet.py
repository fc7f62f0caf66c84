"""The live outlet's batches: shortened only where no dashboard or agent could tell the difference."""

from __future__ import annotations

from scheduling.services.live import _merged


def _job(job_id: int, state: str) -> dict:
    return {"type": "job.update", "job": {"id": job_id, "state": state}}


def test_a_groups_updates_of_one_job_are_reduced_to_the_last():
    batch = [
        ("jobs.tenant.1", _job(7, "running")),
        ("jobs.operators", _job(7, "running")),
        ("jobs.tenant.1", _job(8, "pending")),
        ("jobs.tenant.1", _job(7, "succeeded")),
        ("jobs.operators", _job(7, "succeeded")),
        ("gpus", {"type": "gpu.update", "devices": []}),
    ]
    assert _merged(batch) == [
        ("jobs.tenant.1", _job(8, "pending")),
        ("jobs.tenant.1", _job(7, "succeeded")),
        ("jobs.operators", _job(7, "succeeded")),
        ("gpus", {"type": "gpu.update", "devices": []}),
    ]


def test_an_agents_wakes_are_merged_into_one_carrying_every_binding():
    batch = [
        ("agent.3", {"type": "agent.wake", "start": [{"job_id": 1}], "heartbeat": False}),
        ("agent.4", {"type": "agent.wake", "heartbeat": True}),
        ("agent.3", {"type": "agent.wake", "start": [{"job_id": 2}], "heartbeat": False}),
    ]
    assert _merged(batch) == [
        ("agent.3", {"type": "agent.wake", "start": [{"job_id": 1}, {"job_id": 2}], "heartbeat": False}),
        ("agent.4", {"type": "agent.wake", "start": [], "heartbeat": True}),
    ]

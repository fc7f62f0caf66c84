"""Build state through the real services (Zulip style), for the scheduling tests."""

from __future__ import annotations

from django.utils import timezone

from scheduling.models import Device, Node


def make_node(name: str, gpus: int = 8, model: str = "A100", rack: str = "r1", nvlink: int = 4) -> Node:
    node = Node.objects.create(
        name=name,
        rack=rack,
        nvlink_domain=nvlink,
        cpus=64,
        memory_gib=512,
        last_heartbeat=timezone.now(),
    )
    Device.objects.bulk_create(
        Device(
            node=node, index=i, uuid=f"GPU-{name}-{i}", model=model, memory_gib=80, nvlink_island=i // nvlink
        )
        for i in range(gpus)
    )
    return node


def job_fields(**overrides) -> dict:
    fields = {
        "name": "train",
        "kind": "training",
        "command": ["python", "-c", "print(1)"],
        "gpus": 1,
        "replicas": 1,
        "min_available": 1,
        "preemptible": True,
    }
    fields.update(overrides)
    return fields


def submit(user, tenant, **overrides):
    from scheduling.services.jobs import do_submit_job

    fields = job_fields(**overrides)
    job, _ = do_submit_job(user, tenant, fields, body=fields)
    return job

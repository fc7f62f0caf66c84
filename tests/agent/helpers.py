"""Build agent-side state through the real API and services."""

from __future__ import annotations

import base64
from typing import Any

import redis
from channels.layers import InMemoryChannelLayer
from rest_framework.test import APIClient

from scheduling.services.agents import do_create_join_token

AGENT = "/api/v1/agent/"


def new_join_token(name: str = "test", expires_hours: float | None = None) -> str:
    return do_create_join_token(name, expires_hours)[1]


def node_body(name: str = "gpu-01", gpus: int = 8, model: str = "A100", **overrides: Any) -> dict:
    body = {
        "name": name,
        "rack": "r1",
        "labels": {"zone": "a"},
        "kind": "gpu",
        "cpus": 64,
        "memory_gib": 512,
        "nvlink_domain": 4,
        "metrics_url": "http://127.0.0.1:9400/metrics",
        "devices": [
            {"index": i, "uuid": f"GPU-{name}-{i}", "model": model, "memory_gib": 80} for i in range(gpus)
        ],
    }
    body.update(overrides)
    return body


def client_with(auth: str | None) -> APIClient:
    client = APIClient()
    if auth:
        client.credentials(HTTP_AUTHORIZATION=auth)
    return client


def register(join_token: str, name: str = "gpu-01", **overrides: Any) -> tuple[APIClient, dict]:
    """Register a node; returns an API client holding its credential, and the answer."""
    answer = client_with(f"Join {join_token}").post(
        AGENT + "register", node_body(name, **overrides), format="json"
    )
    assert answer.status_code in (200, 201), answer.content
    return client_with(f"Node {answer.data['credential']}"), answer.data


def reregister(credential: str, name: str = "gpu-01", **overrides: Any) -> tuple[APIClient, dict]:
    """Register a node again with its own credential, as its restarted agent does."""
    answer = client_with(f"Node {credential}").post(
        AGENT + "register", node_body(name, **overrides), format="json"
    )
    assert answer.status_code == 200, answer.content
    return client_with(f"Node {answer.data['credential']}"), answer.data


def heartbeat(node: APIClient, running: list[dict] | None = None) -> dict:
    answer = node.post(AGENT + "heartbeat", {"running": running or []}, format="json")
    assert answer.status_code == 200, answer.content
    return answer.data


def report(node: APIClient, job_id: int, what: str, **body: Any):
    if what == "logs":
        body["data"] = base64.b64encode(body["data"]).decode()
    return node.post(f"{AGENT}jobs/{job_id}/{what}", body, format="json")


def bind(job, node_name: str, gpus: list[int], replica: int = 0):
    """Bind ``job`` to ``gpus`` of a node as a scheduling pass would (state ``scheduled``)."""
    from django.db import transaction
    from django.utils import timezone

    from scheduling.choices import EventType, JobState
    from scheduling.models import Allocation, Device, Job
    from scheduling.services.jobs import allocations_payload, do_transition

    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("tenant").get(pk=job.pk)
        at = timezone.now()  # as the pass: the event first, then its allocations (created after)
        allocs = [
            Allocation.objects.create(
                job=job,
                device=Device.objects.select_related("node").get(node__name=node_name, index=i),
                replica=replica,
                attempt=job.attempts,
            )
            for i in gpus
        ]
        do_transition(
            job, JobState.SCHEDULED, EventType.SCHEDULED, allocations=allocations_payload(allocs), at=at
        )
    return job


def submit(user, tenant, **overrides):
    from scheduling.services.jobs import do_submit_job

    fields = {
        "name": "train",
        "kind": "training",
        "command": ["python", "-c", "print(1)"],
        "gpus": 2,
        "replicas": 1,
        "min_available": 1,
        "preemptible": True,
    }
    fields.update(overrides)
    return do_submit_job(user, tenant, fields, body=fields)[0]


def output_bytes(job) -> bytes:
    """A job's stored output (its replicas' in turn), as the agent sent it."""
    from scheduling.models import Job

    return b"".join(bytes(c.data) for c in Job.objects.get(pk=job.pk).log_chunks.all())


def output_of(job) -> str:
    return output_bytes(job).decode()


def state_of(job) -> str:
    from scheduling.models import Job

    return Job.objects.get(pk=job.pk).state


class UnreachableLayer(InMemoryChannelLayer):
    """A channel layer whose Redis is out of reach: joining or leaving a group fails as
    channels_redis fails then."""

    async def group_add(self, group: str, channel: str) -> None:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    async def group_discard(self, group: str, channel: str) -> None:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

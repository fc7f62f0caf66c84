"""An agent's batch of exit reports: settled in one transaction that reads everything it needs
with the jobs' lock (webhooks, the freed GPUs' other holders, whether a job is pending) and
writes everything at once, its BEGIN and COMMIT riding on those two round trips on PostgreSQL
(``bulk.riding_transaction``). What users rely on: each tenant's webhooks get the deliveries,
and the dashboard's GPU rows show who still holds a shared GPU."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from scheduling.choices import JobState
from scheduling.models import Allocation, Job, Webhook, WebhookDelivery
from scheduling.services import live, passes
from scheduling.services.agents import ExitReport, NotYours, do_report_exits
from tests.scheduling import helpers


def _world_with_a_shared_gpu(world):
    """On one node: alice's ``a`` and bob's ``b`` share GPU 0 (half each), alice's ``c`` holds
    GPU 1. Alice's tenant has a webhook for ends; bob's only for failures."""
    node = helpers.make_node("a100-01", gpus=2)
    a = helpers.submit(world.alice, world.vision, gpus=0.5, name="a")
    b = helpers.submit(world.bob, world.nlp, gpus=0.5, name="b")
    passes.run_pass()
    c = helpers.submit(world.alice, world.vision, gpus=1, name="c")
    passes.run_pass()
    held = Allocation.objects.filter(released_at__isnull=True)
    devices = dict(held.values_list("job_id", "device_id"))
    assert devices[a.pk] == devices[b.pk] != devices[c.pk], "the pass did not pack a and b together"
    Webhook.objects.create(tenant=world.vision, url="https://example.com/hook", secret="s" * 64, events=[])
    Webhook.objects.create(
        tenant=world.nlp, url="https://example.com/nlp", secret="t" * 64, events=["failed"]
    )
    return node, a, b, c


def _published(monkeypatch) -> list[list[dict]]:
    rows: list[list[dict]] = []
    publish = live.publish_devices
    monkeypatch.setattr(live, "publish_devices", lambda devices: (rows.append(devices), publish(devices)))
    return rows


def _check_settled(node, a, b, c, results, rows) -> None:
    assert [r[0].state if isinstance(r, tuple) else type(r) for r in results] == [
        JobState.SUCCEEDED,
        JobState.FAILED,
        NotYours,
    ]
    assert Job.objects.get(pk=a.pk).state == JobState.SUCCEEDED
    assert Job.objects.get(pk=c.pk).state == JobState.FAILED
    assert Job.objects.get(pk=b.pk).state == JobState.SCHEDULED
    # Alice's webhook takes every event: a's success and c's failure. Bob's wants failures of
    # bob's tenant's jobs only: none here.
    sent = sorted(
        (d.webhook.tenant.name, d.event, d.payload["job"]["id"]) for d in WebhookDelivery.objects.all()
    )
    assert sent == [("vision", "failed", c.pk), ("vision", "succeeded", a.pk)]
    assert all(d.state == "pending" and d.attempts == 0 for d in WebhookDelivery.objects.all())
    # The shared GPU still shows b's half; c's GPU is free.
    (published,) = rows
    by_index = {row["index"]: row for row in published}
    shared, whole = (by_index[i] for i in sorted(by_index))
    assert shared["state"] == "shared" and shared["used"] == 0.5
    assert [(j["job_id"], j["tenant"], j["share"]) for j in shared["jobs"]] == [(b.pk, "nlp", 0.5)]
    assert whole["state"] == "free" and whole["jobs"] == [] and whole["node"] == node.name


def _reports(a, c) -> list[ExitReport]:
    started = time.time()
    return [
        ExitReport(a.pk, 0, 0, 0, started_at=started),
        ExitReport(c.pk, 0, 0, 3, started_at=started),
        ExitReport(10**9, 0, 0, 0),
    ]


@pytest.mark.django_db(transaction=True)
def test_an_exit_batch_queues_webhooks_and_publishes_who_still_holds_a_shared_gpu(world, monkeypatch):
    node, a, b, c = _world_with_a_shared_gpu(world)
    rows = _published(monkeypatch)
    results = do_report_exits(node, _reports(a, c))
    _check_settled(node, a, b, c, results, rows)


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql("counts PostgreSQL's round trips")
@pytest.mark.usefixtures("require_postgres")
@pytest.mark.parametrize("riding", [True, False], ids=["riding", "switched-off"])
def test_an_exit_batch_reads_once_and_writes_once_its_begin_and_commit_riding(
    world, monkeypatch, settings, riding
):
    """Two round trips either way; with riding on (the default) the BEGIN goes with the read
    and the COMMIT, after the webhook deliveries, with the writes (TESSERA_RIDING_TRANSACTIONS)."""
    settings.TESSERA = {**settings.TESSERA, "RIDING_TRANSACTIONS": riding}
    node, a, b, c = _world_with_a_shared_gpu(world)
    rows = _published(monkeypatch)
    sent: list[str] = []

    def count(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        results = do_report_exits(node, _reports(a, c))
    assert len(sent) == 2, sent
    assert sent[0].startswith("BEGIN;") == riding and sent[1].endswith(";\nCOMMIT") == riding, sent
    assert "scheduling_webhookdelivery" in sent[1]
    _check_settled(node, a, b, c, results, rows)

"""Tenant isolation, enumerated: every URL pattern of the API, every method it answers.

The endpoints are read from ``scheduling.api.urls`` itself, so a new one fails
``test_every_endpoint_has_an_isolation_rule`` until a rule below says what bob (the outsider),
carol (alice's teammate) and an anonymous caller get from it. The agents' protocol (``agent/``) is
checked by its own tests with agent credentials.

Who may see what: bob never reads or changes vision's objects (404; 403 for what only operators
may do); carol reads and changes them as alice does; nobody without a token gets anything (401).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, reverse
from django.utils import timezone

from scheduling.models import ApiToken, Job, Quota, Webhook, WebhookDelivery
from tests.api.helpers import valid_body

SKIPPED_PREFIXES = ("agent/",)  # the agents' own authentication; tested with agent credentials
IGNORED_NAMES = {"api-not-found"}  # the JSON 404 for every other path


def api_endpoints() -> Iterator[tuple[str, str]]:
    """(url name, HTTP method) for every pattern under /api/v1/, read from its URLconf."""
    from scheduling.api import urls

    def walk(patterns, prefix: str) -> Iterator[tuple[str, Any, str]]:
        for p in patterns:
            route = prefix + str(p.pattern)
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, route)
            elif isinstance(p, URLPattern):
                yield route, p.callback, p.name

    for route, callback, name in walk(urls.urlpatterns, ""):
        if route.startswith(SKIPPED_PREFIXES) or name in IGNORED_NAMES:
            continue
        actions = getattr(callback, "actions", None)
        if actions:
            methods = list(actions)
        elif not hasattr(callback, "view_class"):  # an async function view (the streams): GET
            methods = ["get"]
        else:
            view = callback.view_class
            methods = [m for m in view.http_method_names if m not in ("options", "head") and hasattr(view, m)]
        for method in methods:
            yield name, method.upper()


@dataclass
class Objects:
    job: Job
    quota: Quota
    node: str
    token: ApiToken  # alice's
    webhook: Webhook  # vision's
    delivery: WebhookDelivery  # the webhook's


def no_vision_in(response) -> None:
    """bob's view of a shared resource names neither vision nor its job."""
    text = response.content.decode()
    assert response.status_code == 200
    assert '"vision"' not in text


def shows_vision(response) -> None:
    assert response.status_code == 200
    assert '"vision"' in response.content.decode() or "alice-train" in response.content.decode()


def status(code: int) -> Callable[[Any], None]:
    def check(response) -> None:
        assert response.status_code == code, response.content[:300]

    return check


@dataclass
class Rule:
    url: Callable[[Objects], str]
    bob: Callable[[Any], None]
    carol: Callable[[Any], None]
    body: Callable[[Objects], Any] | None = None
    admin: Callable[[Any], None] | None = None


def job_url(name: str) -> Callable[[Objects], str]:
    return lambda o: reverse(name, kwargs={"pk": o.job.pk})


def bob_job_list(response) -> None:
    assert response.status_code == 200
    assert response.json()["count"] == 0


def carol_job_list(response) -> None:
    assert response.status_code == 200
    assert [j["name"] for j in response.json()["results"]] == ["alice-train"]


def bob_submit_for_vision(response) -> None:
    assert response.status_code == 403 and "own tenant" in response.json()["detail"]
    assert not Job.objects.filter(tenant__name="vision", name="intruder").exists()


def device_uses(response) -> list[dict[str, Any]]:
    data = response.json()
    nodes = data.get("results", [data])
    return [use for node in nodes for device in node["devices"] for use in device["jobs"]]


def carol_sees_alices_job_on_the_node(response) -> None:
    assert response.status_code == 200
    alice_job = Job.objects.get(name="alice-train").pk
    assert [(u["job_id"], u["tenant"]) for u in device_uses(response)] == [(alice_job, "vision")] * 2


def bob_sees_the_gpus_only_as_in_use(response) -> None:
    no_vision_in(response)
    uses = device_uses(response)
    assert len(uses) == 2 and all(u["job_id"] is None and u["tenant"] is None for u in uses)


def unchanged_quota(code: int) -> Callable[[Any], None]:
    def check(response) -> None:
        assert response.status_code == code
        assert Quota.objects.filter(tenant__name="vision", model="*", limit=64).exists()

    return check


def only_own_tokens(who: str) -> Callable[[Any], None]:
    def check(response) -> None:
        assert response.status_code == 200
        assert {t["user"] for t in response.json()["results"]} == {who}

    return check


def all_tokens(response) -> None:
    assert response.status_code == 200
    assert {t["user"] for t in response.json()["results"]} == {"alice", "bob", "carol", "admin"}


def alices_token_kept(code: int) -> Callable[[Any], None]:
    def check(response) -> None:
        assert response.status_code == code
        assert ApiToken.objects.filter(user__username="alice").exists()

    return check


RULES: dict[tuple[str, str], Rule] = {
    ("job-list", "GET"): Rule(lambda o: reverse("job-list"), bob_job_list, carol_job_list),
    ("job-list", "POST"): Rule(
        lambda o: reverse("job-list"),
        bob_submit_for_vision,
        status(201),
        body=lambda o: valid_body(name="intruder", tenant="vision"),
    ),
    ("job-detail", "GET"): Rule(job_url("job-detail"), status(404), status(200)),
    ("job-cancel", "POST"): Rule(job_url("job-cancel"), status(404), status(200)),
    # alice's job runs: carol reaches it, and holding a running job is a conflict
    ("job-hold", "POST"): Rule(job_url("job-hold"), status(404), status(409)),
    ("job-release", "POST"): Rule(job_url("job-release"), status(404), status(200)),
    ("job-events", "GET"): Rule(job_url("job-events"), status(404), status(200)),
    ("job-utilisation", "GET"): Rule(job_url("job-utilisation"), status(404), status(200)),
    ("job-stream", "GET"): Rule(job_url("job-stream"), status(404), status(200)),
    ("job-list-stream", "GET"): Rule(lambda o: reverse("job-list-stream"), status(200), status(200)),
    ("job-logs", "GET"): Rule(job_url("job-logs"), status(404), status(200)),
    ("node-list", "GET"): Rule(
        lambda o: reverse("node-list"), bob_sees_the_gpus_only_as_in_use, carol_sees_alices_job_on_the_node
    ),
    ("node-detail", "GET"): Rule(
        lambda o: reverse("node-detail", kwargs={"name": o.node}),
        bob_sees_the_gpus_only_as_in_use,
        carol_sees_alices_job_on_the_node,
    ),
    ("tenant-list", "GET"): Rule(lambda o: reverse("tenant-list"), no_vision_in, shows_vision),
    ("tenant-detail", "GET"): Rule(
        lambda o: reverse("tenant-detail", kwargs={"pk": o.quota.tenant_id}), status(404), status(200)
    ),
    ("tenant-idle-policy", "GET"): Rule(
        lambda o: reverse("tenant-idle-policy", kwargs={"pk": o.quota.tenant_id}), status(404), status(200)
    ),
    ("tenant-idle-policy", "PUT"): Rule(
        lambda o: reverse("tenant-idle-policy", kwargs={"pk": o.quota.tenant_id}),
        status(403),
        status(403),
        body=lambda o: {"threshold": 0.1},
        admin=status(200),
    ),
    ("quota-list", "GET"): Rule(lambda o: reverse("quota-list"), no_vision_in, shows_vision),
    ("quota-list", "POST"): Rule(
        lambda o: reverse("quota-list"),
        status(403),
        status(403),
        body=lambda o: {"tenant": "vision", "model": "H100", "guaranteed": 1, "limit": 2},
        admin=status(201),
    ),
    ("quota-detail", "GET"): Rule(
        lambda o: reverse("quota-detail", kwargs={"pk": o.quota.pk}), status(404), status(200)
    ),
    ("quota-detail", "PATCH"): Rule(
        lambda o: reverse("quota-detail", kwargs={"pk": o.quota.pk}),
        unchanged_quota(403),
        unchanged_quota(403),
        body=lambda o: {"limit": 1000},
        admin=status(200),
    ),
    ("quota-detail", "DELETE"): Rule(
        lambda o: reverse("quota-detail", kwargs={"pk": o.quota.pk}),
        unchanged_quota(403),
        unchanged_quota(403),
        admin=status(204),
    ),
    ("cluster", "GET"): Rule(lambda o: reverse("cluster"), no_vision_in, status(200)),
    ("audit-list", "GET"): Rule(lambda o: reverse("audit-list"), status(403), status(403), admin=status(200)),
    ("webhook-list", "GET"): Rule(lambda o: reverse("webhook-list"), no_vision_in, shows_vision),
    ("webhook-list", "POST"): Rule(
        lambda o: reverse("webhook-list"),
        status(403),  # naming "tenant": bob may make webhooks for nlp only
        status(201),
        body=lambda o: {"url": "https://93.184.215.14/hook", "tenant": "vision"},
    ),
    ("webhook-detail", "GET"): Rule(
        lambda o: reverse("webhook-detail", kwargs={"pk": o.webhook.pk}), status(404), status(200)
    ),
    ("webhook-detail", "DELETE"): Rule(
        lambda o: reverse("webhook-detail", kwargs={"pk": o.webhook.pk}), status(404), status(204)
    ),
    ("webhook-deliveries", "GET"): Rule(
        lambda o: reverse("webhook-deliveries", kwargs={"pk": o.webhook.pk}), status(404), status(200)
    ),
    ("webhook-redeliver", "POST"): Rule(
        lambda o: reverse("webhook-redeliver", kwargs={"pk": o.webhook.pk, "delivery": o.delivery.pk}),
        status(404),
        status(200),
    ),
    # Tokens are a person's own, not their tenant's: carol sees and revokes alice's no more than bob.
    ("token-list", "GET"): Rule(
        lambda o: reverse("token-list"), only_own_tokens("bob"), only_own_tokens("carol"), admin=all_tokens
    ),
    ("token-list", "POST"): Rule(
        lambda o: reverse("token-list"), status(201), status(201), body=lambda o: {"name": "ci"}
    ),
    ("token-detail", "DELETE"): Rule(
        lambda o: reverse("token-detail", kwargs={"pk": o.token.pk}),
        alices_token_kept(404),
        alices_token_kept(404),
        admin=status(204),
    ),
}

ENDPOINTS = sorted(set(api_endpoints()))


def test_every_endpoint_has_an_isolation_rule():
    assert set(ENDPOINTS) - set(RULES) == set(), "add a rule for each new endpoint"
    assert set(RULES) - set(ENDPOINTS) == set(), "a rule names an endpoint that no longer exists"


def request(client, method: str, url: str, body: Any):
    data = json.dumps(body).encode() if body is not None else b""
    return client.generic(method, url, data, content_type="application/json")


@pytest.fixture
def objects(world, alice_job) -> Objects:
    return Objects(
        job=alice_job,
        quota=Quota.objects.get(tenant=world.vision, model="*"),
        node="n01",
        token=ApiToken.objects.get(user=world.alice),
        webhook=(
            hook := Webhook.objects.create(tenant=world.vision, url="https://93.184.215.14/", secret="s")
        ),
        delivery=WebhookDelivery.objects.create(
            webhook=hook, event="failed", payload={}, state="failed", next_attempt_at=timezone.now()
        ),
    )


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e[1]} {e[0]}")
def test_bob_cannot_reach_vision_objects_and_carol_can(world, objects, endpoint):
    name, method = endpoint
    rule = RULES[endpoint]
    url = rule.url(objects)
    body = rule.body(objects) if rule.body else None
    rule.bob(request(world.client("bob"), method, url, body))
    rule.carol(request(world.client("carol"), method, url, body))
    if rule.admin is not None:
        rule.admin(request(world.client("admin"), method, url, body))


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e[1]} {e[0]}")
def test_no_token_is_a_401(world, objects, endpoint):
    rule = RULES[endpoint]
    body = rule.body(objects) if rule.body else None
    response = request(world.client(None), endpoint[1], rule.url(objects), body)
    assert response.status_code == 401
    assert "detail" in response.json()
    assert Job.objects.count() == 1 and Quota.objects.count() == 2 and ApiToken.objects.count() == 4


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e[1]} {e[0]}")
def test_a_wrong_token_is_a_401(world, objects, endpoint):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    rule = RULES[endpoint]
    body = rule.body(objects) if rule.body else None
    assert request(client, endpoint[1], rule.url(objects), body).status_code == 401


def test_bobs_cancel_leaves_alices_job_running(world, objects):
    request(world.client("bob"), "POST", reverse("job-cancel", kwargs={"pk": objects.job.pk}), None)
    assert Job.objects.get(pk=objects.job.pk).state == "running"


def test_bobs_waiting_job_is_not_told_of_the_alice_job_whose_end_it_waits_for(world, cluster, settings):
    import re

    from scheduling.services import passes
    from tests.api.helpers import bind, run, submit

    settings.TESSERA = {**settings.TESSERA, "ETA_EVERY_S": 0.0}  # this pass plans the estimates
    alices = submit(world.alice, world.vision, name="alice-secret-run", gpus=8, time_limit_seconds=3600)
    bind(alices, cluster["n01"], list(range(8)))
    run(alices)
    bobs = submit(world.bob, world.nlp, name="bobs", gpus=8, accelerators=["H100"])
    passes.run_pass()
    job = world.client("bob").get(reverse("job-detail", kwargs={"pk": bobs.pk})).json()
    assert job["pending_code"] == "reserved" and job["estimated_start"] and job["queue_position"] == 1
    said = " ".join(str(job[k]) for k in ("pending_reason", "estimate_basis", "size_reason"))
    assert "another tenant's job" in job["estimate_basis"], said
    assert not re.search(rf"\bjob {alices.pk}\b", said) and "alice-secret-run" not in said, said
    assert "time limit of 1 h" not in said, said  # alice's job's, not bob's (it has none)

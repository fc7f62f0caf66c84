"""A list's query parameters are the documented ones: a misspelled or unknown one is a 400 naming
it, never silently ignored (``?stat=running`` answered every job, and a CI script acted on them).

alice (vision) lists her tenant's things; admin, an operator, reads the audit log.
"""

from __future__ import annotations

import pytest

from scheduling.models import Webhook
from tests.api.helpers import submit


@pytest.fixture
def lists(world) -> dict[str, tuple[str, str]]:
    """Every list endpoint: who reads it."""
    job = submit(world.alice, world.vision)
    hook = Webhook.objects.create(tenant=world.vision, url="https://hooks.example.com/t", secret="s")
    return {
        "/api/v1/jobs/": "alice",
        f"/api/v1/jobs/{job.pk}/events/": "alice",
        "/api/v1/nodes/": "alice",
        "/api/v1/tenants/": "alice",
        "/api/v1/quotas/": "alice",
        "/api/v1/tokens/": "alice",
        "/api/v1/webhooks/": "alice",
        f"/api/v1/webhooks/{hook.pk}/deliveries/": "alice",
        "/api/v1/audit/": "admin",
    }


def test_every_list_refuses_a_parameter_it_does_not_read_naming_it(world, lists):
    for url, who in lists.items():
        response = world.client(who).get(url, {"stat": "running", "limit": 5})
        assert response.status_code == 400, (url, response.content)
        body = response.json()
        assert set(body) == {"stat"}, url
        assert "unknown query parameter" in body["stat"][0] and "limit" in body["stat"][0]


def test_a_misspelled_filter_no_longer_lists_every_job(world):
    submit(world.alice, world.vision)
    response = world.client("alice").get("/api/v1/jobs/", {"stat": "running"})
    assert response.status_code == 400
    assert "state" in response.json()["stat"][0]  # what it takes, so the typo is plain


@pytest.mark.parametrize(
    "url, query",
    [
        ("/api/v1/jobs/", "state=pending&kind=training&name=resnet&tenant=vision&owner=alice&queue=training"),
        ("/api/v1/jobs/", "limit=2&offset=0&format=json"),
        ("/api/v1/jobs/", "limit=2&cursor=cD0x"),
        ("/api/v1/nodes/", "state=ready&rack=r1&kind=gpu&model=H100&limit=10&offset=0"),
        ("/api/v1/tenants/", "limit=10&offset=0"),
        ("/api/v1/quotas/", "limit=200"),
    ],
)
def test_the_documented_parameters_still_pass(world, url, query):
    submit(world.alice, world.vision)
    assert world.client("alice").get(f"{url}?{query}").status_code == 200


def test_the_audit_logs_own_filters_pass(world):
    query = "action=quota.create&object_type=quota&object_id=1&actor=user%20admin&limit=5"
    assert world.client("admin").get(f"/api/v1/audit/?{query}").status_code == 200


def test_a_jobs_events_take_no_job_list_filter(world):
    job = submit(world.alice, world.vision)
    response = world.client("alice").get(f"/api/v1/jobs/{job.pk}/events/", {"state": "pending"})
    assert response.status_code == 400 and set(response.json()) == {"state"}


def test_a_long_or_odd_unknown_name_is_named_shortly_and_safely(world):
    response = world.client("alice").get(f"/api/v1/jobs/?{'x' * 5000}=1&%FF%00=1")  # not UTF-8; NUL
    assert response.status_code == 400
    assert {len(name) for name in response.json()} <= {65, 2} and len(response.json()) == 2


@pytest.mark.parametrize("url", ["/api/v1/jobs/", "/api/v1/cluster/", "/api/v1/nodes/"])
def test_an_unknown_format_is_a_400_naming_it_not_a_404(world, url):
    response = world.client("alice").get(url, {"format": "xml"})
    assert response.status_code == 400
    assert response.json() == {"format": ["must be one of: api, json"]}
    assert world.client("alice").get(url, {"format": "json"}).status_code == 200


@pytest.fixture
def endpoints(world, cluster):
    """Every endpoint that is not a list, with a request that would succeed: (who, method, url,
    JSON body or None)."""
    from django.utils import timezone

    from scheduling.models import ApiToken, Quota, WebhookDelivery

    job = submit(world.alice, world.vision)
    hook = Webhook.objects.create(tenant=world.vision, url="https://hooks.example.com/t", secret="s")
    delivery = WebhookDelivery.objects.create(
        webhook=hook, event="failed", payload={}, next_attempt_at=timezone.now()
    )
    quota = Quota.objects.get(tenant=world.vision, model="*")
    token = ApiToken.objects.get(user=world.alice)
    body = {"name": "t", "kind": "batch", "command": ["true"], "gpus": 0}
    return [
        ("alice", "post", "/api/v1/jobs/", body),
        ("alice", "get", f"/api/v1/jobs/{job.pk}/", None),
        ("alice", "post", f"/api/v1/jobs/{job.pk}/hold/", None),
        ("alice", "post", f"/api/v1/jobs/{job.pk}/release/", None),
        ("alice", "post", f"/api/v1/jobs/{job.pk}/cancel/", None),
        ("alice", "get", f"/api/v1/jobs/{job.pk}/logs/", None),
        ("alice", "get", f"/api/v1/jobs/{job.pk}/utilisation/", None),
        ("alice", "get", "/api/v1/nodes/n01/", None),
        ("alice", "get", f"/api/v1/tenants/{world.vision.pk}/", None),
        ("alice", "get", f"/api/v1/tenants/{world.vision.pk}/idle-policy/", None),
        ("admin", "put", f"/api/v1/tenants/{world.vision.pk}/idle-policy/", {}),
        ("alice", "get", f"/api/v1/quotas/{quota.pk}/", None),
        (
            "admin",
            "post",
            "/api/v1/quotas/",
            {"tenant": "vision", "model": "H100", "guaranteed": 1, "limit": 2},
        ),
        ("admin", "patch", f"/api/v1/quotas/{quota.pk}/", {"limit": 65}),
        ("admin", "delete", f"/api/v1/quotas/{quota.pk}/", None),
        ("alice", "get", "/api/v1/cluster/", None),
        ("alice", "post", "/api/v1/webhooks/", {"url": "https://hooks.example.com/u"}),
        ("alice", "get", f"/api/v1/webhooks/{hook.pk}/", None),
        ("alice", "post", f"/api/v1/webhooks/{hook.pk}/deliveries/{delivery.pk}/redeliver/", None),
        ("alice", "delete", f"/api/v1/webhooks/{hook.pk}/", None),
        ("alice", "post", "/api/v1/tokens/", {"name": "ci"}),
        ("alice", "delete", f"/api/v1/tokens/{token.pk}/", None),
    ]


def test_every_other_endpoint_refuses_a_parameter_it_does_not_read_and_does_nothing(
    world, endpoints, monkeypatch
):
    """``GET /jobs/7/?wiat=30`` answered at once and ``POST /jobs/?dryrun=true`` stored a job:
    a typo is a 400 naming it, before the endpoint acts; the endpoint then still works."""
    import socket

    from scheduling.models import Job, Quota

    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [(2, 1, 6, "", ("93.184.216.34", 443))])
    jobs, quotas = Job.objects.count(), Quota.objects.count()
    for who, method, url, body in endpoints:
        client = world.client(who)
        response = getattr(client, method)(f"{url}?dryrun=true", body, format="json")
        assert response.status_code == 400, (method, url, response.status_code, response.content)
        assert set(response.json()) == {"dryrun"}, (method, url)
        assert "unknown query parameter; this endpoint takes:" in response.json()["dryrun"][0]
    assert (Job.objects.count(), Quota.objects.count()) == (jobs, quotas)
    for who, method, url, body in endpoints:
        response = getattr(world.client(who), method)(f"{url}?format=json", body, format="json")
        assert response.status_code < 300, (method, url, response.status_code, response.content)


@pytest.mark.parametrize("query", ["wait=0", "format=json&wait=0"])
def test_a_jobs_documented_parameters_still_pass(world, query):
    job = submit(world.alice, world.vision)
    assert world.client("alice").get(f"/api/v1/jobs/{job.pk}/?{query}").status_code == 200
    assert world.client("alice").get(f"/api/v1/jobs/{job.pk}/logs/?offset=0&replica=0").status_code == 200
    response = world.client("alice").get(f"/api/v1/jobs/{job.pk}/?wiat=30")
    assert response.status_code == 400 and "wait" in response.json()["wiat"][0]


@pytest.mark.parametrize("method", ["put", "trace"])
def test_a_method_an_endpoint_does_not_take_is_a_405_whatever_its_query(world, method):
    job = submit(world.alice, world.vision)
    for url in (f"/api/v1/jobs/{job.pk}/", "/api/v1/jobs/", "/api/v1/cluster/"):
        response = world.client("alice").generic(method.upper(), f"{url}?state=running&bogus=1")
        assert response.status_code == 405, (url, response.content)

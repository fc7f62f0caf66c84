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

"""People's tokens are looked up once per process every few seconds, and a change is seen at once.

The world is ``tests/conftest.py``'s: alice in ``vision``.
"""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

JOBS = "/api/v1/jobs/"


def test_a_token_used_again_costs_no_query(world):
    client = world.client("alice")
    assert client.get(JOBS).status_code == 200
    with CaptureQueriesContext(connection) as queries:
        assert client.get(JOBS).status_code == 200
    assert not any("scheduling_apitoken" in q["sql"] for q in queries.captured_queries)


def test_a_deactivated_user_is_refused_at_once(world):
    client = world.client("alice")
    assert client.get(JOBS).status_code == 200
    world.alice.is_active = False
    world.alice.save()
    assert client.get(JOBS).status_code == 401


def test_a_deleted_token_is_refused_at_once(world):
    from scheduling.models import ApiToken

    client = world.client("alice")
    assert client.get(JOBS).status_code == 200
    ApiToken.objects.get(user=world.alice).delete()
    assert client.get(JOBS).status_code == 401


def test_a_user_moved_to_another_tenant_sees_its_jobs_at_once(world):
    from scheduling.models import Membership

    client = world.client("alice")
    assert client.get(JOBS, {"name": "x"}).status_code == 200
    membership = Membership.objects.get(user=world.alice)
    membership.tenant = world.nlp
    membership.save()
    response = client.post(JOBS, {"name": "x", "kind": "batch", "command": ["true"]}, format="json")
    assert response.status_code == 201 and response.json()["tenant"] == "nlp"

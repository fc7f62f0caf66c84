"""Malformed job bodies: each is a 400 naming the field (or ``detail``), 413 when too big; none is
stored, and the service keeps answering. The table runs on PostgreSQL (where NUL characters and
lone surrogates would break the database) and on whatever database is configured (SQLite by default).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduling.models import IdempotencyKey, Job, JobEvent
from tests.api.bad_bodies import CASES
from tests.api.helpers import valid_body

JOBS = "/api/v1/jobs/"
OK = valid_body()


def send(client, body: Any, **extra: Any):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.generic("POST", JOBS, data, content_type="application/json", **extra)


def check_table(world) -> None:
    client = world.client("alice")
    counts = (Job.objects.count(), JobEvent.objects.count(), IdempotencyKey.objects.count())
    for case, body, status, key in CASES:
        response = send(client, body, HTTP_IDEMPOTENCY_KEY=f"key-{case}")
        assert response.status_code == status, (case, response.content[:300])
        error = response.json()
        assert key in error, (case, error)
        assert all(isinstance(v, list | str) for v in error.values()), (case, error)
        assert (Job.objects.count(), JobEvent.objects.count(), IdempotencyKey.objects.count()) == counts, case
    response = send(client, OK)
    assert response.status_code == 201, response.json()
    assert Job.objects.count() == counts[0] + 1


def test_the_table_has_at_least_25_cases_and_unique_ids():
    assert len(CASES) >= 25
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.postgresql("the submit's quota check is a condition of its INSERT only on PostgreSQL")
def test_malformed_bodies_are_refused_and_not_stored_on_postgresql(require_postgres, world):
    check_table(world)


def test_malformed_bodies_are_refused_and_not_stored_on_the_configured_database(world):
    check_table(world)


def test_a_body_that_is_not_json_content_is_a_400(world):
    client = world.client("alice")
    response = client.generic("POST", JOBS, b"name=a", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400 and "detail" in response.json()
    response = client.generic("POST", JOBS, json.dumps(OK).encode(), content_type="text/plain")
    assert response.status_code == 400 and "detail" in response.json()
    assert Job.objects.count() == 0


def test_a_path_without_its_trailing_slash_is_a_redirect_or_a_json_404_never_a_500(world):
    from rest_framework.test import APIClient

    client = APIClient(enforce_csrf_checks=True)  # as a real server: the CSRF middleware is on
    client.credentials(HTTP_AUTHORIZATION=f"Token {world.tokens['alice']}")
    response = client.generic(
        "POST", "/api/v1/jobs", json.dumps(OK).encode(), content_type="application/json"
    )
    assert response.status_code == 404 and "/api/v1/jobs/" in response.json()["detail"]
    response = client.get("/api/v1/jobs?state=pending")
    assert response.status_code == 301 and response["Location"] == "/api/v1/jobs/?state=pending"
    assert client.get("/api/v1/nothing-here/").json() == {"detail": "Not found."}
    assert Job.objects.count() == 0


@pytest.mark.parametrize("key", ["", "k" * 256, "tab\there"])
def test_a_malformed_idempotency_key_is_a_400(world, key):
    response = send(world.client("alice"), OK, HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 400 and "detail" in response.json()
    assert Job.objects.count() == 0

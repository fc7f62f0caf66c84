"""Idempotency-Key: a retried submit returns the first job; the same key with another body is 422."""

from __future__ import annotations

from datetime import timedelta

from scheduling.models import IdempotencyKey, Job
from tests.api.helpers import post_json, valid_body

JOBS = "/api/v1/jobs/"


def test_a_retry_with_the_same_key_and_body_returns_the_first_job_with_200(world):
    client = world.client("alice")
    first = post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="ci-run-42")
    again = post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="ci-run-42")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1


def test_the_same_key_with_another_body_is_a_422_and_stores_nothing(world):
    client = world.client("alice")
    post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="k1")
    response = post_json(client, JOBS, valid_body(gpus=4), HTTP_IDEMPOTENCY_KEY="k1")
    assert response.status_code == 422 and "detail" in response.json()
    assert Job.objects.count() == 1


def test_keys_are_per_user(world):
    alice = post_json(world.client("alice"), JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="shared")
    carol = post_json(world.client("carol"), JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="shared")
    bob = post_json(world.client("bob"), JOBS, valid_body(gpus=4), HTTP_IDEMPOTENCY_KEY="shared")
    assert (alice.status_code, carol.status_code, bob.status_code) == (201, 201, 201)
    assert len({alice.json()["id"], carol.json()["id"], bob.json()["id"]}) == 3


def test_without_a_key_every_submit_is_a_new_job(world):
    client = world.client("alice")
    ids = {post_json(client, JOBS, valid_body()).json()["id"] for _ in range(2)}
    assert len(ids) == 2


def test_a_key_older_than_its_ttl_starts_afresh(world, settings):
    client = world.client("alice")
    first = post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="old")
    IdempotencyKey.objects.update(created_at=IdempotencyKey.objects.get().created_at - timedelta(days=2))
    again = post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="old")
    assert again.status_code == 201 and again.json()["id"] != first.json()["id"]


def test_an_invalid_body_does_not_consume_the_key(world):
    client = world.client("alice")
    assert post_json(client, JOBS, valid_body(gpus=-1), HTTP_IDEMPOTENCY_KEY="k").status_code == 400
    assert post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="k").status_code == 201


def test_a_retry_returns_the_first_job_even_after_the_quota_was_lowered(world):
    from scheduling.models import Quota

    client = world.client("alice")
    first = post_json(client, JOBS, valid_body(gpus=8), HTTP_IDEMPOTENCY_KEY="k")
    Quota.objects.filter(tenant=world.vision).update(guaranteed=1, limit=1)
    again = post_json(client, JOBS, valid_body(gpus=8), HTTP_IDEMPOTENCY_KEY="k")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert post_json(client, JOBS, valid_body(gpus=8), HTTP_IDEMPOTENCY_KEY="new").status_code == 400


def test_a_retry_that_writes_a_whole_number_as_a_float_is_the_same_request(world):
    client = world.client("alice")
    first = post_json(client, JOBS, valid_body(gpus=2, cpus=4), HTTP_IDEMPOTENCY_KEY="ci-7")
    again = post_json(client, JOBS, valid_body(gpus=2.0, cpus=4.0), HTTP_IDEMPOTENCY_KEY="ci-7")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and Job.objects.count() == 1


def test_a_retry_that_reorders_the_keys_is_the_same_request(world):
    client = world.client("alice")
    first = post_json(client, JOBS, valid_body(env={"A": "1", "B": "2"}), HTTP_IDEMPOTENCY_KEY="k")
    body = dict(reversed(valid_body(env={"B": "2", "A": "1"}).items()))
    again = post_json(client, JOBS, body, HTTP_IDEMPOTENCY_KEY="k")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]


def test_the_same_key_with_a_number_that_differs_after_validation_is_still_a_422(world):
    client = world.client("alice")
    post_json(client, JOBS, valid_body(gpus=0.5, replicas=1), HTTP_IDEMPOTENCY_KEY="frac")
    response = post_json(client, JOBS, valid_body(gpus=0.25, replicas=1), HTTP_IDEMPOTENCY_KEY="frac")
    assert response.status_code == 422 and Job.objects.count() == 1


def test_an_operators_key_reused_for_another_tenant_is_a_422(world):
    client = world.client("admin")
    first = post_json(client, JOBS, valid_body(tenant="vision"), HTTP_IDEMPOTENCY_KEY="op")
    other = post_json(client, JOBS, valid_body(tenant="nlp"), HTTP_IDEMPOTENCY_KEY="op")
    assert first.status_code == 201 and other.status_code == 422


def test_a_key_stored_with_the_hash_of_the_bodys_text_still_matches_a_retry_of_that_text(world):
    import hashlib
    import json

    client = world.client("alice")
    first = post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="before-upgrade")
    text_hash = hashlib.sha256(json.dumps(valid_body(), sort_keys=True, default=str).encode()).hexdigest()
    IdempotencyKey.objects.update(body_hash=text_hash)  # as a key stored before this release holds it
    again = post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="before-upgrade")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert (
        post_json(client, JOBS, valid_body(gpus=4), HTTP_IDEMPOTENCY_KEY="before-upgrade").status_code == 422
    )


def test_a_retry_outside_any_transaction_leaves_no_second_job(transactional_db, world):
    # As in the server (autocommit), not inside a test's transaction: on SQLite the job was
    # saved, then its key's insert failed on the unique key, and the job stayed behind.
    client = world.client("alice")
    first = post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="ci-run-43")
    again = post_json(client, JOBS, valid_body(), HTTP_IDEMPOTENCY_KEY="ci-run-43")
    assert (first.status_code, again.status_code) == (201, 200)
    assert list(Job.objects.values_list("pk", flat=True)) == [first.json()["id"]]

"""Named API tokens: several per person, stored hashed, the key shown once, revoked by their owner
or an operator. The world is ``tests/conftest.py``'s (alice and carol in vision, bob in nlp,
admin the operator); each has one token named ``test``.
"""

from __future__ import annotations

import importlib

from django.db import connection

from scheduling.models import ApiToken

TOKENS = "/api/v1/tokens/"
JOBS = "/api/v1/jobs/"


def as_key(key: str):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def stored_text() -> str:
    """Every column of every token row, as text: where a key would be if it were stored."""
    return repr(list(ApiToken.objects.values()))


def test_alice_makes_a_ci_token_beside_her_own_and_both_work(world):
    response = world.client("alice").post(TOKENS, {"name": "ci"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "ci" and body["user"] == "alice" and body["token"].startswith(body["prefix"])
    assert as_key(body["token"]).get(JOBS).status_code == 200
    assert world.client("alice").get(JOBS).status_code == 200
    listed = world.client("alice").get(TOKENS).json()["results"]
    assert sorted(t["name"] for t in listed) == ["ci", "test"]
    assert all("token" not in t for t in listed)


def test_no_key_is_stored_in_clear(world):
    key = world.client("alice").post(TOKENS, {"name": "ci"}, format="json").json()["token"]
    text = stored_text()
    for k in [key, *world.tokens.values()]:
        assert k not in text and k[12:] not in text


def test_a_second_token_of_the_same_name_is_a_conflict_naming_the_field(world):
    response = world.client("alice").post(TOKENS, {"name": "test"}, format="json")
    assert response.status_code == 409 and "name" in response.json()


def test_bad_token_bodies_are_400s(world):
    client = world.client("alice")
    for body in (
        {},
        {"name": ""},
        {"name": 3},
        {"name": "x" * 65},
        {"name": "a\x00b"},
        {"name": "ci", "x": 1},
        [],
    ):
        response = client.post(TOKENS, body, format="json")
        assert response.status_code == 400, body


def test_a_revoked_token_is_refused_at_once(world):
    client = world.client("alice")
    made = client.post(TOKENS, {"name": "ci"}, format="json").json()
    ci = as_key(made["token"])
    assert ci.get(JOBS).status_code == 200
    assert client.delete(f"{TOKENS}{made['id']}/").status_code == 204
    assert ci.get(JOBS).status_code == 401
    assert client.get(JOBS).status_code == 200  # her other token still works


def test_an_operator_revokes_alices_token(world):
    alice_token = ApiToken.objects.get(user=world.alice)
    assert world.client("admin").delete(f"{TOKENS}{alice_token.pk}/").status_code == 204
    assert world.client("alice").get(JOBS).status_code == 401


def test_last_used_is_recorded(world):
    assert ApiToken.objects.get(user=world.bob).last_used_at is None
    world.client("bob").get(JOBS)
    assert ApiToken.objects.get(user=world.bob).last_used_at is not None


def test_a_key_with_the_right_prefix_but_wrong_rest_is_refused(world):
    key = world.tokens["alice"]
    forged = key[:12] + ("A" if key[12] != "A" else "B") + key[13:]
    assert as_key(forged).get(JOBS).status_code == 401


def test_the_migration_hashes_old_clear_text_tokens_and_they_keep_working(world):
    """DRF's old table (``authtoken_token``) held keys in clear: the migration moves each to a
    hashed token named ``default`` and empties it."""
    migration = importlib.import_module("scheduling.migrations.0008_api_tokens")
    old_key = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:
        created = "timestamp with time zone" if connection.vendor == "postgresql" else "datetime"
        cursor.execute(
            f"CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created {created}, user_id integer)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
            [old_key, "2025-01-01 00:00:00+00:00", world.carol.pk],
        )
    from types import SimpleNamespace

    from django.apps import apps

    migration.hash_old_tokens(apps, SimpleNamespace(connection=connection))  # it uses only that
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM authtoken_token")
        assert cursor.fetchone()[0] == 0
        cursor.execute("DROP TABLE authtoken_token")
    moved = ApiToken.objects.get(user=world.carol, name="default")
    assert moved.prefix == old_key[:12] and old_key not in stored_text()
    assert moved.created_at.year == 2025
    assert as_key(old_key).get(JOBS).status_code == 200

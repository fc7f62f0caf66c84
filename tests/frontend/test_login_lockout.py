"""Sign-in throttling: 15 wrong passwords lock the account out, on the portal and the admin alike,
with a page saying so; the right password does not get through a lockout; others are unaffected;
an operator lifts it. The world is ``tests/conftest.py``'s (passwords ``<name>-pass-123``).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

LIMIT = 15


def wrong_passwords(client: Client, url: str, username: str, times: int) -> list[int]:
    return [
        client.post(url, {"username": username, "password": f"guess-{i}"}).status_code for i in range(times)
    ]


@pytest.mark.parametrize("url", ["/login/", "/admin/login/"])
def test_fifteen_wrong_passwords_lock_the_account_out_even_for_the_right_one(world: Any, url: str) -> None:
    who = "admin" if url.startswith("/admin/") else "alice"
    client = Client(REMOTE_ADDR="203.0.113.7")
    codes = wrong_passwords(client, url, who, LIMIT)
    assert codes[: LIMIT - 1] == [200] * (LIMIT - 1) and codes[-1] == 429
    # From another address too: the account is locked, not only the address.
    right = Client(REMOTE_ADDR="198.51.100.9").post(url, {"username": who, "password": f"{who}-pass-123"})
    assert right.status_code == 429
    text = right.content.decode()
    assert "Account locked" in text and "15 minutes" in text
    assert "_auth_user_id" not in right.wsgi_request.session


def test_fourteen_wrong_passwords_then_the_right_one_signs_in_and_resets_the_count(world: Any) -> None:
    client = Client(REMOTE_ADDR="203.0.113.7")
    assert wrong_passwords(client, "/login/", "alice", LIMIT - 1) == [200] * (LIMIT - 1)
    response = client.post("/login/", {"username": "alice", "password": "alice-pass-123"})
    assert response.status_code == 302
    assert wrong_passwords(Client(REMOTE_ADDR="203.0.113.7"), "/login/", "alice", LIMIT - 1)[-1] == 200


def test_a_locked_account_does_not_lock_out_another_user_elsewhere(world: Any) -> None:
    wrong_passwords(Client(REMOTE_ADDR="203.0.113.7"), "/login/", "alice", LIMIT)
    response = Client(REMOTE_ADDR="198.51.100.9").post(
        "/login/", {"username": "bob", "password": "bob-pass-123"}
    )
    assert response.status_code == 302


def test_an_operator_lifts_a_lockout(world: Any) -> None:
    wrong_passwords(Client(REMOTE_ADDR="203.0.113.7"), "/login/", "alice", LIMIT)
    call_command("axes_reset_username", "alice")
    call_command("axes_reset_ip", "203.0.113.7")
    response = Client(REMOTE_ADDR="203.0.113.7").post(
        "/login/", {"username": "alice", "password": "alice-pass-123"}
    )
    assert response.status_code == 302


def test_api_tokens_are_not_locked_out_with_the_password(world: Any) -> None:
    wrong_passwords(Client(REMOTE_ADDR="203.0.113.7"), "/login/", "alice", LIMIT)
    assert world.client("alice").get("/api/v1/jobs/").status_code == 200

"""Fixtures for the agent tests: fast password hashing for the shared world, and a join token."""

from __future__ import annotations

import pytest

from tests.agent.helpers import new_join_token


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    """The world's users are made with passwords; real hashing costs seconds per test here."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def join_token(db) -> str:
    return new_join_token()

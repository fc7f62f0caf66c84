"""Fixtures for the agent tests: fast password hashing for the shared world, a join token, and
an agent's state directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent import fakes
from tests.agent.helpers import new_join_token


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    """The world's users are made with passwords; real hashing costs seconds per test here."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def join_token(db) -> str:
    return new_join_token()


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """An agent's state directory that job users can reach (removed afterwards)."""
    with fakes.job_user_state_dir() as path:
        yield path

"""Fixtures for the dashboard's tests: a small cluster built through the ORM, and session cookies.

The cluster: rack r1 holds n01 (4×H100, NVLink islands of 2); rack r2 holds n02 (2×T4). Nodes have
a fresh heartbeat, so the scheduling pass may place jobs on them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.frontend.browser import agent, server  # noqa: F401  (fixtures for the browser tests)
from tests.frontend.helpers import make_node


@pytest.fixture
def cluster(db) -> list[Any]:
    return [make_node("n01", "r1", 4, "H100", nvlink=2), make_node("n02", "r2", 2, "T4")]


@pytest.fixture(autouse=True)
def memory_layer(settings: Any) -> None:
    """An in-process channel layer by default, so no other process's updates (another test run
    sharing the machine's Redis) reach these sockets. Tests that need Redis ask for it."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    """The test world hashes four passwords per test; the production hasher is slow on purpose."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

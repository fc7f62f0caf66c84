"""Helpers for the dashboard's tests (importable; conftest.py holds only fixtures)."""

from __future__ import annotations

from typing import Any


def make_node(name: str, rack: str, count: int, model: str, nvlink: int = 1) -> Any:
    from django.utils import timezone

    from scheduling.models import Device, Node

    node = Node.objects.create(
        name=name, rack=rack, nvlink_domain=nvlink, cpus=64, memory_gib=512, last_heartbeat=timezone.now()
    )
    for index in range(count):
        Device.objects.create(
            node=node,
            index=index,
            uuid=f"GPU-{name}-{index}",
            model=model,
            memory_gib=80,
            nvlink_island=index // nvlink,
        )
    return node


def session_cookie(user: Any) -> str:
    """A logged-in session for ``user``, as the browser's Cookie header would carry it."""
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"

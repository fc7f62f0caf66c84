"""Helpers for the dashboard's tests (importable; conftest.py holds only fixtures)."""

from __future__ import annotations

from typing import Any


def expanded(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's snapshot with each device row's left-out fields put back, as the page does
    (dashboard.js, ``expandDevice``): then its rows are the rows a ``gpu.update`` carries."""
    defaults = snapshot["device_defaults"]
    for node in snapshot["nodes"]:
        model = node["models"][0] if len(node["models"]) == 1 else None
        for row in node["devices"]:
            row["node"] = node["name"]
            row.setdefault("model", model)
            for key, value in defaults.items():
                row.setdefault(key, list(value) if isinstance(value, list) else value)
    return snapshot


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


def seed_browser_world() -> dict[str, Any]:
    """Users, quotas and a small cluster for a web server subprocess (run inside its settings).

    Returns each user's password and API token, and a join token for a real agent. Racks r1 (two
    8×H100 nodes, one NVLink island each) and r2 (8×A100 in islands of 4, and 4×T4).
    """
    from django.contrib.auth.models import User

    from scheduling.models import Membership, Quota, Tenant
    from scheduling.services.tokens import do_create_api_token

    out: dict[str, Any] = {}
    tenants = {name: Tenant.objects.create(name=name) for name in ("vision", "nlp")}
    for tenant in tenants.values():
        Quota.objects.create(tenant=tenant, model="*", guaranteed=16, limit=64)
    for name, tenant in (("alice", "vision"), ("carol", "vision"), ("bob", "nlp"), ("admin", None)):
        password = f"{name}-browser-pass"
        user = User.objects.create_user(name, password=password, is_staff=tenant is None)
        if tenant is not None:
            Membership.objects.create(user=user, tenant=tenants[tenant])
        out[name] = {"password": password, "token": do_create_api_token(user, "test")[1]}
    make_node("h100-a", "r1", 8, "H100", nvlink=8)
    make_node("h100-b", "r1", 8, "H100", nvlink=8)
    make_node("a100-a", "r2", 8, "A100", nvlink=4)
    make_node("t4-a", "r2", 4, "T4")
    from scheduling.services.agents import do_create_join_token

    out["join_token"] = do_create_join_token("browser-test")[1]
    return out

"""The demo cluster's people and quotas: the one write path behind ``manage.py seed_demo``.

Idempotent: running it again converges on the same tenants, users, memberships and quotas, but
every run gives each demo user a fresh random password and a fresh API token (the old ones stop
working), and mints a fresh join token for the demo's agents. Nodes are not made here: the
agents register them, as on a real cluster.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from scheduling.models import ApiToken, Device, JoinToken, Membership, Node, Quota, Tenant, hash_secret
from scheduling.services.agents import do_create_join_token
from scheduling.services.tokens import do_create_api_token

# (tenant, model) → (guaranteed, limit). The demo cluster: 32 H100, 32 A100, 16 T4 (80 GPUs).
# Guarantees add up to the cluster; limits let each tenant borrow up to the whole of a model.
DEMO_QUOTAS: dict[str, dict[str, tuple[float, float]]] = {
    "vision": {"H100": (16, 32), "A100": (16, 32), "T4": (8, 16)},
    "nlp": {"H100": (16, 32), "A100": (16, 32), "T4": (8, 16)},
}
# username → tenant (None: an operator, who belongs to no tenant and sees everything).
DEMO_USERS: dict[str, str | None] = {"admin": None, "alice": "vision", "carol": "vision", "bob": "nlp"}
DEMO_JOIN_TOKEN_NAME = "demo"
DEMO_API_TOKEN_NAME = "demo"
ENV_JOIN_TOKEN_NAME = "from-env"


@dataclass(frozen=True)
class DemoUser:
    username: str
    tenant: str | None
    password: str
    token: str

    @property
    def operator(self) -> bool:
        return self.tenant is None


@dataclass
class DemoSeed:
    users: list[DemoUser] = field(default_factory=list)
    join_token: str = ""
    quotas: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "users": [
                {
                    "username": u.username,
                    "tenant": u.tenant,
                    "operator": u.operator,
                    "password": u.password,
                    "token": u.token,
                }
                for u in self.users
            ],
            "join_token": self.join_token,
            "quotas": {
                t: {m: {"guaranteed": g, "limit": lim} for m, (g, lim) in rows.items()}
                for t, rows in self.quotas.items()
            },
        }


def _password() -> str:
    # Short enough to type, long enough (~72 bits) to be safe on a reachable demo.
    return secrets.token_urlsafe(9)


@transaction.atomic
def do_seed_demo_people() -> DemoSeed:
    """Tenants, quotas and users of the demo, each user with a new password and token."""
    seed = DemoSeed(quotas=DEMO_QUOTAS)
    tenants: dict[str, Tenant] = {}
    for name, rows in DEMO_QUOTAS.items():
        tenants[name], _ = Tenant.objects.get_or_create(name=name)
        for model, (guaranteed, limit) in rows.items():
            Quota.objects.update_or_create(
                tenant=tenants[name],
                model=model,
                defaults={"guaranteed": guaranteed, "limit": limit, "weight": 1.0},
            )
    for username, tenant_name in DEMO_USERS.items():
        user, _ = User.objects.get_or_create(username=username)
        user.is_active = True
        user.is_staff = user.is_superuser = tenant_name is None
        password = _password()
        user.set_password(password)
        user.save()
        if tenant_name is None:
            Membership.objects.filter(user=user).delete()
        else:
            Membership.objects.update_or_create(user=user, defaults={"tenant": tenants[tenant_name]})
        # A fresh "demo" token every run: whatever an earlier run printed stops working (tokens the
        # user made under other names stay).
        ApiToken.objects.filter(user=user, name=DEMO_API_TOKEN_NAME).delete()
        _, key = do_create_api_token(user, DEMO_API_TOKEN_NAME)
        seed.users.append(DemoUser(username, tenant_name, password, key))
    return seed


# The demo's join tokens register at most this many nodes by default (the demo starts 12 agents),
# so a leaked one cannot flood the cluster with fake nodes; a minted one also expires.
DEMO_JOIN_TOKEN_NODES = 16
DEMO_JOIN_TOKEN_HOURS = 24.0


def do_mint_join_token(max_nodes: int = DEMO_JOIN_TOKEN_NODES, names: str = "") -> str:
    """A fresh join token for the demo's agents, for at most ``max_nodes`` new nodes named by
    ``names`` (comma-separated patterns; empty: any new name), expiring in a day (an agent
    registered once re-registers with its own credential); earlier demo join tokens are revoked.

    Made by the agents' own service (``scheduling.services.agents.do_create_join_token``, behind
    ``manage.py create_join_token``), so that the demo's token follows the same rules.
    """
    JoinToken.objects.filter(name=DEMO_JOIN_TOKEN_NAME, revoked=False).update(revoked=True)
    _, secret = do_create_join_token(
        DEMO_JOIN_TOKEN_NAME, expires_hours=DEMO_JOIN_TOKEN_HOURS, max_nodes=max_nodes, names=names
    )
    return secret


def do_register_join_token(secret: str, names: str = "", max_nodes: int = DEMO_JOIN_TOKEN_NODES) -> str:
    """Accept ``secret`` (chosen by the deployer, e.g. docker-compose's) as a join token for at
    most ``max_nodes`` new nodes named by ``names`` (comma-separated patterns; empty: any new
    name)."""
    if not secret.strip():
        raise ValueError("an empty join token would let anyone register a node")
    JoinToken.objects.update_or_create(
        token_hash=hash_secret(secret),
        defaults={"name": ENV_JOIN_TOKEN_NAME, "revoked": False, "max_nodes": max_nodes, "names": names},
    )
    return secret


# A large simulated cluster (``seed_demo --nodes N``): racks of 20 nodes of 8 GPUs, the model and
# NVLink island size by rack, in turn.
SIM_RACK_SIZE = 20
SIM_MODELS = (("H100", 8), ("A100", 4), ("L40S", 2))


def do_seed_simulated_nodes(count: int) -> int:
    """Register ``count`` simulated 8-GPU nodes (``sim-0001`` …) with no agent behind them, for
    looking at the dashboard and the scheduler at scale; returns how many were new. Idempotent
    by name. They carry a fresh heartbeat and no credential: no agent can act for them, and the
    health sweep marks them ``not-ready`` once the heartbeat is older than its timeout."""
    names = [f"sim-{n:04d}" for n in range(1, count + 1)]
    position = {name: n for n, name in enumerate(names)}
    existing = set(Node.objects.filter(name__in=names).values_list("name", flat=True))
    now = timezone.now()
    with transaction.atomic():
        nodes = Node.objects.bulk_create(
            Node(
                name=name,
                rack=f"s{(n // SIM_RACK_SIZE) + 1:02d}",
                nvlink_domain=SIM_MODELS[(n // SIM_RACK_SIZE) % len(SIM_MODELS)][1],
                cpus=128,
                memory_gib=1024,
                last_heartbeat=now,
                labels={"simulated": "true"},
            )
            for n, name in enumerate(names)
            if name not in existing
        )
        by_name = {node.name: node for node in Node.objects.filter(name__in=[n.name for n in nodes])}
        Device.objects.bulk_create(
            Device(
                node=by_name[node.name],
                index=i,
                uuid=f"GPU-{node.name}-{i}",
                model=SIM_MODELS[(position[node.name] // SIM_RACK_SIZE) % len(SIM_MODELS)][0],
                memory_gib=80,
                nvlink_island=i // node.nvlink_domain,
            )
            for node in nodes
            for i in range(8)
        )
    return len(nodes)

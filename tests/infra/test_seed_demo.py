"""``manage.py seed_demo``: the demo's tenants, quotas and users, idempotent, fresh secrets each run."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command
from rest_framework.exceptions import AuthenticationFailed

from scheduling.api.user_auth import TokenAuthentication
from scheduling.models import JoinToken, Membership, Quota, Tenant, hash_secret

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_hashing(settings):
    # Real password hashing costs ~0.3 s a user; these tests check who gets which password.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def seed() -> dict:
    out = io.StringIO()
    call_command("seed_demo", "--json", stdout=out)
    return json.loads(out.getvalue())


def users_of(result: dict) -> dict[str, dict]:
    return {u["username"]: u for u in result["users"]}


def test_seed_demo_makes_the_demo_tenants_users_and_quotas():
    users = users_of(seed())
    assert set(Tenant.objects.values_list("name", flat=True)) == {"vision", "nlp"}
    assert set(users) == {"admin", "alice", "carol", "bob"}
    rows = Membership.objects.select_related("user", "tenant")
    memberships = {m.user.username: m.tenant.name for m in rows}
    assert memberships == {"alice": "vision", "carol": "vision", "bob": "nlp"}
    for tenant in ("vision", "nlp"):
        models = set(Quota.objects.filter(tenant__name=tenant).values_list("model", flat=True))
        assert models == {"H100", "A100", "T4"}
    for quota in Quota.objects.all():
        assert 0 < quota.guaranteed <= quota.limit


def test_admin_is_an_operator_without_a_tenant_and_the_others_are_not_operators():
    users = users_of(seed())
    assert users["admin"]["operator"] and users["admin"]["tenant"] is None
    admin = authenticate(username="admin", password=users["admin"]["password"])
    assert admin is not None and admin.is_staff and admin.is_superuser
    for name in ("alice", "carol", "bob"):
        person = authenticate(username=name, password=users[name]["password"])
        assert person is not None and not person.is_staff and not person.is_superuser


def test_seeding_twice_converges_on_the_same_cluster():
    seed()
    before = (
        sorted(Tenant.objects.values_list("name", flat=True)),
        sorted(Quota.objects.values_list("tenant__name", "model", "guaranteed", "limit")),
        sorted(Membership.objects.values_list("user__username", "tenant__name")),
    )
    seed()
    after = (
        sorted(Tenant.objects.values_list("name", flat=True)),
        sorted(Quota.objects.values_list("tenant__name", "model", "guaranteed", "limit")),
        sorted(Membership.objects.values_list("user__username", "tenant__name")),
    )
    assert after == before


def test_each_run_gives_fresh_passwords_and_tokens_and_the_old_ones_stop_working():
    first = users_of(seed())
    second = users_of(seed())
    for name in ("admin", "alice", "carol", "bob"):
        assert first[name]["password"] != second[name]["password"]
        assert first[name]["token"] != second[name]["token"]
        assert authenticate(username=name, password=first[name]["password"]) is None
        assert authenticate(username=name, password=second[name]["password"]) is not None
    auth = TokenAuthentication()
    with pytest.raises(AuthenticationFailed):
        auth.authenticate_credentials(first["alice"]["token"])
    user, _ = auth.authenticate_credentials(second["alice"]["token"])
    assert user.username == "alice"


def test_the_printed_join_token_is_a_valid_one_and_only_hashed_in_the_database():
    result = seed()
    token = result["join_token"]
    assert len(token) >= 20
    row = JoinToken.objects.get(token_hash=hash_secret(token))
    assert not row.revoked
    assert not JoinToken.objects.filter(token_hash=token).exists()


def test_join_token_from_env_registers_the_deployers_token(monkeypatch):
    monkeypatch.setenv("TESSERA_JOIN_TOKEN", "compose-chosen-secret-1234567890")
    call_command("seed_demo", "--join-token-from-env", stdout=io.StringIO())
    out = io.StringIO()
    call_command("seed_demo", "--join-token-from-env", stdout=out)
    assert "compose-chosen-secret" not in out.getvalue()  # not repeated in the deployment's logs
    assert "password" in out.getvalue()
    rows = JoinToken.objects.filter(token_hash=hash_secret("compose-chosen-secret-1234567890"))
    assert rows.count() == 1 and not rows.get().revoked


def test_the_deployers_join_token_registers_a_bounded_number_of_the_names_it_is_given(monkeypatch):
    monkeypatch.setenv("TESSERA_JOIN_TOKEN", "compose-chosen-secret-1234567890")
    call_command("seed_demo", "--join-token-from-env", "--join-token-names", "agent-*", stdout=io.StringIO())
    row = JoinToken.objects.get(token_hash=hash_secret("compose-chosen-secret-1234567890"))
    assert row.max_nodes == 16 and row.names == "agent-*"


def register(token: str, name: str) -> int:
    from django.test import Client

    body = {"name": name, "devices": [{"index": 0, "uuid": f"GPU-{name}", "model": "T4", "memory_gib": 16}]}
    response = Client().post(
        "/api/v1/agent/register/", body, content_type="application/json", HTTP_AUTHORIZATION=f"Join {token}"
    )
    return response.status_code


def test_the_demos_join_token_registers_its_nodes_and_no_fake_ones():
    out = io.StringIO()
    call_command(
        "seed_demo", "--json", "--join-token-names", "t4-01,t4-02", "--join-token-nodes", "2", stdout=out
    )
    token = json.loads(out.getvalue())["join_token"]
    assert register(token, "fake-gpus") == 403  # not one of its names
    assert [register(token, "t4-01"), register(token, "t4-02")] == [201, 201]
    row = JoinToken.objects.get(token_hash=hash_secret(token))
    assert row.used_up and row.expires_at is not None


def test_a_demo_join_token_is_bounded_by_default():
    row = JoinToken.objects.get(token_hash=hash_secret(seed()["join_token"]))
    assert row.max_nodes == 16 and row.expires_at is not None


def test_join_token_from_env_refuses_an_empty_token(monkeypatch):
    from django.core.management.base import CommandError

    monkeypatch.setenv("TESSERA_JOIN_TOKEN", "  ")
    with pytest.raises(CommandError):
        call_command("seed_demo", "--join-token-from-env", stdout=io.StringIO())
    assert not JoinToken.objects.exists()


def test_a_new_demo_join_token_revokes_the_previous_one():
    first = seed()["join_token"]
    second = seed()["join_token"]
    assert first != second
    assert JoinToken.objects.get(token_hash=hash_secret(first)).revoked
    assert not JoinToken.objects.get(token_hash=hash_secret(second)).revoked


def test_a_credentials_file_is_the_owners_alone_and_nothing_secret_is_printed(tmp_path):
    path = tmp_path / "creds.json"
    path.write_text("old")
    path.chmod(0o644)  # left readable by an earlier run: made private again
    out = io.StringIO()
    call_command("seed_demo", "--credentials-file", str(path), stdout=out)
    assert path.stat().st_mode & 0o777 == 0o600
    users = users_of(json.loads(path.read_text()))
    for u in users.values():
        assert u["password"] not in out.getvalue() and u["token"] not in out.getvalue()
    assert authenticate(username="alice", password=users["alice"]["password"]) is not None


def test_seed_demo_nodes_registers_a_large_simulated_cluster_once():
    from scheduling.models import Device, Node

    out = io.StringIO()
    call_command("seed_demo", "--nodes", "45", stdout=out)
    assert "simulated nodes: 45 added" in out.getvalue()
    call_command("seed_demo", "--nodes", "45", stdout=io.StringIO())  # idempotent
    assert Node.objects.filter(name__startswith="sim-").count() == 45
    assert Device.objects.filter(node__name__startswith="sim-").count() == 45 * 8
    racks = dict(Node.objects.values_list("name", "rack"))
    assert (racks["sim-0001"], racks["sim-0020"], racks["sim-0021"], racks["sim-0045"]) == (
        "s01",
        "s01",
        "s02",
        "s03",
    )
    first, second = (Device.objects.get(node__name=n, index=5) for n in ("sim-0001", "sim-0021"))
    assert (first.model, first.nvlink_island, second.model, second.nvlink_island) == ("H100", 0, "A100", 1)
    assert Node.objects.get(name="sim-0001").credential_hash is None  # no agent can act for it


def test_seed_demo_refuses_an_absurd_node_count():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--nodes"):
        call_command("seed_demo", "--nodes", "-3", stdout=io.StringIO())

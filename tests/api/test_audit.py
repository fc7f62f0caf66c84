"""The audit log: who changed what, with the values before and after, readable by operators only.

The world is ``tests/conftest.py``'s (alice and carol in vision, bob in nlp, admin the operator);
changes are made through the API and the admin console, as operators make them.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from scheduling.models import AuditEntry, Quota
from tests.agent import helpers as agent

AUDIT = "/api/v1/audit/"


@pytest.fixture
def console(world, client):
    client.force_login(world.admin)
    return client


def entries(**filters) -> list[dict]:
    return list(
        AuditEntry.objects.filter(**filters).values("actor", "action", "object_repr", "before", "after")
    )


def test_an_operators_quota_change_through_the_api_is_logged_with_before_and_after(world):
    quota = Quota.objects.get(tenant=world.vision, model="*")
    response = world.client("admin").patch(f"/api/v1/quotas/{quota.pk}/", {"limit": 32}, format="json")
    assert response.status_code == 200
    (entry,) = entries(action="quota.update")
    assert entry["actor"] == "user admin"
    assert (entry["before"]["limit"], entry["after"]["limit"]) == (64, 32)
    assert entry["before"]["tenant"] == "vision" and entry["after"]["guaranteed"] == 16
    # Operators read it in the API.
    listed = world.client("admin").get(AUDIT, {"action": "quota.update"}).json()["results"]
    assert [(e["actor"], e["before"]["limit"], e["after"]["limit"]) for e in listed] == [
        ("user admin", 64, 32)
    ]


def test_a_quota_change_in_the_console_logs_the_stored_values_not_the_forms(console, world):
    quota = Quota.objects.get(tenant=world.nlp, model="*")
    response = console.post(
        reverse("admin:scheduling_quota_change", args=[quota.pk]), {"guaranteed": 8, "limit": 20, "weight": 2}
    )
    assert response.status_code == 302
    (entry,) = entries(action="quota.update")
    assert entry["before"] == {"guaranteed": 16, "limit": 64, "weight": 1.0, "tenant": "nlp", "model": "*"}
    assert entry["after"] == {"guaranteed": 8, "limit": 20, "weight": 2.0, "tenant": "nlp", "model": "*"}


def test_quota_creation_and_deletion_are_logged(world):
    admin = world.client("admin")
    made = admin.post(
        "/api/v1/quotas/", {"tenant": "nlp", "model": "H100", "guaranteed": 1, "limit": 2}, format="json"
    )
    assert made.status_code == 201
    assert admin.delete(f"/api/v1/quotas/{made.json()['id']}/").status_code == 204
    assert [e["action"] for e in entries(object_type="quota")] == ["quota.delete", "quota.create"]
    assert entries(action="quota.delete")[0]["before"]["limit"] == 2


def test_a_cordon_and_an_uncordon_in_the_console_are_logged(console, cluster):
    url = reverse("admin:scheduling_node_changelist")
    node = cluster["n01"]
    console.post(url, {"action": "cordon", "_selected_action": [node.pk]})
    console.post(url, {"action": "cordon", "_selected_action": [node.pk]})  # no change: no entry
    console.post(url, {"action": "uncordon", "_selected_action": [node.pk]})
    logged = entries(object_type="node")
    assert [(e["action"], e["before"]["state"], e["after"]["state"]) for e in logged] == [
        ("node.uncordon", "cordoned", "ready"),
        ("node.cordon", "ready", "cordoned"),
    ]
    assert all(e["actor"] == "user admin" and e["object_repr"] == "n01" for e in logged)


def test_tokens_made_and_revoked_are_logged_without_their_keys(world):
    made = world.client("alice").post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    world.client("admin").delete(f"/api/v1/tokens/{made['id']}/")
    created, revoked = (
        entries(action="api_token.create", after__name="ci"),
        entries(action="api_token.revoke"),
    )
    assert created[0]["actor"] == "user alice" and revoked[0]["actor"] == "user admin"
    assert made["token"] not in repr(list(AuditEntry.objects.values()))


def test_join_tokens_and_registrations_are_logged(db):
    token = agent.new_join_token("rack-9")
    client, answer = agent.register(token, "gpu-01")
    agent.reregister(answer["credential"], "gpu-01", gpus=4)
    assert entries(action="join_token.create")[0]["after"]["name"] == "rack-9"
    again, first = entries(action="node.register")
    assert first["actor"].startswith("join token") and first["before"] is None
    assert first["after"]["gpus"] == "8×A100"
    assert (
        again["actor"] == "node gpu-01"
        and again["before"]["gpus"] == "8×A100"
        and again["after"]["gpus"] == "4×A100"
    )


def test_a_cancel_by_a_teammate_is_logged_and_the_owners_own_is_not(world, alice_job):
    from tests.api.helpers import submit

    assert world.client("carol").post(f"/api/v1/jobs/{alice_job.pk}/cancel/").status_code == 200
    other = submit(world.alice, world.vision, name="mine")
    assert world.client("alice").post(f"/api/v1/jobs/{other.pk}/cancel/").status_code == 200
    (entry,) = entries(action="job.cancel")
    assert entry["actor"] == "user carol" and entry["before"] == {"state": "running"}


def test_a_teammates_repeated_cancel_changes_nothing_and_is_logged_once(world, alice_job):
    for _ in range(3):  # the job is terminating after the first: the others change nothing
        assert world.client("carol").post(f"/api/v1/jobs/{alice_job.pk}/cancel/").status_code == 200
    (entry,) = entries(action="job.cancel")
    assert entry["before"] == {"state": "running"}


@pytest.mark.parametrize("who", ["alice", "carol", "bob"])
def test_only_operators_read_the_audit_log(world, who):
    assert world.client(who).get(AUDIT).status_code == 403


def test_a_bad_filter_is_a_400_naming_it(world):
    response = world.client("admin").get(AUDIT, {"action": "a\x00b"})
    assert response.status_code == 400 and "action" in response.json()


def test_a_user_made_in_the_console_is_logged_with_the_operator_who_made_it(console, world):
    response = console.post(
        reverse("admin:auth_user_add"),
        {
            "username": "dave",
            "usable_password": "true",
            "password1": "Dave-pass-1234",
            "password2": "Dave-pass-1234",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    (entry,) = entries(action="user.create", object_repr="dave")
    assert entry["actor"] == "user admin" and entry["before"] is None
    assert entry["after"] == {"username": "dave", "is_active": True, "is_staff": False, "is_superuser": False}
    assert "Dave-pass" not in repr(list(AuditEntry.objects.values()))


def test_deactivating_a_user_and_making_them_staff_in_the_console_logs_before_and_after(console, world):
    response = console.post(
        reverse("admin:auth_user_change", args=[world.carol.pk]),
        # is_active left out: unticked
        {"username": "carol", "is_staff": "on", "date_joined_0": "2026-12-01", "date_joined_1": "10:00:00"},
    )
    assert response.status_code == 302, response.content[:2000]
    (entry,) = entries(action="user.update", object_repr="carol")
    assert entry["actor"] == "user admin"
    assert (entry["before"], entry["after"]) == (
        {"is_active": True, "is_staff": False},
        {"is_active": False, "is_staff": True},
    )


def test_a_tenant_membership_change_in_the_console_is_logged_on_its_user(console, world):
    membership = world.carol.membership
    response = console.post(
        reverse("admin:scheduling_membership_change", args=[membership.pk]),
        {"user": world.carol.pk, "tenant": world.nlp.pk},
    )
    assert response.status_code == 302, response.content[:2000]
    moved, joined = entries(action="user.tenant", object_repr="carol")  # newest first
    assert (moved["actor"], moved["before"], moved["after"]) == (
        "user admin",
        {"tenant": "vision"},
        {"tenant": "nlp"},
    )
    assert (joined["actor"], joined["before"], joined["after"]) == (
        "system",
        {"tenant": None},
        {"tenant": "vision"},
    )


def test_a_user_deleted_in_the_console_leaves_their_tenant_and_values_in_the_log(console, world):
    url = reverse("admin:auth_user_delete", args=[world.bob.pk])
    assert console.post(url, {"post": "yes"}).status_code == 302
    logged = entries(object_type="user", object_repr="bob", actor="user admin")
    assert [(e["action"], e["before"], e["after"]) for e in logged] == [
        (
            "user.delete",
            {"username": "bob", "is_active": True, "is_staff": False, "is_superuser": False},
            None,
        ),
        ("user.tenant", {"tenant": "nlp"}, {"tenant": None}),
    ]


def test_changes_outside_a_request_are_the_systems_and_sign_ins_are_not_logged(world, client):
    world.bob.is_superuser = True
    world.bob.set_password("new-pass-5678")
    world.bob.save()
    (entry,) = entries(action="user.update", object_repr="bob")
    assert entry["actor"] == "system" and entry["after"] == {"is_superuser": True}
    assert AuditEntry.objects.get(action="user.update", object_repr="bob").note == "password changed"
    made = AuditEntry.objects.count()
    assert client.login(username="alice", password="alice-pass-123")  # last_login saved: no entry
    assert AuditEntry.objects.count() == made


@pytest.mark.django_db(transaction=True)
def test_an_operator_deleting_their_own_account_is_logged_and_committed(world, client):
    """The entry cannot point at the row being deleted (it would not commit): it names them in words."""
    client.force_login(world.admin)
    response = client.post(reverse("admin:auth_user_delete", args=[world.admin.pk]), {"post": "yes"})
    assert response.status_code == 302
    (entry,) = AuditEntry.objects.filter(action="user.delete", object_repr="admin").values(
        "actor", "actor_user"
    )
    assert entry == {"actor": "user admin", "actor_user": None}

"""Quotas and tenants: tenants' users read their own; only operators write, with validation."""

from __future__ import annotations

import pytest

from scheduling.models import Quota
from tests.api.helpers import post_json

QUOTAS = "/api/v1/quotas/"


def patch_json(client, url, body):
    import json

    return client.generic("PATCH", url, json.dumps(body).encode(), content_type="application/json")


def test_a_tenant_user_reads_only_their_tenants_quotas(world):
    rows = world.client("alice").get(QUOTAS).json()["results"]
    assert [(q["tenant"], q["model"], q["guaranteed"], q["limit"]) for q in rows] == [("vision", "*", 16, 64)]
    assert {q["tenant"] for q in world.client("admin").get(QUOTAS).json()["results"]} == {"vision", "nlp"}


def test_tenants_lists_only_the_visible_ones(world):
    assert [t["name"] for t in world.client("bob").get("/api/v1/tenants/").json()["results"]] == ["nlp"]
    names = [t["name"] for t in world.client("admin").get("/api/v1/tenants/").json()["results"]]
    assert names == ["nlp", "vision"]


def test_an_operator_creates_changes_and_deletes_a_quota(
    world, django_capture_on_commit_callbacks, monkeypatch
):
    passes = []
    monkeypatch.setattr("scheduling.services.triggers.request_pass", lambda: passes.append(1))
    admin = world.client("admin")
    with django_capture_on_commit_callbacks(execute=True):
        created = post_json(
            admin, QUOTAS, {"tenant": "nlp", "model": "H100", "guaranteed": 8, "limit": 16, "weight": 2}
        )
    assert created.status_code == 201, created.json()
    quota = created.json()
    assert (quota["tenant"], quota["model"], quota["weight"]) == ("nlp", "H100", 2)
    url = f"{QUOTAS}{quota['id']}/"
    with django_capture_on_commit_callbacks(execute=True):
        changed = patch_json(admin, url, {"limit": 32})
    assert changed.status_code == 200 and changed.json()["limit"] == 32
    assert Quota.objects.get(pk=quota["id"]).limit == 32
    with django_capture_on_commit_callbacks(execute=True):
        assert admin.delete(url).status_code == 204
    assert not Quota.objects.filter(pk=quota["id"]).exists()
    assert len(passes) == 3  # every change asks for a scheduling pass


@pytest.mark.parametrize("who", ["alice", "carol", "bob"])
def test_only_operators_write_quotas(world, who):
    client = world.client(who)
    quota = Quota.objects.get(tenant=world.nlp if who == "bob" else world.vision)
    assert (
        post_json(client, QUOTAS, {"tenant": "nlp", "model": "A1", "guaranteed": 0, "limit": 1}).status_code
        == 403
    )
    assert patch_json(client, f"{QUOTAS}{quota.pk}/", {"limit": 1000}).status_code == 403
    assert client.delete(f"{QUOTAS}{quota.pk}/").status_code == 403
    assert Quota.objects.get(pk=quota.pk).limit == 64 and Quota.objects.count() == 2


@pytest.mark.parametrize(
    "body, field",
    [
        ({"tenant": "nlp", "model": "A100", "guaranteed": 8, "limit": 4}, "limit"),
        ({"tenant": "nlp", "model": "A100", "guaranteed": -1, "limit": 4}, "guaranteed"),
        ({"tenant": "nlp", "model": "A100", "guaranteed": 1, "limit": 4, "weight": 0}, "weight"),
        ({"tenant": "nlp", "model": "A100", "guaranteed": "1", "limit": 4}, "guaranteed"),
        ({"tenant": "nobody", "model": "A100", "guaranteed": 1, "limit": 4}, "tenant"),
        ({"tenant": "nlp", "model": "", "guaranteed": 1, "limit": 4}, "model"),
        ({"tenant": "nlp", "model": "a\u0000", "guaranteed": 1, "limit": 4}, "model"),
        ({"tenant": "nlp", "model": "A100", "guaranteed": 1, "limit": 4, "colour": 1}, "colour"),
        ({"model": "A100", "guaranteed": 1, "limit": 4}, "tenant"),
    ],
)
def test_a_bad_quota_is_a_400_naming_the_field(world, body, field):
    response = post_json(world.client("admin"), QUOTAS, body)
    assert response.status_code == 400
    assert field in response.json()
    assert Quota.objects.count() == 2


def test_a_second_quota_for_a_tenants_model_is_a_conflict_naming_the_field(world):
    response = post_json(
        world.client("admin"), QUOTAS, {"tenant": "nlp", "model": "*", "guaranteed": 1, "limit": 4}
    )
    assert response.status_code == 409 and "already has a quota" in response.json()["model"][0]
    assert Quota.objects.count() == 2


def test_a_patch_is_checked_against_the_stored_values(world):
    admin = world.client("admin")
    quota = Quota.objects.get(tenant=world.vision)
    response = patch_json(admin, f"{QUOTAS}{quota.pk}/", {"limit": 8})  # guaranteed is 16
    assert response.status_code == 400 and "limit" in response.json()
    response = patch_json(admin, f"{QUOTAS}{quota.pk}/", {"model": "H100"})
    assert response.status_code == 400 and "model" in response.json()
    response = patch_json(admin, f"{QUOTAS}{quota.pk}/", {"guaranteed": 4, "limit": 8})
    assert response.status_code == 200
    assert (Quota.objects.get(pk=quota.pk).guaranteed, Quota.objects.get(pk=quota.pk).limit) == (4, 8)


def test_two_operators_patches_each_fine_alone_but_not_together_give_a_409_not_a_500(world, monkeypatch):
    # Operator A raises the guarantee (16 → 30, under the limit 64) and commits while operator
    # B's PATCH lowering the limit to 20 (above the guarantee B read) is between its check and
    # its write: together they would break limit >= guaranteed.
    from scheduling.api import quotas as api

    quota = Quota.objects.get(tenant=world.vision)
    real = api.do_update_quota

    def after_a_committed(row, **kwargs):
        Quota.objects.filter(pk=row.pk).update(guaranteed=30)
        return real(row, **kwargs)

    monkeypatch.setattr(api, "do_update_quota", after_a_committed)
    response = patch_json(world.client("admin"), f"{QUOTAS}{quota.pk}/", {"limit": 20})
    assert response.status_code == 409 and list(response.json()) == ["limit"], response.content
    stored = Quota.objects.get(pk=quota.pk)
    assert (stored.guaranteed, stored.limit) == (30, 64)


def test_a_patch_answers_the_row_as_stored_with_another_operators_change(world, monkeypatch):
    from scheduling.api import quotas as api

    quota = Quota.objects.get(tenant=world.vision)
    real = api.do_update_quota

    def after_a_committed(row, **kwargs):
        Quota.objects.filter(pk=row.pk).update(weight=3)
        return real(row, **kwargs)

    monkeypatch.setattr(api, "do_update_quota", after_a_committed)
    response = patch_json(world.client("admin"), f"{QUOTAS}{quota.pk}/", {"limit": 40})
    assert response.status_code == 200 and (response.json()["limit"], response.json()["weight"]) == (40, 3)


def test_an_unknown_quota_is_a_404_for_operators(world):
    admin = world.client("admin")
    assert admin.get(f"{QUOTAS}999999/").status_code == 404
    assert patch_json(admin, f"{QUOTAS}{10**30}/", {"limit": 1}).status_code == 404

"""Per-tenant overrides of the idle policy: set by operators inside their bounds (400 naming the
field outside them), audited, read by the tenant's members, and used by the adjustment pass."""

from __future__ import annotations

import pytest

from scheduling.models import AuditEntry

URL = "/api/v1/tenants/{}/idle-policy/"


def test_an_operator_sets_a_tenants_overrides_and_the_change_is_audited(world) -> None:
    url = URL.format(world.vision.pk)
    answer = world.client("admin").put(url, {"threshold": 0.1, "act_after_s": 7200}, format="json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["overrides"] == {"threshold": 0.1, "act_after_s": 7200.0}
    # Warnings keep their place relative to the action: 15 and 45 of 60 minutes become 30 and 90.
    assert body["effective"]["act_after_s"] == 7200 and body["effective"]["warn_after_s"] == [1800, 5400]
    assert body["effective"]["exempt_s"] == 600  # not overridden: the operator's default
    assert body["bounds"]["threshold"] == [0.01, 0.2]
    (entry,) = AuditEntry.objects.filter(action="tenant.idle_policy")
    assert (entry.actor, entry.object_repr, entry.before, entry.after) == (
        "user admin",
        "vision",
        {},
        {"threshold": 0.1, "act_after_s": 7200.0},
    )
    # alice reads her tenant's policy; a null drops an override again.
    assert world.client("alice").get(url).json()["overrides"] == body["overrides"]
    answer = world.client("admin").put(url, {"threshold": None, "act_after_s": 7200}, format="json")
    assert answer.json()["overrides"] == {"act_after_s": 7200.0}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"threshold": 0.5}, "threshold"),
        ({"exempt_s": 10}, "exempt_s"),
        ({"act_after_s": 10**9}, "act_after_s"),
        ({"act_after_s": "soon"}, "act_after_s"),
        ({"warn_after_s": [60]}, "warn_after_s"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_an_override_outside_the_operators_bounds_is_a_400_naming_the_field(world, body, field) -> None:
    answer = world.client("admin").put(URL.format(world.vision.pk), body, format="json")
    assert answer.status_code == 400
    assert list(answer.json()) == [field]
    assert not AuditEntry.objects.filter(action="tenant.idle_policy").exists()


@pytest.mark.parametrize(
    "body",
    [{"exempt_s": "600"}, {"threshold": "0.1"}, {"act_after_s": "3600"}, {"exempt_s": True}],
    ids=["exempt-string", "threshold-string", "act-string", "exempt-bool"],
)
def test_an_override_that_is_not_a_json_number_is_a_400_even_inside_the_bounds(world, body) -> None:
    answer = world.client("admin").put(URL.format(world.vision.pk), body, format="json")
    assert answer.status_code == 400, answer.json()
    assert answer.json() == {next(iter(body)): ["must be a number"]}
    world.vision.refresh_from_db()
    assert not world.vision.idle_policy
    assert not AuditEntry.objects.filter(action="tenant.idle_policy").exists()


def test_the_pass_judges_a_tenants_jobs_by_its_overrides(world, settings) -> None:
    from scheduling.models import Tenant
    from scheduling.services import idle_policy

    idle_policy.do_set_idle_overrides(world.nlp, {"act_after_s": 1800}, world.admin)
    policies = idle_policy.for_tenants(Tenant.objects.all())
    assert policies["nlp"].act_after_s == 1800 and policies["vision"].act_after_s == 3600
    # An operator narrowing the bounds later: the stored override no longer applies.
    settings.TESSERA = {
        **settings.TESSERA,
        "IDLE_BOUNDS": {**settings.TESSERA["IDLE_BOUNDS"], "act_after_s": [3600, 7200]},
    }
    assert idle_policy.for_tenants(Tenant.objects.all())["nlp"].act_after_s == 3600

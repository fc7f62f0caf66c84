"""The operators' console: every model has a page, writes go through the services."""

from __future__ import annotations

import pytest
from django.contrib import admin as django_admin
from django.urls import reverse

from scheduling import models
from scheduling.models import Job, JoinToken, Node, Quota, hash_secret
from tests.api.helpers import post_json, submit, valid_body

ALL_MODELS = [
    models.Tenant,
    models.Membership,
    models.Quota,
    models.JoinToken,
    models.Node,
    models.Device,
    models.Job,
    models.Allocation,
    models.JobEvent,
    models.LogChunk,
    models.IdempotencyKey,
    models.SchedulerState,
    models.EngineMemoryRecord,
    models.AdjustmentState,
    models.SchedulerSettings,
    models.ApiToken,
    models.AuditEntry,
    models.Webhook,
    models.WebhookDelivery,
]


@pytest.fixture
def console(world, client):
    client.force_login(world.admin)
    return client


def test_every_model_is_registered():
    from django.apps import apps

    app_models = set(apps.get_app_config("scheduling").get_models())
    assert app_models == set(ALL_MODELS)
    assert all(django_admin.site.is_registered(m) for m in app_models)


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_every_list_and_detail_page_renders(console, world, alice_job, model):
    from django.utils import timezone

    from scheduling.models import SchedulerState

    SchedulerState.objects.create(last_pass_at=timezone.now())
    models.EngineMemoryRecord.objects.create(updated_at=timezone.now())
    models.SchedulerSettings.objects.create(alpha=0.5)
    models.AdjustmentState.objects.create(last_pass_at=timezone.now(), metrics_ok=False, problem="down")
    JoinToken.objects.create(name="t", token_hash="h" * 64)
    hook = models.Webhook.objects.create(tenant=world.vision, url="https://93.184.215.14/", secret="s")
    models.WebhookDelivery.objects.create(
        webhook=hook, event="failed", payload={}, next_attempt_at=timezone.now()
    )
    post_json(world.client("alice"), "/api/v1/jobs/", valid_body(), HTTP_IDEMPOTENCY_KEY="k")
    meta = model._meta
    response = console.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
    assert response.status_code == 200
    obj = model.objects.first()
    assert obj is not None
    response = console.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk]))
    assert response.status_code == 200


def test_tenant_users_cannot_open_the_console(world, client):
    client.force_login(world.alice)
    response = client.get(reverse("admin:scheduling_job_changelist"))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_cancel_action_cancels_through_the_service(console, world, alice_job):
    pending = submit(world.bob, world.nlp, name="bob-pending")
    response = console.post(
        reverse("admin:scheduling_job_changelist"),
        {"action": "cancel", "_selected_action": [alice_job.pk, pending.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert Job.objects.get(pk=pending.pk).state == "cancelled"
    assert Job.objects.get(pk=alice_job.pk).state == "terminating"  # running: stop signal first
    assert pending.events.filter(type="cancelled").exists()


def test_jobs_are_not_editable_in_the_console(console, alice_job):
    url = reverse("admin:scheduling_job_change", args=[alice_job.pk])
    console.post(url, {"state": "succeeded"})
    assert Job.objects.get(pk=alice_job.pk).state == "running"
    assert console.get(reverse("admin:scheduling_job_add")).status_code == 403


def test_a_quota_saved_in_the_console_goes_through_the_service(
    console, world, monkeypatch, django_capture_on_commit_callbacks
):
    passes = []
    monkeypatch.setattr("scheduling.services.triggers.request_pass", lambda: passes.append(1))
    with django_capture_on_commit_callbacks(execute=True):
        response = console.post(
            reverse("admin:scheduling_quota_add"),
            {"tenant": world.nlp.pk, "model": "H100", "guaranteed": 2, "limit": 4, "weight": 1},
        )
    assert response.status_code == 302, response.content[:2000]
    quota = Quota.objects.get(tenant=world.nlp, model="H100")
    with django_capture_on_commit_callbacks(execute=True):
        console.post(
            reverse("admin:scheduling_quota_change", args=[quota.pk]),
            {"guaranteed": 2, "limit": 8, "weight": 1},
        )
    assert Quota.objects.get(pk=quota.pk).limit == 8
    assert len(passes) == 2


def test_an_invalid_quota_is_refused_by_the_console_form(console, world):
    response = console.post(
        reverse("admin:scheduling_quota_add"),
        {"tenant": world.nlp.pk, "model": "H100", "guaranteed": 8, "limit": 4, "weight": 1},
    )
    assert response.status_code == 200  # the form again, with its error
    assert not Quota.objects.filter(model="H100").exists()


def test_a_join_token_made_in_the_console_is_shown_once_and_stored_hashed(console):
    response = console.post(reverse("admin:scheduling_jointoken_add"), {"name": "rack-7"}, follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"] if "shown only now" in str(m)]
    assert len(shown) == 1
    raw = shown[0].rsplit(": ", 1)[1]
    token = JoinToken.objects.get(name="rack-7")
    assert token.token_hash == hash_secret(raw) and raw not in token.token_hash
    console.post(
        reverse("admin:scheduling_jointoken_changelist"), {"action": "revoke", "_selected_action": [token.pk]}
    )
    assert JoinToken.objects.get(pk=token.pk).revoked


def test_a_console_join_token_keeps_its_bounds_and_its_maker(console, world):
    response = console.post(
        reverse("admin:scheduling_jointoken_add"), {"name": "rack-8", "max_nodes": "3", "names": "a100-*"}
    )
    assert response.status_code == 302
    token = JoinToken.objects.get(name="rack-8")
    assert (token.max_nodes, token.names, token.created_by) == (3, "a100-*", world.admin)


def test_the_node_action_makes_a_join_token_for_those_names_only(console, cluster):
    url = reverse("admin:scheduling_node_changelist")
    response = console.post(
        url, {"action": "join_token_for_names", "_selected_action": [cluster["n01"].pk]}, follow=True
    )
    assert any("shown only now" in str(m) for m in response.context["messages"])
    token = JoinToken.objects.get()
    assert (token.names, token.max_nodes) == ("n01", 1) and token.expires_at is not None


def test_cordon_and_uncordon_a_node(console, cluster):
    url = reverse("admin:scheduling_node_changelist")
    node = cluster["n01"]
    console.post(url, {"action": "cordon", "_selected_action": [node.pk]})
    assert Node.objects.get(pk=node.pk).state == "cordoned"
    console.post(url, {"action": "uncordon", "_selected_action": [node.pk]})
    assert Node.objects.get(pk=node.pk).state == "ready"


def test_an_operator_revokes_alices_token_in_the_console_and_it_stops_working(console, world):
    from scheduling.models import ApiToken

    token = ApiToken.objects.get(user=world.alice)
    page = console.get(reverse("admin:scheduling_apitoken_change", args=[token.pk]))
    assert world.tokens["alice"] not in page.content.decode() and token.key_hash not in page.content.decode()
    response = console.post(
        reverse("admin:scheduling_apitoken_changelist"),
        {"action": "delete_selected", "_selected_action": [token.pk], "post": "yes"},
    )
    assert response.status_code == 302
    assert world.client("alice").get("/api/v1/jobs/").status_code == 401


def test_a_tenants_idle_overrides_saved_in_the_console_are_checked_and_audited(console, world):
    from scheduling.models import AuditEntry, Tenant

    url = reverse("admin:scheduling_tenant_change", args=[world.nlp.pk])
    inline = {"members-TOTAL_FORMS": 0, "members-INITIAL_FORMS": 0, "members-MAX_NUM_FORMS": 1000}
    response = console.post(url, {"name": "nlp", "idle_policy": '{"threshold": 0.9}', **inline})
    assert response.status_code == 200 and b"threshold: must be between" in response.content
    response = console.post(url, {"name": "nlp", "idle_policy": '{"threshold": 0.1}', **inline})
    assert response.status_code == 302, response.content[:2000]
    assert Tenant.objects.get(pk=world.nlp.pk).idle_policy == {"threshold": 0.1}
    (entry,) = AuditEntry.objects.filter(action="tenant.idle_policy")
    assert entry.actor == "user admin" and entry.after == {"threshold": 0.1}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("guaranteed", "1e308"),
        ("limit", "1e308"),
        ("limit", "-1"),
        ("weight", "1e308"),
        ("weight", "0"),
        ("weight", "-0"),
        ("model", "H100\u200b"),
        ("model", "H\u202e100"),
    ],
)
def test_the_console_refuses_a_quota_the_api_refuses_beside_its_field(console, world, field, value):
    body = {"tenant": world.nlp.pk, "model": "H100", "guaranteed": "2", "limit": "4", "weight": "1"}
    response = console.post(reverse("admin:scheduling_quota_add"), {**body, field: value})
    assert response.status_code == 200  # the form again
    assert field in response.context["adminform"].form.errors
    assert not Quota.objects.filter(tenant=world.nlp).exclude(model="*").exists()
    quota = Quota.objects.get(tenant=world.vision)
    if field != "model":
        change = {"guaranteed": quota.guaranteed, "limit": quota.limit, "weight": quota.weight, field: value}
        response = console.post(reverse("admin:scheduling_quota_change", args=[quota.pk]), change)
        assert field in response.context["adminform"].form.errors
        assert (
            Quota.objects.get(pk=quota.pk).limit == quota.limit and Quota.objects.get(pk=quota.pk).weight == 1
        )


def seen_on(page) -> str:
    """The digest a change page was shown with (its hidden ``seen`` field; "" without one)."""
    form = page.context["adminform"].form
    value = form["seen"].value() if "seen" in form.fields else ""
    assert f'name="seen" value="{value}"' in page.content.decode() or not value
    return value


def test_a_quota_changed_in_another_tab_is_not_put_back_by_this_one(console, world):
    quota = Quota.objects.get(tenant=world.vision)
    url = reverse("admin:scheduling_quota_change", args=[quota.pk])
    tab_a, tab_b = seen_on(console.get(url)), seen_on(console.get(url))
    response = console.post(url, {"guaranteed": 16, "limit": 32, "weight": 1, "seen": tab_b})
    assert response.status_code == 302
    # Tab A still shows limit 64; its operator changes the weight only.
    response = console.post(url, {"guaranteed": 16, "limit": 64, "weight": 2, "seen": tab_a})
    assert response.status_code == 200
    assert "changed since you opened this page" in str(response.context["adminform"].form.non_field_errors())
    assert (Quota.objects.get(pk=quota.pk).limit, Quota.objects.get(pk=quota.pk).weight) == (32, 1)
    page = console.get(url)  # reloaded: the values now, and it saves
    response = console.post(url, {"guaranteed": 16, "limit": 32, "weight": 2, "seen": seen_on(page)})
    assert response.status_code == 302 and Quota.objects.get(pk=quota.pk).weight == 2


def test_scheduler_settings_changed_in_another_tab_are_not_put_back_by_this_one(console):
    from scheduling.engine.config import KNOBS
    from scheduling.models import SchedulerSettings

    blank = {knob: "" for knob in KNOBS} | {"kind_accelerators": "null", "preemptor_levels": "null"}
    assert (
        console.post(reverse("admin:scheduling_schedulersettings_add"), {**blank, "alpha": "1"}).status_code
        == 302
    )
    url = reverse("admin:scheduling_schedulersettings_change", args=[1])
    tab_a, tab_b = seen_on(console.get(url)), seen_on(console.get(url))
    assert console.post(url, {**blank, "alpha": "1", "beta": "2", "seen": tab_b}).status_code == 302
    response = console.post(url, {**blank, "alpha": "3", "seen": tab_a})  # tab A: beta blank
    assert response.status_code == 200
    stored = SchedulerSettings.objects.get()
    assert (stored.alpha, stored.beta) == (1, 2)


def test_a_node_price_changed_in_another_tab_is_not_put_back_by_this_one(console, cluster):
    node = Node.objects.get(name="n01")
    url = reverse("admin:scheduling_node_change", args=[node.pk])
    inline = {"devices-TOTAL_FORMS": 0, "devices-INITIAL_FORMS": 0}
    tab_a, tab_b = seen_on(console.get(url)), seen_on(console.get(url))
    assert console.post(url, {"price_per_gpu_hour": "3", "seen": tab_b, **inline}).status_code == 302
    assert console.post(url, {"price_per_gpu_hour": "1", "seen": tab_a, **inline}).status_code == 200
    assert Node.objects.get(pk=node.pk).price_per_gpu_hour == 3


@pytest.mark.parametrize("text", ["[]", "0", "false", '""'])
def test_idle_overrides_that_are_not_an_object_are_refused_not_read_as_none(console, world, text):
    from scheduling.models import Tenant

    Tenant.objects.filter(pk=world.nlp.pk).update(idle_policy={"threshold": 0.1})
    url = reverse("admin:scheduling_tenant_change", args=[world.nlp.pk])
    inline = {"members-TOTAL_FORMS": 0, "members-INITIAL_FORMS": 0, "members-MAX_NUM_FORMS": 1000}
    response = console.post(url, {"name": "nlp", "idle_policy": text, **inline})
    assert response.status_code == 200 and b"idle_policy: must be an object" in response.content
    assert Tenant.objects.get(pk=world.nlp.pk).idle_policy == {"threshold": 0.1}
    response = console.post(url, {"name": "nlp", "idle_policy": "", **inline})  # blank: none
    assert response.status_code == 302 and Tenant.objects.get(pk=world.nlp.pk).idle_policy == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [("expires_at_0", "2020-01-01"), ("names", "gpu-\u202e*"), ("name", "rack\u200b-9")],
)
def test_a_console_join_token_already_expired_or_with_an_invisible_character_is_refused(
    console, field, value
):
    body = {"name": "rack-9", "names": "gpu-*", "expires_at_0": "", "expires_at_1": ""}
    body[field] = value
    if field == "expires_at_0":
        body["expires_at_1"] = "00:00:00"
    response = console.post(reverse("admin:scheduling_jointoken_add"), body)
    assert response.status_code == 200  # the form again, saying why
    assert response.context["adminform"].form.errors
    assert not JoinToken.objects.exists()


def test_a_quota_another_operator_saved_meanwhile_is_a_form_error_not_a_500(console, world, monkeypatch):
    # Two operators add nlp's H100 quota at once: both forms pass the uniqueness check, then the
    # other one's row lands before this one's save. The page answers with the form again and the
    # refusal beside `model`, not a 500 from the unique constraint.
    from scheduling import admin as console_admin

    real = console_admin.do_create_quota

    def other_operator_first(tenant, model, **numbers):
        Quota.objects.create(tenant=tenant, model=model, guaranteed=1, limit=1)
        return real(tenant, model, **numbers)

    monkeypatch.setattr(console_admin, "do_create_quota", other_operator_first)
    response = console.post(
        reverse("admin:scheduling_quota_add"),
        {"tenant": world.nlp.pk, "model": "H100", "guaranteed": 2, "limit": 4, "weight": 1},
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["model"] == [
        "This team already has a quota for this model: change that one."
    ]

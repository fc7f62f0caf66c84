"""The scheduler's knobs, live: the operator's scheduler-settings record over the environment's
defaults, checked whole (a bad value refused with its knob's name), effective from the next pass."""

from __future__ import annotations

import logging

import pytest

from controlplane.env import ImproperlyConfiguredEnv, env_engine_knobs
from scheduling.engine.config import KnobError
from scheduling.models import AuditEntry, Job, Node, SchedulerSettings
from scheduling.services import passes
from scheduling.services.dryrun import dry_run
from scheduling.services.knobs import do_save_scheduler_settings
from tests.scheduling import helpers


def where(world, **fields) -> str:
    """The node a job of alice's would start on now (the pass's own engine, nothing stored)."""
    out = dry_run(world.vision, helpers.job_fields(**fields))
    assert out["would_start"], out
    return out["allocations"][0]["node"]


def configure(world, **knobs) -> None:
    record = SchedulerSettings.objects.filter(pk=1).first() or SchedulerSettings()
    for name, value in knobs.items():
        setattr(record, name, value)
    do_save_scheduler_settings(record, world.admin)


def test_alpha_sends_a_job_to_the_cheaper_node_once_set_and_not_before(world):
    for name in ("a100-01", "a100-02", "a100-03"):
        helpers.make_node(name)
    first = where(world)
    others = sorted({"a100-01", "a100-02", "a100-03"} - {first})
    prices = {first: 9.0, others[0]: 3.0, others[1]: 1.0}
    for name, price in prices.items():
        Node.objects.filter(name=name).update(price_per_gpu_hour=price)
    assert where(world) == first  # α is 0 by default: prices do not count
    configure(world, alpha=1.0)
    assert where(world) == others[1]
    job = helpers.submit(world.alice, world.vision)
    passes.run_pass()
    assert {a.node.name for a in Job.objects.get(pk=job.pk).allocations.all()} == {others[1]}
    record = SchedulerSettings.objects.get()
    assert record.updated_by == world.admin and record.updated_at is not None


def test_kind_accelerators_steer_a_kind_to_the_models_named_for_it(world):
    helpers.make_node("h100-01", model="H100")
    helpers.make_node("t4-01", model="T4", gpus=4, nvlink=1)
    configure(world, kind_accelerators={"inference": ["T4"]})
    assert where(world, kind="inference") == "t4-01"
    configure(world, kind_accelerators={"inference": ["H100"]})
    assert where(world, kind="inference") == "h100-01"


@pytest.mark.parametrize(
    ("knob", "value", "words"),
    [
        ("alpha", -1.0, "at least 0"),
        ("aging_s", 0.0, "above 0"),
        ("min_split_gpus", 3, "power of two"),
        ("kind_accelerators", {"gpu": ["T4"]}, "not a job kind"),
        ("preemptor_levels", [7], "not a queue level"),
        ("preemptor_levels", "x", "must be a list of queue levels"),  # the JSON string "x"
        ("kind_accelerators", "x", "must map job kinds to models"),
    ],
)
def test_a_bad_knob_is_refused_with_its_name_and_nothing_is_saved(world, knob, value, words):
    configure(world, beta=0.5)
    record = SchedulerSettings.objects.get()
    record.delta = 3.0  # a good change alongside the bad one: not saved either
    setattr(record, knob, value)
    with pytest.raises(KnobError) as refused:
        do_save_scheduler_settings(record, world.admin)
    assert refused.value.knob == knob and words in str(refused.value)
    stored = SchedulerSettings.objects.get()
    assert (stored.beta, stored.delta, getattr(stored, knob)) == (0.5, None, None)


def test_the_admin_form_names_the_bad_knob_and_an_operator_saves_a_good_one(world, client):
    client.force_login(world.admin)
    url = "/admin/scheduling/schedulersettings/add/"
    response = client.post(url, {"alpha": "-2", "kind_accelerators": "null", "preemptor_levels": "null"})
    assert response.status_code == 200
    assert "alpha" in response.context["adminform"].form.errors
    assert not SchedulerSettings.objects.exists()
    response = client.post(url, {"alpha": "0.25", "kind_accelerators": "null", "preemptor_levels": "null"})
    assert response.status_code == 302
    assert SchedulerSettings.objects.get().alpha == 0.25


def test_a_tenant_member_cannot_change_the_scheduler_settings(world, client):
    world.alice.is_staff = True
    world.alice.save()
    client.force_login(world.alice)
    response = client.post("/admin/scheduling/schedulersettings/add/", {"alpha": "1"})
    assert response.status_code == 403
    assert not SchedulerSettings.objects.exists()


def test_a_record_broken_behind_the_admin_is_not_applied_and_the_pass_says_so(world, caplog):
    helpers.make_node("a100-01")
    SchedulerSettings.objects.create(alpha=1.0, min_split_gpus=3)  # not through the admin
    job = helpers.submit(world.alice, world.vision)
    with caplog.at_level(logging.ERROR, logger="tessera.pass"):
        passes.run_pass()
    assert Job.objects.get(pk=job.pk).state == "scheduled"
    assert "min_split_gpus" in caplog.text


def test_a_bad_environment_default_stops_the_process_naming_the_variable(monkeypatch):
    monkeypatch.setenv("TESSERA_ENGINE_STARVE_S", "-5")
    with pytest.raises(ImproperlyConfiguredEnv, match="TESSERA_ENGINE_STARVE_S"):
        env_engine_knobs()
    monkeypatch.setenv("TESSERA_ENGINE_STARVE_S", "3600")
    monkeypatch.setenv("TESSERA_ENGINE_BACKFILL", "off")
    assert env_engine_knobs() == {"starve_s": "3600", "backfill": "off"}


def test_an_environment_default_is_used_until_the_record_overrides_it(world, settings):
    settings.TESSERA = {**settings.TESSERA, "ENGINE_KNOBS": {"starve_s": "3600", "alpha": "2"}}
    assert (passes.engine_config().starve_s, passes.engine_config().alpha) == (3600.0, 2.0)
    assert passes.engine_config({"alpha": 0.5}).alpha == 0.5
    assert passes.engine_config({"alpha": 0.5}).starve_s == 3600.0


def test_an_operator_sets_a_nodes_price_in_the_admin_and_nothing_else_of_it(world, client):
    node = helpers.make_node("a100-01")
    client.force_login(world.admin)
    response = client.post(
        f"/admin/scheduling/node/{node.pk}/change/",
        {"price_per_gpu_hour": "2.5", "rack": "elsewhere", **_empty_inline()},
    )
    assert response.status_code == 302, response.content[:2000]
    node.refresh_from_db()
    assert (node.price_per_gpu_hour, node.rack) == (2.5, "r1")


def _empty_inline() -> dict[str, str]:
    prefix = "devices"
    return {f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"}


def test_exclusive_gpu_shares_keeps_two_tenants_fractions_apart_once_set(world):
    helpers.make_node("a100-01", gpus=1, nvlink=1)
    helpers.submit(world.bob, world.nlp, gpus=0.5)
    passes.run_pass()
    first = helpers.submit(world.alice, world.vision, gpus=0.25)
    passes.run_pass()
    assert Job.objects.get(pk=first.pk).state == "scheduled"  # off: any tenants' fractions share
    configure(world, exclusive_gpu_shares=True)
    later = [helpers.submit(world.alice, world.vision, gpus=0.25) for _ in range(2)]
    passes.run_pass()
    waiting = Job.objects.filter(pk__in=[j.pk for j in later])
    assert {j.state for j in waiting} == {"pending"}  # the GPU holds bob's share
    assert any(j.pending_code == "capacity" and "exclusive_gpu_shares" in j.pending_reason for j in waiting)
    entry = AuditEntry.objects.filter(action="settings.update").latest("id")
    assert entry.after["exclusive_gpu_shares"] is True and entry.actor_user == world.admin


def test_a_save_from_a_page_opened_before_anothers_save_is_refused_not_written_over_it(world, client):
    configure(world, alpha=0.25)
    url = "/admin/scheduling/schedulersettings/1/change/"
    client.force_login(world.admin)
    page = client.get(url).context["adminform"].form  # both operators open the page
    shown = {name: page[name].value() for name in page.fields}
    posted = {k: v for k, v in shown.items() if v is not None}
    assert client.post(url, {**posted, "alpha": "0.5"}).status_code == 302  # one saves first
    response = client.post(url, {**posted, "beta": "0.5"})  # the other, from the page as it was
    assert response.status_code == 200  # the page again, saying why
    assert "changed since you opened this page" in str(response.context["adminform"].form.non_field_errors())
    assert SchedulerSettings.objects.get().alpha == 0.5  # the first change stands


def test_an_estimate_past_the_calendar_is_left_out_and_the_pass_goes_on(world):
    # A default runtime of 10^12 s (accepted: finite and positive) puts the waiting job's start
    # past the year 9999: converting it raised OverflowError and failed every pass.
    helpers.make_node("a100-01", gpus=8)
    configure(world, default_runtime_s=1e12)
    helpers.submit(world.alice, world.vision, gpus=8)
    passes.run_pass()
    waiting = helpers.submit(world.alice, world.vision, gpus=8)
    passes.run_pass()
    job = Job.objects.get(pk=waiting.pk)
    assert (job.state, job.estimated_start) == ("pending", None)
    assert job.pending_code
    out = dry_run(world.vision, helpers.job_fields(gpus=8))
    assert not out["would_start"] and out["estimated_start"] is None


@pytest.mark.parametrize("price", ["-1", "1e308", "nan", "inf", ""])
def test_a_price_out_of_bounds_is_refused_beside_its_field_in_the_admin(world, client, price):
    node = helpers.make_node("a100-01")
    Node.objects.filter(pk=node.pk).update(price_per_gpu_hour=2.0)
    client.force_login(world.admin)
    response = client.post(
        f"/admin/scheduling/node/{node.pk}/change/", {"price_per_gpu_hour": price, **_empty_inline()}
    )
    assert response.status_code == 200  # the form again, not a 500
    assert "price_per_gpu_hour" in response.context["adminform"].form.errors
    node.refresh_from_db()
    assert node.price_per_gpu_hour == 2.0


def test_a_blank_yes_or_no_knob_says_it_is_the_environments_default(world, client):
    client.force_login(world.admin)
    page = client.get("/admin/scheduling/schedulersettings/add/").content.decode()
    for knob in ("backfill", "preemption", "exclusive_gpu_shares"):
        select = page[page.index(f'name="{knob}"') :].split("</select>")[0]
        assert "the environment&#x27;s default" in select and "Unknown" not in select
    blank = {
        "kind_accelerators": "null",
        "preemptor_levels": "null",
        "backfill": "unknown",
        "preemption": "false",
    }
    assert client.post("/admin/scheduling/schedulersettings/add/", blank).status_code == 302
    stored = SchedulerSettings.objects.get()
    assert (stored.backfill, stored.preemption) == (None, False)

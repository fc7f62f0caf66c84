"""``export_trace``: the live history in the simulator's formats, judged by the same checker."""

from __future__ import annotations

import io
import json
import shlex

import pytest
from django.core.management import call_command
from django.db import transaction

from scheduling.models import Allocation, Job
from scheduling.services import passes
from scheduling.services.jobs import begin_stop, do_cancel_job, do_mark_running, do_record_exit
from scheduling.sim import cli as sim_cli
from scheduling.sim.check import check
from scheduling.sim.events import read_events
from scheduling.sim.traces import read_jobs, read_nodes, read_quotas
from tests.scheduling import helpers


def _locked(job):
    return Job.objects.select_for_update().select_related("tenant").get(pk=job.pk)


def _start(job):
    passes.run_pass()
    with transaction.atomic():
        do_mark_running(_locked(job))


def _exit(job, code):
    with transaction.atomic():
        do_record_exit(_locked(job), code)


def _check_dir(path, unfinished_ok=False):
    return check(
        read_nodes(path / "nodes.csv"),
        read_jobs(path / "jobs.csv"),
        read_events(path / "events.jsonl"),
        read_quotas(path / "quotas.csv"),
        unfinished_ok=unfinished_ok,
    )


def _live_history(world):
    helpers.make_node("a100-01")
    ok = helpers.submit(world.alice, world.vision, gpus=2)
    _start(ok)
    _exit(ok, 0)
    retried = helpers.submit(world.bob, world.nlp, gpus=1, max_retries=1, kind="inference", preemptible=False)
    _start(retried)
    _exit(retried, 1)
    Job.objects.filter(pk=retried.pk).update(not_before=None)
    _start(retried)
    _exit(retried, 0)
    preempted = helpers.submit(world.alice, world.vision, gpus=4)
    _start(preempted)
    with transaction.atomic():
        begin_stop(_locked(preempted), "preempted: for a test")
    _exit(preempted, -15)
    _start(preempted)
    _exit(preempted, 0)
    cancelled = helpers.submit(world.carol, world.vision, gpus=1)
    do_cancel_job(cancelled.pk)


def test_an_exported_live_history_passes_the_simulators_checker(world, tmp_path):
    _live_history(world)
    call_command("export_trace", str(tmp_path))
    report = _check_dir(tmp_path)
    assert report.violations == []
    assert report.jobs == 4
    kinds = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert kinds.count("start") == 5 and kinds.count("finish") == 3 and kinds.count("cancel") == 1


def test_a_checkpoint_and_a_node_loss_are_exported_and_pass_the_checker(world, tmp_path, settings):
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.models import Node
    from scheduling.services.agents import do_report_checkpoint
    from scheduling.services.health import sweep_nodes

    node = helpers.make_node("a100-01")
    job = helpers.submit(world.alice, world.vision, gpus=2)  # max_retries 0
    _start(job)
    do_report_checkpoint(node, job.pk, 0, timezone.now().timestamp(), "step 10")
    lost = timezone.now() - timedelta(
        seconds=settings.TESSERA["LEASE_S"] + settings.TESSERA["FENCE_MARGIN_S"] + 1
    )
    Node.objects.filter(pk=node.pk).update(last_heartbeat=lost)
    sweep_nodes()  # requeued, node-lost, no retry used
    helpers.make_node("a100-02")  # where it starts again, without its node-local checkpoint
    _start(job)
    _exit(job, 0)
    call_command("export_trace", str(tmp_path))
    assert _check_dir(tmp_path).violations == []  # all its work redone: no more than it needed
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("reason")) for e in events if e["event"] in ("checkpoint", "preempt")] == [
        ("checkpoint", "step 10"),
        ("preempt", "node-lost"),
    ]
    again = [e for e in events if e["event"] == "start"][-1]
    assert again["allocations"][0]["node"] == "a100-02"
    assert again["reason"].startswith("starts from the beginning: its last checkpoint (step 10, at ")


def test_nodes_are_written_with_the_formats_kinds_only(world, tmp_path):
    import csv

    helpers.make_node("a100-01")
    cpu = helpers.make_node("cpu-01", gpus=0)
    cpu.kind = "cpu"
    cpu.save()
    call_command("export_trace", str(tmp_path))
    with open(tmp_path / "nodes.csv", newline="") as fh:
        rows = {r["node"]: r for r in csv.DictReader(fh)}
    assert (rows["a100-01"]["kind"], rows["cpu-01"]["kind"], rows["cpu-01"]["gpus"]) == ("gpu", "gpu", "0")


def test_a_cluster_still_at_work_is_judged_with_its_jobs_running_and_queued(world, tmp_path):
    helpers.make_node("a100-01")  # 8 GPUs
    running = helpers.submit(world.alice, world.vision, gpus=8)
    _start(running)
    queued = helpers.submit(world.bob, world.nlp, gpus=4)
    passes.run_pass()  # no room: it stays queued
    queued.refresh_from_db()
    assert queued.state == "pending"
    call_command("export_trace", str(tmp_path))
    assert len(_check_dir(tmp_path).violations) == 2  # as a finished history: both "never end"
    assert _check_dir(tmp_path, unfinished_ok=True).violations == []


def test_the_checker_catches_a_gpu_bound_to_two_jobs_in_a_live_history(world, tmp_path):
    helpers.make_node("a100-01")
    first = helpers.submit(world.alice, world.vision, gpus=1)
    _start(first)
    second = helpers.submit(world.bob, world.nlp, gpus=1)
    _start(second)
    # Corrupt the history as a double-booking bug would: the second job on the first's GPU.
    event = second.events.get(type="scheduled")
    event.allocations = first.events.get(type="scheduled").allocations
    event.save()
    for job in (first, second):
        _exit(job, 0)
    call_command("export_trace", str(tmp_path))
    report = _check_dir(tmp_path)
    assert any("over-committed" in v for v in report.violations)
    assert Allocation.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_job_submitted_during_an_export_is_in_all_its_files_or_in_none(tmp_path, monkeypatch, settings):
    """The export reads every table in one snapshot: a submit committed (by another connection)
    while nodes.csv is being written is not in jobs.csv without its submit event."""
    import threading

    from django.contrib.auth.models import User
    from django.db import connections

    from scheduling.models import Quota, Tenant
    from scheduling.services import export

    tenant = Tenant.objects.create(name="t")
    Quota.objects.create(tenant=tenant, model="*", guaranteed=8, limit=8)
    user = User.objects.create(username="u")
    helpers.make_node("a100-01")
    helpers.submit(user, tenant, gpus=1)
    rows = export.node_rows

    def submit_meanwhile():
        def other():
            helpers.submit(user, tenant, gpus=1)
            connections.close_all()

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        return rows()

    monkeypatch.setattr(export, "node_rows", submit_meanwhile)
    call_command("export_trace", str(tmp_path))
    assert Job.objects.count() == 2
    report = _check_dir(tmp_path, unfinished_ok=True)
    assert report.violations == [] and report.jobs == 1


def test_a_grow_and_a_shrink_are_exported_and_pass_the_checker(world, tmp_path):
    from datetime import timedelta

    from scheduling.models import Node
    from scheduling.services.agents import ExitReport, do_report_exits

    helpers.make_node("a100-01", gpus=4)
    other = helpers.submit(world.bob, world.nlp, gpus=2)
    _start(other)
    el = helpers.submit(
        world.alice, world.vision, gpus=4, replicas=4, min_available=2, elastic_min_gpus=2, elastic_max_gpus=4
    )
    _start(el)  # on the two GPUs left
    # past the minimum run time before a job may be shrunk (or preempted)
    Job.objects.filter(pk=el.pk).update(started_at=el.submitted_at - timedelta(minutes=10))
    _exit(other, 0)
    assert passes.run_pass().resized == [str(el.pk)]  # grown to 4
    serve = helpers.submit(world.bob, world.nlp, kind="inference", gpus=2, preemptible=False)
    assert passes.run_pass().resized == [str(el.pk)]  # shrunk: its highest replicas stop
    node = Node.objects.get(name="a100-01")
    leaving = Allocation.objects.filter(job=el, leaving_at__isnull=False).values_list("replica", flat=True)
    results = do_report_exits(node, [ExitReport(el.pk, 0, r, 143) for r in sorted(leaving)])
    assert all(isinstance(r, tuple) for r in results), results
    _start(serve)
    _exit(serve, 0)
    _exit(el, 0)
    call_command("export_trace", str(tmp_path))
    assert _check_dir(tmp_path).violations == []
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    sizes = [
        len(e["allocations"]) for e in events if e["job"] == str(el.pk) and e["event"] in ("start", "resize")
    ]
    assert sizes == [2, 4, 2]


@pytest.mark.parametrize("still_at_work", [False, True])
def test_the_check_command_export_trace_prints_passes_on_what_it_wrote(
    world, tmp_path, still_at_work, capsys
):
    _live_history(world)
    if still_at_work:
        helpers.submit(world.alice, world.vision, gpus=1)  # still waiting at the export
    out = io.StringIO()
    call_command("export_trace", str(tmp_path), stdout=out)
    printed = out.getvalue().strip().split("check with: python -m scheduling.sim ", 1)[1]
    assert ("--unfinished-ok" in printed) == still_at_work
    assert sim_cli.main(shlex.split(printed)) == 0, capsys.readouterr()

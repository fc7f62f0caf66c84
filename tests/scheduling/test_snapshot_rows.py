"""The running jobs a pass reads are converted, and made requests, once while their rows stay
the same (``snapshot.KeptRows``, ``snapshot._HoldingJobs``): a pass must still see every change
to a running job's row."""

from __future__ import annotations

from django.utils import timezone

from scheduling.models import Job
from scheduling.services import passes
from scheduling.services.snapshot import load_snapshot
from tests.scheduling import helpers


def _running(world) -> Job:
    helpers.make_node("a100-01")
    job = helpers.submit(world.alice, world.vision, gpus=1, prefer_labels={"zone": "a"})
    passes.run_pass()
    job.refresh_from_db()
    assert job.state in ("scheduled", "running")
    return job


def _request(job: Job):
    (run,) = [r for r in load_snapshot(timezone.now()).snapshot.running if r.job.id == str(job.pk)]
    return run.job


def test_a_running_jobs_changed_json_column_is_read_anew(world):
    job = _running(world)
    assert _request(job).prefer_labels == (("zone", "a"),)
    assert _request(job).prefer_labels == (("zone", "a"),)  # the row unchanged: as converted before
    Job.objects.filter(pk=job.pk).update(prefer_labels={"zone": "b", "disk": "ssd"})
    assert _request(job).prefer_labels == (("disk", "ssd"), ("zone", "b"))


def test_a_running_jobs_changed_column_is_read_anew(world):
    job = _running(world)
    before = _request(job)
    assert _request(job) == before
    Job.objects.filter(pk=job.pk).update(priority=before.priority + 5)
    assert _request(job).priority == before.priority + 5


def test_an_elastic_jobs_new_size_cap_reaches_the_next_pass(world):
    helpers.make_node("a100-01")
    job = helpers.submit(
        world.alice, world.vision, gpus=2, replicas=2, elastic_min_gpus=1, elastic_max_gpus=4
    )
    passes.run_pass()
    job.refresh_from_db()
    assert _request(job).elastic_max_gpus == 4
    Job.objects.filter(pk=job.pk).update(size_cap={"attempt": job.attempts, "gpus": 2})
    assert _request(job).elastic_max_gpus == 2
    Job.objects.filter(pk=job.pk).update(size_cap=None)
    assert _request(job).elastic_max_gpus == 4


def test_a_snapshot_read_twice_is_the_same(world):
    _running(world)
    now = timezone.now()
    assert load_snapshot(now).snapshot == load_snapshot(now).snapshot

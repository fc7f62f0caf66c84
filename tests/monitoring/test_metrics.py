"""The control plane's own /metrics: unauthenticated, cheap, and counting what the database holds.

Built through the real paths: jobs submitted over the API, bound by a scheduling pass.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.frontend.helpers import make_node
from tests.support import free_port


def scrape(client: Client | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = (client or Client()).get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def submit(world: Any, who: str, **body: Any) -> int:
    body = {"name": "m", "kind": "training", "command": ["true"], **body}
    response = world.client(who).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


@pytest.fixture
def busy_cluster(world: Any) -> Any:
    """4 H100 and 2 T4; alice holds 2 H100, bob half a T4; one job of each kind can never fit."""
    from scheduling.services.passes import run_pass

    make_node("n01", "r1", 4, "H100")
    make_node("n02", "r2", 2, "T4")
    submit(world, "alice", gpus=2, accelerators=["H100"])
    submit(world, "bob", gpus=0.5, accelerators=["T4"], kind="inference")
    submit(world, "bob", gpus=64, kind="batch")
    submit(world, "alice", gpus=64, kind="training")
    run_pass()
    return world


def test_metrics_count_jobs_gpus_and_nodes_with_fractions_as_their_share(busy_cluster: Any) -> None:
    got = scrape()  # no credentials: Prometheus scrapes anonymously
    assert got[("tessera_gpus_total", (("model", "H100"),))] == 4
    assert got[("tessera_gpus_total", (("model", "T4"),))] == 2
    assert got[("tessera_gpus_allocated", (("model", "H100"),))] == 2
    assert got[("tessera_gpus_allocated", (("model", "T4"),))] == 0.5
    assert got[("tessera_jobs_pending", (("kind", "batch"),))] == 1
    assert got[("tessera_jobs_pending", (("kind", "training"),))] == 1
    assert got[("tessera_jobs_pending", (("kind", "inference"),))] == 0
    assert got[("tessera_jobs", (("state", "scheduled"),))] == 2
    assert got[("tessera_jobs", (("state", "pending"),))] == 2
    assert got[("tessera_nodes", (("state", "ready"),))] == 2
    assert got[("tessera_nodes", (("state", "not-ready"),))] == 0
    assert got[("tessera_scheduling_pass_seconds_count", ())] >= 1


def test_an_unhealthy_gpu_is_counted_and_freed_capacity_is_no_longer_allocated(busy_cluster: Any) -> None:
    from django.db import transaction

    from scheduling.models import Device, Job
    from scheduling.services.jobs import do_record_exit

    Device.objects.filter(node__name="n01", index=3).update(healthy=False)
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("tenant").get(state="scheduled", gpus=2)
        do_record_exit(job, 0)
    got = scrape()
    assert got[("tessera_gpus_unhealthy", (("model", "H100"),))] == 1
    assert got[("tessera_gpus_allocated", (("model", "H100"),))] == 0
    assert got[("tessera_jobs", (("state", "succeeded"),))] == 1


def test_passes_recorded_by_another_process_show_in_the_histogram_and_the_decision_counts(
    busy_cluster: Any,
) -> None:
    # busy_cluster ran one pass here (2 bound). The Celery worker records its passes in the same
    # row; its writes are what this process's /metrics must show, not its own memory.
    from scheduling.models import SchedulerState
    from scheduling.services.passes import PASS_BUCKETS_S

    state = SchedulerState.objects.get(id=1)
    assert state.passes == 1 and state.decisions_total["bound"] == 2
    buckets = [0] * (len(PASS_BUCKETS_S) + 1)
    buckets[PASS_BUCKETS_S.index(0.05)] = 3  # three passes of 25-50 ms
    buckets[-1] = 1  # and one of over 10 s
    SchedulerState.objects.filter(id=1).update(
        passes=4,
        pass_seconds_sum=12.0,
        pass_buckets=buckets,
        decisions_total={"bound": 40, "dropped": 2, "preempted": 1, "cut_short": 1},
    )
    got = scrape()
    assert got[("tessera_scheduling_pass_seconds_count", ())] == 4
    assert got[("tessera_scheduling_pass_seconds_sum", ())] == 12.0
    assert got[("tessera_scheduling_pass_seconds_bucket", (("le", "0.025"),))] == 0
    assert got[("tessera_scheduling_pass_seconds_bucket", (("le", "0.05"),))] == 3
    assert got[("tessera_scheduling_pass_seconds_bucket", (("le", "10.0"),))] == 3
    assert got[("tessera_scheduling_decisions_total", (("decision", "bound"),))] == 40
    assert got[("tessera_scheduling_decisions_total", (("decision", "dropped"),))] == 2
    assert got[("tessera_scheduling_decisions_total", (("decision", "preempted"),))] == 1
    assert got[("tessera_scheduling_passes_cut_short_total", ())] == 1
    assert got[("tessera_scheduling_last_pass_timestamp_seconds", ())] > 0


def test_a_scrape_takes_the_same_few_queries_however_big_the_cluster(
    busy_cluster: Any, django_assert_max_num_queries: Any
) -> None:
    for i in range(20):
        make_node(f"extra-{i}", "r3", 8, "A100")
    with django_assert_max_num_queries(17):
        got = scrape()
    assert got[("tessera_gpus_total", (("model", "A100"),))] == 160


def test_metrics_refuse_writes(db: Any) -> None:
    assert Client().post("/metrics").status_code == 405


def test_metrics_answer_head_as_get_without_a_body(db: Any) -> None:
    """A probe or load balancer that checks with HEAD gets what GET gets, less the body."""
    head, get = Client().head("/metrics"), Client().get("/metrics")
    assert head.status_code == get.status_code == 200
    assert head["Content-Type"] == get["Content-Type"] and head.content == b""


def test_queue_latency_fragmentation_tenants_lost_work_failures_and_heartbeats(busy_cluster: Any) -> None:
    """The job families are read from rows every deployment writes (not from the process that ran
    the pass): a run, a preemption after a checkpoint, a failure and a silent node show in them."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from scheduling.models import Allocation, Job, JobEvent, Node
    from scheduling.services.jobs import begin_stop, do_mark_running, do_record_exit

    now = timezone.now()
    Node.objects.filter(name="n02").update(last_heartbeat=now - timedelta(seconds=42))
    alice_job = Job.objects.get(state="scheduled", gpus=2)
    bob_job = Job.objects.get(state="scheduled", gpus=0.5)
    Job.objects.filter(id=alice_job.id).update(submitted_at=now - timedelta(seconds=30))
    with transaction.atomic():
        do_mark_running(Job.objects.select_for_update().get(id=alice_job.id), at=now)
    got = scrape()
    assert got[("tessera_queue_length", (("level", "training"),))] == 1
    assert got[("tessera_queue_length", (("level", "finetune-batch"),))] == 1
    assert got[("tessera_queue_length", (("level", "inference"),))] == 0
    assert sum(v for (name, _), v in got.items() if name == "tessera_jobs_pending_by_code") == 2
    assert 30 <= got[("tessera_job_submit_to_running_seconds", (("quantile", "0.5"),))] < 40
    assert 0 <= got[("tessera_job_wait_seconds", (("quantile", "0.99"),))] < 40
    assert got[("tessera_gpus_free", (("model", "H100"),))] == 2
    assert got[("tessera_gpus_free_fragmented", (("model", "H100"),))] == 2
    assert got[("tessera_gpus_free", (("model", "T4"),))] == 1
    assert got[("tessera_tenant_gpus_allocated", (("model", "H100"), ("tenant", "vision")))] == 2
    assert got[("tessera_tenant_gpus_guaranteed", (("model", "*"), ("tenant", "vision")))] == 16
    assert 42 <= got[("tessera_node_heartbeat_age_seconds", (("node", "n02"),))] < 60

    # bob's half GPU ran 100 s, checkpointed 40 s before it was preempted: 20 GPU-seconds lost.
    Allocation.objects.filter(job=bob_job).update(created_at=now - timedelta(seconds=100))
    JobEvent.objects.create(job=bob_job, type="checkpointed", at=now - timedelta(seconds=40))
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("tenant").get(id=bob_job.id)
        begin_stop(job, "preempted by a test", now)
        do_record_exit(job, None, at=now)
        job = Job.objects.select_for_update().select_related("tenant").get(id=alice_job.id)
        do_record_exit(job, 3, at=now)
    got = scrape()
    assert got[("tessera_lost_gpu_seconds_total", (("cause", "preemption"),))] == 20
    assert got[("tessera_lost_gpu_seconds_total", (("cause", "node-lost"),))] == 0
    assert got[("tessera_job_failures_total", (("cause", "exit-code"),))] == 1
    assert got[("tessera_job_failures_total", (("cause", "time-limit"),))] == 0
    assert got[("tessera_gpus_free_fragmented", (("model", "H100"),))] == 0


def test_a_scrape_says_redis_does_not_answer_within_the_scrape_timeout(db: Any, settings: Any) -> None:
    """Redis away stops triggered passes, live updates and rate limits (docs/operations.md): the
    scrape says so (deploy/alerts.yml), and a silent host costs it a second, not the scrape."""
    import socket
    import time

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert scrape()[("tessera_redis_available", ())] == 0
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        settings.REDIS_URL = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        began = time.monotonic()
        assert scrape()[("tessera_redis_available", ())] == 0
        assert time.monotonic() - began < 3
    settings.REDIS_URL = ""  # the embedded default has no Redis to report on
    assert not [name for name, _ in scrape() if name == "tessera_redis_available"]


@pytest.mark.redis("the scrape's PING to a Redis that answers")
def test_a_scrape_says_redis_answers(db: Any, settings: Any, redis_url: str) -> None:
    settings.REDIS_URL = redis_url
    assert scrape()[("tessera_redis_available", ())] == 1


def test_every_metric_docs_metrics_lists_is_exported(busy_cluster: Any, settings: Any) -> None:
    """docs/metrics.md's table is what an operator builds alerts and dashboards on: each row is
    on /metrics (the latency quantiles once a job has started)."""
    import re
    from pathlib import Path

    from django.db import transaction
    from django.utils import timezone

    from scheduling.models import Job
    from scheduling.services.jobs import do_mark_running

    with transaction.atomic():
        do_mark_running(Job.objects.select_for_update().get(state="scheduled", gpus=2), at=timezone.now())
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    table = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(tessera_[a-z_]+)`", table, re.M))
    documented |= set(re.findall(r"`, `(tessera_[a-z_]+)`", table))
    exported = {name.removesuffix("_bucket") for name, _ in scrape()}
    assert len(documented) > 20 and documented <= exported, documented - exported

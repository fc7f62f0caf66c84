"""The agents' own utilisation reports, through the real heartbeat endpoint: kept per (job, GPU)
as per-step maxima for the adjustment pass where no Prometheus is configured, a report for a GPU
the job does not hold ignored with a log line, bad entries refused naming the field.

The store is Redis in services mode and the process's memory in the embedded default: these
tests run against whichever the mode configures.
"""

from __future__ import annotations

import logging
import math
import time
import uuid

import pytest

from monitoring.adjust import reports_reader
from scheduling.models import Node
from scheduling.services import utilisation
from scheduling.services.adjust import HeldGpus
from tests.agent import helpers as h

STEP = 60.0


@pytest.fixture
def node(db, settings):
    settings.PROMETHEUS_URL = ""
    settings.TESSERA = {**settings.TESSERA, "IDLE_STEP_S": STEP}
    # A name of its own: Redis may keep values of an earlier run's job with the same id.
    name = f"util-{uuid.uuid4().hex[:8]}"
    client, _ = h.register(h.new_join_token(), name, gpus=4)
    return client, name


def beat(node, reports):
    answer = node.post(h.AGENT + "heartbeat", {"running": [], "utilisation": reports}, format="json")
    assert answer.status_code == 200, answer.content
    return answer.data


def test_a_heartbeat_asks_for_reports_only_without_prometheus(node, settings) -> None:
    node, _ = node
    assert h.heartbeat(node)["report_utilisation"] is True
    settings.PROMETHEUS_URL = "http://127.0.0.1:9"
    assert h.heartbeat(node)["report_utilisation"] is False


def test_a_node_is_asked_for_a_report_at_most_four_times_a_step_however_often_it_beats(
    node, settings
) -> None:
    node, name = node
    assert h.heartbeat(node)["report_utilisation"] is True
    assert h.heartbeat(node)["report_utilisation"] is False  # asked a moment ago
    node_id = Node.objects.get(name=name).pk
    t0 = time.monotonic() + 1e6  # later than the asks above, whatever the host's uptime
    asked = [t for t in range(240) if utilisation.reports_wanted(node_id, now=t0 + t)]  # a beat a second
    assert asked == [0, 15, 30, 45, 60, 75, 90, 105, 120, 135, 150, 165, 180, 195, 210, 225]
    settings.TESSERA = {**settings.TESSERA, "IDLE_STEP_S": 4.0}  # a demo's short step: every beat
    assert all(utilisation.reports_wanted(node_id, now=t0 + 240 + t) for t in range(5))


def test_reports_for_held_gpus_become_per_step_maxima_and_others_are_ignored(world, node, caplog) -> None:
    node, name = node
    job = h.submit(world.alice, world.vision, gpus=2)
    h.bind(job, name, [0, 1])
    other = h.submit(world.bob, world.nlp, gpus=1)
    h.bind(other, name, [2])
    now = time.time()
    this_step = math.ceil(now / STEP) * STEP
    with caplog.at_level(logging.WARNING, logger="tessera.adjust"):
        beat(
            node,
            [
                {"gpu": 0, "job_ids": [job.pk], "util": 50.0, "sm_active": 0.4},
                {"gpu": 1, "job_ids": [job.pk], "util": 3.0},
                {"gpu": 2, "job_ids": [job.pk], "util": 90.0},  # bob's GPU: not this job's
                {"gpu": 3, "job_ids": [job.pk], "util": 90.0},  # nobody's
            ],
        )
        beat(node, [{"gpu": 0, "job_ids": [job.pk], "util": 10.0, "sm_active": 0.1}])
    ignored = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignored")]
    assert len(ignored) == 2 and "GPU 2" in ignored[0] and "GPU 3" in ignored[1]

    # The step still running is not a point yet (as Prometheus's subquery): read it once ended.
    held = [HeldGpus(job.pk, ((name, 0), (name, 1), (name, 2)), now - 600)]
    assert reports_reader()(held, 3600 + STEP, STEP) == {}
    gpus = [f"{name}/{i}" for i in range(3)]
    later = utilisation.read_series([(job.pk, g, now - 600) for g in gpus], 3600, STEP, now=this_step)
    assert later == {(job.pk, gpus[0]): [(this_step, 0.4)], (job.pk, gpus[1]): [(this_step, 0.03)]}
    # Points from before the attempt started are another attempt's (or another job's, reusing
    # its id after a reset): never this one's.
    assert utilisation.read_series([(job.pk, gpus[0], this_step)], 3600, STEP, now=this_step) == {}


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"gpu": -1, "job_ids": [1], "util": 5}, "gpu"),
        ({"gpu": 0, "job_ids": [1], "util": 101}, "util"),
        ({"gpu": 0, "job_ids": [1], "util": 5, "sm_active": 1.5}, "sm_active"),
        ({"gpu": 0, "job_ids": ["x"], "util": 5}, "job_ids"),
    ],
)
def test_a_bad_utilisation_entry_is_refused_naming_the_field(node, entry, field) -> None:
    node, _ = node
    answer = node.post(h.AGENT + "heartbeat", {"running": [], "utilisation": [entry]}, format="json")
    assert answer.status_code == 400
    assert field in str(answer.content)

"""The checker catches each violation it promises, from hand-written event files.

The world: rack r1 holds n1 (8 H100, one NVLink island of 8, label zone:a) and n2 (8 A100, islands
of 4); rack r2 holds n3 (4 T4). Each test writes a few jobs and events and asserts the message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduling.sim.check import CheckReport, check
from scheduling.sim.events import read_events
from scheduling.sim.traces import read_jobs, read_nodes
from tests.sim.checker_world import HEADER, NODES, alloc, ev, job, run


def only(report: CheckReport, text: str) -> None:
    assert report.violations, "expected a violation"
    assert all(text in v for v in report.violations), report.violations


def test_a_clean_run_passes(tmp_path: Path) -> None:
    report = run(
        tmp_path,
        [job("a", 2)],
        [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n1", [0, 1])), ev(100, "finish", "a")],
    )
    assert report.ok, report.violations


def test_it_flags_a_gpu_over_committed(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "submit", "b"),
        ev(0, "start", "a", alloc("n1", [0])),
        ev(1, "start", "b", alloc("n1", [0])),
        ev(100, "finish", "a"),
        ev(101, "finish", "b"),
    ]
    only(run(tmp_path, [job("a"), job("b")], events), "GPU n1:0 over-committed: shares sum to 2")


def test_it_flags_fractions_summing_above_one(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "submit", "b"),
        ev(0, "start", "a", alloc("n3", [1], share=0.5)),
        ev(0, "start", "b", alloc("n3", [1], share=0.75)),
        ev(100, "finish", "a"),
        ev(100, "finish", "b"),
    ]
    only(
        run(tmp_path, [job("a", 0.5), job("b", 0.75)], events), "GPU n3:1 over-committed: shares sum to 1.25"
    )


def test_it_flags_a_job_on_a_model_it_excluded(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n2", [0])), ev(100, "finish", "a")]
    only(run(tmp_path, [job("a", model="H100")], events), "runs on excluded model A100 on n2 (accepts H100)")


def test_it_flags_a_job_on_a_node_its_selector_excludes(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n1", [0])), ev(100, "finish", "a")]
    only(
        run(tmp_path, [job("a", node_selector="zone:b")], events),
        "runs on n1, which its node_selector excludes",
    )


def test_it_flags_a_replica_across_nodes(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0]), alloc("n2", [0])),
        ev(100, "finish", "a"),
    ]
    only(run(tmp_path, [job("a", 2)], events), "replica 0 spans nodes n1, n2")


def test_it_flags_a_job_crossing_nvlink_islands(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n2", [2, 3, 4, 5])), ev(100, "finish", "a")]
    only(
        run(tmp_path, [job("a", 4, topology="nvlink")], events),
        "topology nvlink broken: GPUs cross NVLink islands of 4 on n2",
    )


def test_it_flags_a_node_job_on_two_nodes(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0], 0), alloc("n2", [0], 1)),
        ev(100, "finish", "a"),
    ]
    only(
        run(tmp_path, [job("a", 2, replicas=2, topology="node")], events),
        "topology node broken: spread over n1, n2",
    )


def test_it_flags_a_rack_job_on_two_racks(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0], 0), alloc("n3", [0], 1)),
        ev(100, "finish", "a"),
    ]
    only(
        run(tmp_path, [job("a", 2, replicas=2, topology="rack")], events),
        "topology rack broken: spread over racks r1, r2",
    )


def test_it_flags_a_gang_started_partially(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n1", [0, 1, 2, 3], 0)), ev(100, "finish", "a")]
    report = run(tmp_path, [job("a", 8, replicas=2, min_available=2)], events)
    assert any("gang started partially: 1 of 2 replicas (min_available 2)" in v for v in report.violations)


def test_a_gang_may_start_with_min_available(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0, 1, 2, 3], 0)),
        ev(0, "resize", "a", alloc("n1", [0, 1, 2, 3], 0), alloc("n2", [0, 1, 2, 3], 1)),
        ev(100, "finish", "a"),
    ]
    # One replica runs 4 of 8 GPUs (rate ½) for 0 s, then all: 100 s of work by t=100.
    assert run(tmp_path, [job("a", 8, replicas=2, min_available=1)], events).ok


def test_it_flags_an_elastic_job_outside_its_range(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0, 1, 2, 3], 0), alloc("n2", [0, 1, 2, 3], 1)),
        ev(10, "resize", "a", *(alloc(n, [0, 1, 2, 3], r) for r, n in enumerate(["n1", "n2", "n3"]))),
        ev(100, "finish", "a"),
    ]
    only(
        run(tmp_path, [job("a", 8, replicas=2, min_gpus=4, max_gpus=8)], events),
        "outside its elastic range [4, 8]",
    )


def test_it_flags_a_non_preemptible_job_preempted(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0])),
        ev(50, "preempt", "a"),
        ev(60, "start", "a", alloc("n1", [0])),
        ev(160, "finish", "a"),
    ]
    only(
        run(tmp_path, [job("a", kind="inference", preemptible="false")], events),
        "a non-preemptible job was preempted",
    )


def test_it_flags_a_finish_before_the_work_is_done(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n1", [0])), ev(50, "finish", "a")]
    only(run(tmp_path, [job("a")], events), "finished before its work was done (50.0 of 100 s of work)")


def test_an_elastic_job_works_at_k_over_g(tmp_path: Path) -> None:
    jobs = [job("a", 16, replicas=2, min_gpus=8, max_gpus=16)]
    early = [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n1", list(range(8)))), ev(150, "finish", "a")]
    only(run(tmp_path, jobs, early), "finished before its work was done (75.0 of 100 s of work)")
    on_time = [*early[:2], ev(200, "finish", "a")]
    assert run(tmp_path, jobs, on_time).ok


def test_a_preempted_job_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    # Signal at 80 - 30 = 50 s of work; the checkpoint at 30 s keeps 30; 70 s are left from t=100.
    jobs = [job("a", checkpoint_s=30, grace_s=30)]
    head = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0])),
        ev(80, "preempt", "a"),
        ev(100, "start", "a", alloc("n1", [1])),
    ]
    only(
        run(tmp_path, jobs, [*head, ev(160, "finish", "a")]),
        "finished before its work was done (90.0 of 100 s",
    )
    assert run(tmp_path, jobs, [*head, ev(170, "finish", "a")]).ok


def test_a_live_jobs_reported_checkpoint_is_what_its_preemption_keeps(tmp_path: Path) -> None:
    # No checkpoint_s: without the report it would restart from zero. It checkpointed at 45 s of
    # work; preempted at 80 (signal at 50 with a 30 s grace): 45 kept, 55 left from t=100.
    jobs = [job("a", grace_s=30)]
    head = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0])),
        ev(45, "checkpoint", "a", reason="step 45"),
        ev(80, "preempt", "a"),
        ev(100, "start", "a", alloc("n1", [1])),
    ]
    only(
        run(tmp_path, jobs, [*head, ev(150, "finish", "a")]),
        "finished before its work was done (95.0 of 100 s",
    )
    assert run(tmp_path, jobs, [*head, ev(155, "finish", "a")]).ok


def test_a_live_job_that_starts_from_the_beginning_keeps_nothing_of_its_checkpoint(tmp_path: Path) -> None:
    # As above, but its checkpoint was on node n1's local disk and it was started again on n2:
    # the 45 s it had kept are lost, all 100 s are left from t=100.
    jobs = [job("a", grace_s=30)]
    fresh = "starts from the beginning: its last checkpoint (step 45, at …) is on node n1's local disk"
    head = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0])),
        ev(45, "checkpoint", "a", reason="step 45"),
        ev(80, "preempt", "a"),
        ev(100, "start", "a", alloc("n2", [0]), reason=fresh),
    ]
    only(
        run(tmp_path, jobs, [*head, ev(155, "finish", "a")]),
        "finished before its work was done (55.0 of 100 s",
    )
    assert run(tmp_path, jobs, [*head, ev(200, "finish", "a")]).ok


def test_it_flags_a_checkpoint_of_a_job_that_is_not_running(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(1, "checkpoint", "a"), ev(2, "start", "a", alloc("n1", [0]))]
    only(
        run(tmp_path, [job("a")], [*events, ev(102, "finish", "a")]),
        "checkpoint of a job that is not running",
    )


def test_it_flags_a_job_that_never_ends(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n1", [0]))]
    only(run(tmp_path, [job("a"), job("b")], events), "never ends")
    report = run(tmp_path, [job("a"), job("b")], events)
    assert "job a: never ends (still running after the last event)" in report.violations
    assert "job b: never ends (never submitted after the last event)" in report.violations


def test_a_live_clusters_history_so_far_may_end_with_jobs_pending_or_running(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n1", [0])), ev(1, "submit", "b")]
    jobs = [job("a"), job("b"), job("c")]
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "jobs.csv").write_text(HEADER + "\n" + "\n".join(jobs) + "\n")
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    report = check(
        read_nodes(tmp_path / "nodes.csv"),
        read_jobs(tmp_path / "jobs.csv"),
        read_events(tmp_path / "events.jsonl"),
        unfinished_ok=True,
    )
    assert report.violations == ["job c: never ends (never submitted after the last event)"]


def test_it_flags_a_reject_the_cluster_could_hold(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(0, "reject", "a", reason="no")]
    only(run(tmp_path, [job("a", 8, model="H100")], events), "rejected but the empty cluster could hold it")


def test_a_reject_of_what_no_node_can_hold_is_legal(tmp_path: Path) -> None:
    jobs = [
        job("a", 16, topology="node"),
        job("b", 8, model="T4"),
        job("c", 8, topology="nvlink", model="A100"),
    ]
    events = [ev(0, "submit", j) for j in "abc"] + [ev(0, "reject", j) for j in "abc"]
    assert run(tmp_path, jobs, events).ok


def test_with_quotas_a_reject_beyond_the_limit_is_legal_and_within_it_is_not(tmp_path: Path) -> None:
    quotas = "t1,H100,2,4,1\nt1,*,0,0,1\n"
    jobs = [job("a", 8, model="H100"), job("b", 4, model="H100")]
    events = [ev(0, "submit", "a"), ev(0, "submit", "b"), ev(0, "reject", "a"), ev(0, "reject", "b")]
    only(
        run(tmp_path, jobs, events, quotas),
        "line 4 (t=0, reject b): rejected but the empty cluster and its quota",
    )


def test_a_non_preemptible_job_beyond_its_guarantee_may_be_rejected(tmp_path: Path) -> None:
    quotas = "t1,H100,2,8,1\n"  # it may never borrow: the guarantee bounds it, not the limit
    jobs = [job("steady", 4, model="H100", preemptible="false"), job("spot", 4, model="H100")]
    events = [
        ev(0, "submit", "steady"),
        ev(0, "submit", "spot"),
        ev(0, "reject", "steady"),
        ev(0, "reject", "spot"),
    ]
    only(run(tmp_path, jobs, events, quotas), "reject spot): rejected but the empty cluster and its quota")


def test_it_flags_a_tenant_above_its_limit(tmp_path: Path) -> None:
    quotas = "t1,H100,2,3,1\n"
    events = [
        ev(0, "submit", "a"),
        ev(0, "submit", "b"),
        ev(0, "start", "a", alloc("n1", [0, 1])),
        ev(0, "start", "b", alloc("n1", [2, 3])),
        ev(100, "finish", "a"),
        ev(100, "finish", "b"),
    ]
    only(
        run(tmp_path, [job("a", 2), job("b", 2)], events, quotas),
        "tenant t1 above its limit on H100: 4 > 3 GPUs",
    )


def test_quota_counts_fractions_as_their_share(tmp_path: Path) -> None:
    quotas = "t1,T4,1,1,1\n"
    events = [
        ev(0, "submit", "a"),
        ev(0, "submit", "b"),
        ev(0, "start", "a", alloc("n3", [0], share=0.5)),
        ev(0, "start", "b", alloc("n3", [1], share=0.5)),
        ev(100, "finish", "a"),
        ev(100, "finish", "b"),
    ]
    assert run(tmp_path, [job("a", 0.5), job("b", 0.5)], events, quotas).ok


def test_it_flags_a_model_without_a_quota_row(tmp_path: Path) -> None:
    events = [ev(0, "submit", "a"), ev(0, "start", "a", alloc("n2", [0])), ev(100, "finish", "a")]
    only(run(tmp_path, [job("a")], events, "t1,H100,2,3,1\n"), "tenant t1 uses A100 without a quota row")


def test_it_flags_time_going_backwards(tmp_path: Path) -> None:
    events = [ev(10, "submit", "a"), ev(10, "start", "a", alloc("n1", [0])), ev(5, "finish", "a")]
    report = run(tmp_path, [job("a", submit_s=10, duration=0)], events)
    assert report.violations == ["line 3 (t=5, finish a): time goes backwards (after t=10)"]


def test_it_flags_events_for_unknown_jobs(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0])),
        ev(100, "finish", "a"),
        ev(100, "finish", "zz"),
    ]
    only(run(tmp_path, [job("a")], events), "event for unknown job 'zz' (not in JOBS.csv)")


def test_it_flags_the_start_of_a_job_already_running(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0])),
        ev(1, "start", "a", alloc("n1", [1])),
        ev(100, "finish", "a"),
    ]
    only(run(tmp_path, [job("a")], events), "start of a job already running")


def test_it_flags_a_time_limit_failure_before_the_limit(tmp_path: Path) -> None:
    events = [
        ev(0, "submit", "a"),
        ev(0, "start", "a", alloc("n1", [0])),
        ev(30, "fail", "a", reason="time-limit"),
    ]
    only(run(tmp_path, [job("a", time_limit_s=60)], events), "failed for time-limit before its limit of 60 s")
    on_time = [*events[:2], ev(60, "fail", "a", reason="time-limit")]
    assert run(tmp_path, [job("a", time_limit_s=60)], on_time).ok


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{", "events.jsonl:1:1: not JSON"),
        ('{"t": "x", "event": "submit", "job": "a"}', "'t' must be a number"),
        ('{"t": 1, "event": "boom", "job": "a"}', "'event' must be one of"),
        ('{"t": 1, "event": "start", "job": "a"}', "needs 'allocations'"),
    ],
)
def test_a_malformed_events_line_is_an_error_naming_its_place(tmp_path: Path, line: str, why: str) -> None:
    (tmp_path / "events.jsonl").write_text(line + "\n")
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        list(read_events(tmp_path / "events.jsonl"))

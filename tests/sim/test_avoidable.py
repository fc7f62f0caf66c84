"""The checker's avoidable wait: time a job waited while the free GPUs, its topology and the quota
rules would have let it start at once — judged from the events alone.

The world is test_check's: n1 (8 H100, one NVLink island), n2 (8 A100, islands of 4), n3 (4 T4).
"""

from __future__ import annotations

from pathlib import Path

from tests.sim.checker_world import alloc, ev, job, run


def test_a_job_waiting_while_its_gpus_stand_free_is_counted_from_the_moment_they_are(tmp_path: Path):
    jobs = [job("a", 4, model="H100"), job("w", 8, model="H100")]
    events = [
        ev(0, "submit", "a"),
        ev(0, "submit", "w"),
        ev(0, "start", "a", alloc("n1", [0, 1, 2, 3])),
        ev(100, "finish", "a"),  # n1 wholly free from here: w could start
        ev(300, "start", "w", alloc("n1", list(range(8)))),
        ev(400, "finish", "w"),
    ]
    report = run(tmp_path, jobs, events)
    assert report.ok, report.violations
    assert report.avoidable_s == {"w": 200}
    assert report.avoidable["avoidable_wait_max_job"] == "w"
    assert report.avoidable["avoidable_wait_by_kind_h"] == {"training": round(200 / 3600, 3)}


def test_free_gpus_split_across_nvlink_islands_do_not_hold_an_nvlink_job(tmp_path: Path):
    def waits(topology: str) -> dict[str, float]:
        jobs = [
            job("b", 2, model="A100"),
            job("c", 2, model="A100"),
            job("g", 4, model="A100", topology=topology),
        ]
        events = [
            ev(0, "submit", "b"),
            ev(0, "submit", "c"),
            ev(0, "submit", "g"),
            ev(0, "start", "b", alloc("n2", [0, 1])),
            ev(0, "start", "c", alloc("n2", [4, 5])),
            ev(100, "finish", "b"),
            ev(100, "start", "g", alloc("n2", [0, 1, 2, 3])),
            ev(100, "finish", "c"),
            ev(200, "finish", "g"),
        ]
        report = run(tmp_path, jobs, events)
        assert report.ok, report.violations
        return report.avoidable_s

    assert waits("nvlink") == {}  # two GPUs free in each island: never room for four in one
    assert waits("") == {"g": 100}  # any topology: four free GPUs on one node will do


def test_quota_rules_decide_whether_a_wait_was_avoidable(tmp_path: Path):
    quotas = "t1,H100,4,8,1\n"
    jobs = [
        job("s1", 4, model="H100", preemptible="false"),
        job("s2", 4, model="H100", preemptible="false"),
        job("p", 4, model="H100", preemptible="true"),
    ]
    events = [
        ev(0, "submit", "s1"),
        ev(0, "submit", "s2"),
        ev(0, "submit", "p"),
        ev(0, "start", "s1", alloc("n1", [0, 1, 2, 3])),
        ev(100, "finish", "s1"),
        ev(100, "start", "s2", alloc("n1", [0, 1, 2, 3])),
        ev(150, "start", "p", alloc("n1", [4, 5, 6, 7])),
        ev(250, "finish", "p"),
        ev(250, "finish", "s2"),
    ]
    report = run(tmp_path, jobs, events, quotas)
    assert report.ok, report.violations
    # s2 could not borrow past the guarantee while s1 ran; p (preemptible) could, up to the limit.
    assert report.avoidable_s == {"p": 150}


def test_inference_waits_count_only_while_its_guarantee_had_room(tmp_path: Path):
    quotas = "t1,H100,4,8,1\n"
    jobs = [
        job("s", 4, model="H100", preemptible="false"),  # the tenant's guarantee, all of it
        job("b", 4, model="H100", preemptible="true", tenant="t2"),
        job("i1", 1, model="H100", preemptible="false", kind="inference"),
        job("i2", 1, model="H100", preemptible="false", kind="inference", submit_s=300),
    ]
    events = [
        ev(0, "submit", "s"),
        ev(0, "submit", "b"),
        ev(0, "start", "s", alloc("n1", [0, 1, 2, 3])),
        ev(0, "start", "b", alloc("n1", [4, 5, 6, 7])),
        ev(0, "submit", "i1"),  # the guarantee is full: i1 waits for s by the quota rules
        ev(200, "finish", "s"),
        ev(200, "start", "i1", alloc("n1", [0])),
        ev(300, "submit", "i2"),  # room in the guarantee: i2 waits 500 s it need not have
        ev(800, "start", "i2", alloc("n1", [1])),
        ev(900, "finish", "i1"),
        ev(900, "finish", "i2"),
        ev(900, "finish", "b"),
    ]
    report = run(tmp_path, jobs, events, f"{quotas}t2,H100,0,8,1\n")
    assert report.ok, report.violations
    # p99 over the two: interpolated between 0 (i1) and 500 (i2)
    assert report.avoidable["inference_p99_queue_within_guarantee_s"] == 0.99 * 500

"""``replay --adjust on``: utilisation-driven progress, the adjustment pass's actions, its metrics."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_replay import NODES, Scripted, bind, on, tj

from scheduling.sim.adjusting import AdjustOptions
from scheduling.sim.cli import main
from scheduling.sim.generate import generate
from scheduling.sim.replay import replay
from scheduling.sim.runner import run_replay
from scheduling.sim.traces import NODE_COLUMNS, TraceJob

JOB_HEADER = [
    "job", "tenant", "kind", "submit_s", "duration_s", "gpus", "replicas", "model", "priority",
    "preemptible", "time_limit_s", "cpus", "memory_gib", "min_gpus", "max_gpus", "checkpoint_s",
    "util_profile", "idle_reclaim",
]  # fmt: skip
TIMING = ("wall_s", "cpu_s", "policy_s", "driver_s", "metrics_s", "decide_calls")


def finish_time(events: list[dict[str, Any]], job: str) -> float:
    return next(e["t"] for e in events if e["event"] == "finish" and e["job"] == job)


def with_profile(job: TraceJob, profile: str) -> TraceJob:
    return TraceJob(job.request, job.submit_s, job.duration_s, profile)


@settings(max_examples=25, deadline=None)
@given(g=st.integers(2, 8), data=st.data(), duration=st.floats(600, 3000))
def test_a_job_on_fewer_gpus_than_it_keeps_busy_slows_and_one_losing_idle_gpus_does_not(g, data, duration):
    k = data.draw(st.integers(1, g - 1))
    gpus = tuple(range(k))
    adjust = AdjustOptions()
    idle = replay(
        NODES, [with_profile(tj("a", gpus=g, duration=duration), "idle")],
        Scripted({0: bind("a", on("n1", *gpus))}), tick_s=0, adjust=adjust,
    )  # fmt: skip
    assert finish_time(idle.events, "a") == duration  # its GPUs were idle: taking them costs nothing
    busy = replay(
        NODES, [with_profile(tj("a", gpus=g, duration=duration), "busy")],
        Scripted({0: bind("a", on("n1", *gpus))}), tick_s=0, adjust=adjust,
    )  # fmt: skip
    # "busy" keeps each GPU 80-98% busy: on k of g GPUs it runs at min(1, k / (u·g)).
    low, high = duration * min(1.0, 0.8 * g / k), duration * max(1.0, 0.98 * g / k)
    assert low - 1e-6 <= finish_time(busy.events, "a") <= high + 1e-6
    off = replay(
        NODES, [tj("a", gpus=g, duration=duration)], Scripted({0: bind("a", on("n1", *gpus))}), tick_s=0
    )
    assert abs(finish_time(off.events, "a") - duration * g / k) < 1e-6  # --adjust off: k/g, as ever


def write_inputs(folder: Path, rows: list[dict[str, Any]], gpus: int = 8) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    nodes, jobs = folder / "nodes.csv", folder / "jobs.csv"
    with open(nodes, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(NODE_COLUMNS)
        w.writerow(["n1", "r1", gpus, "H100", 80, gpus, 128, 1024, 4])
    with open(jobs, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, JOB_HEADER, restval="")
        w.writeheader()
        for row in rows:
            w.writerow({"tenant": "t", "replicas": 1, "model": "H100", "priority": 0, **row})
    return nodes, jobs


def run(
    tmp: Path, rows: list[dict[str, Any]], adjust: bool, name: str, gpus: int = 8
) -> tuple[dict, list[dict]]:
    nodes, jobs = write_inputs(tmp / "in", rows, gpus)
    out = tmp / name
    summary = run_replay(nodes, jobs, None, "tessera", out, show_progress=False, adjust=adjust)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return summary, events


H = 3600.0
# An elastic job (two replicas of 4) whose odd GPUs go idle at once, a job waiting for 4 GPUs, and
# a late small job that stretches the arrival window.
SQUEEZE = [
    {"job": "elastic", "kind": "training", "submit_s": 0, "duration_s": 5 * H, "gpus": 8, "replicas": 2,
     "preemptible": "true", "min_gpus": 4, "max_gpus": 8, "checkpoint_s": 1800,
     "util_profile": "half-idle-after-0"},
    {"job": "waiting", "kind": "batch", "submit_s": 60, "duration_s": 3 * H, "gpus": 4,
     "preemptible": "true", "util_profile": "busy"},
    {"job": "late", "kind": "batch", "submit_s": 5 * H - 600, "duration_s": 600, "gpus": 1,
     "preemptible": "true", "util_profile": "busy"},
]  # fmt: skip


def test_reclaiming_an_idle_half_of_an_elastic_job_lets_a_waiting_job_run(tmp_path: Path):
    off, _ = run(tmp_path, SQUEEZE, False, "off")
    on, events = run(tmp_path, SQUEEZE, True, "on")
    assert off["check"]["ok"] and on["check"]["ok"] and on["unfinished"] == 0
    shrink = next(e for e in events if e["event"] == "resize")
    assert shrink["job"] == "elastic" and shrink["reason"].startswith("idle-reclaim")
    assert sum(len(a["gpus"]) for a in shrink["allocations"]) == 4
    warnings = [(e["t"], e["level"]) for e in events if e["event"] == "idle-warning"]
    assert [level for _, level in warnings[:2]] == [1, 2]  # warned at 15 and 45 min, acted at 60
    assert warnings[1][0] < shrink["t"] and 3600 <= shrink["t"] < 3600 + 60
    # Decided by the pass at 60 min; as live, the removed replicas' GPUs are held through the
    # job's grace period (30 s), then go to the waiting job at once.
    assert shrink["t"] == 3600 + 30
    assert next(e["t"] for e in events if e["event"] == "start" and e["job"] == "waiting") == shrink["t"]
    assert finish_time(events, "elastic") == 5 * H  # its idle GPUs cost it nothing
    assert on["avg_jct_s"] < off["avg_jct_s"]
    assert on["busy_utilisation"] > 1.3 * off["busy_utilisation"]
    assert on["reclaimed_gpu_hours"] > 3 * 4 and on["lost_gpu_hours"] == off["lost_gpu_hours"] == 0


IDLE = [
    {"job": "service", "kind": "inference", "submit_s": 0, "duration_s": 3 * H, "gpus": 1,
     "preemptible": "false", "util_profile": "idle"},
    {"job": "opted-in", "kind": "inference", "submit_s": 0, "duration_s": 3 * H, "gpus": 1,
     "preemptible": "false", "checkpoint_s": 600, "util_profile": "idle", "idle_reclaim": "allow"},
    {"job": "trainer", "kind": "training", "submit_s": 0, "duration_s": 3 * H, "gpus": 2,
     "preemptible": "true", "checkpoint_s": 1800, "util_profile": "idle-after-20"},
]  # fmt: skip
# Two busy jobs that wait (the node's four GPUs are taken) for what a requeue frees.
WAITING = [
    {"job": f"w{i}", "kind": "batch", "submit_s": 60, "duration_s": 2 * H, "gpus": 1,
     "preemptible": "true", "util_profile": "busy"}
    for i in (1, 2)
]  # fmt: skip


def test_a_non_preemptible_job_is_only_warned_unless_its_owner_opted_in(tmp_path: Path):
    summary, events = run(tmp_path, IDLE + WAITING, True, "on", gpus=4)
    assert summary["check"]["ok"] and summary["unfinished"] == 0
    by_job: dict[str, list[str]] = {}
    for e in events:
        by_job.setdefault(e["job"], []).append(e["event"])
    assert by_job["service"] == ["submit", "start", "idle-warning", "idle-warning", "finish"]
    assert "preempt" in by_job["opted-in"] and "preempt" in by_job["trainer"]
    assert summary["touched_non_preemptible"] == 0
    # checkpoint-now: a requeue for idleness loses nothing of a job that checkpoints
    reclaims = [e for e in events if e["event"] == "preempt" and e["reason"].startswith("idle-reclaim")]
    assert len(reclaims) >= 2 and all(e["lost_gpu_seconds"] == 0 for e in reclaims)
    # (What is lost here is the scheduler's: the opted-in service, back in the queue, ranks as
    # inference and preempts a batch job that took its GPU during its grace period, as live.)
    others = [e for e in events if e["event"] == "preempt" and e not in reclaims]
    assert all(e["reason"].startswith("priority: for job opted-in") for e in others)


def test_an_idle_job_is_not_requeued_when_nothing_waiting_could_use_its_gpus(tmp_path: Path):
    # Requeued, it would only be placed back at once (nothing else waits), its idle work still to
    # do: it is warned, keeps its GPUs and finishes on time. A job that waits for more GPUs than
    # it holds cannot use them either.
    big = {"job": "big", "kind": "batch", "submit_s": 60, "duration_s": H, "gpus": 8,
           "preemptible": "true", "util_profile": "busy"}  # fmt: skip
    trainer = IDLE[2]
    summary, events = run(tmp_path, [trainer, big], True, "on", gpus=8)
    assert summary["check"]["ok"] and summary["unfinished"] == 0
    mine = [e["event"] for e in events if e["job"] == "trainer"]
    assert mine == ["submit", "start", "idle-warning", "idle-warning", "finish"]
    assert finish_time(events, "trainer") == 3 * H
    assert summary["adjustments"]["requeue"] == 0


def test_adjust_on_is_deterministic_and_off_writes_no_adjustment(tmp_path: Path):
    generate(tmp_path / "w", 3, 0.2, 1.0, 64)
    w = tmp_path / "w"
    runs = []
    for name, adjust in (("a", True), ("b", True), ("off", False)):
        s = run_replay(
            w / "nodes.csv", w / "jobs.csv", w / "quotas.csv", "tessera", tmp_path / name,
            show_progress=False, adjust=adjust,
        )  # fmt: skip
        runs.append({k: v for k, v in s.items() if k not in TIMING})
    assert runs[0] == runs[1]
    assert (tmp_path / "a" / "events.jsonl").read_bytes() == (tmp_path / "b" / "events.jsonl").read_bytes()
    assert runs[0]["check"]["ok"] and runs[0]["unfinished"] == runs[2]["unfinished"]
    assert runs[2]["adjustments"] == {"warn": 0, "shrink": 0, "requeue": 0}
    assert runs[2]["reclaimed_gpu_hours"] == 0 and runs[0]["adjustments"]["warn"] > 0
    assert b"idle" not in (tmp_path / "off" / "events.jsonl").read_bytes()


def test_an_idle_profile_on_a_job_that_cannot_checkpoint_is_refused_with_adjust_on(tmp_path: Path, capsys):
    rows = [{"job": "forgotten", "kind": "batch", "submit_s": 0, "duration_s": 5 * H, "gpus": 1,
             "preemptible": "true", "util_profile": "idle"}]  # fmt: skip
    nodes, jobs = write_inputs(tmp_path / "in", rows)
    args = ["replay", "--nodes", str(nodes), "--jobs", str(jobs), "--quiet"]
    assert main([*args, "--out", str(tmp_path / "off")]) == 0
    assert main([*args, "--out", str(tmp_path / "on"), "--adjust", "on"]) == 2
    err = capsys.readouterr().err
    assert "job forgotten" in err and "checkpoint_s" in err


def test_a_bad_util_profile_is_named_with_its_line(tmp_path: Path, capsys):
    rows = [{"job": "x", "kind": "batch", "submit_s": 0, "duration_s": 60, "gpus": 1,
             "preemptible": "true", "util_profile": "sleepy"}]  # fmt: skip
    nodes, jobs = write_inputs(tmp_path / "in", rows)
    assert main(["replay", "--nodes", str(nodes), "--jobs", str(jobs), "--out", str(tmp_path / "o"),
                 "--quiet", "--adjust", "on"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "jobs.csv:2" in err and "util_profile" in err and "sleepy" in err

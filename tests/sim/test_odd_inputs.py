"""Inputs from outside (files we never saw) run correctly or are refused with one clear line.

Each case goes through the CLI's ``main``: no traceback, no hang, no checker violation that the
input, not the policy, caused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduling.sim.cli import main

NODES_HEADER = "node,rack,gpus,model,gpu_memory_gib,nvlink_domain,cpus,memory_gib,price_per_gpu_hour\n"
NODES = NODES_HEADER + "n1,r1,8,H100,80,8,64,512,4\n"
JOBS_HEADER = (
    "job,tenant,kind,submit_s,duration_s,gpus,replicas,model,priority,preemptible,time_limit_s,"
    "cpus,memory_gib"
)
ELASTIC_HEADER = JOBS_HEADER + ",min_gpus,max_gpus,min_available"
QUOTAS_HEADER = "tenant,model,guaranteed,limit,weight\n"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return str(path)


def check_inputs(
    tmp_path: Path, jobs: str, nodes: str = NODES, quotas: str | None = None, events: str = ""
) -> int:
    args = [
        "check",
        write(tmp_path, "nodes.csv", nodes),
        write(tmp_path, "jobs.csv", jobs),
        write(tmp_path, "events.jsonl", events),
    ]
    if quotas is not None:
        args.append(write(tmp_path, "quotas.csv", quotas))
    return main(args)


@pytest.mark.parametrize(
    ("column", "row"),
    [
        ("gpus", "j1,t,batch,0,10,inf,1,,0,true,,0,0"),
        ("gpus", "j1,t,batch,0,10,1e400,1,,0,true,,0,0"),
        ("replicas", "j1,t,batch,0,10,1,inf,,0,true,,0,0"),
        ("priority", "j1,t,batch,0,10,1,1,,inf,true,,0,0"),
        ("cpus", "j1,t,batch,0,10,1,1,,0,true,,Infinity,0"),
        ("submit_s", "j1,t,batch,inf,10,1,1,,0,true,,0,0"),
        ("duration_s", "j1,t,batch,0,inf,1,1,,0,true,,0,0"),
    ],
)
def test_an_infinite_number_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, row: str
) -> None:
    assert check_inputs(tmp_path, f"{JOBS_HEADER}\n{row}\n") == 2
    err = capsys.readouterr().err
    assert f"jobs.csv:2: column {column!r}" in err and "must be a finite number" in err


def test_an_infinite_node_size_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = NODES_HEADER + "n1,r1,inf,H100,80,8,64,512,4\n"
    assert check_inputs(tmp_path, f"{JOBS_HEADER}\n", nodes=nodes) == 2
    assert "nodes.csv:2: column 'gpus' = 'inf'" in capsys.readouterr().err


def test_a_byte_order_mark_and_padded_header_names_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = "\ufeff" + NODES_HEADER.replace(",", " , ") + "n1,r1,8,H100,80,8,64,512,4\n"
    jobs = "\ufeff" + JOBS_HEADER.replace(",", ", ") + "\nj1,t,batch,0,10,1,1,,0,true,,0,0\n"
    start = {"node": "n1", "gpus": [0], "share": 1.0, "replica": 0}
    events = "".join(
        json.dumps(e) + "\n"
        for e in (
            {"t": 0, "event": "submit", "job": "j1"},
            {"t": 0, "event": "start", "job": "j1", "allocations": [start]},
            {"t": 10, "event": "finish", "job": "j1"},
        )
    )
    quotas = "\ufeff" + QUOTAS_HEADER + "t,*,1,1,1\n"
    assert check_inputs(tmp_path, jobs, nodes=nodes, quotas=quotas, events=events) == 0
    assert "check: 1 jobs, 3 events: OK" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("row", "column", "why"),
    [
        ("j1,t,batch,0,10,1e-12,1,,0,true,,0,0,,,", "gpus", "between 0.001 and 0.999"),
        ("j1,t,batch,0,10,0.9996,1,,0,true,,0,0,,,", "gpus", "between 0.001 and 0.999"),
        ("j1,t,batch,0,10,8,3,,0,true,,0,0,,,", "replicas", "must divide gpus"),
        ("j1,t,batch,0,10,2,4,,0,true,,0,0,,,", "replicas", "must divide gpus"),
        ("j1,t,batch,0,10,4,2,,0,true,,0,0,,,5", "min_available", "at most replicas"),
        ("j1,t,batch,0,10,4,2,,0,true,,0,0,,,0", "min_available", ">= 1"),
        ("j1,t,batch,0,10,4,2,,0,true,,0,0,,,1.5", "min_available", "whole number"),
        ("j1,t,batch,0,10,8,1,,0,true,,0,0,16,4,", "min_gpus", "min_gpus <= gpus <= max_gpus"),
        ("j1,t,batch,0,10,8,1,,0,true,,0,0,1,4,", "min_gpus", "min_gpus <= gpus <= max_gpus"),
        ("j1,t,batch,0,10,8,1,,0,true,,0,0,0,8,", "min_gpus", ">= 1"),
        ("j1,t,batch,0,10,8,1,,0,true,,0,0,2.5,8,", "min_gpus", "whole number"),
        ("j1,t,batch,0,10,8,1,,0,true,,0,0,4,,", "max_gpus", "both or neither"),
        ("j1,t,batch,0,10,8,2,,0,true,,0,0,3,8,", "min_gpus", "multiples of the per-replica size 4"),
        ("j1,t,batch,0,10,0.5,1,,0,true,,0,0,1,1,", "min_gpus", "needs gpus of at least 1"),
        ("j1,t,batch,0,10,8,4,,0,true,,0,0,4,8,4", "min_available", "disagrees with min_gpus"),
    ],
)
def test_a_job_shape_the_api_refuses_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row: str, column: str, why: str
) -> None:
    assert check_inputs(tmp_path, f"{ELASTIC_HEADER}\n{row}\n") == 2
    err = capsys.readouterr().err
    assert f"jobs.csv:2: column {column!r}" in err and why in err


def test_a_fraction_is_taken_to_thousandths_as_it_is_allocated(tmp_path: Path) -> None:
    jobs = f"{JOBS_HEADER}\nj1,t,batch,0,10,0.1234,1,,0,true,,0,0\nj2,t,batch,0,10,0.46,1,,0,true,,0,0\n"
    out = tmp_path / "out"
    args = ["replay", "--quiet", "--nodes", write(tmp_path, "nodes.csv", NODES)]
    assert main([*args, "--jobs", write(tmp_path, "jobs.csv", jobs), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["check"] == {"ok": True, "violations": 0} and summary["finished"] == 2
    shares = [
        a["share"]
        for line in (out / "events.jsonl").read_text().splitlines()
        for a in json.loads(line).get("allocations", [])
    ]
    assert shares == [0.123, 0.46]


def test_an_elastic_job_within_the_api_rules_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = (
        f"{ELASTIC_HEADER}\nj1,t,batch,0,10,8,2,,0,true,,0,0,4,16,1\nj2,t,batch,0,10,8,2,,0,true,,0,0,4,8,\n"
    )
    assert check_inputs(tmp_path, jobs) == 1  # read; the empty events leave both jobs unfinished
    assert "never ends" in capsys.readouterr().out


def test_a_quotas_file_without_rows_is_no_quotas_in_the_replay_and_its_check(tmp_path: Path) -> None:
    jobs = f"{JOBS_HEADER}\nj1,t,batch,0,10,1,1,,0,true,,0,0\n"
    out = tmp_path / "out"
    args = ["replay", "--quiet", "--nodes", write(tmp_path, "nodes.csv", NODES), "--out", str(out)]
    quotas = write(tmp_path, "quotas.csv", QUOTAS_HEADER)
    assert main([*args, "--jobs", write(tmp_path, "jobs.csv", jobs), "--quotas", quotas]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 1 and summary["check"] == {"ok": True, "violations": 0}


@pytest.mark.parametrize(
    ("rows", "column", "why"),
    [
        (",*,1,2,1\n", "tenant", "a tenant is required"),
        ("t,*,1,2,1\nt,,2,2,1\n", "model", "duplicate quota row for tenant 't', model '*'"),
    ],
)
def test_an_ambiguous_quota_row_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str, column: str, why: str
) -> None:
    assert check_inputs(tmp_path, f"{JOBS_HEADER}\n", quotas=QUOTAS_HEADER + rows) == 2
    err = capsys.readouterr().err
    assert f"quotas.csv:{1 + rows.count(chr(10))}: column {column!r}" in err and why in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("nodes", "pods", "why"),
    [
        (NODES, "", "the pod list is empty"),
        (NODES, "p1,t,batch,0,,0,1,,0,true,,1,1\n", "no pod asks for a GPU"),
        (NODES_HEADER, "p1,t,batch,0,,1,1,,0,true,,1,1\n", "the cluster has no GPUs"),
        (
            NODES_HEADER + "n1,r1,0,,0,1,64,512,0\n",
            "p1,t,batch,0,,1,1,,0,true,,1,1\n",
            "the cluster has no GPUs",
        ),
    ],
)
def test_pack_refuses_what_it_cannot_measure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nodes: str, pods: str, why: str
) -> None:
    args = ["pack", "--quiet", "--seeds", "1", "--processes", "1", "--out", str(tmp_path / "out")]
    args += [
        "--nodes",
        write(tmp_path, "nodes.csv", nodes),
        "--jobs",
        write(tmp_path, "jobs.csv", f"{JOBS_HEADER}\n{pods}"),
    ]
    assert main(args) == 2
    assert why in capsys.readouterr().err


def test_a_gang_no_empty_cluster_could_hold_may_stay_pending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 3 replicas of 8 GPUs on a cluster of 8: each replica fits a node, the gang never does. The
    # policies keep it pending with a 'capacity' reason, as live; the checker may not call that a fault.
    jobs = f"{JOBS_HEADER}\nbig,t,batch,0,10,24,3,,0,true,,0,0\nj1,t,batch,0,10,1,1,,0,true,,0,0\n"
    start = {"node": "n1", "gpus": [0], "share": 1.0, "replica": 0}
    events = "".join(
        json.dumps(e) + "\n"
        for e in (
            {"t": 0, "event": "submit", "job": "big"},
            {"t": 0, "event": "submit", "job": "j1"},
            {"t": 0, "event": "start", "job": "j1", "allocations": [start]},
            {"t": 10, "event": "finish", "job": "j1"},
        )
    )
    assert check_inputs(tmp_path, jobs, events=events) == 0
    assert "check: 2 jobs, 4 events: OK" in capsys.readouterr().out
    # one the empty cluster could hold is still a job that never ends
    assert check_inputs(tmp_path, jobs.replace(",24,3,", ",8,1,"), events=events) == 1
    assert "job big: never ends (still pending after the last event)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("column", "row"),
    [
        ("submit_s", "j1,t,batch,1e300,10,1,1,,0,true,,0,0,,"),
        ("duration_s", "j1,t,batch,0,1e13,1,1,,0,true,,0,0,,"),
        ("time_limit_s", "j1,t,batch,0,10,1,1,,0,true,1e20,0,0,,"),
        ("checkpoint_s", "j1,t,batch,0,10,1,1,,0,true,,0,0,1e20,"),
        ("grace_s", "j1,t,batch,0,10,1,1,,0,true,,0,0,,1e20"),
    ],
)
def test_a_time_beyond_what_seconds_resolve_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, row: str
) -> None:
    # at 1e300 s, 10 s more is the same float: the job 'finished' before its work was done
    assert check_inputs(tmp_path, f"{JOBS_HEADER},checkpoint_s,grace_s\n{row}\n") == 2
    err = capsys.readouterr().err
    assert f"jobs.csv:2: column {column!r}" in err and "must be at most 1e+12 s" in err


def test_epoch_seconds_are_times_like_any_other(tmp_path: Path) -> None:
    jobs = (
        f"{JOBS_HEADER}\nj1,t,batch,1.7e9,10,1,1,,0,true,,0,0\nj2,t,batch,1700000001,0.5,1,1,,0,true,,0,0\n"
    )
    out = tmp_path / "out"
    args = ["replay", "--quiet", "--nodes", write(tmp_path, "nodes.csv", NODES), "--out", str(out)]
    assert main([*args, "--jobs", write(tmp_path, "jobs.csv", jobs)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 2 and summary["check"]["ok"]


@pytest.mark.parametrize("t", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_an_event_time_that_is_not_finite_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], t: str
) -> None:
    events = f'{{"t":{t},"event":"submit","job":"j1"}}\n'
    assert check_inputs(tmp_path, f"{JOBS_HEADER}\nj1,t,batch,0,10,1,1,,0,true,,0,0\n", events=events) == 2
    assert "events.jsonl:1: 't' must be a number" in capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("flag", "value"), [("--days", "inf"), ("--load", "inf"), ("--load", "1e400")])
def test_generate_refuses_an_endless_span_or_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    args = {"--days": "0.01", "--load": "1", flag: value}
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--out", str(tmp_path), "--seed", "1", *(x for kv in args.items() for x in kv)])
    assert exc.value.code == 2
    assert f"{value!r} must be a finite number" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--burst", "1"], ["--days", "1e-7", "--load", "10000"]])
def test_generate_refuses_a_workload_that_arrives_in_one_instant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    # no span between the first and last submit: no load to scale the durations to (it was inf,
    # every job shrank to 1 s and stdout said "load": Infinity, which is not JSON)
    args = {"--days": "0.01", "--load": "1"}
    args.update(zip(extra[::2], extra[1::2], strict=True))
    assert (
        main(["generate", "--out", str(tmp_path), "--seed", "1", *(x for kv in args.items() for x in kv)])
        == 2
    )
    assert "arrive at one instant" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("policy", "big", "clean"),
    [
        ("fcfs-device", "big,t,batch,0,10,24,3,,0,true,,0,0", True),  # 24 GPUs on a cluster of 8
        # A whole node per replica (fcfs-node's own rule), one node: another policy could run it,
        # so the checker still says it never ends; the job behind it runs all the same.
        ("fcfs-node", "big,t,batch,0,10,2,2,,0,true,,0,0", False),
    ],
)
def test_a_first_come_first_served_queue_does_not_wait_behind_a_job_the_cluster_never_holds(
    tmp_path: Path, policy: str, big: str, clean: bool
) -> None:
    # The big job stays pending ('capacity': nodes may join, as live), but nothing this cluster
    # frees will ever start it: the job behind it must not wait for ever.
    nodes = write(tmp_path, "nodes.csv", NODES)
    jobs = write(tmp_path, "jobs.csv", f"{JOBS_HEADER}\n{big}\nj1,t,batch,1,10,1,1,,0,true,,0,0\n")
    out = tmp_path / "out"
    assert (
        main(["replay", "--nodes", nodes, "--jobs", jobs, "--policy", policy, "--out", str(out), "--quiet"])
        == 0
    )
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["job"]) for e in events if e["event"] in ("start", "finish")] == [
        ("start", "j1"),
        ("finish", "j1"),
    ]
    assert main(["check", nodes, jobs, str(out / "events.jsonl")]) == (0 if clean else 1)

"""``python -m scheduling.sim``: bad input ends with one clear line and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling.sim.cli import main

ROOT = Path(__file__).resolve().parents[2]
NODES = (
    "node,rack,gpus,model,gpu_memory_gib,nvlink_domain,cpus,memory_gib,price_per_gpu_hour\n"
    "n1,r1,8,H100,80,8,64,512,4\n"
)
JOBS = (
    "job,tenant,kind,submit_s,duration_s,gpus,replicas,model,priority,preemptible,time_limit_s,"
    "cpus,memory_gib\n"
)


def files(tmp_path: Path, jobs: str = "", nodes: str = NODES) -> tuple[Path, Path]:
    (tmp_path / "nodes.csv").write_text(nodes)
    (tmp_path / "jobs.csv").write_text(JOBS + jobs)
    return tmp_path / "nodes.csv", tmp_path / "jobs.csv"


def test_a_bad_number_names_file_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, jobs = files(tmp_path, "j1,t,batch,0,abc,1,1,,0,true,,1,1\n")
    events = tmp_path / "events.jsonl"
    events.write_text("")
    assert main(["check", str(nodes), str(jobs), str(events)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "jobs.csv:2: column 'duration_s' = 'abc': not a number" in err


def test_a_missing_file_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(tmp_path / "no.csv"), str(tmp_path / "no.csv"), str(tmp_path / "x")]) == 2
    assert "No such file or directory" in capsys.readouterr().err


def test_a_missing_column_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, jobs = files(tmp_path, nodes="node,rack\nn1,r1\n")
    assert main(["replay", "--nodes", str(nodes), "--jobs", str(jobs), "--out", str(tmp_path / "o")]) == 2
    assert "missing column(s) gpus" in capsys.readouterr().err


def test_an_unknown_policy_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, jobs = files(tmp_path, "j1,t,batch,0,10,1,1,,0,true,,1,1\n")
    args = [
        "replay",
        "--nodes",
        str(nodes),
        "--jobs",
        str(jobs),
        "--out",
        str(tmp_path / "o"),
        "--policy",
        "nope",
    ]
    assert main(args) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


def test_replay_needs_durations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduling.sim import policies

    monkeypatch.setattr(policies, "names", lambda: ("fifo",))
    monkeypatch.setattr(policies, "make", lambda *a: None)
    nodes, jobs = files(tmp_path, "j1,t,batch,0,,1,1,,0,true,,1,1\n")
    args = [
        "replay",
        "--nodes",
        str(nodes),
        "--jobs",
        str(jobs),
        "--out",
        str(tmp_path / "o"),
        "--policy",
        "fifo",
    ]
    assert main(args) == 2
    assert "no duration_s (first: j1)" in capsys.readouterr().err


def test_bad_arguments_exit_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--out", "x", "--seed", "1", "--days", "-1", "--load", "1"])
    assert exc.value.code == 2
    assert "'-1' must be positive" in capsys.readouterr().err


def test_check_exits_one_on_a_violation_and_zero_when_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, jobs = files(tmp_path, "j1,t,batch,0,10,1,1,,0,true,,1,1\n")
    events = tmp_path / "events.jsonl"
    events.write_text('{"t":0,"event":"submit","job":"j1"}\n')
    assert main(["check", str(nodes), str(jobs), str(events)]) == 1
    assert "never ends" in capsys.readouterr().out
    # a live cluster's history so far: a job still pending is no violation
    assert main(["check", "--unfinished-ok", str(nodes), str(jobs), str(events)]) == 0
    events.write_text(
        '{"t":0,"event":"submit","job":"j1"}\n'
        '{"t":0,"event":"start","job":"j1","allocations":[{"node":"n1","gpus":[0],"share":1.0,"replica":0}]}\n'
        '{"t":10,"event":"finish","job":"j1"}\n'
    )
    assert main(["check", str(nodes), str(jobs), str(events)]) == 0
    assert "check: 1 jobs, 3 events: OK" in capsys.readouterr().out


def test_the_module_runs_as_a_command(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduling.sim",
            "generate",
            "--out",
            str(tmp_path),
            "--seed",
            "1",
            "--days",
            "0.2",
            "--load",
            "1",
            "--gpus",
            "64",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "jobs.csv").exists()
    assert json.loads(out.stdout)["load"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("command", ["replay", "pack"])
def test_without_matplotlib_a_run_that_plots_says_to_install_the_sim_extra(tmp_path: Path, command: str):
    """matplotlib is in the ``sim`` extra, not a core dependency: without it the simulator stops
    before running, with one line saying what to install, instead of failing at its end."""
    nodes, jobs = files(tmp_path, "j1,t,batch,0,10,1,1,,0,true,,1,1\n")
    argv = [command, "--nodes", str(nodes), "--jobs", str(jobs), "--out", str(tmp_path / "o")]
    code = (
        "import sys; sys.modules['matplotlib'] = None  # as if not installed\n"
        "from scheduling.sim.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: the simulator's plots need matplotlib, which is in Tessera's 'sim' extra: "
        "pip install -e '.[sim]'"
    )
    assert not (tmp_path / "o").exists()


def test_exclusive_gpu_shares_in_replay_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, jobs = files(
        tmp_path,
        "a1,alice,batch,0,600,0.5,1,,0,true,,1,1\n"
        "b1,bob,batch,0,600,0.25,1,,0,true,,1,1\n"
        "a2,alice,batch,0,600,0.25,1,,0,true,,1,1\n",
    )
    shared = tmp_path / "shared.jsonl"  # what the option off does: bob's fraction beside alice's
    shared.write_text(
        "".join(
            f'{{"t":0,"event":"submit","job":"{j}"}}\n'
            f'{{"t":0,"event":"start","job":"{j}","allocations":[{{"node":"n1","gpus":[0],"share":{s},"replica":0}}]}}\n'
            for j, s in (("a1", 0.5), ("b1", 0.25), ("a2", 0.25))
        )
        + "".join(f'{{"t":600,"event":"finish","job":"{j}"}}\n' for j in ("a1", "b1", "a2"))
    )
    assert main(["check", str(nodes), str(jobs), str(shared)]) == 0  # no violation unless asked
    assert main(["check", "--exclusive-gpu-shares", str(nodes), str(jobs), str(shared)]) == 1
    assert "GPU n1:0 holds fractions of tenants alice, bob" in capsys.readouterr().out
    out = tmp_path / "on"
    argv = ["replay", "--quiet", "--nodes", str(nodes), "--jobs", str(jobs), "--out", str(out)]
    assert main([*argv, "--exclusive-gpu-shares"]) == 0
    assert json.loads((out / "summary.json").read_text())["check"]["ok"]
    assert main(["check", "--exclusive-gpu-shares", str(nodes), str(jobs), str(out / "events.jsonl")]) == 0
    assert main([*argv, "--policy", "best-fit", "--exclusive-gpu-shares"]) == 2
    assert "tessera's option" in capsys.readouterr().err

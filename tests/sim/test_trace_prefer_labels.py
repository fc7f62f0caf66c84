"""JOBS.csv's optional ``prefer_labels`` column (``k:v;k:v``): read into the engine's request, a
missing column meaning none, and followed by the simulated placements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduling.sim.cli import main
from scheduling.sim.traces import TraceError, read_jobs

NODES = (
    "node,rack,gpus,model,gpu_memory_gib,nvlink_domain,cpus,memory_gib,price_per_gpu_hour,labels\n"
    "far1,r1,8,H100,80,8,64,512,4,\n"
    "far2,r1,8,H100,80,8,64,512,4,\n"
    "near,r2,8,H100,80,8,64,512,4,data:eu;disk:nvme\n"
    "far3,r2,8,H100,80,8,64,512,4,\n"
)
HEAD = (
    "job,tenant,kind,submit_s,duration_s,gpus,replicas,model,priority,preemptible,"
    "time_limit_s,cpus,memory_gib"
)


def _jobs(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(text)
    return path


def test_the_column_is_read_in_node_selectors_form_and_optional(tmp_path: Path) -> None:
    with_col = _jobs(
        tmp_path,
        HEAD + ",prefer_labels\nj1,t,batch,0,60,1,1,,0,true,,1,1,"
        "disk:nvme;data:eu\nj2,t,batch,0,60,1,1,,0,true,,1,1,\n",
    )
    assert [j.request.prefer_labels for j in read_jobs(with_col)] == [(("data", "eu"), ("disk", "nvme")), ()]
    without = _jobs(tmp_path, HEAD + "\nj1,t,batch,0,60,1,1,,0,true,,1,1\n")
    assert read_jobs(without)[0].request.prefer_labels == ()


@pytest.mark.parametrize("value", ["data", "rack:r1"])
def test_a_bad_value_names_the_column(tmp_path: Path, value: str) -> None:
    path = _jobs(tmp_path, HEAD + f",prefer_labels\nj1,t,batch,0,60,1,1,,0,true,,1,1,{value}\n")
    with pytest.raises(TraceError, match="prefer_labels"):
        read_jobs(path)


def _replay_nodes(tmp_path: Path, prefer: str, seed: int) -> set[str]:
    """The nodes the jobs of a small replay started on."""
    (tmp_path / "nodes.csv").write_text(NODES)
    rows = "".join(f"j{i},t,batch,{i},600,4,1,,0,true,,1,1,{prefer}\n" for i in range(2))
    _jobs(tmp_path, HEAD + ",prefer_labels\n" + rows)
    out = tmp_path / f"out-{seed}"
    assert (
        main(
            [
                "replay",
                "--nodes",
                str(tmp_path / "nodes.csv"),
                "--jobs",
                str(tmp_path / "jobs.csv"),
                "--out",
                str(out),
                "--quiet",
                "--seed",
                str(seed),
            ]
        )
        == 0
    )
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return {a["node"] for e in events if e["event"] == "start" for a in e["allocations"]}


def test_replay_starts_each_job_on_the_node_carrying_its_data(tmp_path: Path) -> None:
    for seed in range(5):
        assert _replay_nodes(tmp_path, "data:eu", seed) == {"near"}
    # without the preference the seeded node order spreads them
    assert any(_replay_nodes(tmp_path, "", seed) != {"near"} for seed in range(5))

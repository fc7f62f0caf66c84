"""A tiny world for the checker's tests: three nodes, job rows and events written by hand.

Rack r1 holds n1 (8 H100, one NVLink island of 8, label zone:a) and n2 (8 A100, islands of 4);
rack r2 holds n3 (4 T4). ``run`` writes the files and returns the checker's report.
"""

from __future__ import annotations

import json
from pathlib import Path

from scheduling.sim.check import CheckReport, check
from scheduling.sim.events import read_events
from scheduling.sim.traces import read_jobs, read_nodes, read_quotas

NODES = """node,rack,gpus,model,gpu_memory_gib,nvlink_domain,cpus,memory_gib,price_per_gpu_hour,labels
n1,r1,8,H100,80,8,64,512,4,zone:a
n2,r1,8,A100,80,4,64,512,2,zone:b
n3,r2,4,T4,16,1,32,128,0.5,
"""
HEADER = (
    "job,tenant,kind,submit_s,duration_s,gpus,replicas,model,priority,preemptible,time_limit_s,"
    "cpus,memory_gib,topology,min_gpus,max_gpus,checkpoint_s,grace_s,min_available,node_selector"
)


def job(name: str, gpus: float = 1, duration: float = 100, **kw: object) -> str:
    cols = {
        "tenant": "t1",
        "kind": "training",
        "submit_s": 0,
        "replicas": 1,
        "model": "",
        "priority": 0,
        "preemptible": "true",
        "time_limit_s": "",
        "cpus": 0,
        "memory_gib": 0,
        "topology": "",
        "min_gpus": "",
        "max_gpus": "",
        "checkpoint_s": "",
        "grace_s": "",
        "min_available": "",
        "node_selector": "",
    }
    cols.update(kw)
    row = {"job": name, "duration_s": duration, "gpus": f"{gpus:g}", **cols}
    return ",".join(str(row[c]) for c in HEADER.split(","))


def alloc(node: str, gpus: list[int], replica: int = 0, share: float = 1.0) -> dict[str, object]:
    return {"node": node, "gpus": gpus, "share": share, "replica": replica}


def ev(t: float, event: str, job_id: str, *allocs: dict[str, object], **extra: object) -> dict:
    out: dict[str, object] = {"t": t, "event": event, "job": job_id}
    if allocs or event in ("start", "resize"):
        out["allocations"] = list(allocs)
    out.update(extra)
    return out


def run(tmp_path: Path, jobs: list[str], events: list[dict], quotas: str | None = None) -> CheckReport:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "jobs.csv").write_text(HEADER + "\n" + "\n".join(jobs) + "\n")
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    q = None
    if quotas is not None:
        (tmp_path / "quotas.csv").write_text("tenant,model,guaranteed,limit,weight\n" + quotas)
        q = read_quotas(tmp_path / "quotas.csv")
    return check(
        read_nodes(tmp_path / "nodes.csv"),
        read_jobs(tmp_path / "jobs.csv"),
        read_events(tmp_path / "events.jsonl"),
        q,
    )

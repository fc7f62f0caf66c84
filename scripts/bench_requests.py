"""CPU per request of one web process (``make bench-requests``): where ``make bench-e2e``'s web time goes.

Starts one daphne (the deployment's ASGI application) on a fresh database (``tessera_reqbench``)
and Redis databases of its own, registers one simulated node, then sends each kind of request
the end-to-end benchmark's jobs cause, ``--n`` times one after another on a kept-alive
connection, and reads the web process's CPU time (``/proc``) before and after each kind. No
worker runs: submitted jobs stay pending, and the passes they ask for stay queued. Prints one
JSON line: milliseconds of web CPU per request, by kind; progress goes to stderr.

``heartbeat_held`` is the steady heartbeat of a busy node: a second node (16 GPUs) holds
:data:`HELD_JOBS` running jobs (the mix of ``bench_e2e``'s: single GPUs, a fraction, gangs;
10 replicas), bound by a real pass run in this process, started through the agent API, and
reported running in every heartbeat, so that nothing is started or stopped.

    .venv/bin/python scripts/bench_requests.py [--n 400]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench_e2e import bench_env, job_body, prepare, say, seed  # noqa: E402
from tests.support import Processes, wait_until, web_answers, web_argv  # noqa: E402


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


class Client:
    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, auth: str, body: Any = None, **headers: str) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Authorization": auth, **headers}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=hdrs)
        response = self.conn.getresponse()
        content = response.read()
        return response.status, json.loads(content) if content[:1] in (b"{", b"[") else content


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=400, help="requests of each kind")
    p.add_argument("--only", default="", help="these kinds only (comma-separated)")
    p.add_argument("--pg", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432"))
    p.add_argument("--db", default="tessera_reqbench")
    p.add_argument("--redis", default=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0"))
    p.add_argument("--redis-dbs", default="11,12", help="Redis databases of the broker and the channel layer")
    args = p.parse_args()

    broker_db, layer_db = (int(x) for x in args.redis_dbs.split(","))
    env = bench_env(args.pg, args.db, args.redis, broker_db, layer_db)
    work = Path(tempfile.mkdtemp(prefix="tessera-reqbench-", dir="/tmp"))
    procs = Processes(work)
    try:
        prepare(args.pg, args.db, args.redis, (broker_db, layer_db), env)
        token, join = seed(24)  # the busy node's 16 GPUs and the first node's 8
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        web = procs.start("web", web_argv(port=port), env)
        base = f"http://127.0.0.1:{port}"
        wait_until("the web server", lambda: web_answers(base), procs, time.monotonic() + 60)
        client = Client(port)
        user = f"Token {token}"
        status, answer = client.call("POST", "/api/v1/agent/register", f"Join {join}", _node_body())
        if status != 201:
            raise SystemExit(f"register answered {status}: {answer}")
        node = f"Node {answer['credential']}"
        only = [k for k in args.only.split(",") if k]
        held_node, held_running = "", list[dict[str, int]]()
        if not only or "heartbeat_held" in only:
            held_node, held_running = _busy_node(client, user, join)
        import random

        rng = random.Random(1)
        counter = iter(range(10**9))
        kinds = {
            "submit": lambda: client.call(
                "POST", "/api/v1/jobs/", user, job_body(0, rng), **{"Idempotency-Key": f"k{next(counter)}"}
            ),
            "job_list_page": lambda: client.call("GET", "/api/v1/jobs/?limit=1", user),
            "heartbeat": lambda: client.call("POST", "/api/v1/agent/heartbeat", node, {"running": []}),
            "heartbeat_held": lambda: client.call(
                "POST", "/api/v1/agent/heartbeat", held_node, {"running": held_running}
            ),
            "wait_timeout_0": lambda: client.call("GET", "/api/v1/agent/wait?timeout=0", node),
            "exits_stale": lambda: client.call(
                "POST",
                "/api/v1/agent/exits",
                node,
                {"exits": [{"job_id": 1, "attempt": 0, "replica": 0, "exit_code": 0, "reason": ""}]},
            ),
            "not_found": lambda: client.call("GET", "/api/v1/nothing-here", user),
        }
        out: dict[str, float] = {}
        for name, call in kinds.items():
            if only and name not in only:
                continue
            for _ in range(20):  # warm: imports, caches, connections
                call()
            before, t0 = cpu_seconds(web.pid), time.perf_counter()
            for _ in range(args.n):
                status, answer = call()
                if status >= 500:
                    raise SystemExit(f"{name} answered {status}: {answer}")
            after = cpu_seconds(web.pid)
            user_s, system = ((a - b) * 1000 / args.n for a, b in zip(after, before, strict=True))
            out[f"{name}_cpu_ms"] = round(user_s + system, 2)
            out[f"{name}_sys_ms"] = round(system, 2)
            out[f"{name}_wall_ms"] = round((time.perf_counter() - t0) * 1000 / args.n, 2)
            say(
                f"{name}: {out[f'{name}_cpu_ms']} ms CPU ({out[f'{name}_sys_ms']} system), "
                f"{out[f'{name}_wall_ms']} ms wall per request"
            )
        print(json.dumps({"requests_each": args.n, **out}), flush=True)
        return 0
    finally:
        procs.stop_all()


# The busy node's jobs (gpus, replicas, topology): bench_e2e's mix, 16 GPUs in 10 replicas.
HELD_JOBS = [(1, 1, "any")] * 3 + [(0.5, 1, "any")] * 2 + [(2, 2, "any"), (8, 2, "node"), (1, 1, "any")]


def _busy_node(client: Client, user: str, join: str) -> tuple[str, list[dict[str, int]]]:
    """Register the busy node, bind :data:`HELD_JOBS` to it with a real pass (this process, the
    benchmark's database), start them through its heartbeats: (its credential, its ``running``)."""
    status, answer = client.call(
        "POST", "/api/v1/agent/register", f"Join {join}", _node_body("reqbench-held", 16, {"bench": "held"})
    )
    if status != 201:
        raise SystemExit(f"register answered {status}: {answer}")
    node = f"Node {answer['credential']}"
    for i, (gpus, replicas, topology) in enumerate(HELD_JOBS):
        body = {
            "name": f"held-{i}",
            "kind": "batch",
            "command": ["sleep", "infinity"],
            "env": {"BENCH": "x" * 64},
            "gpus": gpus,
            "replicas": replicas,
            "topology": topology,
            "node_selector": {"bench": "held"},
        }
        status, answer = client.call("POST", "/api/v1/jobs/", user, body)
        if status != 201:
            raise SystemExit(f"submit answered {status}: {answer}")
    from scheduling.services import passes

    result = passes.run_pass()
    if result is None or len(result.bound) != len(HELD_JOBS):
        raise SystemExit(f"the pass bound {result and result.bound}, not {len(HELD_JOBS)} jobs")
    status, answer = client.call("POST", "/api/v1/agent/heartbeat", node, {"running": []})
    running = [
        {"job_id": b["job_id"], "attempt": b["attempt"], "replica": b["replica"], "pid": 1000 + n}
        for n, b in enumerate(answer["start"])
    ]
    for _ in range(2):  # the first marks them running; the second must change nothing
        status, answer = client.call("POST", "/api/v1/agent/heartbeat", node, {"running": running})
    if status != 200 or answer["start"] or answer["stop"] or len(running) != sum(r for _, r, _ in HELD_JOBS):
        raise SystemExit(f"the busy node is not steady: {status} {answer}")
    return node, running


def _node_body(
    name: str = "reqbench-0", gpus: int = 8, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "rack": "r0",
        "labels": labels or {},
        "kind": "gpu",
        "cpus": 8,
        "memory_gib": 64,
        "nvlink_domain": 4,
        "metrics_url": "",
        "devices": [
            {"index": i, "uuid": f"GPU-{name}-{i}", "model": "A100", "memory_gib": 80} for i in range(gpus)
        ],
    }


if __name__ == "__main__":
    sys.exit(main())

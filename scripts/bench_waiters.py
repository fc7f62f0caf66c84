"""Does waiting cost the others? Submit latency with and without 200 long-polling waiters.

Starts one daphne (PostgreSQL database ``tessera_bench_waiters``, made afresh; Redis databases of
its own; rate limits off) — no worker or agent: jobs stay pending, the submits are what is
measured. Then, in rounds, submits ``--jobs`` jobs from 4 client threads with nobody waiting, and
again while ``--waiters`` clients each hold ``GET /api/v1/jobs/ID/?wait=55`` open on a pending
job (asking again as each answers), the way ``tessera submit --wait`` waits. Rounds alternate
(without, with, without, with, ...) so the machine's drift falls on both alike. Prints ONE JSON
line: each side's p50 and p99 submit latency (ms, all its rounds together) and p99 with ÷
without. The goal (issue 20): ≤ 1.10.

    .venv/bin/python scripts/bench_waiters.py [--jobs 300] [--waiters 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("bench_e2e", ROOT / "scripts" / "bench_e2e.py")
assert _spec is not None and _spec.loader is not None  # the file is in this checkout
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)  # its database, seed and environment helpers

from tests.support import Processes, free_port, web_answers, web_argv  # noqa: E402

BODY = {"kind": "batch", "command": ["true"], "gpus": 1}
SETTLE_S = 10.0
IDLE_S = 5.0


def submit_latencies(base: str, token: str, count: int, tag: str) -> list[float]:
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"

    def one(i: int) -> float:
        started = time.perf_counter()
        answer = session.post(f"{base}/api/v1/jobs/", json={**BODY, "name": f"{tag}-{i}"}, timeout=30)
        answer.raise_for_status()
        return (time.perf_counter() - started) * 1000

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(count)))


class Waiters:
    """``count`` clients each long-polling one pending job until stopped."""

    def __init__(self, base: str, token: str, job_ids: list[int]) -> None:
        self.stop = threading.Event()
        self.answers = 0
        self.threads = [
            threading.Thread(target=self._wait, args=(base, token, job_id), daemon=True) for job_id in job_ids
        ]
        for thread in self.threads:
            thread.start()

    def _wait(self, base: str, token: str, job_id: int) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        while not self.stop.is_set():
            try:
                session.get(f"{base}/api/v1/jobs/{job_id}/", params={"wait": 55}, timeout=70)
                self.answers += 1
            except requests.RequestException:
                time.sleep(0.5)

    def close(self) -> None:
        self.stop.set()  # (the threads are daemons: a wait in flight ends with the process)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300, help="submits per round")
    parser.add_argument("--waiters", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each kind, alternating")
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    args = parser.parse_args()

    env = e2e.bench_env(args.pg, "tessera_bench_waiters", args.redis, 12, 13)
    e2e.prepare(args.pg, "tessera_bench_waiters", args.redis, (12, 13), env)
    token, _ = e2e.seed(args.waiters + 2 * args.rounds * args.jobs + 10)
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-waiters-"))
    procs = Processes(work)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.start("web", web_argv(port=port), env)
        e2e.wait_for("the web server", lambda: web_answers(base), procs, 60)
        e2e.say(f"{args.waiters} jobs to wait on")
        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        waited = [
            session.post(f"{base}/api/v1/jobs/", json={**BODY, "name": f"waited-{i}"}, timeout=30).json()[
                "id"
            ]
            for i in range(args.waiters)
        ]
        submit_latencies(base, token, 50, "warm-up")
        without: list[float] = []
        with_waiters: list[float] = []
        answered = 0
        idle_cpu: list[float] = []
        for r in range(args.rounds):
            e2e.say(f"round {r + 1}: {args.jobs} submits, nobody waiting")
            without += submit_latencies(base, token, args.jobs, f"alone-{r}")
            waiters = Waiters(base, token, waited)
            time.sleep(SETTLE_S)  # every waiter's request is in (and parked) before the submits begin
            cpu_before = procs.cpu_seconds().get("web", 0.0)
            time.sleep(IDLE_S)
            idle_cpu.append((procs.cpu_seconds().get("web", 0.0) - cpu_before) / IDLE_S)
            e2e.say(f"round {r + 1}: {args.jobs} submits, {args.waiters} waiting")
            with_waiters += submit_latencies(base, token, args.jobs, f"waited-{r}")
            waiters.close()
            answered += waiters.answers
        procs.check_alive()
        p99_without, p99_with = e2e.pct(without, 0.99), e2e.pct(with_waiters, 0.99)
        print(
            json.dumps(
                {
                    "submits_per_side": len(without),
                    "waiters": args.waiters,
                    "p50_ms_without": e2e.pct(without, 0.5),
                    "p99_ms_without": p99_without,
                    "p50_ms_with_waiters": e2e.pct(with_waiters, 0.5),
                    "p99_ms_with_waiters": p99_with,
                    "p99_ratio": round(p99_with / p99_without, 3),
                    "waits_answered_early": answered,
                    # the web process's CPU (cores) while the waiters sat parked, nothing else going on
                    "web_cpu_parked": round(max(idle_cpu), 3),  # a wait answers before 55 s only on a change
                }
            )
        )
        return 0
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""End-to-end benchmark (``make bench-e2e``): submit → running through every real part, measured.

Starts, on this machine: a PostgreSQL database of its own (``tessera_bench``, dropped and made
afresh), a Celery worker, Celery beat and daphne (``--web`` processes on one port) on Redis
databases of their own, and 16 node agents of 8 simulated GPUs each (real agent processes, real
job processes), launched by ``tests/support.py`` as the integration and chaos tests launch theirs.
The per-user rate limits are off: one user submitting as fast as it can is the load measured.
Then it submits 2,000 jobs (single-GPU, fractional and gangs; the command is ``true``) through the
REST API: the first half
at 50 per second (the latency phase), the rest as fast as its client threads can (the throughput
phase). It prints ONE JSON line on stdout; progress goes to stderr.

Latency is from the client's send (``time.time()`` just before the POST) to the process start the
agent observed (``started_at``, reported by the agent; same machine, same clock). Jobs that had to
wait for capacity are excluded from the latency (counted): a job is such a job when, at its send,
the GPUs held by bound jobs plus those asked by jobs sent before it and not yet bound left less
than it asks for. Pass durations come from the worker's log (one line per pass).

Every process it starts is stopped at the end (also on Ctrl-C or an error).

    .venv/bin/python scripts/bench_e2e.py [--jobs 2000] [--rate 50] [--paced 1000] [--agents 16]
        [--agent-args '--single-tenant'] [--host-cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import (  # noqa: E402 - the stack launcher the tests use too
    PY,
    Processes,
    StackError,
    agent_argv,
    agent_env,
    beat_argv,
    stack_env,
    wait_until,
    web_answers,
    web_argv,
    worker_argv,
)

TARGET_P99_MS = 150.0
TARGET_SUBMIT_PER_S = 120.0


def say(text: str) -> None:
    print(f"[bench-e2e {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))], 1)


def wait_for(what: str, check, procs: Processes, timeout: float) -> Any:
    return wait_until(what, check, procs, time.monotonic() + timeout)


def fresh_database(pg: str, name: str) -> None:
    import psycopg

    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def bench_env(pg: str, db: str, redis: str, broker_db: int, layer_db: int, **extra: str) -> dict[str, str]:
    """The server processes' environment: database ``db``, Redis databases of the benchmark's own."""
    return stack_env(
        f"{pg}/{db}",
        redis,
        TESSERA_REDIS_BROKER_DB=str(broker_db),
        TESSERA_REDIS_LAYER_DB=str(layer_db),
        TESSERA_DEBUG="0",
        # The per-user rate limits (scheduling/api/throttling.py) would answer 429 to one user
        # submitting 2,000 jobs as fast as it can: the benchmark measures the service, unthrottled.
        TESSERA_RATE_LIMIT_SUBMIT="off",
        TESSERA_RATE_LIMIT_API="off",
        TESSERA_SECRET_KEY="bench-" + "k" * 50,
        **extra,
    )


def prepare(pg: str, db: str, redis: str, redis_dbs: tuple[int, int], env: dict[str, str]) -> None:
    """A fresh database ``db``, migrated; the benchmark's Redis databases emptied (flags left by a
    run killed mid-way included); Django set up in this process, on ``env`` (made current)."""
    say(f"fresh database {db}; migrating")
    os.environ.update(env)
    fresh_database(pg, db)
    subprocess.run([PY, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    import django

    django.setup()
    import redis as redis_lib

    from controlplane.env import redis_db_url

    for n in redis_dbs:
        redis_lib.Redis.from_url(redis_db_url(redis, n)).flushdb()
    from scheduling.services import redis_flags

    for flag in ("pass-queued", "pass-again"):
        redis_flags.client().delete(redis_flags.key(flag))


def seed(gpus: int) -> tuple[str, str]:
    """A tenant with a quota for the whole cluster, a user with a token; a join token."""
    from django.contrib.auth.models import User

    from scheduling.models import Membership, Quota, Tenant
    from scheduling.services.agents import do_create_join_token
    from scheduling.services.tokens import do_create_api_token

    tenant = Tenant.objects.create(name="bench")
    Quota.objects.create(tenant=tenant, model="*", guaranteed=gpus, limit=gpus)
    user = User.objects.create_user("bench", password=None)
    Membership.objects.create(user=user, tenant=tenant)
    return do_create_api_token(user, "bench")[1], do_create_join_token("bench")[1]


def job_body(i: int, rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    body: dict[str, Any] = {"name": f"bench-{i}", "kind": "batch", "command": ["true"]}
    if roll < 0.6:
        body["gpus"] = 1
    elif roll < 0.8:
        body["gpus"] = 0.5  # fractional: half of one GPU
    elif roll < 0.9:
        body.update(gpus=2, replicas=2)  # a gang: two replicas of one GPU
    else:
        body.update(gpus=8, replicas=2, topology="node")  # a gang of two 4-GPU replicas
    return body


class Submitter:
    """Client threads posting jobs; each records (index, send time, status, job id).

    Plain ``http.client`` on a kept-alive connection per thread: the client shares the machine's
    cores with the service it measures (``requests`` cost 3.6 s of CPU for 2,000 posts, this 2.1 s).
    Each thread opens a new connection every ``reconnect_every`` requests, as a pipeline's clients
    come and go: the web processes share one listening socket, and a connection stays with the
    process that accepted it (the one least busy then), so eight connections held for the whole run
    pinned 75% of the submits on one of two processes (1,508 / 502; reconnecting: 889 / 1,121)."""

    def __init__(self, base: str, token: str, threads: int, reconnect_every: int = 0):
        self.reconnect_every = reconnect_every
        parts = urlsplit(base)
        if parts.hostname is None:
            raise SystemExit(f"{base}: no host in the URL")
        self.host, self.port = parts.hostname, parts.port
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(threads)
        self.results: dict[int, dict[str, Any]] = {}

    def _connection(self) -> http.client.HTTPConnection:
        sent = getattr(self.local, "sent", 0)
        if self.reconnect_every and sent >= self.reconnect_every and self.local.conn is not None:
            self.local.conn.close()
            self.local.conn = None
        if getattr(self.local, "conn", None) is None:
            self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            sent = 0
        self.local.sent = sent + 1
        return self.local.conn

    def _send(self, body: bytes, key: str) -> tuple[int, Any]:
        conn = self._connection()
        try:
            conn.request("POST", "/api/v1/jobs/", body, {**self.headers, "Idempotency-Key": key})
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        except (OSError, http.client.HTTPException, ValueError):
            conn.close()
            self.local.conn = None
            raise

    def post(self, i: int, body: dict[str, Any], at: float | None = None) -> None:
        payload = json.dumps(body).encode()
        if at is not None:
            time.sleep(max(0.0, at - time.time()))
        sent = time.time()
        try:
            status, answer = self._send(payload, f"bench-{i}")
            job_id = answer.get("id") if status < 300 and isinstance(answer, dict) else None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            status, job_id = 0, None
            say(f"job {i}: {exc.__class__.__name__}")
        self.results[i] = {
            "sent": sent,
            "done": time.time(),
            "status": status,
            "id": job_id,
            "gpus": float(body.get("gpus", 1)),
        }

    def run(self, items: list[tuple[int, dict[str, Any], float | None]]) -> None:
        for f in [self.pool.submit(self.post, i, b, at) for i, b, at in items]:
            f.result()


def job_times(ids: list[int]) -> dict[int, dict[str, Any]]:
    from scheduling.models import Job, JobEvent

    rows: dict[int, dict[str, Any]] = {
        j["id"]: dict(j)
        for j in Job.objects.filter(pk__in=ids).values(
            "id", "state", "submitted_at", "started_at", "finished_at"
        )
    }
    for e in JobEvent.objects.filter(job_id__in=ids, type="scheduled").values("job_id", "at"):
        rows[e["job_id"]].setdefault("scheduled_at", e["at"])
    return rows


def waited_for_capacity(
    results: dict[int, dict[str, Any]], times: dict[int, dict[str, Any]], total_gpus: int
) -> set[int]:
    """Jobs sent when bound jobs plus jobs queued ahead left too few GPUs for them."""
    spans = []
    for r in results.values():
        t = times.get(r["id"])
        if t and t.get("scheduled_at") and t.get("finished_at"):
            spans.append((t["scheduled_at"].timestamp(), t["finished_at"].timestamp(), r["gpus"]))
    queued = sorted(
        (r["sent"], times[r["id"]]["scheduled_at"].timestamp(), r["gpus"])
        for r in results.values()
        if r["id"] in times and times[r["id"]].get("scheduled_at")
    )
    excluded = set()
    for i, r in results.items():
        t0 = r["sent"]
        held = sum(g for s, f, g in spans if s <= t0 < f)
        ahead = sum(g for sent, bound, g in queued if sent < t0 < bound)
        if total_gpus - held - ahead < r["gpus"]:
            excluded.add(i)
    return excluded


# Celery's log line: "[2026-11-29 23:55:32,752: INFO/MainProcess] pass took 187.2 ms: ..."
PASS_LINE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/\w+\] pass took ([0-9.]+) ms")


def pass_durations(worker_log: str) -> list[tuple[float, float]]:
    """(when it ended, epoch seconds; its duration, ms) of each pass in the worker's log."""
    out = []
    for stamp, ms in PASS_LINE.findall(worker_log):
        when = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000
        out.append((when, float(ms)))
    return out


def host_cpu(redis_port: int) -> dict[str, float]:
    """CPU seconds so far: the machine's busy and idle time (every core, ``/proc/stat``), and
    PostgreSQL's and the benchmark's Redis server's, which the children's counts leave out (every
    ``postgres`` process; the postmaster's reaped backends are in its children's fields)."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = cpu[3] + cpu[4]  # idle, iowait
    out = {"host_busy": (sum(cpu) - idle) / tick, "host_idle": idle / tick, "postgres": 0.0, "redis": 0.0}
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            comm = (proc / "comm").read_text().strip()
            if comm == "postgres":
                key = "postgres"
            elif comm == "redis-server" and f":{redis_port}" in (proc / "cmdline").read_text():
                key = "redis"
            else:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            out[key] += sum(int(f) for f in fields[11:15]) / tick
    return out


def between(passes: list[tuple[float, float]], start: float, end: float) -> list[float]:
    return [ms for when, ms in passes if start <= when < end]


def main() -> int:  # noqa: PLR0915 - one linear script, read top to bottom
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--paced", type=int, default=1000, help="jobs sent at --rate (the rest: burst)")
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs per agent")
    p.add_argument("--threads", type=int, default=8, help="client threads in the burst")
    p.add_argument(
        "--reconnect-every", type=int, default=10, help="requests per client connection (0: one for all)"
    )
    p.add_argument("--web", type=int, default=os.cpu_count() or 1, help="daphne processes")
    p.add_argument("--pg", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432"))
    p.add_argument("--db", default="tessera_bench")
    p.add_argument("--redis", default=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0"))
    p.add_argument("--redis-dbs", default="13,14", help="Redis databases of the broker and the channel layer")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--keep", action="store_true", help="keep the logs directory")
    p.add_argument(
        "--host-cpu",
        action="store_true",
        help="also report, for the burst, the machine's busy and idle CPU seconds, PostgreSQL's and "
        "Redis's (this machine's servers), and this client's",
    )
    p.add_argument(
        "--agent-args",
        default="",
        help="more arguments for every agent, e.g. '--single-tenant' (jobs without a uid of their own, "
        "private mounts or loopback rules: what the node isolation costs, docs/benchmarks/e2e.md)",
    )
    args = p.parse_args()

    broker_db, layer_db = (int(x) for x in args.redis_dbs.split(","))
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-", dir="/tmp"))
    work.chmod(0o711)
    # The worker logs one line per pass at INFO: its duration.
    env = bench_env(args.pg, args.db, args.redis, broker_db, layer_db, TESSERA_LOG_LEVEL="INFO")
    procs = Processes(work)
    total_gpus = args.agents * args.gpus
    try:
        prepare(args.pg, args.db, args.redis, (broker_db, layer_db), env)
        token, join = seed(total_gpus)

        # One listening socket shared by --web daphne processes (the kernel spreads connections
        # over them), as a deployment runs one web process per core.
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        port = listener.getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        procs.start("worker", worker_argv("bench"), env)
        # beat's safety pass, as every deployment runs it: what binds jobs whose trigger was lost
        procs.start("beat", beat_argv(work / "celerybeat-schedule"), env)
        for w in range(args.web):
            procs.start(
                "web" if w == 0 else f"web{w}",
                web_argv(fd=listener.fileno()),
                env,
                pass_fds=(listener.fileno(),),
            )
        wait_for("the worker", lambda: " ready." in procs.output("worker"), procs, 60)
        wait_for("the web server", lambda: web_answers(base), procs, 60)
        agents_env = agent_env(env, join)
        extra_agent_args = shlex.split(args.agent_args)
        for n in range(args.agents):
            spec = f"{args.gpus}xA100,nvlink=4,rack=r{n % 4}"
            procs.start(
                f"agent{n:02d}",
                agent_argv(base, f"bench-{n:02d}", spec, work / f"agent{n:02d}", *extra_agent_args),
                agents_env,
            )
        from scheduling.models import Node

        wait_for(
            f"{args.agents} agents",
            lambda: Node.objects.filter(devices__isnull=False).distinct().count() == args.agents,
            procs,
            120,
        )
        say(f"{args.agents} agents of {args.gpus} GPUs registered; warming up")

        rng = random.Random(args.seed)
        warm = Submitter(base, token, 2)
        warm.run(
            [(-k - 1, {"name": f"warm-{k}", "kind": "batch", "command": ["true"]}, None) for k in range(10)]
        )
        _wait_terminal([r["id"] for r in warm.results.values()], procs, 60)

        bodies = [job_body(i, rng) for i in range(args.jobs)]
        paced = Submitter(base, token, 8, args.reconnect_every)
        t0 = time.time() + 0.5
        say(f"latency phase: {args.paced} jobs at {args.rate:g}/s")
        paced.run([(i, bodies[i], t0 + i / args.rate) for i in range(args.paced)])
        burst = Submitter(base, token, args.threads, args.reconnect_every)
        say(f"throughput phase: {args.jobs - args.paced} jobs, {args.threads} client threads")
        cpu_before = procs.cpu_seconds()
        redis_port = urlsplit(args.redis).port or 6379
        host_before = (host_cpu(redis_port), sum(os.times()[:2])) if args.host_cpu else None
        burst_start = time.time()
        burst.run([(i, bodies[i], None) for i in range(args.paced, args.jobs)])
        burst_end = max((r["done"] for r in burst.results.values()), default=time.time())
        cpu_burst = {k: round(v - cpu_before.get(k, 0.0), 1) for k, v in procs.cpu_seconds().items()}
        if host_before is not None:
            host, client = host_cpu(redis_port), sum(os.times()[:2])
            cpu_burst.update({k: round(v - host_before[0][k], 2) for k, v in host.items()})
            cpu_burst["bench_client"] = round(client - host_before[1], 2)
        say("waiting for every job to finish")
        all_results = {**paced.results, **burst.results}
        ids = [r["id"] for r in all_results.values() if r["id"]]
        _wait_terminal(ids, procs, 300)

        times = job_times(ids)
        excluded = waited_for_capacity(all_results, times, total_gpus)
        lat_paced: list[float] = []
        lat_burst: list[float] = []
        stages: dict[str, list[float]] = {"send_to_stored": [], "stored_to_bound": [], "bound_to_started": []}
        not_started = 0
        for i, r in all_results.items():
            t = times.get(r["id"]) if r["id"] else None
            if not t or not t["started_at"]:
                not_started += 1
                continue
            ms = (t["started_at"].timestamp() - r["sent"]) * 1000
            if i not in excluded:
                (lat_paced if i < args.paced else lat_burst).append(ms)
            if i < args.paced and i not in excluded:
                stored, bound = t["submitted_at"].timestamp(), t["scheduled_at"].timestamp()
                stages["send_to_stored"].append((stored - r["sent"]) * 1000)
                stages["stored_to_bound"].append((bound - stored) * 1000)
                stages["bound_to_started"].append((t["started_at"].timestamp() - bound) * 1000)
        accepted = sum(1 for r in burst.results.values() if r["status"] in (200, 201))
        per_s = accepted / max(1e-9, burst_end - burst_start)
        passes = pass_durations(procs.output("worker"))
        paced_end = max((r["done"] for r in paced.results.values()), default=burst_start)
        paced_ok = sum(1 for r in paced.results.values() if r["status"] in (200, 201))
        paced_passes = between(passes, t0, burst_start)
        burst_passes = between(passes, burst_start, burst_end)
        states: dict[str, int] = {}
        for t in times.values():
            states[t["state"]] = states.get(t["state"], 0) + 1
        out = {
            "p50_submit_to_running_ms": pct(lat_paced, 0.5),
            "p99_submit_to_running_ms": pct(lat_paced, 0.99),
            "samples": len(lat_paced),
            "excluded_waited_for_capacity": sum(1 for i in excluded if i < args.paced),
            "rate_per_s": args.rate,
            "submissions_per_s": round(per_s, 1),
            "burst_accepted": accepted,
            "burst_refused": len(burst.results) - accepted,
            "burst_p50_submit_to_running_ms": pct(lat_burst, 0.5),
            "burst_p99_submit_to_running_ms": pct(lat_burst, 0.99),
            "burst_samples": len(lat_burst),
            "burst_excluded_waited_for_capacity": sum(1 for i in excluded if i >= args.paced),
            "stages_p50_ms": {k: pct(v, 0.5) for k, v in stages.items()},
            "stages_p99_ms": {k: pct(v, 0.99) for k, v in stages.items()},
            "paced_submissions_per_s": round(paced_ok / max(1e-9, paced_end - t0), 1),
            "pass_p50_ms": pct(paced_passes, 0.5),
            "pass_p99_ms": pct(paced_passes, 0.99),
            "passes": len(paced_passes),
            "burst_pass_p50_ms": pct(burst_passes, 0.5),
            "burst_pass_p99_ms": pct(burst_passes, 0.99),
            "burst_passes": len(burst_passes),
            "all_passes": len(passes),
            "jobs": args.jobs,
            "never_started": not_started,
            "states": states,
            "agents": args.agents,
            "web_processes": args.web,
            "client_threads": args.threads,
            "client_reconnect_every": args.reconnect_every,
            "gpus": total_gpus,
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        out["cpu_seconds"] = {**procs.cpu_seconds(), "bench_client": round(sum(os.times()[:2]), 1)}
        out["burst_cpu_seconds"] = cpu_burst  # what each kind of process used while the burst was sent
        print(json.dumps(out), flush=True)
        missed = []
        if out["p99_submit_to_running_ms"] is None or out["p99_submit_to_running_ms"] > TARGET_P99_MS:
            missed.append(f"p99 {out['p99_submit_to_running_ms']} ms > {TARGET_P99_MS:g} ms")
        if per_s < TARGET_SUBMIT_PER_S:
            missed.append(f"{per_s:.0f} submissions/s < {TARGET_SUBMIT_PER_S:g}/s")
        say("targets met" if not missed else "TARGET MISSED: " + "; ".join(missed))
        return 0 if not missed else 1
    except (StackError, subprocess.CalledProcessError) as exc:
        say(f"failed: {exc}")
        for name in ("web", "worker", "agent00"):
            if name in procs.children:
                say(f"--- {name} (tail) ---\n{procs.output(name)[-2000:]}")
        return 2
    finally:
        procs.stop_all()
        if args.keep:
            say(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _wait_terminal(ids: list[int], procs: Processes, timeout: float) -> None:
    from scheduling.models import Job

    done = ("succeeded", "failed", "cancelled")
    last = [0.0]

    def check() -> bool:
        left = Job.objects.filter(pk__in=ids).exclude(state__in=done).count()
        if time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            say(f"{len(ids) - left}/{len(ids)} jobs finished")
        return left == 0

    wait_for("every job to finish", check, procs, timeout)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)

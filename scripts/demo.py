#!/usr/bin/env python
"""``make demo``: the embedded Tessera demo cluster, every part a real process.

1. migrate the embedded SQLite database (``var/tessera.sqlite3``) and seed the demo's tenants,
   quotas and users (``manage.py seed_demo``: fresh passwords, API tokens and join token);
2. start the web process (daphne; the scheduling pass runs inside it in the embedded default);
3. start 12 simulated node agents as separate processes: 4 × 8×H100 in rack r1, 4 × 8×A100 in r2,
   4 × 4×T4 in r3 (each registers its own node with the join token, passed in the environment);
   with ``--gpu``, also one agent on this machine's real NVIDIA GPUs (NVML discovery, metrics from
   NVML on the agent's default port 9400), so jobs run on real devices;
4. print the URLs, each user's password and token, and a curl example — on the terminal only: no
   log holds a secret, and everything the demo writes (the database, logs, the credentials file)
   is readable by its own user alone (files 0600, folders 0700; ``var/`` itself 0711, so that job
   users can reach the agents' folders in it without listing it);
5. on Ctrl-C (or SIGTERM) stop everything it started: each child runs in its own process group,
   which gets SIGTERM, then SIGKILL after a grace period; descendants that left their group (job
   processes) are hunted down by pid and start time, so no process or port is left behind.

Standard library only, so it runs the moment the virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (name, --simulate SPEC): the demo cluster of issue 2.
NODES: list[tuple[str, str]] = (
    [(f"h100-{i:02d}", "8xH100,nvlink=8,rack=r1") for i in range(1, 5)]
    + [(f"a100-{i:02d}", "8xA100,nvlink=4,rack=r2") for i in range(1, 5)]
    + [(f"t4-{i:02d}", "4xT4,nvlink=1,rack=r3") for i in range(1, 4)]
    + [("t4-04", "4xT4,nvlink=1,rack=r3,labels=demo:idle")]  # where idle-batch and wants-gpu go
)
# The idle policy with short windows, so that a warning and a reclaim show within 10 minutes
# (docs/metrics.md, "The adjustment pass"): points of 15 s, judged after the first minute, warned
# at 2 and 4 minutes idle, acted on at 6. The environment's own values win.
DEMO_IDLE_POLICY = {
    "TESSERA_ADJUST_INTERVAL_S": "10",
    "TESSERA_IDLE_STEP_S": "15",
    "TESSERA_IDLE_EXEMPT_S": "60",
    "TESSERA_IDLE_WARN_S": "120,240",
    "TESSERA_IDLE_ACT_S": "360",
}
# Writes a checkpoint; on the agent's "checkpoint now" signal (SIGUSR1) writes another and exits.
CHECKPOINTING = (
    "trap 'echo checkpoint-now >> \"$TESSERA_CHECKPOINT_MARKER\"; exit 0' USR1; "
    'echo step-1 > "$TESSERA_CHECKPOINT_MARKER"; while :; do sleep 1; done'
)
# alice's jobs that show the idle policy (their simulated GPUs replay idle profiles: agent/profiles.py).
IDLE_JOBS: list[dict] = [
    {
        "name": "idle-batch",
        "kind": "batch",
        "gpus": 4,
        "node_selector": {"demo": "idle"},  # all of t4-04
        "checkpoint_seconds": 60,
        "env": {"TESSERA_UTIL_PROFILE": "idle"},
        "command": ["sh", "-c", CHECKPOINTING],
    },
    {
        "name": "idle-elastic",
        "kind": "training",
        "gpus": 2,
        "replicas": 2,
        "elastic": {"min_gpus": 1, "max_gpus": 2},
        "env": {"TESSERA_UTIL_PROFILE": "half-idle-after-0"},
        "command": ["sleep", "86400"],
    },
    {
        "name": "idle-service",
        "kind": "inference",
        "gpus": 1,
        "env": {"TESSERA_UTIL_PROFILE": "idle"},
        "command": ["sleep", "86400"],
    },
    {  # waits for t4-04, which idle-batch holds: the pass requeues an idle job only for a taker
        "name": "wants-gpu",
        "kind": "batch",
        "gpus": 1,
        "node_selector": {"demo": "idle"},
        "env": {"TESSERA_UTIL_PROFILE": "busy"},
        "command": ["sleep", "86400"],
    },
]
# The demo is the embedded default: these would switch parts to real services it does not start.
SERVICE_VARS = ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_URL")
GPU_NODE = "gpu-local"  # --gpu: the node of this machine's real GPUs
STOP_GRACE_S = 8.0
# Files this launcher and its web, migrate and seed steps create are the user's alone; agents keep
# the usual umask, since their job folders must be reachable by the jobs' own users.
PRIVATE_UMASK = 0o077
AGENT_UMASK = 0o022


def log(message: str) -> None:
    print(f"[demo] {message}", flush=True)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    reported_exit: bool = False


@dataclass
class Demo:
    """What the launcher started, so that it can stop exactly that."""

    children: list[Child] = field(default_factory=list)
    stopping: bool = False

    # --- starting -------------------------------------------------------------------------
    def spawn(
        self, name: str, argv: list[str], env: dict[str, str], log_dir: Path, umask: int = PRIVATE_UMASK
    ) -> Child:
        log_path = log_dir / f"{name}.log"
        with private_file(log_path, append=True) as out:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: we stop it whole
                umask=umask,
            )
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    # --- stopping -------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM agents, then the web process; SIGKILL what outlives the grace; reap all."""
        if self.stopping:
            return
        self.stopping = True
        tree = descendants([c.proc.pid for c in self.children])
        agents = [c for c in self.children if c.name != "web"]
        web = [c for c in self.children if c.name == "web"]
        for group in (agents, web):
            for child in group:
                signal_group(child.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for child in group:
                try:
                    child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log(f"{child.name} did not stop within {STOP_GRACE_S:g}s: killing it")
                    signal_group(child.proc.pid, signal.SIGKILL)
                    child.proc.wait()
        # Job processes run in their own sessions; anything of ours still alive goes now.
        for pid, started in tree.items():
            if start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def private_file(path: Path, append: bool = False):
    """``path`` opened for writing, readable by this user only (0600, even if it existed)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab" if append else "wb")


def private_dir(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    return path


def make_private(db: Path) -> None:
    """The SQLite database and its side files: 0600, whoever made them first."""
    for side in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            Path(f"{db}{side}").chmod(0o600)


def signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # start_new_session made the child its group's leader


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (pids are reused; this is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]) if fields[0] != "Z" else None


def descendants(roots: list[int]) -> dict[int, int]:
    """Every live process below ``roots`` (and the roots), as pid → start time."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found: dict[int, int] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        started = start_time(pid)
        if started is None or pid in found:
            continue
        found[pid] = started
        todo.extend(parents.get(pid, []))
    return found


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except (urllib.error.URLError, OSError):
        return False


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_step(name: str, argv: list[str], env: dict[str, str], log_dir: Path, secret: bool = False) -> str:
    """Run one setup command to completion; its output goes to a log, and on failure to the screen.

    ``secret``: its standard output holds credentials, so the log gets only its standard error.
    """
    result = subprocess.run(
        argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, umask=PRIVATE_UMASK
    )
    kept = "(standard output not kept: it holds credentials)\n" if secret else result.stdout
    with private_file(log_dir / f"{name}.log") as out:
        out.write((kept + result.stderr).encode())
    if result.returncode != 0:
        sys.exit(f"[demo] {name} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def agent_flags(python: str, env: dict[str, str]) -> list[str] | None:
    """Which optional flags this agent build takes (it is developed alongside this script)."""
    try:
        result = subprocess.run(
            [python, "-m", "agent", "--help"],
            cwd=ROOT,
            env=env,
            timeout=60,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None
    if result.returncode != 0:
        return None
    wanted = ("--name", "--metrics-port", "--metrics-addr", "--state-dir", "--single-tenant")
    return [flag for flag in wanted if flag in result.stdout]


def traversable_by_all(path: Path) -> bool:
    """Whether every directory above ``path`` lets other users through (o+x).

    As root, the agent runs each job as a uid of its own, which must reach the job directories.
    """
    return all(p.stat().st_mode & 0o001 for p in path.resolve().parents if p.exists())


def child_env(db: str | None) -> dict[str, str]:
    env = dict(os.environ)
    ignored = [name for name in SERVICE_VARS if env.pop(name, "")]
    if ignored:
        log(
            f"ignoring {', '.join(ignored)}: the demo runs on the embedded default "
            "(docker-compose.yml runs the full stack)"
        )
    if db:
        env["DATABASE_URL"] = "sqlite://" + str(Path(db).resolve())
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TESSERA_JOIN_TOKEN", None)
    return env


def banner(base: str, seed: dict, ready_s: float, agents: int, log_dir: Path, gpu: bool = False) -> str:
    users = seed["users"]
    alice = next((u for u in users if u["username"] == "alice"), users[0])
    width = max(len(u["username"]) for u in users)
    rows = []
    for u in users:
        role = "operator" if u["operator"] else f"tenant {u['tenant']}"
        rows.append(f"  {u['username']:<{width}}  {role:<15}  password {u['password']}  token {u['token']}")
    body = json.dumps(
        {"name": "hello", "kind": "batch", "command": ["python", "-c", "print(42)"], "gpus": 1},
        separators=(",", ":"),
    )
    return "\n".join(
        [
            "",
            f"Tessera demo is up in {ready_s:.1f}s: web + scheduler, {agents} simulated agents "
            f"(racks r1 H100, r2 A100, r3 T4)"
            + (f", and node {GPU_NODE} with this machine's real GPUs." if gpu else "."),
            "",
            f"  Dashboard  {base}/",
            f"  API        {base}/api/v1/        (docs: {base}/api/docs/)",
            f"  Admin      {base}/admin/",
            f"  Metrics    {base}/metrics",
            "",
            "Users (fresh passwords and tokens every run):",
            *rows,
            "",
            "Try it (as alice): submit a job, then watch it reach 'succeeded' and read its output:",
            f"  export TOKEN={alice['token']}",
            f"  curl -s -H \"Authorization: Token $TOKEN\" -H 'Content-Type: application/json' "
            f"-d {shlex.quote(body)} {base}/api/v1/jobs/",
            "  export ID=<the id it returned>",
            f'  curl -s -H "Authorization: Token $TOKEN" {base}/api/v1/jobs/$ID/',
            f'  curl -s -H "Authorization: Token $TOKEN" {base}/api/v1/jobs/$ID/logs/',
            "",
            f"Logs: {log_dir.relative_to(ROOT) if log_dir.is_relative_to(ROOT) else log_dir}/. "
            "Press Ctrl-C to stop everything.",
            "",
        ]
    )


IDLE_BANNER = """The idle policy at work (short windows here: warned at 2 and 4 minutes idle, acted on at 6).
alice's jobs idle-batch, idle-elastic and idle-service replay idle GPU profiles; within 10 minutes:
  idle-batch    two idle-warning events, then idle-reclaim: asked to checkpoint now, requeued
                from that checkpoint; wants-gpu, waiting for its node, starts there
  idle-elastic  one GPU of two idle: warned twice, then shrunk to its busy GPU (idle-reclaim,
                then resized once the idle replica has exited)
  idle-service  not preemptible: warned twice, never touched
See them on alice's job pages ({base}/jobs/), the dashboard's idle GPUs, or
  curl -s -H "Authorization: Token $TOKEN" {base}/api/v1/jobs/$ID/events/
"""


def submit_idle_jobs(base: str, seed: dict, wait_s: float = 180.0) -> None:
    """Submit alice's idle-policy jobs (they wait in the queue until the agents register).

    idle-batch goes first, and the others only once it holds its node (or after ``wait_s``):
    submitted together, idle-elastic and idle-service (which may run anywhere) started on t4-04
    whenever its agent was among the first to register, and idle-batch, which needs all of
    t4-04, waited behind them for good: none of the story the README tells."""
    alice = next((u for u in seed["users"] if u["username"] == "alice"), None)
    if alice is None:
        return
    headers = {"Authorization": f"Token {alice['token']}", "Content-Type": "application/json"}
    first, *rest = IDLE_JOBS
    try:
        job = call(
            urllib.request.Request(f"{base}/api/v1/jobs/", data=json.dumps(first).encode(), headers=headers)
        )
        deadline = time.monotonic() + wait_s
        while job.get("state") == "pending" and (left := deadline - time.monotonic()) > 0:
            wait = max(1, min(25, int(left)))  # a long-poll: answers when the job's state changes
            job = call(
                urllib.request.Request(f"{base}/api/v1/jobs/{job['id']}/?wait={wait}", headers=headers)
            )
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        log(f"could not submit the demo job {first['name']}: {exc}")
    for body in rest:
        try:
            call(
                urllib.request.Request(
                    f"{base}/api/v1/jobs/", data=json.dumps(body).encode(), headers=headers
                )
            )
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log(f"could not submit the demo job {body['name']}: {exc}")


def call(request: urllib.request.Request) -> dict:
    with urllib.request.urlopen(request, timeout=40) as response:
        return json.loads(response.read())


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 8000))
    parser.add_argument("--db", help="SQLite file (default var/tessera.sqlite3)")
    parser.add_argument("--agents", type=int, default=len(NODES), help="how many of the 12 nodes")
    parser.add_argument("--log-dir", default=str(ROOT / "var" / "demo-logs"))
    parser.add_argument(
        "--state-dir",
        default=str(ROOT / "var" / "agents"),
        help="the agents' state (credentials, job directories), one folder each",
    )
    parser.add_argument(
        "--credentials-file",
        help="also write the users' credentials and the join token here (JSON, mode 0600)",
    )
    parser.add_argument("--ready-timeout", type=float, default=90.0)
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="also start an agent on this machine's real NVIDIA GPUs (node 'gpu-local')",
    )
    parser.add_argument(
        "--no-idle-jobs",
        action="store_true",
        help="do not submit alice's jobs that show the idle policy (idle-batch, idle-elastic, idle-service)",
    )
    args = parser.parse_args(argv)

    python = sys.executable
    os.umask(PRIVATE_UMASK)
    # var/ holds the agents' folders, which job users must reach: traversable, not listable.
    private_dir(ROOT / "var", 0o711)
    log_dir = private_dir(Path(args.log_dir))
    for old in log_dir.glob("*.log"):
        old.chmod(0o600)  # logs of a run before these rules
    if not port_is_free(args.host, args.port):
        sys.exit(
            f"[demo] port {args.port} on {args.host} is in use: stop what holds it, "
            f"or run PORT=8001 make demo"
        )
    env = child_env(args.db)
    base = f"http://{args.host}:{args.port}"

    log("migrating the embedded database")
    run_step("migrate", [python, "manage.py", "migrate", "--noinput"], env, log_dir)
    make_private(Path(args.db) if args.db else ROOT / "var" / "tessera.sqlite3")
    log("seeding tenants, quotas and users")
    # The join token registers the demo's nodes and no others (a leaked one adds no fake nodes).
    names = [name for name, _ in NODES[: max(0, args.agents)]] + ([GPU_NODE] if args.gpu else [])
    seed_argv = [python, "manage.py", "seed_demo", "--json", "--join-token-names", ",".join(names)]
    seed_argv += ["--join-token-nodes", str(max(1, len(names)))]
    seed = json.loads(run_step("seed_demo", seed_argv, env, log_dir, secret=True))

    demo = Demo()
    stop_requested: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop_requested.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        return run(demo, args, python, env, base, seed, log_dir, started, stop_requested)
    finally:
        log("stopping everything it started")
        demo.stop()
        log("stopped")


def run(
    demo: Demo,
    args: argparse.Namespace,
    python: str,
    env: dict[str, str],
    base: str,
    seed: dict,
    log_dir: Path,
    started: float,
    stop_requested: list[int],
) -> int:
    daphne = Path(python).with_name("daphne")
    server = [str(daphne)] if daphne.exists() else [python, "-m", "daphne"]
    # The embedded default runs the scheduling pass inside the web process; say so explicitly,
    # since the settings turn that loop off by default under pytest (which may launch this demo).
    web_env = {**DEMO_IDLE_POLICY, **env, "PORT": str(args.port), "TESSERA_PASS_LOOP": "1"}
    log(f"starting the web process on {base}")
    web = demo.spawn(
        "web",
        [*server, "-b", args.host, "-p", str(args.port), "controlplane.asgi:application"],
        web_env,
        log_dir,
    )
    deadline = time.monotonic() + args.ready_timeout
    while not answers(f"{base}/metrics"):
        if stop_requested:
            return 0
        if web.proc.poll() is not None:
            log(f"the web process exited ({web.proc.returncode}):\n{tail(web.log_path)}")
            return 1
        if time.monotonic() > deadline:
            log(f"the web process did not answer within {args.ready_timeout:g}s:\n{tail(web.log_path)}")
            return 1
        time.sleep(0.2)

    nodes: list[tuple[str, str | None]] = list(NODES[: max(0, args.agents)])
    if args.gpu:
        nodes.append((GPU_NODE, None))
    flags = agent_flags(python, env) if nodes else []
    if flags is None:
        log("the node agent (python -m agent) is not available: running without agents")
        nodes = []
    agent_env = {**env, "TESSERA_JOIN_TOKEN": seed["join_token"]}  # never in argv, so never in ps
    flags = flags or []
    state_root = Path(args.state_dir).resolve()
    # As root, jobs run as uids of their own, which must reach the job directories; where this
    # checkout is private, the agent's own default (/var/lib/tessera-agent/NAME) is used instead.
    use_state_dir = "--state-dir" in flags and (os.geteuid() != 0 or traversable_by_all(state_root))
    if use_state_dir:
        private_dir(state_root, 0o711)  # jobs reach their agent's folder, never list the agents
    for name, spec in nodes:
        argv = [python, "-m", "agent", "--server", base]
        if spec is not None:
            argv += ["--simulate", spec]
        if "--name" in flags:
            argv += ["--name", name]
        if "--metrics-port" in flags and spec is not None:
            argv += ["--metrics-port", "0"]  # any free port: twelve agents share this host
        if "--metrics-addr" in flags:
            argv += ["--metrics-addr", args.host]  # not on every interface: this is a demo
        if use_state_dir:
            argv += ["--state-dir", str(state_root / name)]
        if "--single-tenant" in flags and os.geteuid() != 0:
            argv += ["--single-tenant"]  # a uid per job needs root: here all run as this user
        demo.spawn(name, argv, agent_env, log_dir, umask=AGENT_UMASK)
    if not args.no_idle_jobs:  # in the background: idle-batch's node may take a while to register
        wait_s = 180.0 if any(name == "t4-04" for name, _ in nodes) else 0.0  # else idle-batch never runs
        threading.Thread(
            target=submit_idle_jobs, args=(base, seed, wait_s), name="idle-jobs", daemon=True
        ).start()
    if args.credentials_file:
        with private_file(Path(args.credentials_file)) as out:
            out.write(
                json.dumps({"url": base, "users": seed["users"], "join_token": seed["join_token"]}).encode()
            )
    print(
        banner(base, seed, time.monotonic() - started, len(nodes) - args.gpu, log_dir, args.gpu), flush=True
    )
    if not args.no_idle_jobs:
        print(IDLE_BANNER.format(base=base), flush=True)

    while not stop_requested:
        if web.proc.poll() is not None:
            log(f"the web process exited ({web.proc.returncode}):\n{tail(web.log_path)}")
            return 1
        for child in demo.children:
            if child is not web and not child.reported_exit and child.proc.poll() is not None:
                child.reported_exit = True
                log(
                    f"agent {child.name} exited ({child.proc.returncode}); "
                    f"its log:\n{tail(child.log_path, 10)}"
                )
        time.sleep(0.3)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C during setup, before anything long-lived was started
        sys.exit(130)

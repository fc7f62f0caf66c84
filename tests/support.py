"""Helpers the test folders and the end-to-end benchmark share: free ports, missing services,
stopping a process, and launching a whole stack (web, Celery worker and beat, node agents) as
real processes — one launcher for ``tests/integration``, ``tests/chaos`` and
``scripts/bench_e2e.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
REQUIRE_SERVICES = os.environ.get("TESSERA_REQUIRE_SERVICES", "") in ("1", "true", "yes")


def need_service(what: str) -> None:
    """Skip (or, under TESSERA_REQUIRE_SERVICES=1 as CI runs, fail) because ``what`` is missing."""
    import pytest

    if REQUIRE_SERVICES:
        pytest.fail(f"{what} is required (TESSERA_REQUIRE_SERVICES=1) but not available")
    pytest.skip(f"{what} not available")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds; always reaped."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- A stack of real processes -----------------------------------------------------------------


class StackError(RuntimeError):
    """A process of the stack died, or something it should do did not happen in time."""


def database_url_of(settings: Any) -> str:
    """``DATABASE_URL`` for the database Django is using (e.g. the test database pytest made)."""
    db = settings.DATABASES["default"]
    auth = quote(db["USER"] or "postgres")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def stack_env(database_url: str, redis_url: str, **tessera: str) -> dict[str, str]:
    """The environment of a stack's server processes: this process's, without its own Tessera,
    Django and pytest settings, pointed at the given services, passes in the Celery worker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "DJANGO_", "PYTEST_"))}
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "TESSERA_EMBEDDED_PASSES": "0",
            "TESSERA_PASS_LOOP": "0",
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            **tessera,
        }
    )
    return env


def agent_env(env: dict[str, str], join_token: str) -> dict[str, str]:
    """An agent's environment: no database, no Redis; the join token (never on its argv)."""
    out = {k: v for k, v in env.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    out["TESSERA_JOIN_TOKEN"] = join_token
    return out


def worker_argv(name: str) -> list[str]:
    return [
        PY,
        "-m",
        "celery",
        "-A",
        "controlplane",
        "worker",
        "-P",
        "solo",
        "--without-mingle",
        "--without-gossip",
        "--without-heartbeat",
        "-n",
        f"{name}-{os.getpid()}@%h",
        "-l",
        "INFO",
    ]


def beat_argv(schedule: Path) -> list[str]:
    return [PY, "-m", "celery", "-A", "controlplane", "beat", "-l", "WARNING", "-s", str(schedule)]


def web_argv(port: int | None = None, fd: int | None = None) -> list[str]:
    """daphne on ``port``, or on an inherited listening socket ``fd`` (several share one port)."""
    where = ["--fd", str(fd)] if fd is not None else ["-b", "127.0.0.1", "-p", str(port)]
    return [PY, "-m", "daphne", *where, "controlplane.asgi:application"]


# A uid per job needs a root agent; as another user the tests run every job as that user.
SINGLE_TENANT = ["--single-tenant"] if os.geteuid() != 0 else []


def agent_argv(server: str, name: str, spec: str, state_dir: Path, *extra: str) -> list[str]:
    return [
        PY,
        "-m",
        "agent",
        "--server",
        server,
        "--simulate",
        spec,
        "--name",
        name,
        "--metrics-port",
        "0",
        "--metrics-addr",
        "127.0.0.1",
        "--state-dir",
        str(state_dir),
        *SINGLE_TENANT,
        *extra,
    ]


def web_answers(base: str) -> bool:
    """Whether the web process serves the API yet (an anonymous request answers 401)."""
    import requests

    try:
        return requests.get(base + "/api/v1/jobs/", timeout=2).status_code == 401
    except requests.RequestException:
        return False


class Processes:
    """Child processes in their own sessions, each logging to a file; all stopped by
    :meth:`stop_all` (agents first, with SIGINT, so they stop their jobs)."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.children: dict[str, subprocess.Popen] = {}

    def start(
        self, name: str, argv: list[str], env: dict[str, str], pass_fds: Iterable[int] = ()
    ) -> subprocess.Popen:
        """Start ``name`` (again, after a kill: a new log file, so old output is not read as new)."""
        with open(self.log_dir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=tuple(pass_fds),
            )
        self.children[name] = proc
        return proc

    def output(self, name: str, since: dict[str, int] | None = None) -> str:
        """``name``'s output, from where it was at ``since`` (a :meth:`marks`) on."""
        with open(self.log_dir / f"{name}.log", "rb") as log:
            log.seek((since or {}).get(name, 0))
            return log.read().decode(errors="replace")

    def marks(self) -> dict[str, int]:
        """Where each child's output is now: what a test sharing the processes reads from."""
        return {name: (self.log_dir / f"{name}.log").stat().st_size for name in self.children}

    def stop(self, name: str) -> None:
        """Stop one child (an agent with SIGINT, so it stops its jobs) and its process group."""
        proc = self.children.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT if name.startswith("agent") else signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)

    def dead(self) -> list[str]:
        return [n for n, p in self.children.items() if p.poll() is not None]

    def check_alive(self) -> None:
        for name in self.dead():
            code = self.children[name].returncode
            raise StackError(f"{name} exited with {code}:\n{self.output(name)[-3000:]}")

    def report(self, tail: int = 2500) -> str:
        return "\n".join(f"--- {name} ---\n{self.output(name)[-tail:]}" for name in self.children)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) each kind of child used so far: where the machine's time went."""
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for name, proc in self.children.items():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                key = "agents" if name.startswith("agent") else "web" if name.startswith("web") else name
                out[key] = round(out.get(key, 0.0) + sum(int(f) for f in fields[11:15]) / tick, 1)
        return out

    def stop_all(self) -> None:
        for name in sorted(self.children, key=lambda n: not n.startswith("agent")):
            proc = self.children[name]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGINT if name.startswith("agent") else signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self.children.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: whatever a child left behind
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def wait_until(what: str, check: Callable[[], Any], procs: Processes, deadline: float) -> Any:
    """Poll ``check`` until it returns something true (returned) or ``deadline`` (monotonic) passes
    (:class:`StackError`, with every process's log tail); a dead child fails at once."""
    while time.monotonic() < deadline:
        procs.check_alive()
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise StackError(f"timed out waiting for {what}\n{procs.report()}")


def start_servers(
    procs: Processes, env: dict[str, str], name: str, deadline: float, beat: bool = False
) -> str:
    """A Celery worker (which runs the passes), optionally Celery beat, and daphne on a free
    port; the web server's base URL once both answer."""
    port = free_port()
    procs.start("worker", worker_argv(name), env)
    if beat:
        procs.start("beat", beat_argv(procs.log_dir / "beat-schedule"), env)
    procs.start("web", web_argv(port=port), env)
    wait_until("the Celery worker", lambda: " ready." in procs.output("worker"), procs, deadline)
    base = f"http://127.0.0.1:{port}"
    wait_until("the web server", lambda: web_answers(base), procs, deadline)
    return base


class SharedServers:
    """A web server and a Celery worker (and beat) that several tests share, each test starting
    the agents it needs (``start_agent``) on the rows it made: a test database is emptied after
    each test, the node an agent registered with it, so agents do not outlive their test.

    Nothing in the servers outlives a test's rows: they hold no rows in memory between requests
    (tokens are looked up by their hash; new users and jobs get new ids)."""

    def __init__(self, work: Path, env: dict[str, str], name: str, beat: bool = False, timeout: float = 60):
        self.work, self.env, self.procs = work, env, Processes(work)
        self.agents = 0
        try:
            self.base = start_servers(self.procs, env, name, time.monotonic() + timeout, beat=beat)
        except BaseException:
            self.procs.stop_all()
            raise

    def start_agent(
        self, name: str, spec: str, join_token: str, *extra: str, state_dir: Path | None = None
    ) -> str:
        """Start agent ``name`` with a fresh state directory; its key in ``procs``."""
        self.agents += 1
        key = f"agent-{name}-{self.agents}"
        state = state_dir or self.work / key
        argv = agent_argv(self.base, name, spec, state, *extra)
        self.procs.start(key, argv, agent_env(self.env, join_token))
        return key

    def stop_agents(self) -> None:
        for key in [k for k in self.procs.children if k.startswith("agent")]:
            self.procs.stop(key)


class RedisServer:
    """A redis-server of a test's own, on a free port, without persistence: it may stop and
    restart it without touching anyone else's Redis."""

    def __init__(self, work: Path):
        self.port = free_port()
        self.work = work
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.work),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)

"""Fixtures for the monitoring tests: a real Prometheus server, a real agent, short idle-policy
windows, and alice's idle jobs for the adjustment pass's end-to-end tests.

A missing tool skips its test, or fails it under ``TESSERA_REQUIRE_SERVICES=1`` (CI), through
``tests.support.need_service``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.monitoring.agents import poll, running_agent
from tests.support import free_port, need_service

PROMETHEUS = "/usr/bin/prometheus"


# The control plane's /metrics runs its aggregate queries at scrape time, in the test's own live
# server: on a loaded machine one scrape may take over a second, so it gets longer than the agents.
SLOW_TARGETS = {"tessera": "3s"}


def scrape_config(targets: dict[str, str]) -> str:
    """A Prometheus config scraping each ``name: host:port[/path]`` every second (the control
    plane's /metrics every 3 s, each scrape allowed as long)."""
    lines = ["global:", "  scrape_interval: 1s", "  evaluation_interval: 1s", "scrape_configs:"]
    for name, target in targets.items():
        address, _, path = target.partition("/")
        every = SLOW_TARGETS.get(name, "1s")
        lines += [
            f"  - job_name: {name}",
            f"    scrape_interval: {every}",
            f"    scrape_timeout: {every}",
            f"    metrics_path: /{path or 'metrics'}",
            "    static_configs:",
            f"      - targets: ['{address}']",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], str]]:
    """Start a real Prometheus scraping the given targets; returns its URL. Stopped afterwards,
    or by the test calling ``prometheus.stop()``."""
    binary = PROMETHEUS if Path(PROMETHEUS).exists() else shutil.which("prometheus")
    if binary is None:
        need_service("Prometheus (apt-get install prometheus)")
    started: list[subprocess.Popen[bytes]] = []

    def start(targets: dict[str, str], more_jobs: str = "") -> str:
        """``more_jobs``: scrape jobs of its own, YAML appended under ``scrape_configs``."""
        config = tmp_path / "prometheus.yml"
        config.write_text(scrape_config(targets) + more_jobs)
        port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - the process holds it
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(url + "/-/ready", timeout=1).status_code == 200:
                    return url
            except requests.RequestException:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Prometheus was not ready within 20 s"
            time.sleep(0.1)

    def stop() -> None:
        for proc in started:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    start.stop = stop  # type: ignore[attr-defined]  # a test may stop it mid-way (an outage)
    yield start
    stop()


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    """The test world hashes four passwords per test; the production hasher is slow on purpose."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def metrics_source(settings: Any) -> None:
    """Where the adjustment pass reads utilisation, set before the agent starts: Prometheus (a
    test sets ``PROMETHEUS_URL`` once its server scrapes the agent); a module overrides it."""


@pytest.fixture
def agent(live_server: Any, tmp_path: Path, metrics_source: None) -> Iterator[dict[str, Any]]:
    """A real agent with four simulated GPUs, registered with the live server; stopped after."""
    with running_agent(live_server.url, tmp_path, gpus=4) as agent:
        yield agent


@pytest.fixture
def short_windows(settings: Any) -> None:
    """The idle policy in seconds: a 2 s step, warnings at 6 and 12 s, action at 18 s."""
    settings.TESSERA = {
        **settings.TESSERA,
        "IDLE_STEP_S": 2.0,
        "IDLE_EXEMPT_S": 2.0,
        "IDLE_WARN_S": [6.0, 12.0],
        "IDLE_ACT_S": 18.0,
    }


IDLE = {"TESSERA_UTIL_PROFILE": "idle"}
# Writes a checkpoint, then on the agent's "checkpoint now" signal writes another and exits.
CHECKPOINTING = (
    "trap 'echo now >> \"$TESSERA_CHECKPOINT_MARKER\"; exit 0' USR1; "
    'echo step-1 > "$TESSERA_CHECKPOINT_MARKER"; while :; do sleep 0.2; done'
)


@dataclass
class IdleJobs:
    """alice's jobs on the agent's four GPUs, as the API shows them: an elastic one (two
    one-GPU replicas, the second idle), a preemptible batch job idle from the start that
    checkpoints on "checkpoint now", a service (not preemptible) idle from the start; and two
    busy jobs waiting for a GPU (the pass requeues an idle job only when something waiting could
    use its GPUs: the second still waits if the shrink's GPU went to the first)."""

    world: Any
    elastic: int = 0
    batch: int = 0
    service: int = 0
    waiting: int = 0
    waiting_too: int = 0

    def submit(self, **body: Any) -> int:
        body = {"name": "idle", "command": ["sleep", "600"], **body}
        response = self.world.client("alice").post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, response.content
        return int(response.json()["id"])

    def events(self, job_id: int) -> list[dict[str, Any]]:
        body = self.world.client("alice").get(f"/api/v1/jobs/{job_id}/events/").json()
        return body["results"] if isinstance(body, dict) else body

    def types(self, job_id: int) -> list[str]:
        """The job's adjustment events, oldest first."""
        return [e["type"] for e in self.events(job_id) if e["type"].startswith("idle-")]

    def of_type(self, job_id: int, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events(job_id) if e["type"] == kind]

    def story(self, job_id: int) -> str:
        """The job's events and its output with the agent's notes, for a failure's message."""
        log = self.world.client("alice").get(f"/api/v1/jobs/{job_id}/logs/").json()
        events = "\n".join(f"{e['at']} {e['type']}: {e['reason']}" for e in self.events(job_id))
        return f"events:\n{events}\noutput:\n{log.get('data', log)}"

    def settle(self) -> None:
        """Run the adjustment pass, and the scheduling pass after it, once a second until the
        batch job is requeued, the elastic job's shrink done and the waiting job placed."""
        from monitoring.adjust import adjust_once
        from scheduling.models import Job
        from scheduling.services.passes import run_pass

        def done() -> bool:
            result = adjust_once()
            assert result.metrics_ok, result.problem
            run_pass()
            return (
                bool(self.of_type(self.batch, "requeued"))
                and bool(self.of_type(self.elastic, "resized"))
                and Job.objects.get(pk=self.waiting).state == "running"
            )

        poll("two warnings, then a requeue and a shrink, and the freed GPUs used", done, 90, 1.0)

    def assert_acted_on(self, node: str) -> None:
        """What the pass did, each event with its inputs (``node``: the agent's)."""
        from scheduling.models import Allocation, Job

        # The batch job: warned twice, then asked to checkpoint now and requeued from that.
        assert self.types(self.batch)[:3] == ["idle-warning", "idle-warning", "idle-reclaim"]
        reclaim = self.of_type(self.batch, "idle-reclaim")[0]
        assert reclaim["details"]["action"] == "requeue" and reclaim["details"]["applied"] is True
        (gpu,) = reclaim["details"]["gpus"]
        assert gpu["gpu"].startswith(f"{node}/")
        assert gpu["idle_s"] >= 18 and gpu["max_util"] < 0.05 and gpu["points"] >= 9
        after = [e for e in self.events(self.batch) if e["at"] >= reclaim["at"]]
        checkpoints = [e["reason"] for e in after if e["type"] == "checkpointed"]
        assert checkpoints[:1] == ["now"], self.story(self.batch)
        requeued = [e for e in after if e["type"] == "requeued"][0]["reason"]
        assert requeued == "from its last checkpoint if its next nodes can reach it, else from the start"

        # The elastic job: warned twice, then shrunk to its busy GPU; the idle one given back.
        assert self.types(self.elastic)[:3] == ["idle-warning", "idle-warning", "idle-reclaim"]
        shrink = self.of_type(self.elastic, "idle-reclaim")[0]["details"]
        assert shrink["action"] == "shrink" and shrink["applied"] is True and shrink["to_gpus"] == 1
        assert len(shrink["release"]) == 1 and shrink["removed"] == shrink["release"]
        (busy,) = [g for g in shrink["gpus"] if g["gpu"] not in shrink["release"]]
        (idle,) = [g for g in shrink["gpus"] if g["gpu"] in shrink["release"]]
        assert busy["max_util"] > 0.5 and idle["idle_s"] >= 18 and idle["max_util"] < 0.05
        (resized,) = self.of_type(self.elastic, "resized")
        assert resized["reason"] == "shrunk from 2 to 1 replicas"
        assert resized["details"]["inputs"]["gpus"] == shrink["gpus"]
        held = Allocation.objects.filter(job_id=self.elastic, released_at__isnull=True)
        assert Job.objects.get(pk=self.elastic).state == "running" and held.count() == 1

        # The service: warned twice, never touched.
        assert self.types(self.service) == ["idle-warning", "idle-warning"]
        assert Job.objects.get(pk=self.service).state == "running"


@pytest.fixture
def idle_jobs(world: Any, agent: dict[str, Any], short_windows: None) -> IdleJobs:
    """:class:`IdleJobs`, the first three running on the agent, the last two pending."""
    from scheduling.models import Job
    from scheduling.services.passes import run_pass

    jobs = IdleJobs(world)
    jobs.elastic = jobs.submit(
        kind="training",
        gpus=2,
        replicas=2,
        elastic={"min_gpus": 1, "max_gpus": 2},
        env={"TESSERA_UTIL_PROFILE": "half-idle-after-0"},
    )
    jobs.batch = jobs.submit(
        kind="batch", gpus=1, env=IDLE, checkpoint_seconds=60, command=["sh", "-c", CHECKPOINTING]
    )
    jobs.service = jobs.submit(kind="inference", gpus=1, env=IDLE)
    run_pass()
    ids = (jobs.elastic, jobs.batch, jobs.service)
    poll(
        "the agent starting the jobs",
        lambda: Job.objects.filter(pk__in=ids, state="running").count() == 3,
        timeout_s=30,
    )
    jobs.waiting = jobs.submit(kind="batch", gpus=1, env={"TESSERA_UTIL_PROFILE": "busy"})
    jobs.waiting_too = jobs.submit(kind="batch", gpus=1, env={"TESSERA_UTIL_PROFILE": "busy"})
    run_pass()
    waiting = Job.objects.filter(pk__in=(jobs.waiting, jobs.waiting_too), state="pending")
    assert waiting.count() == 2  # every GPU is taken
    return jobs

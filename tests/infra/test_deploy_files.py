"""The deployment files: docker-compose.yml and deploy/prometheus.yml are valid and agree.

Validated by the real tools (Debian's docker-compose 1.29 and Prometheus's promtool). Without them
these tests skip — unless TESSERA_REQUIRE_SERVICES=1 (CI), where a missing tool is a failure.
"""

from __future__ import annotations

import functools
import os
import subprocess

import pytest
import yaml

from tests.infra.helpers import COMPOSE, ROOT, SECRETS, agent_services, tool

PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
STACK = {"postgres", "redis", "web", "worker", "beat", "prometheus"}
APP_SERVICES = ("web", "worker", "beat")


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SECRETS} if env is None else env
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env
    )


@functools.cache
def _resolved_compose() -> str:
    result = run(tool("docker-compose"), "-f", str(COMPOSE), "config")
    assert result.returncode == 0, result.stderr
    return result.stdout


def compose_config() -> dict:
    """The file as docker-compose resolves it (anchors merged, variables filled in)."""
    return yaml.safe_load(_resolved_compose())


def test_docker_compose_accepts_the_compose_file():
    result = run(tool("docker-compose"), "-f", str(COMPOSE), "config", "-q")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_docker_compose_refuses_to_start_without_each_real_secret(missing):
    env = {k: v for k, v in {**os.environ, **SECRETS}.items() if k != missing}
    result = run(tool("docker-compose"), "-f", str(COMPOSE), "config", "-q", env=env)
    assert result.returncode != 0 and missing in result.stderr


def test_published_ports_listen_on_127_0_0_1_unless_told_otherwise():
    published = [p for svc in compose_config()["services"].values() for p in svc.get("ports", [])]
    assert published and all(str(p).startswith("127.0.0.1:") for p in published), published
    wide = run(
        tool("docker-compose"),
        "-f",
        str(COMPOSE),
        "config",
        env={**os.environ, **SECRETS, "TESSERA_BIND": "0.0.0.0"},
    )
    assert "0.0.0.0:8000:8000" in wide.stdout


def test_docker_compose_would_reject_an_unknown_key(tmp_path):
    # The check above must be able to fail: a misspelt key is refused.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("  worker:\n", "  worker:\n    comand: nope\n", 1))
    result = run(tool("docker-compose"), "-f", str(broken), "--project-directory", str(ROOT), "config", "-q")
    assert result.returncode != 0
    assert "comand" in result.stderr


def test_the_stack_has_every_process_and_two_simulated_agents():
    config = compose_config()
    assert set(config["services"]) >= STACK
    agents = agent_services(config)
    assert len(agents) >= 2
    for svc in agents.values():
        assert "--simulate" in svc["command"] and "--server" in svc["command"]


def test_app_services_point_at_the_real_services_in_production_mode():
    config = compose_config()
    services = config["services"]
    for name in APP_SERVICES:
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://"), name
        assert env["REDIS_URL"].startswith("redis://"), name
        assert env["PROMETHEUS_URL"].startswith("http://"), name
        assert env["TESSERA_DEBUG"] == "0", name
        assert env["TESSERA_SECRET_KEY"] and env["TESSERA_ALLOWED_HOSTS"], name


def test_agents_get_the_join_token_from_the_environment_not_argv():
    for name, svc in agent_services(compose_config()).items():
        assert svc["environment"].get("TESSERA_JOIN_TOKEN"), name
        assert not any("join-token" in str(arg) for arg in svc["command"]), name


def test_only_web_and_the_agents_see_the_join_token_and_agents_see_no_database():
    config = compose_config()
    agents = agent_services(config)
    for name, svc in config["services"].items():
        env = svc.get("environment") or {}
        assert ("TESSERA_JOIN_TOKEN" in env) == (name == "web" or name in agents), name
        if name in agents:
            assert not {"DATABASE_URL", "REDIS_URL", "TESSERA_SECRET_KEY"} & set(env), name


def test_beat_keeps_its_schedule_in_a_writable_file():
    command = compose_config()["services"]["beat"]["command"]
    assert "beat" in command and "-s" in command
    assert command[command.index("-s") + 1].startswith("/tmp/")


def test_promtool_accepts_the_prometheus_config():
    result = run(tool("promtool"), "check", "config", str(PROMETHEUS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_alert_rules_and_they_fire_when_their_tests_say():
    rules = PROMETHEUS.parent / "alerts.yml"
    checked = run(tool("promtool"), "check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = run(tool("promtool"), "test", "rules", str(PROMETHEUS.parent / "alerts_test.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_tessera_metric_an_alert_reads_is_one_docs_metrics_lists():
    """promtool checks the rules' syntax, not their names: an alert on a misspelt or removed
    metric never fires. Every one of them reads a metric the web exports (docs/metrics.md's
    table; tests/monitoring/test_metrics.py holds the exporter to its rows)."""
    import re

    documented = set(re.findall(r"^\| `(tessera_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text(), re.M))
    documented |= set(re.findall(r"`, `(tessera_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    rules = yaml.safe_load((PROMETHEUS.parent / "alerts.yml").read_text())["groups"][0]["rules"]
    read = {name for rule in rules for name in re.findall(r"\b(tessera_[a-z_]+)", rule["expr"])}
    assert read and read <= documented, read - documented


def test_compose_mounts_the_alert_rules_the_prometheus_config_loads():
    assert yaml.safe_load(PROMETHEUS.read_text())["rule_files"] == ["alerts.yml"]
    volumes = compose_config()["services"]["prometheus"]["volumes"]
    mounted = [v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in volumes]
    assert any(
        m.endswith("/etc/prometheus/alerts.yml") or ":/etc/prometheus/alerts.yml" in m for m in mounted
    )


def test_promtool_would_reject_a_broken_config(tmp_path):
    broken = tmp_path / "prometheus.yml"
    broken.write_text(PROMETHEUS.read_text().replace("scrape_interval: 5s", "scrape_interval: soon"))
    result = run(tool("promtool"), "check", "config", str(broken))
    assert result.returncode != 0


def test_prometheus_scrapes_the_web_metrics_and_every_agent_service():
    config = compose_config()
    scrape = yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    targets = {t for job in scrape for group in job.get("static_configs", []) for t in group["targets"]}
    web_jobs = [job for job in scrape if any("web:8000" in g["targets"] for g in job["static_configs"])]
    assert web_jobs and web_jobs[0].get("metrics_path", "/metrics") == "/metrics"
    for name, svc in agent_services(config).items():
        port = svc["command"][svc["command"].index("--metrics-port") + 1]
        assert f"{name}:{port}" in targets, f"Prometheus does not scrape agent {name}"


def test_the_image_is_python_311_slim_and_runs_as_an_unprivileged_user():
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    assert instructions[0] == "FROM python:3.11-slim"
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    # The build context leaves out the local virtualenv and databases.
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "var" in ignored and ".git" in ignored


def test_every_app_service_is_built_from_this_repository():
    services = compose_config()["services"]
    for name in (*APP_SERVICES, *agent_services(compose_config())):
        assert services[name]["build"]["context"] == str(ROOT), name

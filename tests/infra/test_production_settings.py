"""Production settings: ``manage.py check --deploy`` is clean with them, and ``TESSERA_TLS=1`` turns
on what it asks for (HTTPS redirect, HSTS, secure cookies) while plain HTTP stays the default.

Each case runs in a process of its own, since settings are read from the environment at start.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_") and k != "DATABASE_URL"}
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        DATABASE_URL=f"sqlite://{tmp_path / 'db.sqlite3'}",
        TESSERA_DEBUG="0",
        TESSERA_TLS="1",
        TESSERA_TLS_PROXY="1",
        TESSERA_SECRET_KEY=secrets.token_urlsafe(50),
        TESSERA_ALLOWED_HOSTS="tessera.example.com",
        TESSERA_CSRF_TRUSTED_ORIGINS="https://tessera.example.com",
    )
    env.update(extra)
    return env


def deploy_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    result = deploy_check(production_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_fails_on_plain_http_settings(tmp_path):
    # The check above can fail: without TLS it names what is missing.
    result = deploy_check(production_env(tmp_path, TESSERA_TLS="0"))
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stdout + result.stderr


PROBE = """
import django, json
django.setup()
from django.test import Client
plain = Client().get("/login/", HTTP_HOST="tessera.example.com")
https = Client().get("/login/", HTTP_HOST="tessera.example.com", HTTP_X_FORWARDED_PROTO="https")
agent = Client().post("/api/v1/agent/heartbeat", HTTP_HOST="tessera.example.com")
print(json.dumps({
    "plain": [plain.status_code, plain.get("Location", "")],
    "https": [https.status_code, https.get("Strict-Transport-Security", ""),
              https.cookies["csrftoken"]["secure"] if "csrftoken" in https.cookies else None,
              https.get("Content-Security-Policy", "")],
    "agent": agent.status_code,
}))
"""


def probe(env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_tls_redirects_to_https_and_sends_hsts_and_secure_cookies(tmp_path):
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=production_env(tmp_path),
        check=True,
        timeout=120,
    )
    seen = probe(production_env(tmp_path))
    assert seen["plain"] == [301, "https://tessera.example.com/login/"]
    status, hsts, secure_cookie, csp = seen["https"]
    assert status == 200 and "max-age=31536000" in hsts and "includeSubDomains" in hsts
    assert secure_cookie is True
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert seen["agent"] == 401  # the agents' API is not redirected: refused for its credential
    # Without a proxy said to set it, a client's own X-Forwarded-Proto is not believed.
    assert probe(production_env(tmp_path, TESSERA_TLS_PROXY="0"))["https"][0] == 301


def test_plain_http_is_the_default(tmp_path):
    env = production_env(tmp_path)
    del env["TESSERA_TLS"]
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
    )
    seen = probe(env)
    assert seen["plain"][0] == 200
    assert seen["https"][1] == "" and seen["https"][2] in (False, "")

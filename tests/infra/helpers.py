"""Helpers for the deployment tests: where the files are, the tools that check them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
REQUIRE = os.environ.get("TESSERA_REQUIRE_SERVICES", "") in ("1", "true", "yes")
# The secrets docker-compose.yml insists on (it has no defaults), as a deployer would set them.
SECRETS = {
    "TESSERA_SECRET_KEY": "test-secret-key-" + "k" * 40,
    "TESSERA_JOIN_TOKEN": "test-join-token-" + "j" * 24,
    "POSTGRES_PASSWORD": "test-postgres-password",
}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (apt-get install --no-install-recommends {name})"
        if REQUIRE:
            pytest.fail(f"{message}; required under TESSERA_REQUIRE_SERVICES=1")
        pytest.skip(message)
    return path


def agent_services(config: dict) -> dict[str, dict]:
    return {name: svc for name, svc in config["services"].items() if "agent" in (svc.get("command") or [])}

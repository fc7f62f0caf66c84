"""The agent says at its start when jobs may make user namespaces of their own."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent import sandbox


def sysctls(root: Path, values: dict[str, str]) -> Path:
    for name, value in values.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(value + "\n")
    return root


@pytest.mark.parametrize(
    ("values", "open_"),
    [
        ({"user/max_user_namespaces": "96553"}, True),
        ({}, True),  # nothing readable: a kernel that says nothing is taken as open
        ({"user/max_user_namespaces": "0"}, False),
        ({"user/max_user_namespaces": "96553", "kernel/unprivileged_userns_clone": "0"}, False),
        ({"user/max_user_namespaces": "96553", "kernel/unprivileged_userns_clone": "1"}, True),
        ({"user/max_user_namespaces": "96553", "kernel/apparmor_restrict_unprivileged_userns": "1"}, False),
    ],
)
def test_user_namespaces_are_open_unless_a_sysctl_closes_them(tmp_path, values, open_):
    assert sandbox.user_namespaces_open(sysctls(tmp_path, values)) is open_


def test_a_multi_tenant_agent_warns_when_jobs_may_make_user_namespaces(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "SYSCTL", sysctls(tmp_path / "open", {"user/max_user_namespaces": "5"}))
    with caplog.at_level(logging.WARNING, logger="tessera.agent"):
        sandbox.detect(enabled=True)
        warned = "user namespaces" in caplog.text
        caplog.clear()
        sandbox.detect(enabled=False)  # --single-tenant: nothing between jobs to guard
    assert warned and "user namespaces" not in caplog.text

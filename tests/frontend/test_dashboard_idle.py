"""Idle GPUs on the dashboard's map, in a real browser (Chromium, Playwright) against a real ASGI
server whose embedded adjustment loop reads a real agent's utilisation reports (no Prometheus).

alice runs a 2-GPU job on the agent's node whose second GPU idles while the first is busy
(profile ``half-idle-after-0``, one profile minute per second; idle policy in seconds). On her map
the idle GPU is marked by a shape (class ``idle``: dashed ring and "z"), not colour alone, and
both carry their utilisation band and words; the marks arrive as ``gpu.update`` deltas, and a
fresh snapshot shows the same. bob, another tenant, sees both GPUs only as "in use": no mark, no
utilisation. A screenshot goes to ``test-artifacts/dashboard-idle.png``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.frontend.browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    need_chromium,
    running_agent,
    running_server,
    sign_in,
    submit,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# The idle policy in seconds; no action within the test (it is about what the map shows).
IDLE_ENV = {
    "TESSERA_ADJUST_INTERVAL_S": "1",
    "TESSERA_IDLE_STEP_S": "2",
    "TESSERA_IDLE_EXEMPT_S": "2",
    "TESSERA_IDLE_WARN_S": "6,600",
    "TESSERA_IDLE_ACT_S": "1200",
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with running_server(tmp_path, **IDLE_ENV) as server:
        yield server


@pytest.fixture
def agent(server: dict[str, Any], tmp_path: Path) -> Iterator[str]:
    with running_agent(server, tmp_path, "--util-speed", "60") as name:
        yield name


def test_alice_sees_her_idle_gpu_marked_and_bob_sees_only_in_use(server: dict[str, Any], agent: str) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            loaded_at = alice.evaluate("window.TESSERA.loadedAt")
            job_id = submit(
                server,
                "alice",
                name="alice-half-idle",
                gpus=2,
                accelerators=["L40S"],
                env={"TESSERA_UTIL_PROFILE": "half-idle-after-0"},
            )
            mine = f".cell.mine[data-jobs~='{job_id}']"
            alice.wait_for_function(f'document.querySelectorAll("{mine}.idle").length === 1', timeout=30_000)
            cells = alice.eval_on_selector_all(
                mine, "cs => cs.map(c => [c.dataset.node, c.className, c.title])"
            )
            assert {node for node, _, _ in cells} == {agent} and len(cells) == 2
            (idle,) = [c for c in cells if " idle" in c[1]]
            (busy,) = [c for c in cells if " idle" not in c[1]]
            assert "util-0" in idle[1] and "utilisation " in idle[2] and idle[2].endswith(", idle")
            assert "util-0" not in busy[1] and "utilisation" in busy[2]
            # The mark is a shape, not colour alone: a dashed outline and a "z".
            looks = alice.eval_on_selector(
                f"{mine}.idle",
                "c => [getComputedStyle(c).outlineStyle, getComputedStyle(c, '::after').content]",
            )
            assert looks == ["dashed", '"z"']
            # Pushed (the page was loaded before the job was submitted), and what a fresh
            # snapshot shows too.
            assert alice.evaluate("window.TESSERA.loadedAt") == loaded_at
            assert alice.evaluate("window.TESSERA.deltas") > 0
            fresh = alice.evaluate("window.TESSERA.fetchNormalized()")
            rows = [d for n in fresh["nodes"] if n["name"] == agent for d in n["devices"]]
            assert sorted(bool(d.get("idle")) for d in rows if d["jobs"]) == [False, True]
            ARTIFACTS.mkdir(exist_ok=True)
            alice.screenshot(path=str(ARTIFACTS / "dashboard-idle.png"), full_page=True)

            bob = sign_in(browser, server, "bob")
            theirs = f".cell[data-node='{agent}'].in-use"
            bob.wait_for_function(f'document.querySelectorAll("{theirs}").length === 2', timeout=15_000)
            bob.wait_for_timeout(2_500)  # a few adjustment passes: still nothing of hers
            assert bob.eval_on_selector_all(f".cell[data-node='{agent}'].idle", "cs => cs.length") == 0
            titles = bob.eval_on_selector_all(theirs, "cs => cs.map(c => c.title)")
            assert all("utilisation" not in t and "idle" not in t for t in titles)
            fresh = bob.evaluate("window.TESSERA.fetchNormalized()")
            rows = [d for n in fresh["nodes"] if n["name"] == agent for d in n["devices"]]
            assert all("util" not in d and "idle" not in d for d in rows)
        finally:
            browser.close()

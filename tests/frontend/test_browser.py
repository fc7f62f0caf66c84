"""The dashboard in a real browser: Debian's headless Chromium, driven by Playwright, against a
real ASGI server (daphne, in a subprocess) with websockets and the embedded pass loop.

alice signs in and sees the cluster; bob's jobs show to her only as "in use". When she submits a
job, the pass binds it to the GPUs of a real agent's node and the agent starts it: her GPU cells
and her running list change on the open page — pushed over the websocket, with no reload. The
page's model after those deltas equals a fresh snapshot. bob, on his own page, sees her GPUs only
as "in use". A screenshot goes to ``test-artifacts/dashboard.png``.

The server runs on its own SQLite file (the embedded default), so it shares nothing with pytest's
test database and needs no other service.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.frontend.browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    need_chromium,
    sign_in,
    submit,
    wait_quiet,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_alice_sees_her_job_take_its_gpus_live_without_a_reload(server: dict[str, Any], agent: str) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    # bob is already using the cluster; one job of his cannot fit anywhere.
    bob_job = submit(server, "bob", name="bob-pretraining", gpus=8, accelerators=["H100"])
    submit(server, "bob", name="bob-notebook", gpus=0.5, kind="inference", accelerators=["T4"])
    submit(server, "bob", name="bob-too-big", gpus=64)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            alice.wait_for_function("document.querySelectorAll('.cell.in-use').length >= 8", timeout=15_000)
            # Nothing of bob's jobs but "in use": no ids, names or tenant on alice's page.
            html = alice.content()
            assert "bob-pretraining" not in html and "nlp" not in html and f"job {bob_job}" not in html
            alice.evaluate("window.__noReloadMarker = 'still here'")
            loaded_at = alice.evaluate("window.TESSERA.loadedAt")
            snapshots = alice.evaluate("window.TESSERA.snapshots")

            # The job runs for real on the agent's node: bound by the pass, started by the agent.
            job_id = submit(server, "alice", name="alice-resnet", gpus=4, accelerators=["L40S"])
            mine = f".cell.mine[data-jobs~='{job_id}']"
            alice.wait_for_function(f'document.querySelectorAll("{mine}").length === 4', timeout=15_000)
            cells = alice.eval_on_selector_all(
                mine, "cells => cells.map(c => [c.dataset.node, c.dataset.state, c.title])"
            )
            assert {node for node, _, _ in cells} == {agent}
            for _, state, title in cells:
                assert state == "allocated" and f"job {job_id} alice-resnet" in title
            running = f"#running li[data-job-id='{job_id}'][data-state='running']"
            alice.wait_for_selector(running, timeout=15_000)

            # Pushed, not reloaded: the page's own state survived, and no second snapshot was needed.
            assert alice.evaluate("window.__noReloadMarker") == "still here"
            assert alice.evaluate("window.TESSERA.loadedAt") == loaded_at
            assert alice.evaluate("window.TESSERA.snapshots") == snapshots
            assert alice.evaluate("window.TESSERA.deltas") > 0

            # Snapshot plus deltas equals a fresh snapshot (docs/websockets.md), in the page's own code.
            wait_quiet(alice)
            # The snapshot asked for while the page was parsed (a preload) is the one its script
            # took: each snapshot the page drew was asked for once.
            asked = (
                "performance.getEntriesByType('resource').filter(r => r.name.includes('state.json')).length"
            )
            assert alice.evaluate(asked) == alice.evaluate("window.TESSERA.snapshots")
            current = alice.evaluate("window.TESSERA.currentNormalized()")
            fresh = alice.evaluate("window.TESSERA.fetchNormalized()")
            assert current == fresh

            ARTIFACTS.mkdir(exist_ok=True)
            alice.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

            # bob sees alice's GPUs only as "in use", without her job's id or name.
            bob = sign_in(browser, server, "bob")
            bob.wait_for_function("document.querySelectorAll('.cell.in-use').length >= 4", timeout=10_000)
            titles = bob.eval_on_selector_all(
                f".cell[data-node='{agent}']", "cells => cells.map(c => c.className + ' ' + c.title)"
            )
            assert sum("in-use" in t for t in titles) == 4
            assert "alice-resnet" not in bob.content() and f"job {job_id}" not in bob.content()
            bob.screenshot(path=str(ARTIFACTS / "dashboard-bob.png"), full_page=True)
        finally:
            browser.close()

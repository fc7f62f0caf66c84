"""The dashboard's queue in a real browser (Debian's headless Chromium, Playwright, daphne over
its own SQLite file: ``tests/frontend/browser.py``).

A waiting job's line says why it waits: its code, then the scheduler's sentence. Most sentences
begin with their code already ("held: until its owner or an operator releases it", "quota: vision uses
…"), and the code must then not be said twice.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, sign_in, submit

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_waiting_jobs_reason_names_its_code_once(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="held-back", gpus=64)  # no node can hold it: it waits
    held = requests.post(
        f"{server['url']}/api/v1/jobs/{job}/hold/",
        headers={"Authorization": f"Token {server['users']['alice']['token']}"},
        timeout=10,
    )
    assert held.status_code == 200 and held.json()["pending_code"] == "held", held.text
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            line = f".job[data-job-id='{job}'] .job-reason"
            alice.wait_for_selector(line, timeout=10_000)
            assert alice.inner_text(line) == "held: until its owner or an operator releases it"
        finally:
            browser.close()

"""The submit form in a real browser (Debian's headless Chromium, Playwright, daphne over its own
SQLite file: ``tests/frontend/browser.py``): a double click submits one job."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_double_click_on_submit_stores_one_job(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            alice.goto(server["url"] + "/jobs/new/")
            alice.fill("#id_name", "clicked-twice")
            alice.select_option("#id_kind", "training")
            alice.fill("#id_command", "sleep 600")
            alice.fill("#id_gpus", "1")
            # A person's double click: the second press comes once the first form's request has
            # left (Playwright's own dblclick is faster than the browser starting a navigation, and
            # its click waits for the navigation to end).
            alice.evaluate(
                """() => {
                  const button = document.getElementById("submit-job");
                  button.click();
                  setTimeout(() => button.click(), 60);
                }"""
            )
            alice.wait_for_selector("#job-page", timeout=15_000)  # the first is aborted: no wait_for_url
            jobs = requests.get(
                server["url"] + "/api/v1/jobs/",
                headers={"Authorization": f"Token {server['users']['alice']['token']}"},
                timeout=10,
            ).json()["results"]
            jobs = [j for j in jobs if j["name"] == "clicked-twice"]
            assert len(jobs) == 1
            assert alice.url.endswith(f"/jobs/{jobs[0]['id']}/")
        finally:
            browser.close()

"""The browser's console stays clean on every page, in a real browser (Debian's headless Chromium,
Playwright, daphne over its own SQLite file: ``tests/frontend/browser.py``).

A fresh browser asks every site for ``/favicon.ico``; a 404 there is a console error on the first
page of every visit (the sign-in page, the admin's), so the site answers it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, submit, submit_sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_no_page_logs_an_error_to_the_console(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="console-check", gpus=1)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        errors: list[str] = []  # of the page being walked
        try:
            for who, paths in (
                ("alice", ["/", "/jobs/", f"/jobs/{job}/", "/jobs/new/", "/team/", "/tokens/"]),
                ("admin", ["/", "/admin/", "/api/docs/"]),
            ):
                page = browser.new_context().new_page()  # a fresh browser: no favicon cached
                errors.clear()
                page.on(
                    "console",
                    lambda m: (
                        errors.append(f"{m.text} ({m.location.get('url')})") if m.type == "error" else None
                    ),
                )
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(server["url"] + "/login/")
                page.wait_for_load_state("networkidle")
                submit_sign_in(page, server, who)
                page.wait_for_url(server["url"] + "/")
                for path in paths:
                    page.goto(server["url"] + path)
                    page.wait_for_load_state("networkidle")
                page.wait_for_timeout(500)
                assert errors == [], (who, errors)
        finally:
            browser.close()

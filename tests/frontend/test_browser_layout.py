"""Pages at a phone's width in a real browser (Debian's headless Chromium, Playwright, daphne over
its own SQLite file: ``tests/frontend/browser.py``).

A wide table scrolls inside its own box (``.table-wrap``), and nothing in it may stick out of
that box: the team page's hour-by-hour table holds a visually hidden sentence (for screen readers)
that is absolutely positioned, so the box must be its containing block, or the sentence sits past
the table's right edge and the whole page scrolls sideways on a phone.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, sign_in, submit

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_team_page_with_its_last_24_hours_fits_a_phone(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="on-the-books", gpus=8, accelerators=["A100"])
    headers = {"Authorization": f"Token {server['users']['alice']['token']}"}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            alice.wait_for_selector(f".cell[data-jobs~='{job}']", timeout=20_000)  # it holds GPUs
            assert requests.get(f"{server['url']}/api/v1/jobs/{job}/", headers=headers, timeout=5).json()[
                "allocations"
            ]
            phone = browser.new_page(
                viewport={"width": 375, "height": 740}, is_mobile=True, has_touch=True, bypass_csp=True
            )
            phone.context.add_cookies(alice.context.cookies())
            phone.goto(server["url"] + "/team/")
            phone.wait_for_selector(".history-table")  # the team's GPUs, hour by hour
            # Against the phone's 375 px, not window.innerWidth: a mobile browser zooms out to
            # show a page wider than the screen, and innerWidth grows with it.
            overflow = phone.evaluate("document.documentElement.scrollWidth") - 375
            assert overflow <= 1, f"the team page is {overflow}px wider than the phone"
        finally:
            browser.close()


def test_a_copy_of_a_job_with_a_long_unbroken_name_fits_the_screen(server: dict[str, Any]) -> None:
    """The submit form's "a copy of #N <name>" beside its heading: a 128-character name with no
    space in it must wrap, not make the page scroll sideways (it was 1,897 px wide at 1,400); the
    job's own page and the list keep fitting too."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="W" * 128, gpus=1)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            for width in (1400, 375):
                alice.set_viewport_size({"width": width, "height": 900})
                for path in (f"/jobs/new/?from={job}", f"/jobs/{job}/", "/jobs/"):
                    alice.goto(server["url"] + path)
                    alice.wait_for_selector("main h1")
                    overflow = alice.evaluate("document.documentElement.scrollWidth") - width
                    assert overflow <= 1, f"{path} is {overflow}px wider than {width}px"
        finally:
            browser.close()

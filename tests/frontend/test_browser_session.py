"""A portal page left open after its session ends, in a real browser (Debian's headless Chromium,
Playwright, daphne over its own SQLite file: ``tests/frontend/browser.py``).

alice follows a job's page, and her session ends without a sign-out (it expired). When her job
next changes, the page must not paste the sign-in page into the job's status box (the fragment's fetch
is redirected to ``/login/``): it goes to the sign-in page, which brings her back once she has
signed in again. An open dashboard goes there too as she signs out in another tab (the server
closes that session's sockets), and receives nothing of her team's jobs after.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import requests

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, submit, submit_sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_job_page_whose_session_ended_goes_to_the_sign_in_page(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="left-open", gpus=64)  # too big: it waits
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(bypass_csp=True)  # bypass_csp: as sign_in, for the probes
            alice = context.new_page()
            alice.goto(f"{server['url']}/jobs/{job}/")
            submit_sign_in(alice, server, "alice")
            alice.wait_for_url(f"{server['url']}/jobs/{job}/")
            alice.wait_for_selector("#live.live-on", timeout=10_000)
            alice.wait_for_function("window.TESSERA_PORTAL.refreshes > 0", timeout=10_000)

            # The session ends with no sign-out (it expired): its socket, authenticated at the
            # handshake, stays open, and the page's next fetches go without a session.
            context.clear_cookies()

            # The job changes after the session ended (a client with her token cancels it).
            cancelled = requests.post(
                f"{server['url']}/api/v1/jobs/{job}/cancel/",
                headers={"Authorization": f"Token {server['users']['alice']['token']}"},
                timeout=10,
            )
            assert cancelled.status_code == 200, cancelled.text
            alice.wait_for_url(re.compile(r".*/login/\?next=.*"), timeout=15_000)
            assert f"/jobs/{job}/" in requests.utils.unquote(alice.url)
            assert alice.locator("#id_username").count() == 1  # one sign-in form, the page's own
            assert alice.locator("#job-status").count() == 0
        finally:
            browser.close()


def test_signing_out_sends_an_open_dashboard_to_sign_in_and_stops_its_updates(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(bypass_csp=True)  # bypass_csp: as sign_in, for the probes
            alice = context.new_page()
            frames: list[str] = []
            alice.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(str(f))))
            alice.goto(server["url"] + "/")
            submit_sign_in(alice, server, "alice")
            alice.wait_for_url(server["url"] + "/")
            alice.wait_for_selector("#live.live-on", timeout=10_000)

            other = context.new_page()
            other.goto(server["url"] + "/team/")
            other.click("text=Sign out")
            other.wait_for_url(re.compile(r".*/login/.*"))

            alice.wait_for_url(re.compile(r".*/login/\?next=.*"), timeout=15_000)
            submit(server, "alice", name="after-sign-out", gpus=1)
            alice.wait_for_timeout(2000)
            assert not any("after-sign-out" in f for f in frames)
        finally:
            browser.close()


def test_the_back_button_after_signing_out_shows_no_private_page(server: dict[str, Any]) -> None:
    """After alice signs out, Back must not bring her job's page (its name, its command) back from
    the browser's cache for whoever sits at the machine next: private pages are not stored."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="secret-experiment", gpus=64, command=["echo", "secret-flag"])
    with sync_playwright() as p:
        # With the back/forward cache on, as in a person's browser (Playwright turns it off).
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, ignore_default_args=["--disable-back-forward-cache"]
        )
        try:
            page = browser.new_context().new_page()
            page.goto(f"{server['url']}/jobs/{job}/")
            submit_sign_in(page, server, "alice")
            page.wait_for_url(f"{server['url']}/jobs/{job}/")
            assert "secret-experiment" in page.content()
            page.goto(f"{server['url']}/jobs/")
            page.click("#signout button[type=submit], form[action='/logout/'] button")
            page.wait_for_url(re.compile(r".*/login/"))
            for _ in range(2):  # back to the list, then to the job's page
                # commit: a page restored from the back/forward cache fires no load event.
                page.go_back(wait_until="commit")
                html = page.content()
                assert "secret-experiment" not in html and "secret-flag" not in html, page.url
                page.wait_for_url(re.compile(r".*/login/\?next=.*"), wait_until="commit", timeout=10_000)
        finally:
            browser.close()

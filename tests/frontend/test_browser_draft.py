"""The submit form keeps what was typed across the end of a session, in a real browser (Debian's
headless Chromium, Playwright, daphne over its own SQLite file: ``tests/frontend/browser.py``).

A person whose session ended while they filled the form (it expired, or they signed out in
another tab) pressed Submit, signed in again and came back to an empty form: everything typed was
lost. The tab now keeps the form's text (``frontend/static/frontend/draft.js``) until the job is
submitted.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, sign_in, submit_sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_what_was_typed_survives_the_session_ending_before_submit(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    url = server["url"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            alice.goto(url + "/jobs/new/")
            assert alice.is_hidden("#draft-note")
            alice.fill("#id_name", "typed-then-expired")
            alice.select_option("#id_kind", "training")
            alice.fill("#id_command", "python train.py --epochs 3 --name 'a b'")
            alice.fill("#id_gpus", "2")
            alice.fill("#id_env", "SEED=3\nMODE=offline")
            # The session ends (as when it expires): its cookie is gone, the CSRF cookie stays.
            context = alice.context
            kept = [c for c in context.cookies() if c["name"] != "sessionid"]
            context.clear_cookies()
            context.add_cookies(kept)  # type: ignore[arg-type]
            alice.click("#submit-job")
            alice.wait_for_url("**/login/?next=/jobs/new/")
            submit_sign_in(alice, server, "alice")
            alice.wait_for_url(url + "/jobs/new/")

            alice.wait_for_selector("#draft-note:not([hidden])")
            assert alice.input_value("#id_name") == "typed-then-expired"
            assert alice.input_value("#id_kind") == "training"
            assert alice.input_value("#id_command") == "python train.py --epochs 3 --name 'a b'"
            assert alice.input_value("#id_env") == "SEED=3\nMODE=offline"

            alice.click("#submit-job")
            alice.wait_for_selector("#job-page")
            job_id = int(alice.get_attribute("#job-page", "data-job-id") or 0)
            job = requests.get(
                f"{url}/api/v1/jobs/{job_id}/",
                headers={"Authorization": f"Token {server['users']['alice']['token']}"},
                timeout=10,
            ).json()
            assert job["name"] == "typed-then-expired" and job["gpus"] == 2
            assert job["command"] == ["python", "train.py", "--epochs", "3", "--name", "a b"]
            assert job["env"] == {"SEED": "3", "MODE": "offline"}

            # Submitted: the next form is a fresh one.
            alice.goto(url + "/jobs/new/")
            assert alice.input_value("#id_name") == "" and alice.is_hidden("#draft-note")

            # A draft left behind can be cleared; signing out drops it.
            alice.fill("#id_name", "half-typed")
            alice.goto(url + "/jobs/new/")
            assert alice.input_value("#id_name") == "half-typed"
            alice.click("#draft-clear")
            assert alice.input_value("#id_name") == "" and alice.is_hidden("#draft-note")
            alice.fill("#id_name", "left-at-sign-out")
            alice.click("text=Sign out")
            alice.wait_for_url("**/login/**")
            submit_sign_in(alice, server, "alice")
            alice.goto(url + "/jobs/new/")
            assert alice.input_value("#id_name") == ""
        finally:
            browser.close()

"""Times on the portal read in the viewer's own time zone, in a real browser (Debian's headless
Chromium, Playwright, daphne over its own SQLite file: ``tests/frontend/browser.py``).

The server writes every time in UTC, as ``<time datetime>``; a person in Kolkata (UTC+5:30) or
St. John's (UTC-3:30) read a job's start estimate as their own clock's and were hours off, while
the dashboard already showed its times in theirs.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import requests

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, submit, submit_sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_start_estimate_and_a_jobs_times_read_in_the_viewers_time_zone(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    api = {"Authorization": f"Token {server['users']['alice']['token']}"}
    submit(
        server,
        "alice",
        name="holds-the-h100s",
        gpus=16,
        replicas=2,
        accelerators=["H100"],
        time_limit_seconds=3 * 86400,
    )
    waiting = submit(server, "alice", name="waits-for-them", gpus=16, replicas=2, accelerators=["H100"])
    deadline = time.monotonic() + 20
    while (
        not requests.get(f"{server['url']}/api/v1/jobs/{waiting}/", headers=api, timeout=5)
        .json()
        .get("estimated_start")
    ):
        assert time.monotonic() < deadline, str(
            requests.get(f"{server['url']}/api/v1/jobs/{waiting}/", headers=api, timeout=5).json()
        )
        time.sleep(0.2)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for zone in ("Asia/Kolkata", "America/St_Johns"):
                # bypass_csp: as sign_in, for the probe below (the page's own scripts keep to it).
                page = browser.new_context(timezone_id=zone, locale="en-GB", bypass_csp=True).new_page()
                page.goto(f"{server['url']}/jobs/{waiting}/")
                submit_sign_in(page, server, "alice")
                page.wait_for_url(f"{server['url']}/jobs/{waiting}/")
                # The status box is fetched again once the socket is ready: its times too.
                page.wait_for_function("window.TESSERA_PORTAL.refreshes > 0", timeout=10_000)
                page.wait_for_selector("#estimate time[data-local]", timeout=10_000)
                shown = page.eval_on_selector_all(
                    "#job-status time[datetime]",
                    "els => els.map(e => [e.getAttribute('datetime'), e.textContent.trim(), e.title])",
                )
                assert len(shown) >= 2  # submitted, the estimate (and its band)
                for iso, text, title in shown:
                    at = datetime.fromisoformat(iso).astimezone(ZoneInfo(zone))
                    with_seconds = text.count(":") == 2
                    assert text == at.strftime("%Y-%m-%d %H:%M" + (":%S" if with_seconds else "")), (
                        zone,
                        iso,
                    )
                    assert title.startswith(at.strftime("%Y-%m-%d %H:%M:%S")) and "GMT" in title
                # The list says "starts ~" with the time alone only for today: this one is days off.
                page.goto(f"{server['url']}/jobs/")
                page.wait_for_selector(".estimate time[data-local]", timeout=10_000)
                iso, text = page.eval_on_selector(
                    ".estimate time", "e => [e.getAttribute('datetime'), e.textContent.trim()]"
                )
                at = datetime.fromisoformat(iso).astimezone(ZoneInfo(zone))
                assert at.date() > datetime.now(ZoneInfo(zone)).date()
                assert text == at.strftime("%Y-%m-%d %H:%M"), (zone, iso, text)
                page.context.close()
        finally:
            browser.close()


def test_a_job_that_ended_days_ago_says_which_day_on_the_dashboard(server: dict[str, Any]) -> None:
    need_chromium()
    import subprocess
    import sys

    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="ended-long-ago", gpus=64)  # waits: cancelled at once
    api = {"Authorization": f"Token {server['users']['alice']['token']}"}
    assert requests.post(f"{server['url']}/api/v1/jobs/{job}/cancel/", headers=api, timeout=10).ok
    # Three days ago, in the server's database (its own SQLite file).
    move = (
        "import django; django.setup(); from datetime import timedelta; from django.utils import timezone; "
        "from scheduling.models import Job; "
        f"Job.objects.filter(pk={job}).update(finished_at=timezone.now() - timedelta(days=3))"
    )
    subprocess.run([sys.executable, "-c", move], env=server["env"], check=True, timeout=60)
    ended = requests.get(f"{server['url']}/api/v1/jobs/{job}/", headers=api, timeout=5).json()["finished_at"]
    zone = "Asia/Kolkata"
    local = datetime.fromisoformat(ended.replace("Z", "+00:00")).astimezone(ZoneInfo(zone))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(timezone_id=zone, locale="en-GB").new_page()
            page.goto(server["url"] + "/")
            submit_sign_in(page, server, "alice")
            item = page.wait_for_selector(f"li.job[data-job-id='{job}'] .job-meta", timeout=15_000)
            text = item.text_content() or ""
            assert f"ended {local:%d/%m/%Y}, {local:%H:%M:%S}" in text, text
        finally:
            browser.close()

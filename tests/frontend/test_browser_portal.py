"""The portal in a real browser (Debian's headless Chromium, Playwright, daphne, a real agent).

A researcher's path: alice signs in, submits from the form, watches her job start without a
reload and reads its output; a job too big to fit shows why it waits, and she cancels it; a failed
job stays findable with its exit code. A click on her GPU opens her job; so does the keyboard.
bob never sees her job's name, command or output, and her job's page is a 404 for him. axe-core
finds no serious or critical violation on any page, and a phone-width dashboard keeps 8-GPU NVLink
islands on one row, and every page fits its width. Screenshots of every page, at desktop and
phone width, go to ``test-artifacts/portal-*.png`` (git-ignored).
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import requests

from tests.frontend.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, need_chromium, sign_in, submit

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SECRET = "alice-secret-output-7731"
AT_ROW_END = (
    "(() => { const c = document.activeElement;"
    " const row = c.closest('.node-row').querySelectorAll('.cell'); return c === row[row.length - 1]; })()"
)


def job_id_of(page: Any) -> int:
    match = re.search(r"/jobs/(\d+)/$", page.url)
    assert match, page.url
    return int(match.group(1))


def fill_and_submit(page: Any, **fields: str) -> None:
    page.click("nav >> text=Submit")
    page.wait_for_selector("#id_name")
    for name, value in fields.items():
        if name == "kind":
            page.select_option("#id_kind", value)
        else:
            page.fill(f"#id_{name}", value)
    page.click("#submit-job")
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))


def wait_state(server: dict[str, Any], job_id: int, state: str, timeout_s: float = 20) -> None:
    headers = {"Authorization": f"Token {server['users']['alice']['token']}"}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = requests.get(f"{server['url']}/api/v1/jobs/{job_id}/", headers=headers, timeout=5).json()
        if job["state"] == state:
            return
        time.sleep(0.2)
    pytest.fail(f"job {job_id} did not reach {state}: {job['state']}")


def test_a_researchers_whole_path_in_the_portal(server: dict[str, Any], agent: str) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    failed = submit(
        server, "alice", name="alice-fails", command=["sh", "-c", "exit 3"], gpus=1, accelerators=["L40S"]
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            # Submit from the form; land on the job's page; watch it start, with no reload.
            fill_and_submit(
                alice,
                name="alice-resnet",
                kind="training",
                command=f"sh -c 'echo {SECRET}; sleep 600'",
                gpus="2",
                accelerators="L40S",
            )
            running = job_id_of(alice)
            alice.evaluate("window.__noReload = 'still here'")
            alice.wait_for_selector("#job-state:text('running')", timeout=20_000)
            alice.wait_for_function(
                f"document.getElementById('log').textContent.includes('{SECRET}')", timeout=20_000
            )
            assert alice.evaluate("window.__noReload") == "still here"
            assert agent in alice.inner_text("#job-status")  # where it runs
            alice.screenshot(path=str(ARTIFACTS / "portal-job-running.png"), full_page=True)

            # A job too big for the cluster: it waits, says why, and is cancelled from its page.
            fill_and_submit(alice, name="alice-too-big", kind="batch", command="true", gpus="64")
            waiting = job_id_of(alice)
            alice.wait_for_function(
                "document.querySelector('#why-pending .code') && "
                "document.querySelector('#why-pending .code').textContent.trim() !== 'priority'",
                timeout=20_000,
            )
            reason = alice.inner_text("#why-pending")
            assert "capacity" in reason or "quota" in reason, reason
            alice.screenshot(path=str(ARTIFACTS / "portal-job-pending.png"), full_page=True)
            alice.click("#cancel-job")
            alice.wait_for_selector("#job-state:text('cancelled')", timeout=10_000)
            wait_state(server, waiting, "cancelled")

            # A dropped connection: the page reconnects and catches up with what it missed.
            gone = submit(server, "alice", name="alice-cancelled-offline", gpus=64)
            alice.goto(f"{server['url']}/jobs/{gone}/")
            alice.wait_for_selector("#live.live-on", timeout=10_000)
            alice.evaluate("window.__noReload = 'still here'; window.TESSERA_PORTAL.socket.close()")
            alice.wait_for_selector("#live.live-off", timeout=5_000)
            headers = {"Authorization": f"Token {server['users']['alice']['token']}"}
            requests.post(f"{server['url']}/api/v1/jobs/{gone}/cancel/", headers=headers, timeout=10)
            alice.wait_for_selector("#job-state:text('cancelled')", timeout=20_000)
            assert alice.evaluate("window.__noReload") == "still here"

            # The failed job is still there, with its exit code, in the list and on the dashboard.
            wait_state(server, failed, "failed")
            alice.goto(server["url"] + "/jobs/?state=failed")
            row = alice.wait_for_selector(f"tr[data-job-id='{failed}']")
            assert "exit 3" in row.inner_text()
            alice.screenshot(path=str(ARTIFACTS / "portal-jobs.png"), full_page=True)
            alice.goto(server["url"] + "/")
            alice.wait_for_selector(f"#ended li[data-job-id='{failed}'][data-state='failed']", timeout=10_000)

            # One click on her GPU opens her job's page...
            cell = f".cell.mine[data-jobs~='{running}']"
            alice.wait_for_selector(cell, timeout=10_000)
            alice.click(cell)
            alice.wait_for_url(f"{server['url']}/jobs/{running}/")
            # ...and so does the keyboard: one Tab stop for the whole map, arrows, then Enter.
            alice.goto(server["url"] + "/")
            alice.wait_for_selector(cell, timeout=10_000)
            assert alice.eval_on_selector_all("#heatmap .cell[tabindex='0']", "cells => cells.length") == 1
            alice.focus("#heatmap .cell[tabindex='0']")
            for _ in range(80):
                if alice.evaluate(f'document.activeElement.matches("{cell}")'):
                    break
                if alice.evaluate(AT_ROW_END):
                    alice.keyboard.press("Home")
                    alice.keyboard.press("ArrowDown")
                else:
                    alice.keyboard.press("ArrowRight")
            else:
                pytest.fail("the keyboard never reached alice's GPU")
            alice.keyboard.press("Enter")
            alice.wait_for_url(f"{server['url']}/jobs/{running}/")

            # Cancel the running job too: it stops, and its output stays readable.
            alice.click("#cancel-job")
            wait_state(server, running, "cancelled", timeout_s=30)
            alice.wait_for_selector("#job-state:text('cancelled')", timeout=10_000)

            # bob sees none of it: not on his pages, not in his frames; her page is a 404.
            bob = sign_in(browser, server, "bob")
            frames: list[str] = []
            bob.on(
                "websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(str(payload)))
            )
            bob.reload()
            bob.wait_for_selector("#live.live-on", timeout=10_000)
            for url in ("/", "/jobs/", "/team/"):
                bob.goto(server["url"] + url)
                html = bob.content()
                assert "alice-resnet" not in html and SECRET not in html and "alice-fails" not in html, url
            response = bob.goto(f"{server['url']}/jobs/{running}/")
            assert response is not None and response.status == 404
            assert all("alice-resnet" not in f and SECRET not in f for f in frames)
        finally:
            browser.close()


def test_every_page_passes_axe_and_the_phone_layout_keeps_nvlink_islands_whole(
    server: dict[str, Any], agent: str
) -> None:
    need_chromium()
    from axe_playwright_python.sync_playwright import Axe
    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="axe-job", command=["sleep", "600"], gpus=1, accelerators=["L40S"])
    axe = Axe()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            refused: list[str] = []  # what the Content-Security-Policy blocked, if anything
            alice.on(
                "console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None
            )
            pages = {
                "/": "dashboard-alice",
                "/jobs/": "jobs-list",
                f"/jobs/{job}/": "job",
                "/jobs/new/": "submit-form",
                "/team/": "team",
                "/tokens/": "tokens",
            }
            for url, shot in pages.items():
                alice.goto(server["url"] + url)
                alice.wait_for_load_state("networkidle")
                alice.screenshot(path=str(ARTIFACTS / f"portal-{shot}.png"), full_page=True)
                found = axe.run(alice).response["violations"]
                serious = [
                    (v["id"], v["impact"], v["nodes"][0]["html"][:120])
                    for v in found
                    if v["impact"] in ("serious", "critical")
                ]
                assert serious == [], (url, serious)
            # The form with errors beside its fields is accessible too.
            alice.goto(server["url"] + "/jobs/new/")
            alice.fill("#id_gpus", "lots")
            alice.click("#submit-job")
            alice.wait_for_selector(".field-error")
            alice.screenshot(path=str(ARTIFACTS / "portal-submit-form-errors.png"), full_page=True)
            found = axe.run(alice).response["violations"]
            assert [v["id"] for v in found if v["impact"] in ("serious", "critical")] == []
            assert refused == []  # no inline script, style or handler anywhere

            # The map's filters: rows by rack and by model; cells of other tenants dimmed, for
            # operators only (a tenant's user sees no other tenant's names to filter by).
            alice.goto(server["url"] + "/")
            alice.wait_for_selector(f".cell.mine[data-jobs~='{job}']", timeout=20_000)
            alice.select_option("#filter-rack", "r2")
            alice.wait_for_selector(".node-row[data-rack='r1']", state="hidden")
            assert alice.is_visible(".cell[data-node='a100-a']")
            assert alice.is_visible(".cell[data-node='t4-a']")
            alice.select_option("#filter-model", "T4")
            alice.wait_for_selector(".cell[data-node='a100-a']", state="hidden")
            assert alice.is_visible(".cell[data-node='t4-a']")
            assert alice.query_selector("#filter-tenant") is None
            admin = sign_in(browser, server, "admin")
            admin.wait_for_selector(f".cell[data-jobs~='{job}']", timeout=20_000)
            admin.select_option("#filter-tenant", "vision")
            admin.wait_for_selector(".cell.dim[data-node='h100-a']")
            assert "dim" not in (admin.get_attribute(f".cell[data-jobs~='{job}']", "class") or "")
            admin.screenshot(path=str(ARTIFACTS / "portal-dashboard-tenant-filter.png"), full_page=True)

            phone = browser.new_page(
                viewport={"width": 375, "height": 740}, is_mobile=True, has_touch=True, bypass_csp=True
            )
            phone.context.add_cookies(alice.context.cookies())
            phone.goto(server["url"] + "/")
            phone.wait_for_selector(".cell[data-node='h100-a']", timeout=10_000)
            tops = phone.eval_on_selector_all(
                ".cell[data-node='h100-a']",
                "cells => cells.map(c => Math.round(c.getBoundingClientRect().top))",
            )
            assert len(tops) == 8 and len(set(tops)) == 1, tops  # one island of 8, one row
            # The phone's 375 px, not innerWidth: that grows as a mobile browser zooms out to show
            # a page wider than the screen, so it hid a page that overflowed.
            assert phone.evaluate("document.documentElement.scrollWidth <= 376")
            phone.screenshot(path=str(ARTIFACTS / "portal-phone.png"), full_page=True)
            # Every other page fits the phone's width too (a wide table scrolls in its own box).
            for url, shot in pages.items():
                phone.goto(server["url"] + url)
                phone.wait_for_load_state("networkidle")
                assert phone.evaluate("document.documentElement.scrollWidth <= 376"), url
                phone.screenshot(path=str(ARTIFACTS / f"portal-phone-{shot}.png"), full_page=True)
            phone.goto(server["url"] + "/")
            # A tap on a GPU of hers opens her job.
            cell = f".cell.mine[data-jobs~='{job}']"
            phone.wait_for_selector(cell, timeout=20_000)
            phone.tap(cell)
            phone.wait_for_url(f"{server['url']}/jobs/{job}/")
        finally:
            browser.close()

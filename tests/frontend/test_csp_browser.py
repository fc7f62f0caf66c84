"""The Content-Security-Policy in a real browser: every page of the portal, the admin and the API
docs renders under it with no violation, and nothing is fetched from another origin (the API
docs' code comes from the drf-spectacular-sidecar package, not a CDN).

Debian's headless Chromium, driven by Playwright, against a real daphne (``tests/frontend/browser.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, submit, submit_sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def test_every_page_renders_under_the_csp_and_fetches_nothing_from_elsewhere(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="csp-check", gpus=1)
    violations: list[str] = []
    foreign: list[str] = []

    def watch(page: Any) -> Any:
        page.on(
            "console",
            lambda m: (
                violations.append(f"{page.url}: {m.text}") if "Content Security Policy" in m.text else None
            ),
        )
        page.on(
            "request",
            lambda r: None if r.url.startswith((server["url"], "data:", "blob:")) else foreign.append(r.url),
        )
        return page

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            alice = watch(context.new_page())
            alice.goto(server["url"] + "/login/")
            submit_sign_in(alice, server, "alice")
            alice.wait_for_url(server["url"] + "/")
            alice.wait_for_selector(".cell[data-node]", timeout=10_000)  # the dashboard's script ran
            for path in ("/jobs/", f"/jobs/{job}/", "/jobs/new/", "/team/"):
                alice.goto(server["url"] + path)
                alice.wait_for_load_state("networkidle")

            alice.goto(server["url"] + "/api/docs/")
            alice.wait_for_selector(".opblock", timeout=20_000)  # Swagger UI drew the operations
            assert alice.locator(".opblock").count() > 10
            alice.goto(server["url"] + "/api/redoc/")
            alice.wait_for_selector("text=/api/v1/jobs/", timeout=30_000)  # ReDoc drew the paths

            admin = watch(browser.new_context().new_page())
            admin.goto(server["url"] + "/admin/login/")
            admin.fill("#id_username", "admin")
            admin.fill("#id_password", server["users"]["admin"]["password"])
            admin.click("input[type=submit]")
            admin.wait_for_url(server["url"] + "/admin/")
            for path in ("/admin/scheduling/job/", f"/admin/scheduling/job/{job}/change/"):
                admin.goto(server["url"] + path)
                admin.wait_for_load_state("networkidle")
        finally:
            browser.close()
    # ReDoc's "API docs by Redocly" footer links its logo from redoc.ly: the policy blocks it (a
    # missing picture; the browser reports the attempt and the violation), the one expected.
    assert [v for v in violations if REDOC_LOGO not in v] == []
    assert [url for url in foreign if REDOC_LOGO not in url] == []

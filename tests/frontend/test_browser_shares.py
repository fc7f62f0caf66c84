"""A share of a GPU on the dashboard, as the API keeps it: to the thousandth of a GPU.

A job holding 0.125 of a T4 was labelled "13%", and one holding 0.001 (the allocation's unit)
"0%", as if the GPU were not used at all; the API answers 0.125 and 0.001.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, sign_in, submit

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_gpu_share_is_labelled_to_the_tenth_of_a_percent(server: dict[str, Any]) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    eighth = submit(server, "alice", name="eighth", gpus=0.125, kind="inference", accelerators=["T4"])
    tiny = submit(server, "bob", name="tiny", gpus=0.001, kind="inference", accelerators=["T4"])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for who, job_id, share in (("alice", eighth, "12.5%"), ("bob", tiny, "0.1%")):
                page = sign_in(browser, server, who)
                cell = f".cell[data-jobs~='{job_id}']"
                page.wait_for_selector(cell, timeout=15_000)
                label = page.get_attribute(cell, "title") or ""
                assert f"job {job_id}" in label and f" {share}" in label, label
        finally:
            browser.close()

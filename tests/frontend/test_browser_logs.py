"""A job's output on its page in a real browser (Debian's headless Chromium, Playwright, daphne and
a real agent: ``tests/frontend/browser.py``).

Choosing another replica's output while a read of the first one is still on its way must show the
chosen replica's output only: the late answer for the replica left behind is dropped, not added
to the new one's text (nor its offset used to read the new one).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS, need_chromium, sign_in, submit

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_switching_replicas_mid_read_shows_the_chosen_replicas_output_only(
    server: dict[str, Any], agent: str
) -> None:
    need_chromium()
    from playwright.sync_api import sync_playwright

    job = submit(
        server,
        "alice",
        name="two-replicas",
        gpus=2,
        replicas=2,
        accelerators=["L40S"],
        command=["sh", "-c", 'echo "out-of-replica-$TESSERA_REPLICA"; sleep 600'],
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            alice.goto(f"{server['url']}/jobs/{job}/")
            alice.wait_for_selector("#log:has-text('out-of-replica-0')", timeout=30_000)

            # Hold back a read of replica 0 until replica 1 has been chosen.
            chosen = threading.Event()
            held: list[Any] = []

            def hold_replica_0(route: Any) -> None:
                if not chosen.is_set():
                    held.append(route)
                else:
                    route.continue_()

            alice.route(re.compile(r".*/logs/\?offset=\d+&replica=0$"), hold_replica_0)
            alice.uncheck("#log-follow")  # no new read of its own meanwhile
            alice.check("#log-follow")  # one read now: held
            deadline = 50
            while not held and deadline:
                alice.wait_for_timeout(100)
                deadline -= 1
            assert held, "the page did not read replica 0 again"
            alice.select_option("#log-replica", "1")
            chosen.set()
            held[0].fallback()  # replica 0's answer comes now, after replica 1 was chosen
            alice.wait_for_selector("#log:has-text('out-of-replica-1')", timeout=15_000)
            alice.wait_for_timeout(2500)  # more reads of replica 1
            text = alice.inner_text("#log")
            assert text.strip() == "out-of-replica-1", text
        finally:
            browser.close()


def test_output_with_colours_and_progress_bars_reads_as_a_terminal_shows_it(server: dict[str, Any]) -> None:
    """A job's output with ANSI colours (cut between two reads, too) and a progress bar redrawn
    with carriage returns: the page shows the text a terminal would, not ``[32m`` and every
    state of the bar glued together. The output comes from the logs endpoint, answered here."""
    need_chromium()
    import json

    from playwright.sync_api import sync_playwright

    job = submit(server, "alice", name="colourful", gpus=64)  # too big: it waits; its page loads
    chunks = [
        "\x1b[32mINFO\x1b[0m loading\r\n",
        "epoch 1:  10%|#    |\r",
        "epoch 1:  50%|#####|\repoch 1: 100%|##########|\n\x1b]0;title\x07done \x1b[1",
        ";31mred\x1b[0m\n" + "x" * 5000 + "\n",
    ]
    offsets = [0]
    for chunk in chunks:
        offsets.append(offsets[-1] + len(chunk))

    def answer(route: Any) -> None:
        offset = int(re.search(r"offset=(\d+)", route.request.url).group(1))
        n = offsets.index(offset) if offset in offsets[:-1] else None  # None: past the end
        data = chunks[n] if n is not None else ""
        end = offsets[n + 1] if n is not None else offset
        eof = n is None or n == len(chunks) - 1
        body = {"data": data, "next_offset": end, "eof": eof, "truncated": False}
        route.fulfill(content_type="application/json", body=json.dumps(body))

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            alice.route(re.compile(rf".*/api/v1/jobs/{job}/logs/\?.*"), answer)
            alice.goto(f"{server['url']}/jobs/{job}/")
            alice.wait_for_selector("#log-state:has-text('Complete')", timeout=15_000)
            text = alice.eval_on_selector("#log", "e => e.textContent")
            assert text.split("\n") == [
                "INFO loading",
                "epoch 1: 100%|##########|",
                "done red",
                "x" * 5000,
                "",
            ]
            width = alice.eval_on_selector("#log", "e => [e.scrollWidth, e.clientWidth]")
            assert width[0] <= width[1]  # a 5,000-character line wraps in its box
        finally:
            browser.close()

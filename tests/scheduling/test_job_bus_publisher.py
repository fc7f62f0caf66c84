"""The job bus's publisher thread (``services/job_bus.py``): the caller never waits for Redis,
an idle publisher sends at once, and keys put while it sends go together in its next message."""

from __future__ import annotations

import threading

import pytest

from scheduling.services import job_bus


def test_keys_put_while_a_message_is_sent_go_together_in_the_next(monkeypatch: pytest.MonkeyPatch):
    sent: list[list[str]] = []
    first_sending, release = threading.Event(), threading.Event()
    arrived = threading.Semaphore(0)

    def send(keys: list[str]) -> None:
        if not sent:
            first_sending.set()
            assert release.wait(10)
        sent.append(keys)
        arrived.release()

    monkeypatch.setattr(job_bus, "_send", send)
    publisher = job_bus.Publisher()
    publisher.put(["job:1", "jobs"])
    assert first_sending.wait(10), "an idle publisher sends at once"
    publisher.put(["job:2", "jobs"])  # the caller returns while the first message is still out
    publisher.put(["job:3", "tenant:1"])
    release.set()
    assert arrived.acquire(timeout=10) and arrived.acquire(timeout=10)
    assert sent == [["job:1", "jobs"], ["job:2", "job:3", "jobs", "tenant:1"]]
    assert not arrived.acquire(timeout=0.2), "nothing was sent twice"

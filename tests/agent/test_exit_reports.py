"""Exit reports leave the agent in batches: replicas that end together cost one request."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from agent.client import Rejected, ServerError
from agent.reports import ExitReporter
from tests.agent import fakes


def report_together(reporter: ExitReporter, job_ids: list[int]) -> dict[int, Any]:
    """Each job's supervisor reports its exit from its own thread, at the same moment."""
    results: dict[int, Any] = {}
    gate = threading.Barrier(len(job_ids))

    def one(job_id: int) -> None:
        gate.wait()
        try:
            results[job_id] = reporter.exited(job_id, 0, 0, 0, started_at=1.5e9, pid=job_id)
        except (Rejected, ServerError) as exc:
            results[job_id] = exc

    threads = [threading.Thread(target=one, args=(j,)) for j in job_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_exits_reported_at_the_same_moment_go_in_one_request():
    server = fakes.FakeServer()
    results = report_together(ExitReporter(server, window_s=0.05), [1, 2, 3, 4, 5, 6, 7, 8])
    assert all(r["state"] == "succeeded" for r in results.values())
    assert [c for c in server.calls if c[0] == "exits"] == [("exits", {"count": 8})]
    assert sorted(e["job_id"] for e in server.exits) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert all(e["started_at"] == 1.5e9 for e in server.exits)


class RefusesOne(fakes.FakeServer):
    def report_exits(self, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"status": 409, "detail": "stale"} if r["job_id"] == 2 else {"status": 200, "state": "failed"}
            for r in reports
        ]


def test_a_report_refused_in_a_batch_fails_only_its_own_caller():
    results = report_together(ExitReporter(RefusesOne(), window_s=0.05), [1, 2, 3])
    assert isinstance(results[2], Rejected) and results[2].status == 409
    assert results[1]["state"] == results[3]["state"] == "failed"


class Down(fakes.FakeServer):
    def report_exits(self, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
        raise ServerError("exits: HTTP 502")


def test_a_failed_request_raises_in_every_caller_so_each_retries():
    results = report_together(ExitReporter(Down(), window_s=0.01), [1, 2])
    assert all(isinstance(r, ServerError) for r in results.values())


def test_other_calls_go_straight_to_the_client():
    server = fakes.FakeServer()
    reporter = ExitReporter(server)
    assert reporter.started(4, 0, 0, 99)["state"] == "running"
    assert server.calls == [
        ("started", {"job_id": 4, "attempt": 0, "replica": 0, "pid": 99, "started_at": None})
    ]


@pytest.mark.parametrize("n", [1, 300])
def test_every_report_is_answered_however_many(n):
    server = fakes.FakeServer()
    results = report_together(ExitReporter(server, window_s=0.01), list(range(1, n + 1)))
    assert len(results) == n and all(r["recorded"] for r in results.values())


class WithoutExits(fakes.FakeServer):
    """A control plane from before the ``exits`` endpoint."""

    def report_exits(self, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
        raise Rejected(404, {"detail": "Not found."})


def test_against_a_server_without_the_batch_endpoint_each_exit_is_reported_alone():
    server = WithoutExits()
    reporter = ExitReporter(server, window_s=0.01)
    results = report_together(reporter, [1, 2, 3])
    assert all(r["recorded"] for r in results.values())
    assert sorted(e["job_id"] for e in server.exits) == [1, 2, 3]
    assert reporter.batched is False

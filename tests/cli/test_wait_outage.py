"""A wait rides out a server it cannot reach: a CI step waiting on a long job must not fail
(exit 202) because the server restarted for longer than the client's own retries last."""

from __future__ import annotations

from typing import Any

import pytest
from tessera_cli import outcome
from tessera_cli.errors import CliError
from tessera_cli.waiting import OUTAGE_S, WaitTimeout, wait_for_end


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class Server:
    """Answers the job's reads from ``script``: a state, or None for "cannot reach" (each such
    answer costs what the client's retries would: 15 s)."""

    timeout = 30.0

    def __init__(self, clock: Clock, script: list[str | None]) -> None:
        self.clock, self.script, self.reads = clock, script, 0

    def get(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.reads += 1
        state = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if state is None:
            self.clock.now += 15.0
            raise CliError("cannot reach http://x/api/v1: Connection refused", outcome.UNREACHABLE)
        return {"id": 7, "state": state}


def test_a_restart_longer_than_the_retries_is_ridden_out(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    server = Server(clock, ["running", None, None, None, None, "succeeded"])
    job = wait_for_end(server, 7, None, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert job["state"] == "succeeded"
    err = capsys.readouterr().err
    assert err.count("still waiting for the job") == 1 and "Connection refused" in err


def test_with_a_wait_timeout_an_outage_past_it_is_a_wait_timeout_not_unreachable() -> None:
    clock = Clock()
    server = Server(clock, ["running", None])
    with pytest.raises(WaitTimeout) as timed_out:
        wait_for_end(server, 7, 120.0, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert timed_out.value.job["state"] == "running" and clock.now >= 120.0


def test_without_one_it_gives_up_after_the_outage_bound() -> None:
    clock = Clock()
    server = Server(clock, ["running", None])
    with pytest.raises(CliError) as failed:
        wait_for_end(server, 7, None, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert failed.value.code == outcome.UNREACHABLE and OUTAGE_S <= clock.now <= OUTAGE_S + 30


def test_other_errors_are_not_retried() -> None:
    clock = Clock()

    class Gone(Server):
        def get(self, path: str, **kwargs: Any) -> dict[str, Any]:
            if self.reads:
                raise CliError("job 7 not found", outcome.REFUSED_STATE)
            return super().get(path, **kwargs)

    server = Gone(clock, ["running"])
    with pytest.raises(CliError):
        wait_for_end(server, 7, None, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert server.reads == 1 and clock.now == 0.0

"""The job state machine: the allowed transitions, in one place (docs/api.md, "States")."""

from __future__ import annotations

from scheduling.choices import JobState as S

ALLOWED: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED}),
    S.SCHEDULED: frozenset({S.RUNNING, S.CANCELLED, S.PENDING, S.FAILED, S.SUCCEEDED, S.TERMINATING}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.TERMINATING, S.PENDING}),
    S.TERMINATING: frozenset({S.PENDING, S.CANCELLED, S.FAILED, S.SUCCEEDED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
# Notes on the less obvious edges:
# - scheduled → pending: the node was lost (lease expired) before the agent started the job.
# - scheduled → succeeded/failed: a very short job whose start and exit arrive in one report.
# - running → pending: a failed attempt with retries left, or a lost node (after its lease).
# - terminating → succeeded/failed: the process exited on its own during the grace period.


class InvalidTransition(Exception):
    """A state change the contract does not allow (a bug or a stale request, never silent)."""

    def __init__(self, job_id: int, current: str, target: str):
        super().__init__(f"job {job_id}: {current} → {target} is not allowed")
        self.current, self.target = current, target


def check_transition(job_id: int, current: str, target: str) -> None:
    if target not in ALLOWED.get(current, frozenset()):
        raise InvalidTransition(job_id, current, target)

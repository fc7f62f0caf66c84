"""The default ``Idempotency-Key`` of a submit inside a CI pipeline.

The key names the CI run, its attempt and the step, plus a digest of the job's body: a step that
is retried (or whose ``tessera submit`` retries after a lost answer) gets the first job back
instead of submitting again, while two steps, or two different jobs in one step, never share a
key. Outside a known CI, there is no default key (each submit makes a job).

| CI | run | attempt | step |
| --- | --- | --- | --- |
| GitHub Actions | ``GITHUB_RUN_ID`` | ``GITHUB_RUN_ATTEMPT`` | ``GITHUB_JOB`` + ``GITHUB_ACTION`` |
| GitLab CI | ``CI_PIPELINE_ID`` | — (a retried job is the same step) | ``CI_JOB_NAME`` |
| Jenkins | ``BUILD_TAG`` | — | ``STAGE_NAME`` |

GitLab's ``CI_JOB_ID`` and Jenkins's restarts change with every retry, so they are left out: a
retried GitLab job is the same step of the same pipeline. GitHub's "re-run" is a new attempt by
choice, so it submits anew.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

PROVIDERS: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    # (name, the variable that tells it is running, the run's variables, the step's variables)
    (
        "github",
        "GITHUB_ACTIONS",
        ("GITHUB_REPOSITORY", "GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT"),
        ("GITHUB_JOB", "GITHUB_ACTION"),
    ),
    ("gitlab", "GITLAB_CI", ("CI_PROJECT_ID", "CI_PIPELINE_ID"), ("CI_JOB_NAME",)),
    ("jenkins", "JENKINS_URL", ("BUILD_TAG",), ("STAGE_NAME",)),
]


def derive(env: Mapping[str, str], body_digest: str) -> str | None:
    """``tessera-<ci>-<hex>`` for the run, step and body; None outside a CI it knows."""
    for name, marker, run_vars, step_vars in PROVIDERS:
        if not env.get(marker):
            continue
        run = [env.get(v, "") for v in run_vars]
        if not any(run):
            return None
        parts = [name, *run, *(env.get(v, "") for v in step_vars), body_digest]
        digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:40]
        return f"tessera-{name}-{digest}"
    return None

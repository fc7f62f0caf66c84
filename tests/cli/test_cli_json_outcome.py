"""``tessera submit --wait -o json`` always prints its outcome as JSON (docs/cli.md: the GitLab
step keeps it as ``outcome.json``, ``when: always``), also when no job came of it: a refused
token, a body the server refused, a failing or unreachable server. Then ``job`` is null,
``outcome`` is ``error``, ``error`` says why and ``cli_exit_code`` is the code it exits with.
"""

from __future__ import annotations

import json

import pytest
import yaml
from tessera_cli import outcome

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers

FAILURES = {
    "a refused token": (401, b'{"detail": "Invalid token."}', outcome.AUTH),
    "a refused body": (400, b'{"gpus": ["must be at most 4096"]}', outcome.BAD_INPUT),
    "a failing server": (500, b'{"detail": "A server error occurred."}', outcome.UNREACHABLE),
    "a sign-in page": (200, b"<html>Sign in</html>", outcome.UNREACHABLE),
}


@pytest.mark.parametrize("failure", [*FAILURES, "no server"])
@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_a_submit_that_made_no_job_still_prints_its_outcome(canned_server, run_tessera, failure, fmt):
    url, canned = canned_server
    if failure in FAILURES:
        canned.status, canned.body, code = FAILURES[failure]
    else:
        url, code = NOWHERE, outcome.UNREACHABLE
    result = run_tessera(url, "submit", "--wait", "-o", fmt, "--", "true")
    assert result.returncode == code, (result.stdout, result.stderr)
    printed = json.loads(result.stdout) if fmt == "json" else yaml.safe_load(result.stdout)
    assert printed["job"] is None and printed["outcome"] == "error", printed
    assert printed["cli_exit_code"] == code and printed["error"], printed
    assert result.stderr.startswith("tessera: ") and result.stderr.count("\n") == 1, result.stderr


def test_a_quota_refusal_keeps_its_own_outcome(canned_server, run_tessera):
    url, canned = canned_server
    canned.status, canned.body = 400, b'{"accelerators": ["no quota of tenant vision admits 8 GPUs"]}'
    result = run_tessera(url, "submit", "--wait", "-o", "json", "--", "true")
    assert result.returncode == outcome.UNSCHEDULABLE
    assert json.loads(result.stdout)["outcome"] == "refused"


def test_a_refused_token_says_how_to_store_a_new_one(canned_server, run_tessera):
    url, canned = canned_server
    canned.status, canned.body = 401, b'{"detail": "Invalid token."}'
    result = run_tessera(url, "ls")
    assert result.returncode == outcome.AUTH
    assert result.stderr == "tessera: Invalid token. (HTTP 401; `tessera login` stores a new token)\n"

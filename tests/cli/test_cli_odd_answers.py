"""The ``tessera`` command against a server whose 2xx answers are not the API's JSON: a sign-in
page of a proxy in front, the portal instead of the API (a wrong ``TESSERA_URL``), a body cut
short. Each command must say so in one line and exit 202 (the server failing), never print the
page as if it were the answer and exit 0, never a Python error with the "bad input" code, and
never page through such a list forever; ``login`` must save nothing.
"""

from __future__ import annotations

import json
import time

import pytest
from tessera_cli import outcome

ANSWERS = {
    "an html page": (b"<!doctype html><html><body>Sign in to continue</body></html>", "text/html"),
    "a json string": (b'"ok"', "application/json"),
    "a json list where an object is due": (b"[1, 2]", "application/json"),
    "an empty body": (b"", "application/json"),
}
# Read by the commands that list: a page whose results are not a list of objects, which a
# command paging by ``next`` would otherwise follow forever.
BAD_PAGE = (
    b'{"count": 9, "next": "http://x/?offset=1", "previous": null, "results": "abc"}',
    "application/json",
)

COMMANDS = [
    ["ls"],
    ["status", "1"],
    ["why", "1"],
    ["events", "1"],
    ["logs", "1"],
    ["cancel", "1"],
    ["quota"],
    ["nodes"],
    ["submit", "--", "true"],
    ["submit", "--wait", "--", "true"],
    ["webhooks", "ls"],
    ["webhooks", "add", "https://ci.example.org/hook"],
]


LISTING = [["ls"], ["events", "1"], ["quota"], ["nodes"], ["webhooks", "ls"], ["webhooks", "deliveries", "1"]]


@pytest.mark.parametrize("kind", [*ANSWERS, "a page whose results are not a list"])
def test_an_answer_that_is_not_the_apis_json_is_one_line_and_exit_202(canned_server, run_tessera, kind):
    url, canned = canned_server
    canned.body, canned.content_type = ANSWERS.get(kind, BAD_PAGE)
    for args in COMMANDS if kind in ANSWERS else LISTING:
        result = run_tessera(url, *args)
        said = (args, result.returncode, result.stdout[:200], result.stderr[:300])
        assert result.returncode == outcome.UNREACHABLE, said
        assert result.stderr.startswith("tessera: ") and result.stderr.count("\n") == 1, said
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr, said
        assert "Sign in" not in result.stdout, said


def test_login_to_something_that_is_not_the_api_saves_nothing(canned_server, run_tessera, tmp_path):
    url, canned = canned_server
    canned.body, canned.content_type = ANSWERS["an html page"]
    for extra in ([], ["--keep-token"]):
        result = run_tessera(url, "login", "--token-stdin", *extra, stdin="tsr_test\n")
        assert result.returncode == outcome.UNREACHABLE, (extra, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
        assert not (tmp_path / "config.json").exists()


def test_a_delete_answered_204_without_a_body_is_still_a_success(canned_server, run_tessera):
    url, canned = canned_server
    canned.status, canned.body = 204, b""  # what the API answers a DELETE: no content
    result = run_tessera(url, "webhooks", "rm", "1")
    assert result.returncode == 0, (result.stdout, result.stderr)


@pytest.mark.parametrize(
    "args", [["submit", "--", "true"], ["cancel", "1"], ["webhooks", "rm", "1"], ["login", "--token-stdin"]]
)
def test_a_write_the_server_redirects_is_refused_not_replayed_as_a_read(canned_server, run_tessera, args):
    """An http:// URL redirected to https:// (or a moved server): following the 301 would turn the
    POST into a GET of the list, which the command would take as the job it submitted."""
    url, canned = canned_server
    canned.redirect_writes_to = "/api/v1/jobs/"
    canned.body = b'{"count": 0, "next": null, "previous": null, "results": []}'
    result = run_tessera(url, *args, stdin="tsr_test\n")
    assert result.returncode == outcome.UNREACHABLE, (result.stdout, result.stderr)
    assert "redirect" in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("follow", [[], ["--follow"]])
def test_wait_timeout_bounds_the_command_even_when_the_server_hangs(hanging_server, run_tessera, follow):
    started = time.monotonic()
    result = run_tessera(
        hanging_server, "submit", "--wait", *follow, "--wait-timeout", "2", "-o", "json", "--", "echo"
    )
    took = time.monotonic() - started
    assert result.returncode == 204, result.stderr
    assert took < 15, took  # 2 s, and one last read's 5 s: not the 30 s of a read's own timeout
    answer = json.loads(result.stdout)
    assert answer["outcome"] == "wait-timeout" and answer["job"]["id"] == 7
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["ls", "--limit", "0"],
        ["status"],
        ["nope"],
        ["submit", "--bogus", "--", "echo"],
        ["submit", "--wait", "--wait-timeout", "nan", "--", "echo"],
    ],
)
def test_a_bad_option_or_argument_is_one_line_naming_it_and_exit_200(canned_server, run_tessera, args):
    url, _ = canned_server
    result = run_tessera(url, *args)
    assert result.returncode == outcome.BAD_INPUT
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("tessera: "), (
        result.stderr
    )
    assert result.stdout == ""


@pytest.mark.parametrize("fmt", [["-o", "json"], ["-ojson"], ["--output=json"]])
def test_a_submit_asked_for_json_prints_its_outcome_even_when_its_options_are_bad(
    canned_server, run_tessera, fmt
):
    url, _ = canned_server
    result = run_tessera(url, "submit", *fmt, "--wait", "--wait-timeout", "-1", "--", "echo")
    assert result.returncode == outcome.BAD_INPUT
    answer = json.loads(result.stdout)
    assert answer["job"] is None and answer["outcome"] == "error" and "--wait-timeout" in answer["error"]


@pytest.mark.parametrize(
    ("args", "words"),
    [(["login"], "--token-stdin"), (["login", "--token-stdin"], "--url")],
)
def test_login_without_a_terminal_says_what_to_give_in_one_line(run_tessera, tmp_path, args, words):
    url = "" if "--token-stdin" in args else "http://127.0.0.1:9"  # "": no server given either
    result = run_tessera(url, *args)
    assert result.returncode == outcome.BAD_INPUT, result.stderr
    assert result.stderr.count("\n") == 1 and "no terminal" in result.stderr and words in result.stderr
    assert not (tmp_path / "config.json").exists()


@pytest.fixture
def silent_server():
    """A server that takes connections and never answers."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


@pytest.mark.parametrize("how", [["--timeout", "1"], ["TESSERA_TIMEOUT=1"]])
def test_a_silent_server_is_given_up_on_after_the_timeout_asked_for(silent_server, run_tessera, how):
    # Without --timeout each request waited 30 s (and each retry again): a CI step against a hung
    # server could not say how long it was willing to wait.
    args = how if how[0].startswith("--") else []
    env = dict(part.split("=", 1) for part in how if "=" in part)
    result = run_tessera(silent_server, *args, "ls", env=env)
    assert result.returncode == outcome.UNREACHABLE, result.stderr
    assert result.stderr == f"tessera: {silent_server}/api/v1 did not answer in 1 s\n"


def test_a_timeout_that_is_not_a_number_of_seconds_is_bad_input(run_tessera):
    result = run_tessera("http://127.0.0.1:9", "--timeout", "0", "ls")
    assert result.returncode == outcome.BAD_INPUT and "--timeout" in result.stderr


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_server_still_refusing_for_load_or_failing_after_the_retries_exits_202(
    canned_server, run_tessera, status
):
    url, canned = canned_server
    canned.status, canned.body = status, b'{"detail": "Request was throttled."}'
    result = run_tessera(url, "ls")
    assert result.returncode == outcome.UNREACHABLE, result.stderr
    assert result.stderr == f"tessera: the server answered HTTP {status}: Request was throttled.\n"

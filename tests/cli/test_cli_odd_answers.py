"""The ``tessera`` command against a server whose 2xx answers are not the API's JSON: a sign-in
page of a proxy in front, the portal instead of the API (a wrong ``TESSERA_URL``), a body cut
short. Each command must say so in one line and exit 202 (the server failing), never print the
page as if it were the answer and exit 0, never a Python error with the "bad input" code, and
never page through such a list forever; ``login`` must save nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tessera_cli import outcome

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "cli"

SIGN_IN_PAGE = (b"<!doctype html><html><body>Sign in to continue</body></html>", "text/html")
ANSWERS = {
    "an html page": SIGN_IN_PAGE,
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


@pytest.fixture
def odd_server() -> Iterator[tuple[str, dict[str, tuple]]]:
    """A server answering every request with ``answer["status"]`` (200) and ``answer["now"]``."""
    answer: dict[str, tuple] = {"now": SIGN_IN_PAGE, "status": (200,)}

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body, content_type = answer["now"]
            self.send_response(answer["status"][0])
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answer
    finally:
        server.shutdown()
        server.server_close()


def tessera(url: str, tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "GITHUB_", "CI_"))}
    env.update(
        TESSERA_URL=url,
        TESSERA_TOKEN="tsr_test",
        TESSERA_RETRIES="0",
        TESSERA_CONFIG=str(tmp_path / "config.json"),
        PYTHONPATH=str(CLIENT),  # this checkout's client, wherever the installed one came from
    )
    code = "import sys; from tessera_cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
    )


LISTING = [["ls"], ["events", "1"], ["quota"], ["nodes"], ["webhooks", "ls"], ["webhooks", "deliveries", "1"]]


@pytest.mark.parametrize("kind", [*ANSWERS, "a page whose results are not a list"])
def test_an_answer_that_is_not_the_apis_json_is_one_line_and_exit_202(odd_server, tmp_path, kind):
    url, answer = odd_server
    answer["now"] = ANSWERS.get(kind, BAD_PAGE)
    for args in COMMANDS if kind in ANSWERS else LISTING:
        result = tessera(url, tmp_path, *args)
        said = (args, result.returncode, result.stdout[:200], result.stderr[:300])
        assert result.returncode == outcome.UNREACHABLE, said
        assert result.stderr.startswith("tessera: ") and result.stderr.count("\n") == 1, said
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr, said
        assert "Sign in" not in result.stdout, said


def test_login_to_something_that_is_not_the_api_saves_nothing(odd_server, tmp_path):
    url, _ = odd_server
    for extra in ([], ["--keep-token"]):
        result = tessera(url, tmp_path, "login", "--token-stdin", *extra, stdin="tsr_test\n")
        assert result.returncode == outcome.UNREACHABLE, (extra, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
        assert not (tmp_path / "config.json").exists()


def test_a_delete_answered_204_without_a_body_is_still_a_success(odd_server, tmp_path):
    url, answer = odd_server
    answer["now"] = (b"", "application/json")
    answer["status"] = (204,)  # what the API answers a DELETE: no content
    result = tessera(url, tmp_path, "webhooks", "rm", "1")
    assert result.returncode == 0, (result.stdout, result.stderr)

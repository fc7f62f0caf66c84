"""The pooled ASGI handler (``controlplane/pooled_handler.py``), as daphne runs it with PostgreSQL.

Sync views run with the whole middleware chain in a pooled thread; the agents' long-poll, marked
``without_middleware``, is called directly on the event loop and still answers as the contract
says (401 with its challenge, the wake answer).
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator

from tests.agent import helpers as h


@pytest.fixture
def handler(transactional_db, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.TESSERA = {**settings.TESSERA, "WEB_THREADS": 2}
    from controlplane.pooled_handler import PooledASGIHandler

    return PooledASGIHandler()


def _get(app, path: str, query: str = "", auth: str | None = None) -> tuple[int, dict, dict]:
    return _call(app, "GET", path, query, auth)


def _call(
    app, method: str, path: str, query: str = "", auth: str | None = None, body: bytes = b""
) -> tuple[int, dict, dict]:
    headers = [(b"host", b"testserver")] + ([(b"authorization", auth.encode())] if auth else [])
    if body:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": headers,
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1),
    }

    async def go():
        talk = ApplicationCommunicator(app, scope)
        # the body in two messages, as a server may deliver it
        await talk.send_input({"type": "http.request", "body": body[:5], "more_body": True})
        await talk.send_input({"type": "http.request", "body": body[5:], "more_body": False})
        start = await talk.receive_output(10)
        answer = await talk.receive_output(10)
        return start, answer

    start, answer = async_to_sync(go)()
    response_headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], response_headers, json.loads(answer["body"] or b"{}")


def test_a_sync_view_runs_with_the_middleware_in_the_pool(handler, world):
    status, headers, body = _get(handler, "/api/v1/jobs/", auth=f"Token {world.tokens['alice']}")
    assert status == 200 and body["count"] == 0
    assert headers["x-frame-options"] == "DENY"  # the middleware chain ran


def test_a_post_reaches_its_view_with_its_body_and_what_it_stores_is_kept(handler, world):
    from scheduling.models import Job

    body = json.dumps({"name": "via-pool", "kind": "batch", "command": ["true"], "gpus": 1}).encode()
    auth = f"Token {world.tokens['alice']}"
    status, _, answer = _call(handler, "POST", "/api/v1/jobs/", auth=auth, body=body)
    assert status == 201 and answer["name"] == "via-pool"
    assert Job.objects.get(pk=answer["id"]).name == "via-pool"


def test_a_bad_body_is_a_400_naming_the_field(handler, world):
    body = json.dumps({"name": "bad", "kind": "batch", "command": ["true"], "gpus": -1}).encode()
    auth = f"Token {world.tokens['alice']}"
    status, _, answer = _call(handler, "POST", "/api/v1/jobs/", auth=auth, body=body)
    assert status == 400 and "gpus" in answer


def test_the_long_poll_is_served_without_the_middleware_and_answers_as_before(handler):
    _, answer = h.register(h.new_join_token(), "pool-01")
    status, headers, body = _get(handler, "/api/v1/agent/wait", "timeout=0", f"Node {answer['credential']}")
    assert (status, body) == (200, {"wake": False})
    assert "x-frame-options" not in headers  # no middleware: the view alone


def test_the_long_poll_still_refuses_a_bad_credential_with_its_challenge(handler):
    status, headers, body = _get(handler, "/api/v1/agent/wait", "timeout=0", "Node nope")
    assert status == 401 and headers["www-authenticate"] == "Node" and "detail" in body


def test_an_unknown_path_is_still_a_404(handler, world):
    status, _, _ = _get(handler, "/api/v1/nothing-here/", auth=f"Token {world.tokens['alice']}")
    assert status == 404

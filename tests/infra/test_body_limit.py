"""A request body past TESSERA_MAX_BODY_BYTES is a 413 before the web process stores it: the
README's "request body limit (413 above it)", held for anonymous clients too, whose bodies Django's
ASGI handler otherwise reads whole (to a temporary file) before any authentication."""

from __future__ import annotations

import asyncio
import json

from django.conf import settings

from controlplane.asgi import application

CHUNK = 64 * 1024


def post(total: int, declare: bool) -> tuple[int, int, dict]:
    """POST ``total`` bytes to /api/v1/jobs/ with no credential, in chunks: (chunks read, status,
    JSON answer)."""
    read, status, _, body = post_raw(total, declare, path="/api/v1/jobs/")
    return read, status, json.loads(body)


def post_raw(
    total: int, declare: bool, path: str, accept: bytes | None = None
) -> tuple[int, int, dict[bytes, bytes], bytes]:
    """POST ``total`` bytes to ``path``: (chunks read, status, headers, body)."""
    sent = 0
    out: list[dict] = []

    async def receive() -> dict:
        nonlocal sent
        if sent >= total:
            await asyncio.sleep(60)  # nothing more comes: only a reader past the end waits here
        sent += CHUNK
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": sent < total}

    async def send(message: dict) -> None:
        out.append(message)

    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    if accept is not None:
        headers.append((b"accept", accept))
    if declare:
        headers.append((b"content-length", str(total).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(asyncio.wait_for(application(scope, receive, send), 30))
    (start,) = [m for m in out if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in out if m["type"] == "http.response.body")
    return sent // CHUNK, start["status"], dict(start["headers"]), body


def test_a_declared_body_over_the_limit_is_refused_before_a_byte_is_read():
    read, status, answer = post(64 * 1024 * 1024, declare=True)
    assert (read, status, answer) == (0, 413, {"detail": "Request body is too large."})


def test_a_chunked_body_is_read_no_further_than_just_past_the_limit():
    read, status, answer = post(64 * 1024 * 1024, declare=False)
    assert status == 413 and answer == {"detail": "Request body is too large."}
    assert read <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE // CHUNK + 1


def test_a_body_within_the_limit_reaches_the_api_as_before():
    read, status, _ = post(CHUNK, declare=True)
    assert (read, status) == (1, 401)  # no credential


BROWSER_ACCEPT = b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def test_a_browsers_form_over_the_limit_gets_a_page_that_says_so_not_json():
    """A job file of more than 1 MiB pasted into the portal's form showed the person a bare
    {"detail": ...} in place of a page."""
    for declare in (True, False):
        _, status, headers, body = post_raw(
            4 * 1024 * 1024, declare=declare, path="/jobs/new/", accept=BROWSER_ACCEPT
        )
        page = body.decode()
        assert status == 413 and headers[b"content-type"] == b"text/html; charset=utf-8"
        assert "Too large to send" in page and "(1 MiB)" in page and "nothing was stored" in page
        assert "<script" not in page and "style=" not in page
        assert headers[b"x-frame-options"] == b"DENY" and headers[b"cache-control"] == b"no-store"


def test_an_api_client_that_accepts_anything_still_gets_json():
    _, status, _, body = post_raw(4 * 1024 * 1024, declare=True, path="/api/v1/jobs/", accept=b"*/*")
    assert status == 413 and json.loads(body) == {"detail": "Request body is too large."}

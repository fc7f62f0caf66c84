"""Request bodies past ``TESSERA_MAX_BODY_BYTES`` refused before they are read: 413.

Django's ASGI handler reads a request's whole body into a temporary file (in memory, then on
disk) before any middleware, authentication or view runs; ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is
checked only when a view reads the body. So any client, signed in or not, could make a web
process write as much as it sent to its temporary directory, and got its 401 or 413 only once
all of it was stored (a 64 MiB anonymous POST: every byte read, then 401). This wrapper refuses a
declared ``Content-Length`` over the limit at once, reading nothing, and stops reading a body
sent without one (chunked) as soon as it passes the limit. A browser's form (a request that
accepts HTML) gets a page that says so in words; every other client, the JSON ``detail``.

Under daphne this saves Django's copy, not Twisted's: daphne calls the application only once
Twisted has received the whole request (into memory, or a temporary file past 100 kB). A server
that streams bodies (uvicorn) stops at the limit; behind daphne, a proxy's body limit does.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[..., Awaitable[None]]  # an ASGI application (Django's handlers type their own scope)

TOO_LARGE = json.dumps({"detail": "Request body is too large."}).encode()


def declared_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else None
    return None


# No script, no inline style, nothing from another site: it keeps to the portal's
# Content-Security-Policy, sent with it since Django's middleware never sees this answer.
TOO_LARGE_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Too large to send · Tessera</title>
<link rel="stylesheet" href="/static/frontend/tessera.css"></head>
<body><main class="login-card" id="too-large"><h1>Too large to send</h1>
<p>What the form sent was larger than the server takes ({limit}), so nothing was stored.</p>
<p>Go back (what you typed is still in the form) and make it smaller: a job file or command that
large is refused by the API too.</p>
<p><a href="/">Dashboard</a> · <a href="/jobs/">Jobs</a></p></main></body></html>
"""


def size_in_words(limit: int) -> str:
    """``1048576`` → ``"1 MiB"``; a limit not a whole number of KiB in bytes."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if limit % scale == 0:
            return f"{limit // scale} {unit}"
    return f"{limit} bytes"


def wants_html(scope: dict[str, Any]) -> bool:
    """A browser's request (navigation or form) accepts ``text/html``; API clients do not ask."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"accept":
            return b"text/html" in value.lower()
    return False


async def refuse(send: Send, scope: dict[str, Any], limit: int) -> None:
    if wants_html(scope):
        body, kind = TOO_LARGE_PAGE.format(limit=size_in_words(limit)).encode(), b"text/html; charset=utf-8"
    else:
        body, kind = TOO_LARGE, b"application/json"
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
    if kind.startswith(b"text/html"):
        headers += [
            (b"cache-control", b"no-store"),
            (b"x-frame-options", b"DENY"),
            (b"x-content-type-options", b"nosniff"),
            (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'"),
        ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: HTTP requests whose body is larger than ``limit`` bytes get 413."""

    def __init__(self, app: App, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.limit:
            await refuse(send, scope, self.limit)
            return
        read = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal read, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.limit:
                    over = True  # Django's handler stops reading at a disconnect, answering nothing
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited_receive, tracked_send)
        if over and not started:
            await refuse(send, scope, self.limit)

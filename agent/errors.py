"""How a call to the server fails, for every transport the agent speaks (HTTP and the stream)."""

from __future__ import annotations

from typing import Any


class ServerError(Exception):
    """The server could not be reached or answered 5xx: try again later."""


class ServerBusy(ServerError):
    """The server took the connection but cannot serve it now (it closed the stream with 4013,
    "try again later": its Redis is away): a failure like any other, not a session that went
    well, so the agent backs off before it tries again."""


class Rejected(Exception):
    """The server refused the request (4xx): retrying the same request will not help."""

    def __init__(self, status: int, body: Any):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body

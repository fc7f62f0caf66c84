"""How a call to the server fails, for every transport the agent speaks (HTTP and the stream)."""

from __future__ import annotations

from typing import Any


class ServerError(Exception):
    """The server could not be reached or answered 5xx: try again later."""


class Rejected(Exception):
    """The server refused the request (4xx): retrying the same request will not help."""

    def __init__(self, status: int, body: Any):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body

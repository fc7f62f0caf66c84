"""What authenticated a caller, kept in the web process for a few seconds.

Every API request needs its caller (a person's token, an agent's node credential): one query each
time was a sizeable share of a web process's CPU (docs/benchmarks/requests.md). An entry lives
``ttl_s`` seconds; a change that could make it wrong (a token, a user, a node saved or deleted:
the callers connect :meth:`ProcessCache.forget` to those signals) empties this process's cache at
once. Other web processes notice within ``ttl_s``.
"""

from __future__ import annotations

import time
from typing import Any


class ProcessCache:
    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._entries: dict[str, tuple[float, Any]] = {}  # key -> (expires, value)

    def get(self, key: str) -> Any | None:
        """The value kept for ``key`` less than ``ttl_s`` ago, or None."""
        hit = self._entries.get(key)
        return hit[1] if hit is not None and hit[0] > time.monotonic() else None

    def put(self, key: str, value: Any) -> None:
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + self.ttl_s, value)

    def forget(self, **_: Any) -> None:
        """Empty the cache (a signal receiver)."""
        self._entries.clear()

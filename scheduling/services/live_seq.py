"""The live updates' sequence: a number that grows with every batch the outlet sends, so that a
dashboard may ask for its snapshot while its socket is still joining, and still lose nothing.

1. The outlet takes the next number (:func:`take`) after commit and before it sends; every
   message of the batch carries it as ``seq``.
2. The snapshot reads the current number (:func:`current`) before it reads the database: any
   message numbered at most that was committed before the read, so the snapshot shows it (or
   something newer).
3. A socket reads the current number once it has joined its groups and says it in ``ready``:
   any message numbered above that reaches the socket. The socket drops messages numbered at
   most that (a snapshot at least as new shows them).

So a snapshot numbered at least the socket's ``ready`` misses nothing, and the page drops the
frames numbered at most the snapshot's; an older snapshot is fetched again (docs/websockets.md).

Across processes (``REDIS_URL`` set) the number is one Redis key; in the embedded default (the
in-memory channel layer: everything in this process) a counter in this process. Redis down: 0,
and messages go without a number (the page applies them, as before there was one).
"""

from __future__ import annotations

import threading

import redis
from django.conf import settings

from scheduling.services import redis_flags, redis_outage

_local_last = 0  # the last number taken in this process (no REDIS_URL)
_guard = threading.Lock()


def _key() -> str:
    return redis_flags.key("live-seq")


def take() -> int | None:
    """The next number, for a batch about to be sent (None: Redis does not answer)."""
    global _local_last
    if not settings.REDIS_URL:
        with _guard:
            _local_last += 1
            return _local_last
    try:
        number = int(redis_flags.client().incr(_key()))
    except redis.RedisError as exc:
        redis_outage.failed("live sequence not taken", exc)
        return None
    redis_outage.answered()
    return number


def current() -> int:
    """The last number taken (0: none yet, or Redis does not answer)."""
    if not settings.REDIS_URL:
        with _guard:
            return _local_last
    try:
        return int(redis_flags.client().get(_key()) or 0)
    except redis.RedisError as exc:
        redis_outage.failed("live sequence not read", exc)
        return 0

"""Per-user request limits: a runaway script gets 429 with ``Retry-After``, not the whole web tier.

Two budgets per user, each a fixed window counted where every web process sees it (Redis when the
cluster has one; in process for the embedded default): ``api`` for every request of the user API,
and ``submit`` for job submissions (views that say ``throttle_scope = "jobs"``, action ``create``,
and the portal's submit form).
Operators are limited like everyone. Agents are not people: their credentials are never limited
here (their request rate is bounded by the agent protocol itself).

Rates come from ``settings.TESSERA_RATE_LIMITS`` (``{"submit": (1200, 60), "api": (6000, 60)}``,
count per period in seconds; environment ``TESSERA_RATE_LIMIT_SUBMIT`` / ``TESSERA_RATE_LIMIT_API``
as ``N/s``, ``N/m``, ``N/h`` or ``off``). If Redis cannot be reached the request is allowed:
limits protect the service, they must never be the reason it refuses work.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from django.conf import settings
from rest_framework.throttling import BaseThrottle

from scheduling.services import redis_flags, redis_outage

log = logging.getLogger("tessera.api")


class _LocalCounters:
    """Fixed-window counters in this process (the embedded default has one web process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, int], int] = {}

    def hit(self, key: str, window: int) -> int:
        with self.lock:
            if len(self.counts) > 10_000:  # old windows: forget them
                self.counts = {k: v for k, v in self.counts.items() if k[1] >= window}
            n = self.counts.get((key, window), 0) + 1
            self.counts[(key, window)] = n
            return n

    def clear(self) -> None:
        with self.lock:
            self.counts.clear()


local_counters = _LocalCounters()


def forget_counts() -> None:
    """Start every budget afresh (tests; an operator after raising a limit needs no restart)."""
    local_counters.clear()
    if settings.REDIS_URL:
        try:
            client = redis_flags.client()
            keys = list(client.scan_iter(match=redis_flags.key("rate:*"), count=1000))
            if keys:
                client.delete(*keys)
        except redis.RedisError:
            log.warning("rate-limit counts not cleared: Redis unreachable")


def _hit(key: str, window: int, period: int) -> int:
    if not settings.REDIS_URL:
        return local_counters.hit(key, window)

    name = redis_flags.key(f"rate:{key}:{window}")
    try:
        pipe = redis_flags.client().pipeline(transaction=False)
        pipe.incr(name)
        pipe.expire(name, period + 1)
        count = int(pipe.execute()[0])
    except redis.RedisError as exc:
        redis_outage.failed("rate limit not counted", exc)
        return 0
    redis_outage.answered()
    return count


def over_limit(user, scopes: list[str]) -> float | None:
    """Count one request of ``user`` against each budget of ``scopes``: None while within them,
    else the seconds until the exceeded budget's window ends (its ``Retry-After``). The API's
    throttle and the portal's submit form both count here, so the form is no way around the
    ``submit`` budget."""
    limits = settings.TESSERA_RATE_LIMITS
    now = time.time()
    for scope in scopes:
        rate = limits.get(scope)
        if rate is None:
            continue
        count, period = rate
        window = int(now // period)
        if _hit(f"{scope}:{user.pk}", window, period) > count:
            return max(1.0, (window + 1) * period - now)
    return None


class UserRateLimit(BaseThrottle):
    """The ``api`` budget for every user request, and ``submit`` for job submissions."""

    def __init__(self) -> None:
        self.retry_after: float | None = None

    def allow_request(self, request, view) -> bool:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or user.pk is None:  # anonymous, or an agent
            return True
        scopes = ["api"]
        if getattr(view, "throttle_scope", None) == "jobs" and getattr(view, "action", None) == "create":
            scopes.append("submit")
        self.retry_after = over_limit(user, scopes)
        return self.retry_after is None

    def wait(self) -> float | None:
        return self.retry_after

"""Tiny flags in Redis shared by all workers (e.g. "one more pass"): losing them loses no job.

Keys are ``tessera:<database name>:<flag>``: one cluster's flags are shared by its web and worker
processes, and two clusters (or test runs, or the benchmark) on one Redis never see each other's.
"""

from __future__ import annotations

import functools
import logging

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from controlplane.env import redis_db_url

log = logging.getLogger("tessera.flags")


def key(name: str) -> str:
    return f"tessera:{settings.DATABASES['default']['NAME']}:{name}"


@functools.lru_cache(maxsize=1)
def client() -> redis.Redis:
    return redis.Redis.from_url(redis_db_url(settings.REDIS_URL, 2), socket_timeout=2)


# A scrape (docs/metrics.md, ``tessera_redis_available``) must answer within Prometheus's timeout
# even when Redis's host drops packets: one second to connect and to read, never a retry.
PROBE_TIMEOUT_S = 1.0


@functools.lru_cache(maxsize=2)
def _probe_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        redis_db_url(url, 2),
        socket_timeout=PROBE_TIMEOUT_S,
        socket_connect_timeout=PROBE_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )


def answers() -> bool:
    """Whether Redis answers a PING now (within :data:`PROBE_TIMEOUT_S`)."""
    try:
        return bool(_probe_client(settings.REDIS_URL).ping())
    except redis.RedisError:
        return False


def set_flag(name: str, ttl_s: int = 60) -> None:
    try:
        client().set(key(name), "1", ex=ttl_s)
    except redis.RedisError:
        log.warning("could not set flag %s", name)


def take_flag(name: str) -> bool:
    try:
        return client().getdel(key(name)) is not None
    except redis.RedisError:
        return False


def set_flags(name: str, once: str, ttl_s: int = 60, once_ttl_s: int = 30) -> bool:
    """Set flag ``name``, and flag ``once`` unless it is set, in one round trip. True if this call
    set ``once``; on a Redis error, True (act)."""
    try:
        pipe = client().pipeline(transaction=False)
        pipe.set(key(name), "1", ex=ttl_s)
        pipe.set(key(once), "1", ex=once_ttl_s, nx=True)
        return bool(pipe.execute()[1])
    except redis.RedisError:
        return True


# Atomic, so that a flag set by another process between the test and the delete is never lost.
_CLEAR_UNLESS = "if redis.call('exists', KEYS[2]) == 1 then return 1 end redis.call('del', KEYS[1]) return 0"


def clear_unless(name: str, unless: str) -> bool:
    """Clear flag ``name`` unless flag ``unless`` is set, atomically. True if ``unless`` was set
    (``name`` then stays); on a Redis error, False."""
    try:
        return bool(client().eval(_CLEAR_UNLESS, 2, key(name), key(unless)))
    except redis.RedisError:
        return False

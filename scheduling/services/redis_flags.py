"""Tiny flags in Redis shared by all workers (e.g. "one more pass"): losing them loses no job.

Keys are ``tessera:<database name>:<flag>``: one cluster's flags are shared by its web and worker
processes, and two clusters (or test runs, or the benchmark) on one Redis never see each other's.
"""

from __future__ import annotations

import functools
import logging

import redis
from django.conf import settings

from controlplane.env import redis_db_url

log = logging.getLogger("tessera.flags")


def key(name: str) -> str:
    return f"tessera:{settings.DATABASES['default']['NAME']}:{name}"


@functools.lru_cache(maxsize=1)
def client() -> redis.Redis:
    return redis.Redis.from_url(redis_db_url(settings.REDIS_URL, 2), socket_timeout=2)


def set_flag(name: str, ttl_s: int = 60) -> None:
    try:
        client().set(key(name), "1", ex=ttl_s)
    except redis.RedisError:
        log.warning("could not set flag %s", name)


def set_flag_once(name: str, ttl_s: int = 30) -> bool:
    """Set the flag unless it is set; True if this call set it. On a Redis error, True (act)."""
    try:
        return bool(client().set(key(name), "1", ex=ttl_s, nx=True))
    except redis.RedisError:
        return True


def take_flag(name: str) -> bool:
    try:
        return client().getdel(key(name)) is not None
    except redis.RedisError:
        return False

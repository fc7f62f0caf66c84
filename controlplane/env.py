"""Typed helpers for env-driven settings: each fails loudly, naming the variable, on a bad value."""

from __future__ import annotations

import logging
import math
import os
import secrets
from typing import Any
from urllib.parse import unquote, urlparse, urlsplit

import dj_database_url

from scheduling.engine.config import KNOBS, EngineConfig, KnobError, configure


class ImproperlyConfiguredEnv(SystemExit):
    """A setting's environment variable holds a value that cannot be used.

    A ``SystemExit``: raised while the settings load (manage.py, daphne, the Celery worker and
    beat), it stops the process with its message on stderr and status 1, and no traceback. An
    ordinary exception printed a page of traceback with the message on its last line, and the
    Celery CLI wrapped it in "Couldn't import 'controlplane'" and exited 2. Nothing but the
    settings calls these helpers, so it never stops a running process."""

    def __init__(self, message: str) -> None:
        super().__init__(message)  # ``code``: printed by the interpreter, which exits 1


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfiguredEnv(f"{name}={raw!r}: expected true/false, 1/0, yes/no or on/off")


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: expected an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: must be at least {minimum}")
    return value


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: expected a number") from None
    if not _finite_from(value, minimum):
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: must be a finite number{_at_least(minimum)}")
    return value


def _finite_from(value: float, minimum: float | None) -> bool:
    return math.isfinite(value) and (minimum is None or value >= minimum)


def _at_least(minimum: float | None) -> str:
    return f" >= {minimum}" if minimum is not None else ""


def env_floats(name: str, default: list[float], minimum: float | None = None) -> list[float]:
    """A comma-separated list of finite numbers (``900,2700``), each at least ``minimum``."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    values: list[float] = []
    for item in (item.strip() for item in raw.split(",")):
        if not item:
            continue
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not _finite_from(value, minimum):
            raise ImproperlyConfiguredEnv(
                f"{name}={raw!r}: expected comma-separated finite numbers{_at_least(minimum)}, not {item!r}"
            )
        values.append(value)
    return values


def env_bounds(name: str, default: list[float]) -> list[float]:
    """Two numbers ``low,high`` (``0.01,0.2``), each finite and at least 0, low not above high.
    Read as any list of numbers, ``0.5`` or ``7200,300`` started the process and then failed
    each request that read the bounds (an IndexError: 500), or refused every override."""
    if not os.environ.get(name, "").strip():
        return default
    values = env_floats(name, default, minimum=0.0)
    if len(values) != 2 or values[0] > values[1]:
        raise ImproperlyConfiguredEnv(
            f"{name}={os.environ.get(name)!r}: expected two numbers low,high with low <= high"
        )
    return values


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_url(name: str, schemes: tuple[str, ...]) -> str:
    """An optional URL: '' when unset; otherwise it must parse and use one of ``schemes``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return ""
    parsed = urlparse(raw)
    if parsed.scheme not in schemes or not (parsed.netloc or parsed.path):
        raise ImproperlyConfiguredEnv(
            f"{name}={raw!r}: expected a URL starting with {' or '.join(s + '://' for s in schemes)}"
        )
    try:
        parsed.port  # noqa: B018 - parsing it is the check: "host:abc" or a port past 65535
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: the port is not a number from 0 to 65535") from None
    return raw


def env_secret(name: str, kept_in: os.PathLike[str] | str) -> str:
    """A secret: the variable's value, else a random one made once and kept in the file ``kept_in``
    (mode 0600), so that there is no known default and one machine's processes share it. Several
    machines serving one site must share it: set the variable there."""
    raw = os.environ.get(name, "")
    if raw:
        if len(raw) < 32:
            raise ImproperlyConfiguredEnv(f"{name}: at least 32 characters (e.g. openssl rand -hex 32)")
        return raw
    path = os.fspath(kept_in)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with open(path) as kept:
            value = kept.read().strip()
        if len(value) >= 32:
            return value
        raise ImproperlyConfiguredEnv(f"{path} is not a usable key: delete it, or set {name}") from None
    except OSError as exc:
        raise ImproperlyConfiguredEnv(
            f"{name} is not set and {path} cannot be made ({exc}): set {name}"
        ) from None
    value = secrets.token_urlsafe(48)
    with os.fdopen(fd, "w") as kept:
        kept.write(value)
    return value


def database_from_url(url: str, base_dir: os.PathLike[str] | str) -> dict[str, Any]:
    """Django DATABASES['default'] from DATABASE_URL ('' = the embedded SQLite file).

    A PostgreSQL URL is parsed by dj-database-url: the user and password percent-decoded, query
    options (``?sslmode=require``, ``connect_timeout``, ...) passed to psycopg in ``OPTIONS``.
    What the URL leaves out is Tessera's default: user ``postgres``, host ``127.0.0.1``, port
    5432, database ``tessera``. ``sqlite:///path`` names the file at the absolute ``/path`` (as
    this variable always has; dj-database-url would read it as a relative path).
    """
    scheme = urlsplit(url).scheme if url else "sqlite"
    if scheme == "sqlite":
        path = unquote(urlsplit(url).path) if url else ""
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path or os.path.join(base_dir, "var", "tessera.sqlite3"),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    try:
        parsed = dj_database_url.parse(url, conn_max_age=0)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"DATABASE_URL: {exc}") from None
    name = parsed.get("NAME") or "tessera"
    return {
        **parsed,
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": parsed.get("USER") or "postgres",
        "PASSWORD": parsed.get("PASSWORD") or "",
        "HOST": parsed.get("HOST") or "127.0.0.1",
        "PORT": str(parsed.get("PORT") or 5432),
        "TEST": {"NAME": "test_" + name},
    }


def redis_db_url(url: str, db: int) -> str:
    """The same Redis server, another logical database (broker, layer and results stay apart)."""
    parsed = urlparse(url)
    return parsed._replace(path=f"/{db}").geturl()


# channels_redis waits for a channel's next message with BZPOPMIN for 5 s; redis-py 8 reads every
# reply with a 5 s socket timeout by default. The two raced: an idle consumer's wait timed out on
# the client as the server answered "nothing", and the consumer died with it (an agent's stream
# closed 1011 a few times a minute under load, a dashboard's socket too; docs/benchmarks/e2e.md).
# The layer's connections read with a timeout well past the wait.
CHANNEL_LAYER_SOCKET_TIMEOUT_S = 20.0


def channel_layer_host(url: str) -> dict[str, object]:
    """channels_redis's host entry for the Redis at ``url``."""
    return {"address": url, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_S}


def env_log_level(name: str, default: str) -> str:
    """A logging level's name, in any case (``debug``, ``INFO``): its upper-case form. Read raw,
    ``debug`` or ``verbose`` reached ``dictConfig`` as it was, which stopped every process with a
    page of "ValueError: Unable to configure logger" traceback."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw.upper() not in logging.getLevelNamesMapping():
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: expected DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return raw.upper()


RATE_PERIODS = {"s": 1, "m": 60, "h": 3600}


def env_rate(name: str, default: str) -> tuple[int, int] | None:
    """A request rate ``N/s``, ``N/m`` or ``N/h`` as (count, period seconds); ``off`` → None."""
    raw = os.environ.get(name) or default
    text = raw.strip().lower()
    if text == "off":
        return None
    count, _, unit = text.partition("/")
    if not count.isdigit() or int(count) < 1 or unit not in RATE_PERIODS:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: expected N/s, N/m, N/h (N ≥ 1) or off")
    return int(count), RATE_PERIODS[unit]


def env_engine_knobs() -> dict[str, str]:
    """The scheduler's knobs set in the environment, ``TESSERA_ENGINE_<KNOB>`` (e.g.
    ``TESSERA_ENGINE_ALPHA=0.5``, ``TESSERA_ENGINE_KIND_ACCELERATORS='{"inference": ["T4"]}'``):
    the defaults the scheduler-settings record's fields override. Checked here, whole, so a bad
    value stops the process with the variable's name."""
    prefix = "TESSERA_ENGINE_"
    for name in sorted(os.environ):
        # A misspelt knob (TESSERA_ENGINE_PREEMPT=off) was ignored: the operator believed it set.
        if name.startswith(prefix) and name[len(prefix) :].lower() not in KNOBS:
            raise ImproperlyConfiguredEnv(
                f"{name}={os.environ[name]!r}: not a scheduler knob; "
                f"{prefix}<KNOB> is one of {', '.join(prefix + k.upper() for k in KNOBS)}"
            )
    raw = {k: os.environ[f"{prefix}{k.upper()}"] for k in KNOBS if os.environ.get(f"{prefix}{k.upper()}")}
    try:
        configure(EngineConfig(), raw)
    except KnobError as exc:
        name = f"TESSERA_ENGINE_{exc.knob.upper()}"
        raise ImproperlyConfiguredEnv(f"{name}={raw[exc.knob]!r}: {exc.message}") from None
    return raw

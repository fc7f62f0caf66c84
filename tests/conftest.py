"""Shared fixtures: the three-user world, and access to the real services.

Who may see what (docs/api.md): alice (owner) and carol (teammate) are both in tenant ``vision``
and see each other's jobs; bob is in ``nlp`` and sees none of vision's; admin is an operator
(staff, no tenant) and sees everything.

Modes: ``make test`` runs on the embedded default (SQLite, in-memory channel layer, passes in
process) and, in CI, again on PostgreSQL and Redis. A test that needs one of those says why in its
mark — ``@pytest.mark.postgresql("why")``, ``@pytest.mark.redis("why")`` — and takes the
``require_postgres`` or ``redis_url`` fixture; collection refuses a test that takes the fixture
without the mark. Without the service such a test skips, giving its reason — unless
``TESSERA_REQUIRE_SERVICES=1`` (CI), where a missing service fails it instead. Every other test
must pass in both modes.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from urllib.parse import urlparse

import pytest

from tests.support import need_service


def _answers(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), 1):
            return True
    except OSError:
        return False


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    """Every test starts with full request budgets and no node asked for a utilisation report
    yet (user and node ids repeat between tests on SQLite)."""
    from scheduling.api.throttling import forget_counts
    from scheduling.services.utilisation import forget_asked

    forget_counts()
    forget_asked()


# The fixture that reaches each service, and the mark that must say why a test needs it.
SERVICE_MARKS = {"require_postgres": "postgresql", "redis_url": "redis"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = [
        f'{item.nodeid} (@pytest.mark.{mark}("why"))'
        for item in items
        for fixture, mark in SERVICE_MARKS.items()
        if fixture in getattr(item, "fixturenames", ()) and not _why(item, mark)
    ]
    if unmarked:
        raise pytest.UsageError("tests that need a service must say why:\n  " + "\n  ".join(unmarked))


def _why(item: pytest.Item, mark: str) -> str:
    found = item.get_closest_marker(mark)
    return str(found.args[0]) if found and found.args else ""


@pytest.fixture
def redis_url(request: pytest.FixtureRequest) -> str:
    url = os.environ.get("REDIS_URL", "")
    if not url or not _answers(url, 6379):
        need_service(f"Redis (set REDIS_URL), needed as {_why(request.node, 'redis')}")
    return url


@pytest.fixture
def redis_channel_layer(settings, redis_url: str):
    """Channels over Redis (database 2, under a prefix of its own: other test runs may share it),
    as a deployment runs them; the layer is made afresh before and after the test."""
    import uuid

    from channels.layers import channel_layers

    from controlplane.env import channel_layer_host, redis_db_url

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [channel_layer_host(redis_db_url(redis_url, 2))],
                "prefix": f"t{uuid.uuid4().hex[:8]}",
            },
        }
    }
    settings.REDIS_URL = redis_url
    channel_layers.backends.pop("default", None)
    yield
    channel_layers.backends.pop("default", None)


@pytest.fixture
def require_postgres(request: pytest.FixtureRequest, settings) -> None:
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        need_service(f"PostgreSQL (set DATABASE_URL), needed as {_why(request.node, 'postgresql')}")


@dataclass
class World:
    vision: object
    nlp: object
    alice: object
    carol: object
    bob: object
    admin: object
    tokens: dict[str, str]

    def client(self, who: str | None):
        """An API client authenticated with ``who``'s token (None = anonymous)."""
        from rest_framework.test import APIClient

        client = APIClient()
        if who is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {self.tokens[who]}")
        return client


@pytest.fixture
def world(db, settings) -> World:
    from django.contrib.auth.models import User

    from scheduling.models import Membership, Quota, Tenant
    from scheduling.services.tokens import do_create_api_token

    # The users have passwords; real hashing costs ~2 s per test on this machine.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    vision = Tenant.objects.create(name="vision")
    nlp = Tenant.objects.create(name="nlp")
    Quota.objects.create(tenant=vision, model="*", guaranteed=16, limit=64)
    Quota.objects.create(tenant=nlp, model="*", guaranteed=16, limit=64)
    users = {}
    for name, tenant in (("alice", vision), ("carol", vision), ("bob", nlp)):
        user = User.objects.create_user(name, password=f"{name}-pass-123")
        Membership.objects.create(user=user, tenant=tenant)
        users[name] = user
    users["admin"] = User.objects.create_user(
        "admin", password="admin-pass-123", is_staff=True, is_superuser=True
    )
    tokens = {name: do_create_api_token(u, "test")[1] for name, u in users.items()}
    return World(vision, nlp, users["alice"], users["carol"], users["bob"], users["admin"], tokens)


@pytest.fixture(scope="session")
def shared_servers(django_db_setup, django_db_blocker):
    """daphne and a Celery worker on the test database, started once for every test of the
    session that asks (``tests/cli/test_pipeline_step.py``, ``tests/integration/
    test_end_to_end.py``): each test starts its own agents (``SharedServers.start_agent``).

    Web and worker use a broker database of their own (``TESSERA_REDIS_BROKER_DB``), so no other
    test run's worker takes their tasks; loopback webhooks are allowed (the tests' receivers)."""
    import shutil
    import tempfile
    from pathlib import Path

    from django.conf import settings

    from tests.support import SharedServers, database_url_of, stack_env

    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        need_service("PostgreSQL (set DATABASE_URL), needed by the servers several processes share")
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url or not _answers(redis_url, 6379):
        need_service("Redis (set REDIS_URL), the Celery broker of the shared servers")
    work = Path(tempfile.mkdtemp(prefix="tessera-shared-", dir="/tmp"))
    work.chmod(0o711)  # the job user must reach the agents' job directories below it
    env = stack_env(
        database_url_of(settings),
        redis_url,
        TESSERA_REDIS_BROKER_DB=str(8 + os.getpid() % 8),
        TESSERA_WEBHOOK_ALLOWLIST="127.0.0.1",
        TESSERA_WEBHOOK_BACKOFF_S="0.2",
        TESSERA_WEBHOOK_ATTEMPTS="3",
    )
    servers = None
    try:
        servers = SharedServers(work, env, "shared")
        yield servers
    finally:
        if servers is not None:
            servers.procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


# --- The end of the run ---------------------------------------------------------------------
# A request thread of pytest-django's live server that is still serving an async view when the
# run ends (an agent's long-poll whose agent a test killed) holds an asgiref event loop in a
# ThreadPoolExecutor thread; the interpreter joins such threads at exit, and one whose loop never
# finishes cancelling its tasks kept CI runs waiting, after their summary, until CI's time ran
# out. Such a thread may be a daemon (a thread made by a daemon thread is one) and still be
# joined, and atexit handlers can wait too; so once pytest is done a daemon watchdog gives the
# interpreter EXIT_GRACE_S to end by itself, and after that names on stderr the threads still
# running and ends the process with pytest's own exit status. TESSERA_TEST_EXIT_GUARD=0 turns
# this off (the interpreter then waits for them).
EXIT_GRACE_S = float(os.environ.get("TESSERA_TEST_EXIT_GRACE_S", "10"))
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status[:] = [int(exitstatus)]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if os.environ.get("TESSERA_TEST_EXIT_GUARD", "1") == "0" or not _exit_status:
        return
    status = _exit_status[0]
    threading.Thread(target=_end_after_grace, args=(status,), name="tests-exit-guard", daemon=True).start()


def _end_after_grace(status: int) -> None:
    time.sleep(EXIT_GRACE_S)
    sys.stdout.flush()
    print(_still_running(), file=sys.stderr, flush=True)
    os._exit(status)


def _still_running() -> str:
    """The threads alive now (but this one), each with where it is: the same place counted once."""
    frames = sys._current_frames()
    seen: dict[str, int] = {}
    for thread in threading.enumerate():
        if thread is threading.current_thread():
            continue
        stack = traceback.format_stack(frames[thread.ident]) if thread.ident in frames else []
        kind = "daemon" if thread.daemon else "thread"
        where = "".join(stack[-3:]).strip()
        key = f"  {thread.name} ({kind}): {where}"
        seen[key] = seen.get(key, 0) + 1
    lines = [f"tests: the process had not ended {EXIT_GRACE_S:g} s after the run; ending it. Still running:"]
    lines += [key if n == 1 else f"{key}\n    (x{n})" for key, n in seen.items()]
    return "\n".join(lines)

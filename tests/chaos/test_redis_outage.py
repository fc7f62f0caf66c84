"""Redis away for a while under real processes, against a redis-server of the test's own.

PostgreSQL keeps the truth, so nothing accepted is lost (docs/operations.md, "What happens when
something fails"); what these tests hold is what an operator sees meanwhile: each process says
the outage once in its log, in one line, and once more when Redis is back, rather than a
traceback per tick or per request that buries when it began and ended.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support import (
    Processes,
    RedisServer,
    beat_argv,
    database_url_of,
    free_port,
    stack_env,
    wait_until,
    web_answers,
    web_argv,
)

pytestmark = [
    pytest.mark.services,
    pytest.mark.timeout(120),
    pytest.mark.postgresql("beat and the web read their settings and state from the database"),
]


@pytest.fixture
def own_redis() -> RedisServer:
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is needed for a Redis of the test's own")
    work = Path(tempfile.mkdtemp(prefix="tessera-redisout-", dir="/tmp"))
    redis = RedisServer(work)
    redis.start()
    yield redis
    redis.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_beat_logs_a_broker_outage_once_and_its_end_once(
    require_postgres, transactional_db, settings, own_redis
):
    procs = Processes(own_redis.work)
    env = stack_env(
        database_url_of(settings), f"redis://127.0.0.1:{own_redis.port}/0", TESSERA_PASS_INTERVAL_S="0.5"
    )
    try:
        procs.start("beat", [*beat_argv(own_redis.work / "celerybeat-schedule"), "-l", "INFO"], env)
        wait_until(
            "beat",
            lambda: "Sending due task scheduling-safety-pass" in procs.output("beat"),
            procs,
            time.monotonic() + 60,
        )
        own_redis.stop()
        time.sleep(6)  # a dozen ticks of the safety pass, the health sweep and the webhooks
        own_redis.start()
        wait_until(
            "beat's recovery",
            lambda: "queueing scheduled tasks again" in procs.output("beat"),
            procs,
            time.monotonic() + 30,
        )
        log = procs.output("beat")
    finally:
        procs.stop_all()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("cannot queue scheduled tasks") == 1, log[-3000:]
    assert log.count("queueing scheduled tasks again") == 1, log[-3000:]


def test_an_agents_stream_opened_while_redis_is_away_is_closed_at_once_by_daphne(
    require_postgres, transactional_db, settings, own_redis
):
    """Under daphne, not the test communicator: the close must reach the agent (daphne, through
    autobahn, sends an application's close code only if it is 1000 or 3000-4999; another left the
    socket open and dead, and the agent's exit reports on it waited for their timeout)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from tests.agent import helpers as h

    _, node = h.register(h.new_join_token(), "gpu-01")
    procs = Processes(own_redis.work)
    port = free_port()
    env = stack_env(database_url_of(settings), f"redis://127.0.0.1:{own_redis.port}/0")
    try:
        procs.start("web", web_argv(port=port), env)
        wait_until(
            "the web server", lambda: web_answers(f"http://127.0.0.1:{port}"), procs, time.monotonic() + 60
        )
        own_redis.stop()
        headers = {"Authorization": f"Node {node['credential']}"}
        with connect(
            f"ws://127.0.0.1:{port}/api/v1/agent/stream", additional_headers=headers, proxy=None
        ) as ws:
            began = time.monotonic()
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4013, closed.value
        assert time.monotonic() - began < 3
    finally:
        procs.stop_all()
    assert "Exception inside application" not in procs.output("web"), procs.output("web")[-3000:]


def test_an_open_agent_stream_is_closed_with_4013_when_redis_goes_and_leaves_nothing_behind(
    require_postgres, transactional_db, settings, own_redis
):
    """A socket open when Redis goes: its consumer's read of its channel fails. It is told 4013
    (it was 1011 and a traceback from daphne per socket: a cluster's worth at once), and its wake
    callback goes with it (it stayed, taking the node's wakes for a dead socket: the wakes asked
    of every socket once the subscription is back raised in it)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from tests.agent import helpers as h

    _, node = h.register(h.new_join_token(), "gpu-01")
    procs = Processes(own_redis.work)
    port = free_port()
    env = stack_env(database_url_of(settings), f"redis://127.0.0.1:{own_redis.port}/0")
    url, headers = (
        f"ws://127.0.0.1:{port}/api/v1/agent/stream",
        {"Authorization": f"Node {node['credential']}"},
    )
    try:
        procs.start("web", web_argv(port=port), env)
        wait_until(
            "the web server", lambda: web_answers(f"http://127.0.0.1:{port}"), procs, time.monotonic() + 60
        )
        with connect(url, additional_headers=headers, proxy=None) as ws:
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.5)  # open, nothing to say
            own_redis.stop()
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4013, closed.value
        own_redis.start()
        wait_until(
            "a stream that stays open again", lambda: _stays_open(url, headers), procs, time.monotonic() + 30
        )
    finally:
        procs.stop_all()
    log = procs.output("web")
    assert "Exception inside application" not in log and "Traceback" not in log, log[-4000:]


def _stays_open(url: str, headers: dict[str, str]) -> bool:
    """Whether a stream opened now stays open half a second (Redis answers the web again)."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    try:
        with connect(url, additional_headers=headers, proxy=None) as ws:
            ws.recv(timeout=0.5)  # a heartbeat asked once the subscription is back: open too
            return True
    except TimeoutError:
        return True
    except (ConnectionClosed, InvalidStatus, OSError):
        return False


def test_an_open_dashboard_is_closed_with_4013_when_redis_goes_not_with_a_traceback(
    require_postgres, transactional_db, settings, world, own_redis
):
    """The dashboard's sockets read their channels from the same Redis: when it goes, each is told
    4013 (the page reconnects with its backoff), and a socket opened meanwhile is refused at the
    handshake; the web's log says it once, not a traceback per dashboard."""
    import json

    from django.test import Client
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    browser = Client()
    browser.force_login(world.alice)
    procs = Processes(own_redis.work)
    port = free_port()
    env = stack_env(database_url_of(settings), f"redis://127.0.0.1:{own_redis.port}/0")
    base = f"127.0.0.1:{port}"
    headers = {"Cookie": f"sessionid={browser.cookies['sessionid'].value}", "Origin": f"http://{base}"}
    try:
        procs.start("web", web_argv(port=port), env)
        wait_until("the web server", lambda: web_answers(f"http://{base}"), procs, time.monotonic() + 60)
        with connect(f"ws://{base}/ws/dashboard/", additional_headers=headers, proxy=None) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "ready"
            own_redis.stop()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4013, closed.value
        with pytest.raises(InvalidStatus):
            connect(f"ws://{base}/ws/dashboard/", additional_headers=headers, proxy=None, open_timeout=10)
    finally:
        procs.stop_all()
    log = procs.output("web")
    assert "Exception inside application" not in log and "Traceback" not in log, log[-4000:]
    assert log.count("Redis unreachable") == 1, log[-4000:]


@pytest.mark.parametrize("switch", ["1", "0"])
def test_the_worker_logs_a_broker_outage_once_and_its_end_once_unless_switched_off(
    require_postgres, transactional_db, settings, own_redis, switch
):
    """As deployed (docker-compose.yml: prefork, gossip and mingle on, INFO). Celery's consumer
    logged every reconnection attempt as an error, and the loss with a deprecation warning and
    (at times) "Error on restarting Gossip" with four chained tracebacks
    (controlplane/celery_outage.py); it does again with ``TESSERA_CELERY_OUTAGE_LOG=0``."""
    procs = Processes(own_redis.work)
    redis_url = f"redis://127.0.0.1:{own_redis.port}/0"
    env = stack_env(database_url_of(settings), redis_url, TESSERA_CELERY_OUTAGE_LOG=switch)
    argv = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-l", "INFO", "-c", "1"]
    argv += ["-n", f"outage-{os.getpid()}@%h"]
    try:
        procs.start("worker", argv, env)
        wait_until("the worker", lambda: " ready." in procs.output("worker"), procs, time.monotonic() + 60)
        own_redis.stop()
        said = "Redis unreachable" if switch == "1" else "Cannot connect to"
        outage = lambda: said in procs.output("worker")  # noqa: E731
        wait_until("the outage", outage, procs, time.monotonic() + 30)
        time.sleep(7)  # three attempts to reconnect or more (after 0, 2 and 6 s)
        own_redis.start()
        back = "Redis answers again" if switch == "1" else "Connected to"
        wait_until(
            "the worker's recovery",
            lambda: procs.output("worker").count(back) == (1 if switch == "1" else 2),
            procs,
            time.monotonic() + 30,
        )
        log = procs.output("worker")
    finally:
        procs.stop_all()
    if switch == "0":  # Celery's own lines
        assert log.count("Cannot connect to") >= 2, log[-3000:]
        return
    assert "Traceback" not in log and "Cannot connect to" not in log, log[-3000:]
    assert "CPendingDeprecationWarning" not in log, log[-3000:]
    assert log.count("Redis unreachable: the worker's broker connection") == 1, log[-3000:]
    ended = re.search(r"Redis answers again after \d+ s; (\d+) operations failed", log)
    assert ended and int(ended[1]) >= 3, log[-3000:]

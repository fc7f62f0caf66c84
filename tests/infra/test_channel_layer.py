"""The channel layer's consumers survive idle waits: its reads outlast channels_redis's BZPOPMIN.

channels_redis waits for a channel's next message with BZPOPMIN for ``brpop_timeout`` (5 s);
redis-py 8 reads each reply with a 5 s socket timeout unless told otherwise. The two raced, and
an idle consumer (an agent's stream, a dashboard's socket) died with "Timeout reading from
Redis" as the server answered "nothing yet" — a few times a minute in the end-to-end benchmark.
"""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels_redis.utils import create_pool


@pytest.mark.redis("these are channels_redis's own connections and blocking reads")
def test_the_layers_connections_read_longer_than_its_blocking_wait(redis_channel_layer):
    layer = get_channel_layer()
    connection = create_pool(layer.hosts[0]).make_connection()
    assert connection.socket_timeout is None or connection.socket_timeout >= layer.brpop_timeout + 10


def test_the_deployments_layer_is_configured_so(settings):
    """The settings a deployment gets with REDIS_URL (read in a fresh interpreter)."""
    import json
    import os
    import subprocess
    import sys

    code = "import json, controlplane.settings as s; print(json.dumps(s.CHANNEL_LAYERS))"
    env = {**os.environ, "REDIS_URL": "redis://r:6379/0", "TESSERA_REDIS_LAYER_DB": "7"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (host,) = json.loads(out)["default"]["CONFIG"]["hosts"]
    assert host["address"] == "redis://r:6379/7" and host["socket_timeout"] >= 15


@pytest.mark.redis("these are channels_redis's own connections and blocking reads")
def test_a_receive_idle_past_one_blocking_wait_gets_the_message(redis_channel_layer):
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    timer = threading.Timer(layer.brpop_timeout + 1.0, async_to_sync(layer.send), (channel, {"type": "x"}))
    timer.start()
    try:
        assert async_to_sync(layer.receive)(channel) == {"type": "x"}
    finally:
        timer.cancel()

"""A Redis pub/sub subscription kept alive: the one loop the agent-wake bus and the job-change bus
listen with (``wake_bus.py``, ``job_bus.py``).

It subscribes, waits until Redis confirms (from then on, what is published comes here), sets
``ready``, and hands each message's data on. When Redis goes away it clears ``ready``, waits
(0.5 s, doubling to 5 s) and subscribes again; on every subscription after the first it calls
``on_resubscribed``, since what was published meanwhile is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis.asyncio
from django.conf import settings

from controlplane.env import redis_db_url
from scheduling.services import redis_outage

READY_TIMEOUT_S = 5.0


async def listen_forever(
    channel: str,
    ready: asyncio.Event,
    on_message: Callable[[Any], None],
    on_resubscribed: Callable[[], None],
    what: str,
) -> None:
    """Deliver ``channel``'s messages to ``on_message`` until cancelled (``what`` names it in logs)."""
    delay, subscribed_before = 0.5, False
    while True:
        client = redis.asyncio.Redis.from_url(redis_db_url(settings.REDIS_URL, 2))
        try:
            pubsub = client.pubsub()
            await pubsub.subscribe(channel)
            await confirmed(pubsub)  # Redis has it: what is published from now on comes here
            ready.set()
            if subscribed_before:  # what was published meanwhile is lost
                on_resubscribed()
            subscribed_before, delay = True, 0.5
            redis_outage.answered()
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    on_message(message["data"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Redis went away: subscribe again
            redis_outage.failed(f"{what} subscription lost; subscribing again", exc)
        finally:
            ready.clear()
            await client.aclose()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


async def confirmed(pubsub: Any) -> None:
    """Return once Redis has confirmed the subscription (TimeoutError if it does not)."""
    while True:
        message = await pubsub.get_message(timeout=READY_TIMEOUT_S)
        if message is None:
            raise TimeoutError("no confirmation of the subscription")
        if message.get("type") == "subscribe":
            return

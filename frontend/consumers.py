"""The dashboard's websocket: job and GPU deltas for one signed-in person.

Access is checked before any group is joined (as AWX's consumers do): anonymous sockets are refused
at the handshake; a tenant's user joins ``jobs.tenant.<its tenant id>`` and ``gpus``, an operator
``jobs.operators`` and ``gpus``. ``gpu.update`` rows are redacted for the viewer before they leave,
and a ``job.update`` whose tenant is not the viewer's is dropped even if it reached the group, so
another tenant's job never reaches a tenant's socket.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from frontend.redaction import Viewer, redact_device, viewer_for

log = logging.getLogger("tessera.ws")

GPU_GROUP = "gpus"
# Close code for a refused handshake (4000–4999 are the application's own).
CLOSE_UNAUTHENTICATED = 4401


class GpuFrames:
    """When a socket's GPU rows are sent: at once while fewer than ``calm_rows`` rows went out in
    the last ``window_s`` (a small or quiet cluster: no added latency); past that, rows are kept
    (a GPU's latest row replacing its earlier ones) and sent together one ``window_s`` after the
    last frame. At 8,000 GPUs with a tenth changing each second, four frames a second cost the
    page 7 long tasks a minute, one a second 2 (``scripts/bench_dashboard.py``, docs/portal.md).
    """

    def __init__(self, window_s: float = 1.0, calm_rows: int = 200) -> None:
        self.window_s, self.calm_rows = window_s, calm_rows
        self.sent: list[tuple[float, int]] = []  # (when, rows) of recent frames
        self.kept: dict[tuple[Any, Any], dict[str, Any]] = {}

    def take(self, devices: list[dict[str, Any]], now: float) -> bool:
        """True: send ``devices`` now (it was recorded); False: they are kept for a flush."""
        self.sent = [(at, n) for at, n in self.sent if now - at < self.window_s]
        if not self.kept and sum(n for _, n in self.sent) + len(devices) <= self.calm_rows:
            self.sent.append((now, len(devices)))
            return True
        for row in devices:
            self.kept[(row.get("node"), row.get("index"))] = row
        return False

    def wait(self, now: float) -> float:
        """Seconds until the kept rows are due."""
        last = max((at for at, _ in self.sent), default=now - self.window_s)
        return max(0.0, last + self.window_s - now)

    def flush(self, now: float) -> list[dict[str, Any]]:
        rows, self.kept = list(self.kept.values()), {}
        if rows:
            self.sent.append((now, len(rows)))
        return rows


# The most GPU rows one frame carries: a page parses and applies each frame in one task, and at
# 8,000 GPUs a second's 800 rows in one frame (110 KB) made that task long on a busy machine.
FRAME_ROWS = 200


def in_parts(rows: list[dict[str, Any]], size: int = FRAME_ROWS) -> list[list[dict[str, Any]]]:
    """``rows`` in order, in frames of at most ``size`` rows (one a second is still one batch:
    its frames go out together)."""
    return [rows[i : i + size] for i in range(0, len(rows), size)]


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    viewer: Viewer | None = None
    joined: list[str]
    flusher: asyncio.Future[None] | None = None

    async def connect(self) -> None:
        self.joined = []
        self.frames = GpuFrames()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.viewer = await database_sync_to_async(viewer_for)(user)
        for group in [*self.viewer.job_groups(), GPU_GROUP]:
            await self.channel_layer.group_add(group, self.channel_name)
            self.joined.append(group)
        await self.accept()
        # Joined: from here on no delta is missed, so the page may fetch its snapshot now.
        await self.send_json({"type": "ready", "viewer": self.viewer.as_json()})

    async def disconnect(self, code: int) -> None:
        if self.flusher is not None:
            self.flusher.cancel()
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = []

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The socket is push-only; a client's "ping" gets a "pong" so it can check liveness.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kw: Any) -> None:
        # Garbage from a client is ignored, never a traceback.
        try:
            await super().receive(text_data=text_data, bytes_data=bytes_data, **kw)
        except ValueError:
            return

    async def job_update(self, event: dict[str, Any]) -> None:
        job = event.get("job") or {}
        if self.viewer is None or not self.viewer.may_see_job(job):
            log.warning("dropped a job.update outside %s's scope", getattr(self.viewer, "username", "?"))
            return
        await self.send_json({"type": "job.update", "job": job})

    async def node_update(self, event: dict[str, Any]) -> None:
        # Nodes are shared by every tenant: the outlet sends only fields anyone may see.
        if self.viewer is not None:
            await self.send_json({"type": "node.update", "node": event.get("node") or {}})

    async def gpu_update(self, event: dict[str, Any]) -> None:
        """Sent at once while the cluster is calm; batched when it churns (see :class:`GpuFrames`)."""
        if self.viewer is None:
            return
        devices = [redact_device(row, self.viewer) for row in event.get("devices", [])]
        if self.frames.take(devices, time.monotonic()):
            await self.send_json({"type": "gpu.update", "devices": devices})
        elif self.flusher is None:
            self.flusher = asyncio.ensure_future(self.flush_later(self.frames.wait(time.monotonic())))

    async def flush_later(self, delay: float) -> None:
        while True:
            await asyncio.sleep(delay)
            for part in in_parts(self.frames.flush(time.monotonic())):
                await self.send_json({"type": "gpu.update", "devices": part})
            if not self.frames.kept:  # rows kept while that frame was being sent go in the next
                self.flusher = None
                return
            delay = self.frames.wait(time.monotonic())

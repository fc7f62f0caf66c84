"""The dashboard's websocket: job and GPU deltas for one signed-in person.

Access is checked before any group is joined (as AWX's consumers do): anonymous sockets are refused
at the handshake; a tenant's user joins ``jobs.tenant.<its tenant id>`` and ``gpus``, an operator
``jobs.operators`` and ``gpus``. ``gpu.update`` rows are redacted for the viewer before they leave,
and a ``job.update`` whose tenant is not the viewer's is dropped even if it reached the group, so
another tenant's job never reaches a tenant's socket.

A socket reads its session once, at the handshake; each socket also joins its session's group, so
that signing out (``user_logged_out``: :func:`end_session_sockets`) closes that session's sockets
with the refused handshake's code, and a tab left open stops receiving the team's jobs. It picks
its groups (its viewer) once too, so a change of its user's team or role (:func:`viewer_changed`)
closes its user's sockets with :data:`CLOSE_REJOIN`: the page reconnects as the new viewer. A
session that expires without a sign-out ends its sockets too (:func:`session_left_s`, looked at
when it is due to expire and at least every :data:`SESSION_CHECK_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from importlib import import_module
from typing import Any

import redis
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import SESSION_KEY

from frontend.redaction import Viewer, redact_device, viewer_for
from scheduling.models import Membership
from scheduling.services import live, live_seq, redis_outage

log = logging.getLogger("tessera.ws")

GPU_GROUP = "gpus"
# Close code for a refused handshake (4000–4999 are the application's own), and for a socket
# whose session has ended.
CLOSE_UNAUTHENTICATED = 4401
# Close code for a socket whose user's team or role changed: the page reconnects at once, and the
# new socket joins the groups of the user as it is now.
CLOSE_REJOIN = 4409
# Close code for a socket whose Redis (the channel layer) went away: 1013's meaning, "try again
# later", in the range daphne lets an application send; the page reconnects with its backoff.
CLOSE_TRY_AGAIN_LATER = 4013
# The longest a socket goes without looking whether its session still stands (one read of it).
SESSION_CHECK_S = 300.0
# A user's fields that make another viewer (``viewer_for``); a sign-in saves ``last_login`` only.
VIEWER_FIELDS = frozenset({"is_staff", "is_active"})


def session_group(session_key: str) -> str:
    """The group of one session's sockets, named by a digest of its key (never the key itself,
    which would then sit in the channel layer's group names)."""
    return "session." + hashlib.sha256(session_key.encode()).hexdigest()[:40]


def end_session_sockets(sender: Any, request: Any = None, **kwargs: Any) -> None:
    """``user_logged_out``'s receiver: close the sockets of the session being ended (the signal
    comes before the session is flushed). Through the live outlet, best effort as every live
    message: a channel layer that does not answer does not stop the sign-out."""
    key = getattr(getattr(request, "session", None), "session_key", None)
    if not key:
        return
    live.publish_on_commit((session_group(key), {"type": "session.end"}))


def session_left_s(session_key: str, user_id: int) -> float:
    """Seconds until the session ``session_key`` of ``user_id`` expires; 0 once it has (expired,
    flushed, or now another user's). Read afresh from the session store: the session may have
    been prolonged since the socket joined."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    if str(store.load().get(SESSION_KEY)) != str(user_id):
        return 0.0
    return max(0.0, float(store.get_expiry_age()))


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


def viewer_changed(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    """``post_save``/``post_delete`` of a ``Membership`` or a user: once committed, close that
    user's sockets so that they rejoin as the viewer the user is now (another team's groups, or
    an operator's, or none)."""
    if sender is Membership:
        user_id = instance.user_id
    elif update_fields is not None and not VIEWER_FIELDS & set(update_fields):
        return  # e.g. a sign-in's last_login
    else:
        user_id = instance.pk
    live.publish_on_commit((user_group(user_id), {"type": "viewer.changed"}))


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
        # The highest live sequence number among the kept rows' messages (``live_seq``): a frame
        # of them is as new as that, and its rows of older messages are each GPU's latest.
        self.kept_seq: int | None = None
        self.flushed_seq: int | None = None

    def take(self, devices: list[dict[str, Any]], now: float, seq: int | None = None) -> bool:
        """True: send ``devices`` now (it was recorded); False: they are kept for a flush."""
        self.sent = [(at, n) for at, n in self.sent if now - at < self.window_s]
        if not self.kept and sum(n for _, n in self.sent) + len(devices) <= self.calm_rows:
            self.sent.append((now, len(devices)))
            return True
        for row in devices:
            self.kept[(row.get("node"), row.get("index"))] = row
        if seq is not None:
            self.kept_seq = max(seq, self.kept_seq or 0)
        return False

    def wait(self, now: float) -> float:
        """Seconds until the kept rows are due."""
        last = max((at for at, _ in self.sent), default=now - self.window_s)
        return max(0.0, last + self.window_s - now)

    def flush(self, now: float) -> list[dict[str, Any]]:
        """The kept rows (their sequence number was ``kept_seq`` until this call: ``flushed_seq``)."""
        rows, self.kept = list(self.kept.values()), {}
        self.flushed_seq, self.kept_seq = self.kept_seq, None
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
    expiry: asyncio.Future[None] | None = None
    # The live sequence number once joined: messages numbered at most that may have missed this
    # socket, and any snapshot numbered at least that shows them (``live_seq``).
    joined_seq = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except redis.RedisError as exc:
            # The layer's Redis away, at the handshake (joining the groups) or under an open socket
            # (reading its channel): the page is told to come back later (a refused handshake
            # before the accept), and the outage is logged once, not as daphne's traceback for
            # every open dashboard at once.
            for task in (self.flusher, self.expiry):
                if task is not None:
                    task.cancel()
            redis_outage.failed("a dashboard's socket closed (4013)", exc)
            with contextlib.suppress(Exception):  # the socket may be gone already
                await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER})

    async def connect(self) -> None:
        self.joined = []
        self.frames = GpuFrames()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.viewer = await database_sync_to_async(viewer_for)(user)
        key = getattr(self.scope.get("session"), "session_key", None)
        sessions = [session_group(key)] if key else []
        for group in [*sessions, user_group(user.pk), *self.viewer.job_groups(), GPU_GROUP]:
            await self.channel_layer.group_add(group, self.channel_name)
            self.joined.append(group)
        self.joined_seq = await sync_to_async(live_seq.current)()
        await self.accept()
        # Joined: from here on no delta is missed. A snapshot numbered at least ``seq`` shows
        # everything before (the page may have asked for one already); older ones are fetched again.
        await self.send_json({"type": "ready", "viewer": self.viewer.as_json(), "seq": self.joined_seq})
        if key:
            self.expiry = asyncio.ensure_future(self.end_with_session(key, user.pk))

    async def end_with_session(self, key: str, user_id: int) -> None:
        """Close the socket (as a refused handshake) once its session has expired, with no
        sign-out to say so: a tab left open must not receive the team's jobs for ever."""
        while (left := await database_sync_to_async(session_left_s)(key, user_id)) > 0:
            await asyncio.sleep(min(left + 0.5, SESSION_CHECK_S))
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def disconnect(self, code: int) -> None:
        for task in (self.flusher, self.expiry):
            if task is not None:
                task.cancel()
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = []

    async def session_end(self, event: dict[str, Any]) -> None:
        """Its session was signed out: nothing more for this socket (the page goes to sign-in)."""
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def viewer_changed(self, event: dict[str, Any]) -> None:
        """Its user's team or role changed: this socket's groups are stale (the page reconnects)."""
        await self.close(code=CLOSE_REJOIN)

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

    def before_joining(self, event: dict[str, Any]) -> bool:
        """Whether ``event`` was numbered before this socket joined (a snapshot as new as the
        socket shows it: dropped). Unnumbered messages go on."""
        seq = event.get("seq")
        return isinstance(seq, int) and seq <= self.joined_seq

    async def send_frame(self, frame: dict[str, Any], seq: Any) -> None:
        if isinstance(seq, int):
            frame["seq"] = seq
        await self.send_json(frame)

    async def job_update(self, event: dict[str, Any]) -> None:
        job = event.get("job") or {}
        if self.viewer is None or not self.viewer.may_see_job(job):
            log.warning("dropped a job.update outside %s's scope", getattr(self.viewer, "username", "?"))
            return
        if not self.before_joining(event):
            await self.send_frame({"type": "job.update", "job": job}, event.get("seq"))

    async def node_update(self, event: dict[str, Any]) -> None:
        # Nodes are shared by every tenant: the outlet sends only fields anyone may see.
        if self.viewer is not None and not self.before_joining(event):
            await self.send_frame({"type": "node.update", "node": event.get("node") or {}}, event.get("seq"))

    async def gpu_update(self, event: dict[str, Any]) -> None:
        """Sent at once while the cluster is calm; batched when it churns (see :class:`GpuFrames`)."""
        if self.viewer is None or self.before_joining(event):
            return
        devices = [redact_device(row, self.viewer) for row in event.get("devices", [])]
        seq = event.get("seq")
        if self.frames.take(devices, time.monotonic(), seq if isinstance(seq, int) else None):
            await self.send_frame({"type": "gpu.update", "devices": devices}, seq)
        elif self.flusher is None:
            self.flusher = asyncio.ensure_future(self.flush_later(self.frames.wait(time.monotonic())))

    async def flush_later(self, delay: float) -> None:
        while True:
            await asyncio.sleep(delay)
            rows = self.frames.flush(time.monotonic())
            seq = self.frames.flushed_seq
            for part in in_parts(rows):
                await self.send_frame({"type": "gpu.update", "devices": part}, seq)
            if not self.frames.kept:  # rows kept while that frame was being sent go in the next
                self.flusher = None
                return
            delay = self.frames.wait(time.monotonic())

"""Webhooks: a tenant's URLs told of its jobs' ends (and preemptions, idle warnings), signed.

1. A job event of a type webhooks carry (:data:`EVENTS`) is recorded: in the same transaction,
   one ``WebhookDelivery`` row per webhook of the job's tenant that wants it
   (:func:`queue_for_events`, called where events are written). Nothing is sent there: after
   commit a sender is woken (the Celery task ``deliver_webhooks`` with Redis, the web process's
   sender thread in the embedded default), so a request or a pass never waits on a tenant's
   server, and a dead one never slows scheduling.
2. :func:`deliver_due` claims due rows (``SKIP LOCKED`` and a lease: two senders never send one
   row at the same time) and POSTs each: a 2xx marks it ``delivered``; anything else is retried
   after ``WEBHOOK_BACKOFF_S`` doubling, and after ``WEBHOOK_ATTEMPTS`` attempts it is ``failed``
   (kept, with its last status and error, and redeliverable).
3. Each request carries ``Tessera-Signature: t=<unix time>,v1=<hex>``, the HMAC-SHA256 with the
   webhook's secret of ``"<t>.<body>"``: a receiver checks it, refuses a ``t`` older than a few
   minutes (a replayed request), and uses ``Tessera-Delivery`` (the row's id) to drop repeats.
4. Targets are checked when a webhook is made and again before each attempt (the name may
   resolve elsewhere by then): every address the host resolves to must be public — no private,
   loopback, link-local, multicast or reserved address — unless the host or address is in the
   operator's ``TESSERA_WEBHOOK_ALLOWLIST``. An attempt connects to an address that check
   returned (never to a second lookup: DNS rebinding), directly (no proxy), and has
   ``TIMEOUT_S`` in all; redirects are not followed, and the answer's body is not read.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import requests
import requests.utils
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from scheduling.choices import DeliveryState, EventType
from scheduling.models import Job, JobEvent, Tenant, Webhook, WebhookDelivery
from scheduling.services.bulk import RowsInsert, Write
from scheduling.services.snapshot import PreparedRead

log = logging.getLogger("tessera.webhooks")

DELIVER_TASK = "scheduling.tasks.deliver_webhooks"
# The events webhooks carry: a job's end, a preemption, and (once the adjustment pass emits
# them) idle warnings.
EVENTS = tuple(
    e for e in ("succeeded", "failed", "cancelled", "preempted", "idle-warning") if e in EventType.values
)
TIMEOUT_S = 5.0
BATCH = 20
# A claimed row is not claimed again before this (its sender died meanwhile): longer than a
# batch can take to send (each attempt has TIMEOUT_S in all), or a second sender would claim
# and send again the rows a live sender has not reached yet.
LEASE_S = BATCH * TIMEOUT_S + 30.0
MAX_BACKOFF_S = 3600.0

_wake = threading.Event()  # the embedded sender's


class TargetRefused(ValueError):
    """A URL webhooks may not be sent to (the reason in words)."""


class TooManyWebhooks(Exception):
    """The tenant already has ``WEBHOOKS_PER_TENANT`` webhooks."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a tenant may have at most {limit} webhooks: delete one first")
        self.limit = limit


# --- targets ------------------------------------------------------------------------------------


def _allowed(host: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    for entry in settings.TESSERA["WEBHOOK_ALLOWLIST"]:
        if entry.lower() == host.lower():
            return True
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 prefixes whose addresses carry an IPv4 address a gateway (or the host's own stack) may
# forward to: NAT64's well-known prefix (RFC 6052) and the deprecated IPv4-compatible one, whose
# IPv4 is the last 32 bits; 6to4's (2002::/16) is ``ip.sixtofour``.
_EMBEDS_IPV4 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("::/96"))


def _public(address: Address) -> bool:
    """Whether ``address`` is one the Internet routes to, and so is any IPv4 it carries."""
    if not address.is_global or address.is_multicast:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if inner is None and any(address in net for net in _EMBEDS_IPV4):
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None:
            return _public(inner)
    return True


def check_target(url: str) -> list[Address]:
    """Raise :class:`TargetRefused` unless ``url`` is http(s) to public addresses (or allowlisted);
    the addresses its host resolved to, all checked (a delivery connects to these, never to what
    a second lookup might answer)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a bracketed host that is no IPv6 address
        raise TargetRefused("must be an http:// or https:// URL with a host") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused("must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise TargetRefused("must not carry credentials (sign with the webhook's secret instead)")
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError, UnicodeError):
        raise TargetRefused(f"{host} does not resolve") from None
    addresses: list[Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])  # a TCP address: host first
        if not _public(address) and not _allowed(host, address):
            raise TargetRefused(
                f"{host} resolves to {address}, a private, loopback or link-local address "
                "(an operator may allow it: TESSERA_WEBHOOK_ALLOWLIST)"
            )
        if address not in addresses:
            addresses.append(address)
    return addresses


# --- making webhooks and deliveries -----------------------------------------------------------


def do_create_webhook(tenant: Tenant, url: str, events: list[str], user) -> tuple[Webhook, str]:
    """A new webhook and its secret (shown once). TargetRefused for a URL it may not call;
    TooManyWebhooks once the tenant has ``WEBHOOKS_PER_TENANT`` of them.

    The bound: every job end makes one delivery per webhook, sent by senders all tenants share
    one at a time (5 s each at worst), so a tenant with thousands of webhooks would delay every
    other tenant's deliveries, and make Tessera send thousands of POSTs for one job's end. It is
    counted under the tenant row's lock, so parallel requests cannot pass it together."""
    check_target(url)
    secret = secrets.token_hex(32)
    limit = settings.TESSERA["WEBHOOKS_PER_TENANT"]
    with transaction.atomic():
        Tenant.objects.select_for_update().filter(pk=tenant.pk).exists()
        if Webhook.objects.filter(tenant=tenant).count() >= limit:
            raise TooManyWebhooks(limit)
        webhook = Webhook.objects.create(
            tenant=tenant, url=url, events=events, secret=secret, created_by=user
        )
    return webhook, secret


def do_delete_webhook(webhook: Webhook) -> None:
    webhook.delete()


def payload(event: JobEvent) -> dict[str, Any]:
    job = event.job
    return {
        "event": event.type,
        "at": event.at.isoformat(),
        "reason": event.reason or None,
        "job": {
            "id": job.pk,
            "name": job.name,
            "tenant": job.tenant.name,
            "state": job.state,
            "exit_code": job.exit_code,
            "attempts": job.attempts,
        },
    }


# A webhook as deliveries need it: (its id, the event types it wants; empty: every one).
HookRow = tuple[int, list[str]]

# The webhooks of the tenants of some jobs (``HOOKS_OF_JOBS.rows(job_ids)``), as (tenant id,
# webhook id, events) rows: read with those jobs' lock, in the same round trip, by a caller that
# then queues their events' deliveries without another read (:func:`delivery_write`).
HOOKS_OF_JOBS = PreparedRead(
    lambda job_ids: (
        Webhook.objects.filter(tenant_id__in=Job.objects.filter(pk__in=job_ids).values("tenant_id"))
        .order_by("id")
        .values_list("tenant_id", "id", "events")
    )
)


def hooks_by_tenant(rows: Iterable[Sequence[Any]]) -> dict[int, list[HookRow]]:
    """``HOOKS_OF_JOBS`` rows, per tenant id."""
    out: dict[int, list[HookRow]] = {}
    for tenant_id, hook_id, wanted in rows:
        out.setdefault(tenant_id, []).append((hook_id, wanted))
    return out


def queue_for_events(events: Iterable[JobEvent]) -> None:
    """Deliveries for ``events`` (being written in the caller's transaction), sent after commit."""
    wanted = [e for e in events if e.type in EVENTS]
    if not wanted:
        return
    tenants = {e.job.tenant_id for e in wanted}
    hooks = hooks_by_tenant(
        Webhook.objects.filter(tenant_id__in=tenants).values_list("tenant_id", "id", "events")
    )
    rows = _deliveries(wanted, hooks)
    if rows:
        WebhookDelivery.objects.bulk_create(rows)
        transaction.on_commit(request_delivery)


def delivery_write(events: Iterable[JobEvent], hooks: dict[int, list[HookRow]]) -> Write | None:
    """:func:`queue_for_events` with the webhooks already read (``hooks``: per tenant id, every
    webhook of the events' jobs' tenants): the deliveries' INSERT, for the caller to send with
    its other writes (None: no delivery), and a sender woken after commit."""
    wanted = [e for e in events if e.type in EVENTS and e.job.tenant_id in hooks]
    rows = _deliveries(wanted, hooks) if wanted else []
    if not rows:
        return None
    transaction.on_commit(request_delivery)
    return _WRITE_DELIVERIES.write(rows)


# Every column a new delivery has a value in (the others are NULL until it is sent).
_WRITE_DELIVERIES = RowsInsert(
    WebhookDelivery,
    ("webhook", "event", "payload", "state", "attempts", "next_attempt_at", "last_error", "created_at"),
)


def _deliveries(wanted: list[JobEvent], hooks: dict[int, list[HookRow]]) -> list[WebhookDelivery]:
    now = timezone.now()
    return [
        WebhookDelivery(webhook_id=hook_id, event=e.type, payload=payload(e), next_attempt_at=now)
        for e in wanted
        for hook_id, types in hooks.get(e.job.tenant_id, ())
        if not types or e.type in types
    ]


def do_redeliver(delivery: WebhookDelivery) -> WebhookDelivery:
    """Send a delivery again (a failed one, or a delivered one its receiver lost), from attempt 0."""
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        state=DeliveryState.PENDING, attempts=0, next_attempt_at=timezone.now(), last_error=""
    )
    transaction.on_commit(request_delivery)
    delivery.refresh_from_db()
    return delivery


def request_delivery() -> None:
    """Wake a sender: the Celery task with Redis, the embedded sender thread without."""
    if settings.TESSERA["EMBEDDED_PASSES"]:
        _wake.set()
        return
    try:
        current_app.send_task(DELIVER_TASK)
    except Exception:  # the broker is down: beat's periodic run sends them later
        log.warning("could not queue webhook deliveries", exc_info=True)


def wait_for_wake(timeout: float) -> None:
    _wake.wait(timeout=timeout)
    _wake.clear()


# --- sending -------------------------------------------------------------------------------------


def signature(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def _claim(now: datetime) -> list[WebhookDelivery]:
    with transaction.atomic():
        due = list(
            WebhookDelivery.objects.select_for_update(skip_locked=True)
            .filter(state=DeliveryState.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at", "id")[:BATCH]
        )
        if due:
            WebhookDelivery.objects.filter(pk__in=[d.pk for d in due]).update(
                next_attempt_at=now + timedelta(seconds=LEASE_S)
            )
    return due


def _post(url: str, addresses: list[Address], body: bytes, headers: dict[str, str]) -> int:
    """POST ``body`` to ``url`` at one of ``addresses`` (checked by :func:`check_target`): its
    HTTP status. Raises OSError, ``http.client.HTTPException`` or ValueError on any failure.

    The connection goes to a checked address, never to a second lookup of the name (which a
    hostile DNS server could answer with a private address: rebinding), and without a proxy;
    TLS still checks the certificate against the URL's host name. The whole attempt — connect,
    TLS handshake, request and the answer's status line and headers — has ``TIMEOUT_S``: the
    socket is shut down when that is spent, so a receiver that trickles bytes cannot hold a
    sender longer. The answer's body is never read (only its status counts)."""
    # As requests writes a URL on the wire: the host in IDNA, the path and query percent-encoded
    # (a URL may be an IRI: the API keeps it as given).
    parts = urlsplit(requests.Request("POST", url).prepare().url or url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    headers = {"Host": parts.netloc, **headers}
    deadline = time.monotonic() + TIMEOUT_S
    raw: socket.socket | None = None
    failure: OSError = OSError("no address to connect to")
    for address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("connect timed out")
        try:
            raw = socket.create_connection((str(address), port), timeout=left)
            break
        except OSError as exc:
            failure = exc
    if raw is None:
        raise failure
    watch = raw.dup()  # the same socket: shutting it down ends any read on ``raw`` or its TLS
    cut = threading.Event()
    timer = threading.Timer(max(deadline - time.monotonic(), 0.0), _shut, (watch, cut))
    timer.daemon = True
    timer.start()
    sock: socket.socket = raw
    try:
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=requests.utils.DEFAULT_CA_BUNDLE_PATH)
            sock = context.wrap_socket(raw, server_hostname=host)
        connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
        connection.sock = sock  # connected and checked above: http.client only speaks HTTP on it
        path = parts.path or "/"
        connection.request("POST", f"{path}?{parts.query}" if parts.query else path, body, headers)
        status = connection.getresponse().status
        if cut.is_set():  # what was read may be cut short (headers ended by the shutdown)
            raise TimeoutError("the receiver did not answer in time")
        return status
    finally:
        timer.cancel()
        sock.close()
        watch.close()


def _shut(sock: socket.socket, cut: threading.Event) -> None:
    cut.set()
    with contextlib.suppress(OSError):  # already closed: the attempt ended meanwhile
        sock.shutdown(socket.SHUT_RDWR)


def _send(delivery: WebhookDelivery) -> tuple[int | None, str]:
    """POST it once: (HTTP status or None, error words)."""
    hook = delivery.webhook
    try:
        addresses = check_target(hook.url)
    except TargetRefused as refused:
        return None, f"target refused: {refused}"
    body = json.dumps({"delivery": delivery.pk, **delivery.payload}, separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "tessera-webhooks",
        "Tessera-Event": delivery.event,
        "Tessera-Delivery": str(delivery.pk),
        "Tessera-Signature": signature(hook.secret, int(time.time()), body),
    }
    try:
        status = _post(hook.url, addresses, body, headers)
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a malformed URL
        return None, type(exc).__name__
    return status, "" if 200 <= status < 300 else f"HTTP {status}"


def _backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(settings.TESSERA["WEBHOOK_BACKOFF_S"] * 2 ** (attempts - 1), MAX_BACKOFF_S))


def deliver_due(now: datetime | None = None) -> int:
    """Send every delivery due now; returns how many were attempted. Safe to run in parallel."""
    attempted = 0
    while True:
        now_ = now or timezone.now()
        batch = _claim(now_)
        if not batch:
            return attempted
        for delivery in WebhookDelivery.objects.filter(pk__in=[d.pk for d in batch]).select_related(
            "webhook"
        ):
            status, error = _send(delivery)
            attempts = delivery.attempts + 1
            done = not error
            fields: dict[str, Any] = {"attempts": attempts, "last_status": status, "last_error": error[:256]}
            if done:
                fields.update(state=DeliveryState.DELIVERED, delivered_at=timezone.now())
            elif attempts >= settings.TESSERA["WEBHOOK_ATTEMPTS"]:
                fields.update(state=DeliveryState.FAILED)
            else:
                fields.update(next_attempt_at=timezone.now() + _backoff(attempts))
            WebhookDelivery.objects.filter(pk=delivery.pk).update(**fields)
            attempted += 1
        if now is not None:
            return attempted

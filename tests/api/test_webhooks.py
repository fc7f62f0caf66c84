"""Webhooks: a tenant's receiver gets signed deliveries of its jobs' ends; a failing one is retried
with backoff and then marked failed, and can be redelivered; private targets are refused unless
an operator allows them.

The receiver is a real HTTP server on 127.0.0.1 (allowed through ``WEBHOOK_ALLOWLIST``, as an
operator would allow an in-house service); jobs end through the real services, and the sender
(``deliver_due``, what the Celery task and the embedded thread run) is called by the test.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scheduling.models import WebhookDelivery
from scheduling.services import webhooks
from scheduling.services.jobs import do_cancel_job
from scheduling.services.webhooks import TargetRefused, check_target, deliver_due
from tests.api.helpers import bind, finish, run, slow_receiver, submit, tls_receiver


class Receiver:
    """An HTTP server that records each POST and answers ``status``."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append((dict(self.headers), body))
                receiver.paths.append(self.path)
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver(settings):
    settings.TESSERA = {**settings.TESSERA, "WEBHOOK_ALLOWLIST": ["127.0.0.1"], "WEBHOOK_BACKOFF_S": 0.0}
    found = Receiver()
    yield found
    found.server.shutdown()


def register(world, who: str, url: str, **body):
    return world.client(who).post("/api/v1/webhooks/", {"url": url, **body}, format="json")


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    fields = dict(part.split("=", 1) for part in headers["Tessera-Signature"].split(","))
    expected = hmac.new(secret.encode(), fields["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields["v1"]) and abs(time.time() - int(fields["t"])) < 300


def test_a_receiver_gets_a_signed_delivery_when_a_job_ends(world, cluster, receiver):
    made = register(world, "alice", receiver.url)
    assert made.status_code == 201, made.content
    secret = made.json()["secret"]
    job = submit(world.alice, world.vision, name="nightly")
    bind(job, cluster["n01"], [0])
    run(job)
    finish(job, 3)
    assert deliver_due() == 1
    ((headers, body),) = receiver.requests
    assert verified(secret, headers, body)
    assert not verified("another-secret", headers, body)
    sent = json.loads(body)
    assert sent["event"] == "failed" and sent["reason"] == "exit 3"
    assert sent["job"] == {
        "id": job.pk,
        "name": "nightly",
        "tenant": "vision",
        "state": "failed",
        "exit_code": 3,
        "attempts": 0,
    }
    assert headers["Tessera-Event"] == "failed" and headers["Tessera-Delivery"] == str(sent["delivery"])
    delivery = WebhookDelivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("delivered", 1, 200)
    assert deliver_due() == 0  # sent once


def test_only_the_events_asked_for_and_only_the_tenants_jobs_are_sent(world, cluster, receiver):
    register(world, "alice", receiver.url, events=["succeeded"])
    do_cancel_job(submit(world.alice, world.vision).pk)  # cancelled: not asked for
    do_cancel_job(submit(world.bob, world.nlp).pk)  # another tenant's
    job = submit(world.alice, world.vision)
    bind(job, cluster["n01"], [0])
    run(job)
    finish(job, 0)
    deliver_due()
    assert [json.loads(body)["event"] for _, body in receiver.requests] == ["succeeded"]


def test_a_failing_receiver_is_retried_then_marked_failed_and_can_be_redelivered(world, receiver, settings):
    settings.TESSERA = {**settings.TESSERA, "WEBHOOK_ATTEMPTS": 3}
    hook = register(world, "alice", receiver.url).json()
    receiver.status = 500
    do_cancel_job(submit(world.alice, world.vision).pk)
    deliver_due()  # the backoff is 0 here: every attempt falls due at once
    delivery = WebhookDelivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("failed", 3, 500)
    assert len(receiver.requests) == 3

    listed = world.client("carol").get(f"/api/v1/webhooks/{hook['id']}/deliveries/").json()
    assert [d["state"] for d in listed["results"]] == ["failed"]
    receiver.status = 204
    again = world.client("carol").post(f"/api/v1/webhooks/{hook['id']}/deliveries/{delivery.pk}/redeliver/")
    assert again.status_code == 200 and again.json()["state"] == "pending"
    deliver_due()
    delivery.refresh_from_db()
    assert (delivery.state, delivery.last_status) == ("delivered", 204)


def test_the_backoff_between_attempts_doubles(world, receiver, settings):
    settings.TESSERA = {**settings.TESSERA, "WEBHOOK_BACKOFF_S": 30.0}
    register(world, "alice", receiver.url)
    receiver.status = 503
    do_cancel_job(submit(world.alice, world.vision).pk)
    assert deliver_due() == 1  # then not due for 30 s
    delivery = WebhookDelivery.objects.get()
    waited = (delivery.next_attempt_at - delivery.created_at).total_seconds()
    assert delivery.state == "pending" and 29 <= waited <= 40


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/x",
        "http://localhost/x",
        "http://10.1.2.3/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/x",
        "http://0.0.0.0/x",
        "http://2130706433/x",
        "http://0x7f.1/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://[fe80::1%25eth0]/x",
        "ftp://example.org/x",
        "http://user:pw@example.org/x",
        "not a url",
    ],
)
def test_private_loopback_and_link_local_targets_are_refused_without_the_allowlist(world, url):
    answer = register(world, "alice", url)
    assert answer.status_code == 400 and list(answer.json()) == ["url"], answer.content


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:127.0.0.1",  # IPv4-mapped
        "64:ff9b::7f00:1",  # NAT64 (RFC 6052) of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # ... of 169.254.169.254
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:a00:1::1",  # ... of 10.0.0.1
        "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254
        "fe80::1",
    ],
)
def test_a_name_resolving_to_an_ipv6_address_that_carries_a_private_ipv4_one_is_refused(monkeypatch, address):
    def resolve(host, port, *args, **kwargs):
        return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port, 0, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(TargetRefused, match="private"):
        check_target("https://hook.example/x")


@pytest.mark.parametrize("port", ["0", "00", "0443", "65536"])
def test_a_url_whose_port_no_request_can_go_to_is_refused_even_where_its_host_is_allowed(
    world, receiver, port
):
    answer = register(world, "alice", f"http://127.0.0.1:{port}/hook")
    assert answer.status_code == 400 and list(answer.json()) == ["url"], answer.content
    assert register(world, "alice", "http://127.0.0.1:65535/hook").status_code == 201


def test_a_target_that_turned_private_after_registration_is_not_called(world, receiver, settings):
    register(world, "alice", receiver.url)
    settings.TESSERA = {**settings.TESSERA, "WEBHOOK_ALLOWLIST": []}  # the operator withdrew it
    do_cancel_job(submit(world.alice, world.vision).pk)
    deliver_due()
    assert receiver.requests == []
    assert "target refused" in WebhookDelivery.objects.get().last_error
    with pytest.raises(TargetRefused):
        check_target(receiver.url)


def test_bob_cannot_see_or_delete_alices_webhook_and_the_secret_is_shown_once(world, receiver):
    hook = register(world, "alice", receiver.url).json()
    assert len(hook["secret"]) == 64
    assert world.client("bob").get(f"/api/v1/webhooks/{hook['id']}/").status_code == 404
    assert world.client("bob").delete(f"/api/v1/webhooks/{hook['id']}/").status_code == 404
    assert world.client("bob").get("/api/v1/webhooks/").json()["results"] == []
    seen = world.client("carol").get(f"/api/v1/webhooks/{hook['id']}/").json()
    assert "secret" not in seen and seen["url"] == receiver.url
    assert world.client("carol").delete(f"/api/v1/webhooks/{hook['id']}/").status_code == 204


@pytest.mark.parametrize(
    "body, field",
    [
        ({"url": 7}, "url"),
        ({"url": "http://x", "events": ["started"]}, "events"),
        ({"url": "x", "y": 1}, "y"),
    ],
)
def test_bad_webhook_bodies_are_400s_naming_the_field(world, body, field):
    answer = world.client("alice").post("/api/v1/webhooks/", body, format="json")
    assert answer.status_code == 400 and field in answer.json()


def test_a_webhook_for_another_tenant_is_refused_in_words_about_webhooks(world, receiver):
    answer = register(world, "alice", receiver.url, tenant="nlp")
    assert answer.status_code == 403
    assert answer.json() == {"detail": "You may register webhooks only for your own tenant."}
    unnamed = register(world, "admin", receiver.url)
    assert unnamed.status_code == 400
    assert unnamed.json() == {
        "tenant": ["operators belong to no tenant: name the tenant to register the webhook for"]
    }


def test_a_delivery_connects_to_the_address_it_checked_not_to_a_second_lookup(
    world, receiver, monkeypatch, settings
):
    # A hostile name server answers the check with an allowed address, then (rebinding) the
    # connection's own lookup with the loopback address where the receiver listens.
    port = receiver.server.server_address[1]
    real = socket.getaddrinfo
    answers: Iterator[str] = itertools.repeat("127.0.0.2")  # until the webhook is registered

    def rebinding(host, *args, **kwargs):
        if host != "hook.example":
            return real(host, *args, **kwargs)
        address = next(answers, "127.0.0.1")
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    # 127.0.0.2 allowed, not the receiver's 127.0.0.1; one attempt
    settings.TESSERA = {**settings.TESSERA, "WEBHOOK_ALLOWLIST": ["127.0.0.2"], "WEBHOOK_BACKOFF_S": 60.0}
    assert register(world, "alice", f"http://hook.example:{port}/hook").status_code == 201
    answers = iter(["127.0.0.2"])  # the delivery's check; any lookup after it: 127.0.0.1
    do_cancel_job(submit(world.alice, world.vision).pk)
    deliver_due()
    assert receiver.requests == []  # nothing reached 127.0.0.1
    assert WebhookDelivery.objects.get().last_error == "ConnectionRefusedError"  # 127.0.0.2:port


@pytest.mark.timeout(20)
@pytest.mark.parametrize("answer", ["trickled headers", "endless body"])
def test_a_receiver_that_trickles_or_never_ends_its_answer_holds_a_sender_only_its_time(
    world, receiver, monkeypatch, settings, answer
):
    monkeypatch.setattr(webhooks, "TIMEOUT_S", 1.0)
    settings.TESSERA = {**settings.TESSERA, "WEBHOOK_BACKOFF_S": 60.0}  # one attempt
    with slow_receiver(answer) as url:
        register(world, "alice", url)
        do_cancel_job(submit(world.alice, world.vision).pk)
        started = time.monotonic()
        deliver_due()
        took = time.monotonic() - started
    delivery = WebhookDelivery.objects.get()
    assert took < 3, took
    if answer == "endless body":  # its status was all that counted; the body was never read
        assert delivery.state == "delivered" and delivery.last_status == 200
    else:
        assert delivery.state == "pending" and delivery.last_error


def test_a_url_with_non_ascii_characters_is_delivered_percent_encoded(world, receiver):
    url = receiver.url.replace("/hook", "/hoök?team=visión")
    assert register(world, "alice", url).status_code == 201
    do_cancel_job(submit(world.alice, world.vision).pk)
    deliver_due()
    assert WebhookDelivery.objects.get().state == "delivered"
    assert receiver.paths == ["/ho%C3%B6k?team=visi%C3%B3n"]
    ((headers, _),) = receiver.requests
    assert headers["Host"] == receiver.url.split("/")[2]


@pytest.mark.parametrize(("name", "delivered"), [("hook.example", True), ("other.example", False)])
def test_an_https_delivery_checks_the_certificate_against_the_urls_host_not_the_address(
    world, receiver, monkeypatch, tmp_path, name, delivered
):
    import requests.utils

    with tls_receiver("hook.example", str(tmp_path)) as (port, bundle, seen):
        real = socket.getaddrinfo

        def resolve(host, *args, **kwargs):  # both names: the receiver's address
            if host in ("hook.example", "other.example"):
                return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))]
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", resolve)
        monkeypatch.setattr(requests.utils, "DEFAULT_CA_BUNDLE_PATH", bundle)
        assert register(world, "alice", f"https://{name}:{port}/hook").status_code == 201
        do_cancel_job(submit(world.alice, world.vision).pk)
        deliver_due()
    delivery = WebhookDelivery.objects.get()
    if delivered:
        assert delivery.state == "delivered" and seen[0]["Host"] == f"hook.example:{port}"
    else:  # the certificate is hook.example's: no request sent, whatever the address
        assert delivery.state != "delivered" and "SSL" in delivery.last_error and seen == []


def test_a_tenant_has_at_most_its_bound_of_webhooks(world, receiver, settings):
    settings.TESSERA = {**settings.TESSERA, "WEBHOOKS_PER_TENANT": 2}
    answers = [register(world, who, receiver.url).status_code for who in ("alice", "carol", "alice")]
    assert answers == [201, 201, 409]
    assert register(world, "bob", receiver.url).status_code == 201  # another tenant's own bound
    hook = world.client("alice").get("/api/v1/webhooks/").json()["results"][0]["id"]
    assert world.client("alice").delete(f"/api/v1/webhooks/{hook}/").status_code == 204
    assert register(world, "alice", receiver.url).status_code == 201


def test_a_batch_claimed_by_one_sender_is_not_claimed_by_another_while_it_may_still_be_sending(
    world, receiver
):
    from datetime import timedelta

    from django.utils import timezone

    register(world, "alice", receiver.url)
    for _ in range(webhooks.BATCH):
        do_cancel_job(submit(world.alice, world.vision).pk)
    now = timezone.now()
    assert len(webhooks._claim(now)) == webhooks.BATCH
    # every one of them slow (TIMEOUT_S each): the last is sent only this late
    last_sent = now + timedelta(seconds=webhooks.BATCH * webhooks.TIMEOUT_S)
    assert webhooks._claim(last_sent) == []

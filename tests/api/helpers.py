"""Helpers for the REST API tests: job bodies, JSON posts, nodes, and jobs moved through their
lives with the real services; only the binding of a job to GPUs is done by hand (``bind``), so that
these tests do not depend on which placement the scheduling policy of the day would choose.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

from django.db import transaction
from django.utils import timezone

from scheduling.choices import EventType, JobState
from scheduling.models import Allocation, Device, Job, LogChunk, Node
from scheduling.services.jobs import (
    allocations_payload,
    do_mark_running,
    do_record_exit,
    do_submit_job,
    do_transition,
)


def valid_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "resnet",
        "kind": "training",
        "command": ["python", "train.py"],
        "gpus": 2,
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not ...}


def post_json(client, url: str, body: Any, **extra: Any):
    """POST ``body`` as JSON text (``bytes`` are sent as they are)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.generic("POST", url, raw, content_type="application/json", **extra)


def make_node(name: str, model: str, gpus: int, rack: str = "r1", nvlink: int = 1) -> Node:
    node = Node.objects.create(
        name=name, rack=rack, nvlink_domain=nvlink, cpus=64, memory_gib=512, last_heartbeat=timezone.now()
    )
    Device.objects.bulk_create(
        Device(
            node=node, index=i, uuid=f"GPU-{name}-{i}", model=model, memory_gib=80, nvlink_island=i // nvlink
        )
        for i in range(gpus)
    )
    return node


def submit(user, tenant, **overrides: Any) -> Job:
    """Submit through the service, with the API's defaults filled in."""
    from scheduling.api.job_serializers import model_fields, validated_submit

    body = valid_body(**overrides)
    job, _ = do_submit_job(user, tenant, model_fields(validated_submit(body)), body)
    return job


def bind(job: Job, node: Node, gpus: list[int], replica: int = 0, share: float = 1.0) -> Job:
    """Bind ``job`` to ``gpus`` of ``node`` (what a scheduling pass would do), state ``scheduled``."""
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("tenant").get(pk=job.pk)
        at = timezone.now()  # as the pass: the event first, then its allocations (created after)
        allocs = [
            Allocation.objects.create(
                job=job,
                device=Device.objects.select_related("node").get(node=node, index=i),
                replica=replica,
                share_milli=round(share * 1000),
                attempt=job.attempts,
            )
            for i in gpus
        ]
        do_transition(
            job, JobState.SCHEDULED, EventType.SCHEDULED, allocations=allocations_payload(allocs), at=at
        )
    return job


def run(job: Job) -> Job:
    with transaction.atomic():
        return do_mark_running(Job.objects.select_for_update().select_related("tenant").get(pk=job.pk))


def finish(job: Job, exit_code: int = 0) -> Job:
    with transaction.atomic():
        return do_record_exit(
            Job.objects.select_for_update().select_related("tenant").get(pk=job.pk), exit_code
        )


def add_log(job: Job, data: bytes, replica: int = 0) -> None:
    """Append output as the agent's log upload stores it (consecutive chunks)."""
    last = LogChunk.objects.filter(job=job, replica=replica).order_by("-offset").first()
    offset = last.offset + len(bytes(last.data)) if last else 0
    LogChunk.objects.create(job=job, replica=replica, offset=offset, data=data)


@contextlib.contextmanager
def slow_receiver(answer: str) -> Iterator[str]:
    """A webhook receiver on 127.0.0.1 (its URL) that, to every request, answers either its
    status line and then one header byte every 0.2 s (``"trickled headers"``), or 200 and a body
    that never ends (``"endless body"``), until the context ends."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.5)
            with contextlib.suppress(OSError):
                conn.recv(65536)
                if answer == "trickled headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    while not stop.wait(0.2):
                        conn.sendall(b"X")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n")
                    while not stop.is_set():
                        conn.sendall(b"\0" * 65536)

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    finally:
        stop.set()
        server.close()


@contextlib.contextmanager
def tls_receiver(host_name: str, directory: str) -> Iterator[tuple[int, str, list[dict[str, str]]]]:
    """An HTTPS webhook receiver on 127.0.0.1 whose certificate (self-signed, written to
    ``directory``) is for ``host_name``: its port, the certificate's file (a CA bundle that trusts
    it) and the headers of each POST it answered 204."""
    import datetime
    import ssl
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from pathlib import Path

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host_name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = Path(directory) / "receiver.pem", Path(directory) / "receiver.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append(dict(self.headers))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], str(cert_file), seen
    finally:
        server.shutdown()
        server.server_close()

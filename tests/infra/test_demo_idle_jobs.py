"""`make demo`'s idle-policy jobs: idle-batch must hold all of t4-04 before the jobs that may run
anywhere are submitted, or they may take t4-04 first and the README's story never happens."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from scripts import demo

SEED = {"users": [{"username": "alice", "token": "tsr_alice"}]}


class FakeApi(BaseHTTPRequestHandler):
    """Jobs stay pending until the third read of job 1 (its node registered late)."""

    calls: list[str] = []
    reads = 0

    def answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(f"submit {body['name']}")
        self.answer({"id": len([c for c in self.calls if c.startswith("submit")]), "state": "pending"})

    def do_GET(self) -> None:
        type(self).reads += 1
        state = "scheduled" if self.reads >= 3 else "pending"
        self.calls.append(f"read {self.path} {state}")
        self.answer({"id": 1, "state": state})

    def log_message(self, *args: object) -> None:
        pass


def test_the_demo_submits_the_other_idle_jobs_only_once_idle_batch_holds_its_node():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        demo.submit_idle_jobs(f"http://127.0.0.1:{server.server_address[1]}", SEED)
    finally:
        server.shutdown()
    assert FakeApi.calls[0] == "submit idle-batch"
    assert FakeApi.calls[1:4] == [
        f"read /api/v1/jobs/1/?wait=25 {s}" for s in ("pending", "pending", "scheduled")
    ]
    assert FakeApi.calls[4:] == ["submit idle-elastic", "submit idle-service", "submit wants-gpu"]

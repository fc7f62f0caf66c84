"""The agent's websocket client, back to back: CPU-seconds per message (docs/benchmarks/agent-stream.md).

A websocket server in a process of its own (the ``websockets`` library's asyncio server, on
127.0.0.1) answers each request at once and, asked to, pushes wakes back to back. Each run is a
fresh Python process holding one :class:`agent.stream.Stream` with its listener thread, as the
agent does, and measures its own CPU time (every thread: ``time.process_time``) over

- ``request``: ``--requests`` exit reports sent one after the other, each waiting for its answer
  (the agent's reporter thread; the answer comes through the listener thread);
- ``wake``: ``--wakes`` wakes of one binding each, pushed back to back, read by the listener.

Runs alternate between the implementations given (``--impl NAME=SOURCE``: ``agent.stream``, or
the path of another version of that module, e.g. one saved from git history), ``--runs`` of
each, and the median of each is printed as one JSON line:

    .venv/bin/python scripts/bench_stream.py --runs 5 \\
        --impl before=/tmp/stream_before.py --impl library=agent.stream
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BINDING = {
    "job_id": 1,
    "attempt": 1,
    "replica": 0,
    "command": ["python", "train.py", "--epochs", "3"],
    "env": {"TESSERA_JOB": "1"},
    "gpus": [0],
    "lease_seconds": 60.0,
}
EXIT = {
    "job_id": 1,
    "attempt": 1,
    "replica": 0,
    "exit_code": 0,
    "reason": "",
    "started_at": 1.0e9,
    "pid": 4321,
}


# --- the server (its own process) ---------------------------------------------------------------


async def _serve() -> None:
    from websockets.asyncio.server import serve

    wake = json.dumps({"wake": True, "start": [BINDING], "heartbeat": False})

    async def handler(ws: Any) -> None:
        async for text in ws:
            body = json.loads(text)
            for _ in range(int(body.get("push", 0))):
                await ws.send(wake)
            results = [{"status": 200, "state": "succeeded", "recorded": True} for _ in body.get("exits", [])]
            await ws.send(json.dumps({"id": body["id"], "status": 200, "results": results}))

    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(port, flush=True)
        await asyncio.Future()


# --- one run (its own process) ------------------------------------------------------------------


def _stream_class(source: str) -> Any:
    if source.endswith(".py"):
        spec = importlib.util.spec_from_file_location("stream_under_test", source)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(source)
    return module.Stream


def _run(source: str, port: int, requests: int, wakes: int) -> dict[str, float]:
    from agent.client import ServerError

    stream = _stream_class(source).open(
        f"http://127.0.0.1:{port}/api/v1/agent/", "Node bench", timeout=10.0, idle_s=60.0
    )
    received = 0
    all_in = threading.Event()

    def listen() -> None:
        nonlocal received
        try:
            while True:
                stream.receive()
                received += 1
                if received == wakes:
                    all_in.set()
        except ServerError:
            pass

    threading.Thread(target=listen, daemon=True).start()
    for _ in range(50):  # warm up
        stream.request({"exits": [EXIT]}, 10.0)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(requests):
        stream.request({"exits": [EXIT]}, 10.0)
    request_cpu, request_wall = time.process_time() - cpu, time.perf_counter() - wall
    cpu, wall = time.process_time(), time.perf_counter()
    stream.request({"push": wakes}, 60.0)
    if not all_in.wait(60):
        raise SystemExit(f"only {received} of {wakes} wakes arrived")
    wake_cpu, wake_wall = time.process_time() - cpu, time.perf_counter() - wall
    stream.close()
    return {
        "request_cpu_us": 1e6 * request_cpu / requests,
        "request_wall_us": 1e6 * request_wall / requests,
        "wake_cpu_us": 1e6 * wake_cpu / wakes,
        "wake_wall_us": 1e6 * wake_wall / wakes,
    }


# --- the comparison -----------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", action="append", default=[], metavar="NAME=SOURCE")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--wakes", type=int, default=3000)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run", metavar="SOURCE", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    if args.run:
        print(json.dumps(_run(args.run, args.port, args.requests, args.wakes)))
        return
    impls = dict(item.split("=", 1) for item in (args.impl or ["library=agent.stream"]))
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in impls}
        for i in range(args.runs):
            for name, source in impls.items():
                out = subprocess.run(
                    [sys.executable, __file__, "--run", source, "--port", str(port)]
                    + ["--requests", str(args.requests), "--wakes", str(args.wakes)],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=ROOT,
                ).stdout
                runs[name].append(json.loads(out))
                print(f"run {i + 1} {name}: {out.strip()}", file=sys.stderr)
        medians = {
            name: {key: round(statistics.median(r[key] for r in results), 1) for key in results[0]}
            for name, results in runs.items()
        }
        print(json.dumps({"runs": args.runs, "requests": args.requests, "wakes": args.wakes, **medians}))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()

"""The dashboard at scale, in headless Chromium: first paint at N nodes, and long tasks a minute
while a tenth of the GPU cells change each second. A benchmark, not a test: it prints one JSON
line (goals from the portal's issue: first paint < 1 s, at most 2 long tasks a minute).

    REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python scripts/bench_dashboard.py [--nodes 1000]

1. A fresh SQLite file: migrate, ``seed_demo --nodes N`` (N simulated 8-GPU nodes, no agents).
2. daphne serves it, with the Channels layer on Redis (its own database, ``--layer-db``) so that
   this process can push to the page as the pass would.
3. Chromium signs in as the operator (who sees every cell unredacted: the most work per cell) and
   opens the dashboard; first paint is the page's own mark when the map is first drawn
   (``window.TESSERA.firstPaintMs``, from the start of navigation).
4. For ``--seconds``, every ``1/--frames`` s this process sends one ``gpu.update`` to the ``gpus``
   group with ``--churn`` of the GPUs over a second (10%: 800 of 8,000), each turned free or
   allocated to a job; the page counts long tasks (> 50 ms, the Long Tasks API) meanwhile.

Also printed: where first paint's time went (the HTML's and the snapshot's arrival, the first
render's own time, ``map_built_ms`` when the last rack is built), the frames' size and the page's
time in its frame handler. ``--trace FILE`` records Chromium's performance trace of the churn and
prints what each long task held (script by function, style, layout, paint, GC); ``--cpuprofile
FILE`` records the page's V8 CPU profile (open either in Chromium's DevTools).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.frontend.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.support import free_port, stop_process  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--churn", type=float, default=0.10, help="share of GPUs changing each second")
    parser.add_argument("--frames", type=int, default=4, help="update messages a second")
    parser.add_argument("--layer-db", type=int, default=11, help="Redis database for the Channels layer")
    parser.add_argument("--cpuprofile", type=Path, help="write the page's V8 CPU profile of the churn here")
    parser.add_argument(
        "--trace",
        type=Path,
        help="write Chromium's performance trace of the churn here and print what its long tasks did",
    )
    args = parser.parse_args()
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        sys.exit("bench_dashboard: set REDIS_URL (the page is pushed to over the Redis channel layer)")

    workdir = Path(tempfile.mkdtemp(prefix="tessera-bench-dash-"))
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_URL",)}
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        DATABASE_URL=f"sqlite://{workdir / 'db.sqlite3'}",
        REDIS_URL=redis_url,
        TESSERA_REDIS_LAYER_DB=str(args.layer_db),
        TESSERA_PASS_LOOP="0",
        TESSERA_HEARTBEAT_TIMEOUT_S="86400",
        PYTHONPATH=str(ROOT),
    )
    os.environ.update(env)
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    seeded = subprocess.run(
        [python, "manage.py", "seed_demo", "--json", "--nodes", str(args.nodes)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    admin = next(u for u in json.loads(seeded.stdout.splitlines()[-1])["users"] if u["operator"])

    import django

    django.setup()
    from channels.layers import get_channel_layer

    from scheduling.models import Device

    devices = list(Device.objects.select_related("node").order_by("node__name", "index"))
    layer = get_channel_layer()
    port = free_port()
    log = open(workdir / "daphne.log", "wb")  # noqa: SIM115 - closed after the process ends
    server = subprocess.Popen(
        [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "controlplane.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/login/")
        result = drive(url, admin, devices, layer, args)
    finally:
        stop_process(server, timeout=10)
        log.close()
    result.update(
        nodes=args.nodes, gpus=len(devices), seconds=args.seconds, churn=args.churn, frames_per_s=args.frames
    )
    print(json.dumps(result))


def wait_for(url: str) -> None:
    import requests

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    sys.exit("daphne did not answer within 60 s")


LONG_TASKS = """
window.__long = [];
new PerformanceObserver(list => {
  for (const e of list.getEntries()) window.__long.push([e.startTime, e.duration]);
}).observe({type: "longtask", buffered: true});
window.__ws = {frames: 0, chars: 0, maxChars: 0};
const PageSocket = window.WebSocket;
window.WebSocket = class extends PageSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener("message", e => {
      window.__ws.frames += 1;
      window.__ws.chars += e.data.length;
      window.__ws.maxChars = Math.max(window.__ws.maxChars, e.data.length);
    });
  }
};
"""


def drive(url: str, admin: dict, devices: list, layer, args) -> dict:
    from playwright.sync_api import sync_playwright

    rng = random.Random(1)
    per_frame = max(1, round(len(devices) * args.churn / args.frames))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # The page's Content-Security-Policy forbids eval, which the long-task counter injected
            # below and Playwright's string predicates need; the benchmark measures speed, not CSP.
            page = browser.new_page(viewport={"width": 1600, "height": 1000}, bypass_csp=True)
            page.goto(url + "/login/")
            page.fill("#id_username", admin["username"])
            page.fill("#id_password", admin["password"])
            page.click("button[type=submit]")
            page.wait_for_url(url + "/")
            page.add_init_script(LONG_TASKS)
            page.reload()
            page.wait_for_function("window.TESSERA && window.TESSERA.firstPaintMs > 0", timeout=60_000)
            first_paint = page.evaluate("window.TESSERA.firstPaintMs")
            first_render = page.evaluate("window.TESSERA.firstRenderMs")
            page.wait_for_function("window.TESSERA.mapBuiltMs > 0", timeout=60_000)
            map_built = page.evaluate("window.TESSERA.mapBuiltMs || window.TESSERA.firstPaintMs")
            snapshot = page.evaluate(
                "(() => { const e = performance.getEntriesByType('resource')"
                ".find(r => r.name.includes('state.json'));"
                " return e ? [e.startTime, e.responseEnd, e.encodedBodySize] : null; })()"
            )
            navigation = page.evaluate(
                "(() => { const n = performance.getEntriesByType('navigation')[0];"
                " return [n.responseStart, n.responseEnd, n.domContentLoadedEventEnd, n.transferSize]; })()"
            )
            page.wait_for_selector("#live.live-on", timeout=30_000)
            time.sleep(1.0)
            start = page.evaluate("performance.now()")
            counts = {"sent": 0}
            if args.cpuprofile:
                cdp = page.context.new_cdp_session(page)
                cdp.send("Profiler.enable")
                cdp.send("Profiler.setSamplingInterval", {"interval": 500})
                cdp.send("Profiler.start")
            if args.trace:
                browser.start_tracing(page=page, path=str(args.trace), categories=TRACE_CATEGORIES)
            # Playwright's sync API holds this thread's event loop: the pushes go from another.
            pusher = threading.Thread(target=push, args=(layer, devices, per_frame, args, rng, counts))
            pusher.start()
            while pusher.is_alive():
                page.wait_for_timeout(200)
            pusher.join()
            sent = counts["sent"]
            time.sleep(1.0)
            if args.trace:
                browser.stop_tracing()
            if args.cpuprofile:
                args.cpuprofile.write_text(json.dumps(cdp.send("Profiler.stop")["profile"]))
            long_tasks = page.evaluate(f"window.__long.filter(t => t[0] >= {start})")
            renders = page.evaluate("window.TESSERA.renders")
            render_ms = page.evaluate("window.TESSERA.renderMsTotal")
            deltas = page.evaluate("window.TESSERA.deltas")
            handler = page.evaluate("[window.TESSERA.handlerMsTotal || 0, window.TESSERA.handlerMsMax || 0]")
            ws = page.evaluate("window.__ws")
        finally:
            browser.close()
    minutes = args.seconds / 60
    profile = {}
    if args.trace:
        profile["long_task_contents"] = long_task_contents(json.loads(args.trace.read_text()))
    return {
        "first_paint_ms": round(first_paint),
        "first_render_ms": round(first_render),
        "map_built_ms": round(map_built),
        "html_first_byte_at_ms": round(navigation[0]),
        "html_received_at_ms": round(navigation[1]),
        "dom_ready_at_ms": round(navigation[2]),
        "snapshot_requested_at_ms": round(snapshot[0]) if snapshot else None,
        "snapshot_received_at_ms": round(snapshot[1]) if snapshot else None,
        "snapshot_bytes": snapshot[2] if snapshot else None,
        "render_ms_per_frame": round(render_ms / max(1, renders), 1),
        "long_tasks": len(long_tasks),
        "long_tasks_per_minute": round(len(long_tasks) / minutes, 2),
        "longest_task_ms": round(max((d for _, d in long_tasks), default=0)),
        "frames_sent": sent,
        "frames_received": deltas,
        "renders": renders,
        "frame_chars_mean": round(ws["chars"] / max(1, ws["frames"])),
        "frame_chars_max": ws["maxChars"],
        "handler_ms_per_frame": round(handler[0] / max(1, deltas), 1),
        "handler_ms_max": round(handler[1], 1),
        **profile,
    }


TRACE_CATEGORIES = ["devtools.timeline", "disabled-by-default-devtools.timeline", "v8", "blink", "loading"]


def long_task_contents(trace: dict, threshold_ms: float = 50.0) -> list[dict]:
    """Each task over ``threshold_ms`` on the page's main thread, with the milliseconds of the
    work inside it by kind (script by function, style, layout, paint, GC, parsing)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    main = {
        (e["pid"], e["tid"])
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e["args"].get("name") == "CrRendererMain"
    }
    spans = [e for e in events if e.get("ph") == "X" and (e["pid"], e["tid"]) in main and "dur" in e]
    tasks = [e for e in spans if e["name"] in ("RunTask", "ThreadControllerImpl::RunTask")]
    tasks = [t for t in tasks if t["dur"] / 1000 > threshold_ms]
    kinds = {
        "FunctionCall": "script",
        "EventDispatch": "event",
        "FireAnimationFrame": "animation frame",
        "TimerFire": "timer",
        "UpdateLayoutTree": "style",
        "Layout": "layout",
        "PrePaint": "prepaint",
        "Paint": "paint",
        "Layerize": "layerize",
        "MinorGC": "minor GC",
        "MajorGC": "major GC",
        "V8.GC_SCAVENGER": "minor GC",
        "V8.GC_MARK_COMPACTOR": "major GC",
        "ParseHTML": "parse HTML",
        "v8.compile": "compile",
    }
    out = []
    for task in tasks:
        lo, hi = task["ts"], task["ts"] + task["dur"]
        inside: dict[str, float] = {}
        for e in spans:
            if e is task or not (lo <= e["ts"] and e["ts"] + e["dur"] <= hi):
                continue
            kind = kinds.get(e["name"])
            if kind is None:
                continue
            if e["name"] == "FunctionCall":
                data = e.get("args", {}).get("data", {})
                kind = f"script {data.get('functionName') or '?'}:{data.get('lineNumber', '?')}"
            inside[kind] = round(inside.get(kind, 0.0) + e["dur"] / 1000, 1)
        ranked = dict(sorted(inside.items(), key=lambda kv: -kv[1]))
        out.append({"ms": round(task["dur"] / 1000, 1), "inside": ranked})
    return out


def push(layer, devices: list, per_frame: int, args, rng: random.Random, counts: dict) -> None:
    """Send ``args.frames`` gpu.update messages a second for ``args.seconds``."""

    async def run() -> None:
        job, next_at = 1_000_000, time.monotonic()
        end = next_at + args.seconds
        while time.monotonic() < end:
            rows = []
            for device in rng.sample(devices, per_frame):
                job += 1
                rows.append(row(device, job if rng.random() < 0.5 else None))
            await layer.group_send("gpus", {"type": "gpu.update", "devices": rows})
            counts["sent"] += 1
            next_at += 1 / args.frames
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    asyncio.run(run())


def row(device, job_id: int | None) -> dict:
    """A device row as ``inventory.device_rows`` makes it (an operator's, unredacted)."""
    jobs = (
        [{"job_id": job_id, "tenant_id": 1, "tenant": "vision", "share": 1.0, "replica": 0}] if job_id else []
    )
    return {
        "node": device.node.name,
        "index": device.index,
        "uuid": device.uuid,
        "model": device.model,
        "memory_gib": device.memory_gib,
        "nvlink_island": device.nvlink_island,
        "state": "allocated" if job_id else "free",
        "used": 1.0 if job_id else 0.0,
        "jobs": jobs,
    }


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Check Tessera on a machine with real NVIDIA GPUs: discovery, real jobs, metrics, stopping.

Starts the embedded demo with ``scripts/demo.py --gpu --agents 0 --no-idle-jobs`` (web + scheduler,
and one agent on this machine's GPUs, discovered through NVML), then, through the REST API as a user would:

1. the node registers with the GPUs NVML reports (count, short model, memory);
2. a 1-GPU job runs a real CUDA computation (PyTorch matrix products, ~8 s) as the job user, on the
   GPU named in CUDA_VISIBLE_DEVICES; the agent's /metrics reports that GPU busy (NVML) meanwhile;
3. two 0.5-GPU jobs share one GPU at the same time, each told its share (TESSERA_GPU_SHARE);
4. a job asking for more GPUs than the node has stays pending and says why;
5. a job that would run forever is cancelled: it passes through ``terminating``, and once it is
   ``cancelled`` the GPU memory it held is free (its process has exited).

Prints one line per check and writes a JSON report (``--report``); exits non-zero if a check
failed. ``--dry-run`` runs the same flow on a simulated 1×H200 node without GPU assertions (to
test this script where no GPU is).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
METRICS_URL = "http://127.0.0.1:9400/metrics"  # the --gpu agent's default metrics port

# The job's program: a real GPU computation when PyTorch and a GPU are there.
GPU_PROGRAM = r"""
import os, sys, time
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
print("TESSERA_JOB_ID=" + os.environ.get("TESSERA_JOB_ID", "<unset>"))
print("TESSERA_GPU_SHARE=" + os.environ.get("TESSERA_GPU_SHARE", "<unset>"))
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
try:
    import torch
except ImportError:
    print("no torch"); time.sleep(seconds); sys.exit(0)
if not torch.cuda.is_available():
    print("torch sees no GPU"); sys.exit(3)
print("device=" + torch.cuda.get_device_name(0) + " count=" + str(torch.cuda.device_count()))
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
n, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    n += 20
elapsed = time.perf_counter() - start
print(f"matmuls={n} tflops={2 * 8192**3 * n / elapsed / 1e12:.0f}")
"""


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.base, self.token = base, token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def job(self, job_id: int) -> dict:
        return self.call("GET", f"/api/v1/jobs/{job_id}/")[1]

    def submit(self, **body) -> dict:
        status, job = self.call("POST", "/api/v1/jobs/", body)
        if status != 201:
            raise SystemExit(f"submit {body['name']} answered {status}: {job}")
        return job

    def wait(self, job_id: int, states: set[str], timeout: float, seen: list[str] | None = None) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if seen is not None and (not seen or seen[-1] != job["state"]):
                seen.append(job["state"])
            if job["state"] in states or time.monotonic() > deadline:
                return job
            time.sleep(0.1)

    def logs(self, job_id: int) -> str:
        return self.call("GET", f"/api/v1/jobs/{job_id}/logs/")[1].get("data", "")


class Checks:
    def __init__(self) -> None:
        self.results: list[dict] = []

    def check(self, name: str, ok: bool, detail: object = "") -> bool:
        self.results.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail != "" else ""), flush=True)
        return ok

    @property
    def failed(self) -> int:
        return sum(not r["ok"] for r in self.results)


def gpu_util(index: str) -> float | None:
    """DCGM_FI_DEV_GPU_UTIL of one GPU from the agent's /metrics, None if unreadable."""
    try:
        with urllib.request.urlopen(METRICS_URL, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and re.search(rf'gpu="{index}"', line):
            return float(line.rsplit(" ", 1)[1])
    return None


def gpu_memory_used_mib() -> float | None:
    """Memory in use on all GPUs (nvidia-smi; its process list is empty inside some VMs)."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return sum(float(v) for v in out.split())


def start_demo(args: argparse.Namespace, workdir: Path) -> tuple[subprocess.Popen, dict]:
    creds = workdir / "credentials.json"
    argv = [
        sys.executable,
        str(ROOT / "scripts" / "demo.py"),
        "--port",
        str(args.port),
        "--db",
        str(workdir / "tessera.sqlite3"),
        "--credentials-file",
        str(creds),
        "--log-dir",
        args.log_dir,
        "--state-dir",
        str(workdir / "agents"),
        "--no-idle-jobs",  # the demo's idle jobs would take the check's one GPU
    ]
    argv += ["--agents", "0", "--gpu"] if not args.dry_run else ["--agents", "0"]
    proc = subprocess.Popen(argv, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 180
    while not (creds.exists() and creds.stat().st_size):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the demo did not start (see its logs)")
        time.sleep(0.3)
    return proc, json.loads(creds.read_text())


def dry_run_agent(base: str, workdir: Path, join_token: str) -> subprocess.Popen:
    env = {**os.environ, "TESSERA_JOIN_TOKEN": join_token}
    argv = [
        sys.executable,
        "-m",
        "agent",
        "--server",
        base,
        "--simulate",
        "1xH200,nvlink=1",
        "--name",
        "gpu-local",
        "--state-dir",
        str(workdir / "agents" / "gpu-local"),
        "--metrics-port",
        "0",
    ]
    return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)


def run_checks(args: argparse.Namespace, base: str, users: list[dict], checks: Checks) -> None:
    token = {u["username"]: u["token"] for u in users}
    admin, alice = Api(base, token["admin"]), Api(base, token["alice"])

    # 1. The node, as NVML found it.
    deadline, node = time.monotonic() + 60, None
    while time.monotonic() < deadline and node is None:
        status, nodes = admin.call("GET", "/api/v1/nodes/")
        rows = nodes["results"] if isinstance(nodes, dict) else nodes
        node = next((n for n in rows if n["name"] == "gpu-local" and n["state"] == "ready"), None)
        time.sleep(0.5)
    if not checks.check("the GPU node registered and is ready", node is not None) or node is None:
        return
    models = sorted({d["model"] for d in node["devices"]})
    nvsmi = (
        subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        if shutil.which("nvidia-smi")
        else ""
    )
    expected = len([line for line in nvsmi.splitlines() if line.startswith("GPU ")]) if nvsmi else None
    checks.check(
        "devices match nvidia-smi",
        args.dry_run or len(node["devices"]) == expected,
        {"devices": node["devices"], "nvidia_smi": nvsmi.strip()},
    )
    model, count = models[0], len(node["devices"])
    status, quota = admin.call(
        "POST",
        "/api/v1/quotas/",
        {"tenant": "vision", "model": model, "guaranteed": count, "limit": count + 8},
    )
    checks.check(f"quota for vision on {model}", status == 201, quota)

    program = ["python", "-c", GPU_PROGRAM]
    # 2. A real GPU job; the agent's NVML metrics see the GPU busy.
    job = alice.submit(
        name="gpu-matmul", kind="training", command=[*program, "8"], gpus=1, accelerators=[model]
    )
    running = alice.wait(job["id"], {"running", "succeeded", "failed"}, 60)
    checks.check(
        "1-GPU job starts",
        running["state"] in ("running", "succeeded"),
        {"state": running["state"], "reason": running.get("pending_reason")},
    )
    peak = 0.0
    gpu_index = str(running["allocations"][0]["gpus"][0]) if running["allocations"] else "0"
    deadline = time.monotonic() + 120  # an 8 s job: bounded even if the agent dies under it
    while alice.job(job["id"])["state"] == "running" and time.monotonic() < deadline:
        peak = max(peak, gpu_util(gpu_index) or 0.0)
        time.sleep(0.5)
    done = alice.wait(job["id"], {"succeeded", "failed"}, 60)
    out = alice.logs(job["id"])
    checks.check(
        "1-GPU job succeeded",
        done["state"] == "succeeded",
        {"exit_code": done.get("exit_code"), "logs": out[-600:]},
    )
    checks.check(
        "job saw exactly its GPU",
        f"CUDA_VISIBLE_DEVICES={gpu_index}" in out and (args.dry_run or "count=1" in out),
        out[:200],
    )
    if not args.dry_run:
        checks.check(
            "job computed on the GPU",
            bool(re.search(r"tflops=\d+", out)),
            re.findall(r"device=.*|tflops=\d+", out),
        )
        checks.check("agent /metrics saw the GPU busy (NVML)", peak > 10, {"peak_util_percent": peak})

    # 3. Two half GPUs on one GPU at the same time.
    halves = [
        alice.submit(
            name=f"half-{i}", kind="inference", command=[*program, "6"], gpus=0.5, accelerators=[model]
        )
        for i in range(2)
    ]
    states = [alice.wait(h["id"], {"running", "succeeded", "failed"}, 60) for h in halves]
    both = [alice.job(h["id"]) for h in halves]
    same_gpu = [tuple(j["allocations"][0]["gpus"]) for j in states if j["allocations"]]
    checks.check(
        "two 0.5-GPU jobs run at once on one GPU",
        all(j["state"] == "running" for j in both) and len(set(same_gpu)) == 1,
        {"states": [j["state"] for j in both], "gpus": same_gpu},
    )
    finals = [alice.wait(h["id"], {"succeeded", "failed"}, 60) for h in halves]
    outs = [alice.logs(h["id"]) for h in halves]
    checks.check(
        "both shares succeeded, each told its share",
        all(f["state"] == "succeeded" for f in finals) and all("TESSERA_GPU_SHARE=0.5" in o for o in outs),
        [o[-300:] for o in outs],
    )

    # 4. More GPUs than the node has: pending, with a reason.
    big = alice.submit(
        name="too-big", kind="training", command=["true"], gpus=count + 1, accelerators=[model]
    )
    time.sleep(2)
    big = alice.job(big["id"])
    checks.check(
        "an impossible job stays pending and says why",
        big["state"] == "pending" and bool(big["pending_reason"]) and bool(big["pending_code"]),
        {"code": big["pending_code"], "reason": big["pending_reason"]},
    )
    alice.call("POST", f"/api/v1/jobs/{big['id']}/cancel/")

    # 5. Cancel a running GPU job: terminating, then its process is off the GPU.
    forever = alice.submit(
        name="forever",
        kind="training",
        command=[*program, "3600"],
        gpus=1,
        accelerators=[model],
        grace_seconds=5,
    )
    started = alice.wait(forever["id"], {"running"}, 60)
    if not checks.check(
        "a job that runs until stopped starts", started["state"] == "running", started["state"]
    ):
        return
    time.sleep(5)  # let it reach the GPU
    before = gpu_memory_used_mib()
    seen: list[str] = []
    alice.call("POST", f"/api/v1/jobs/{forever['id']}/cancel/")
    final = alice.wait(forever["id"], {"cancelled"}, 60, seen)
    after = gpu_memory_used_mib()
    checks.check("cancel: terminating, then cancelled", final["state"] == "cancelled", seen)
    if before is not None and after is not None:
        checks.check(
            "its process left the GPU: its memory is free once the job is cancelled",
            before > 500 and after < 100,
            {"gpu_memory_used_mib_before": before, "after": after},
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--log-dir", default=str(ROOT / "var" / "gpu-check-logs"))
    parser.add_argument("--report", help="write the results here (JSON)")
    parser.add_argument("--dry-run", action="store_true", help="simulated 1×H200 node, no GPU assertions")
    args = parser.parse_args(argv)
    checks = Checks()
    workdir = Path(tempfile.mkdtemp(prefix="tessera-gpu-check-"))
    os.chmod(workdir, 0o755)  # job uids (when run as root) reach the job folders
    demo, extra = None, None
    try:
        demo, creds = start_demo(args, workdir)
        base = creds["url"]
        if args.dry_run:
            extra = dry_run_agent(base, workdir, creds["join_token"])
        run_checks(args, base, creds["users"], checks)
    finally:
        for proc in (extra, demo):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        if args.report:
            Path(args.report).write_text(
                json.dumps({"failed": checks.failed, "checks": checks.results}, indent=2)
            )
    print(f"{len(checks.results) - checks.failed} passed, {checks.failed} failed", flush=True)
    return 1 if checks.failed or not checks.results else 0


if __name__ == "__main__":
    sys.exit(main())

"""``scripts/gpu_check.py``, the real-GPU check, run here in its dry-run mode.

On a GPU machine the same script asserts NVML discovery, real CUDA work, NVML metrics and GPU memory
freed on cancel (docs/gpu-check.md); here, on a simulated 1×H200 node, it must still drive the whole
flow — node, quota, a job, two shares of one GPU, a pending reason, a cancel — and pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_the_gpu_check_passes_its_dry_run_and_reports_every_check(tmp_path):
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "scripts/gpu_check.py",
            "--dry-run",
            "--port",
            str(free_port()),
            "--log-dir",
            str(tmp_path / "logs"),
            "--report",
            str(report),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checks = {c["check"]: c for c in json.loads(report.read_text())["checks"]}
    assert all(c["ok"] for c in checks.values())
    assert checks["two 0.5-GPU jobs run at once on one GPU"]["detail"]["gpus"] == [[0], [0]]
    assert checks["an impossible job stays pending and says why"]["detail"]["code"] == "capacity"
    assert checks["cancel: terminating, then cancelled"]["detail"][-1] == "cancelled"

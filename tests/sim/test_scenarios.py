"""The generator's scenario knobs: each bends the workload the way it says, the defaults none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scheduling.sim.generate import Scenario, generate
from scheduling.sim.traces import read_jobs, read_quotas


def make(tmp_path: Path, name: str, scenario: Scenario = Scenario(), load: float = 1.0) -> Path:
    generate(tmp_path / name, seed=4, days=1, load=load, scenario=scenario)
    return tmp_path / name


def test_default_knobs_write_the_default_workload(tmp_path: Path) -> None:
    generate(tmp_path / "plain", seed=4, days=1, load=1.0)
    knobs = make(tmp_path, "knobs", Scenario())
    for f in ("nodes.csv", "jobs.csv", "quotas.csv"):
        assert (tmp_path / "plain" / f).read_bytes() == (knobs / f).read_bytes()


def test_a_skewed_tenant_asks_k_times_its_guarantee_in_steady_training_on_the_model(tmp_path: Path) -> None:
    out = make(tmp_path, "skew", Scenario(skew_tenant="vision", skew_model="H100", skew_factor=2.0))
    jobs = read_jobs(out / "jobs.csv")
    span = max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs)
    mine = [
        j
        for j in jobs
        if j.request.tenant == "vision"
        and j.request.kind == "training"
        and j.request.accelerators == ("H100",)
    ]
    demand = sum(j.request.gpus * (j.duration_s or 0) for j in mine) / span
    guarantee = next(
        q.guaranteed for q in read_quotas(out / "quotas.csv") if (q.tenant, q.model) == ("vision", "H100")
    )
    assert demand >= 2.0 * guarantee * 0.95
    assert sum(not j.request.preemptible for j in mine) >= len(mine) * 0.9


def test_steady_share_tightness_burst_and_limits_do_what_they_say(tmp_path: Path) -> None:
    base = make(tmp_path, "base")
    bent = make(
        tmp_path,
        "bent",
        Scenario(steady_share=0.5, tightness=0.6, burst=0.5, limit_over=(1.0, 1.5)),
    )
    jobs = read_jobs(bent / "jobs.csv")
    long_running = [j for j in jobs if j.request.kind in ("training", "finetune")]
    steady = sum(not j.request.preemptible for j in long_running) / len(long_running)
    assert 0.4 < steady < 0.6
    quotas = {(q.tenant, q.model): q for q in read_quotas(base / "quotas.csv")}
    for q in read_quotas(bent / "quotas.csv"):
        assert q.guaranteed == pytest.approx(quotas[(q.tenant, q.model)].guaranteed * 0.6, abs=0.01)
        assert q.limit == quotas[(q.tenant, q.model)].limit
    submits = [j.submit_s for j in jobs]
    together = sum(a == b for a, b in zip(submits, submits[1:], strict=False)) / len(submits)
    assert together > 0.3
    ratios = [
        j.request.time_limit_s / j.duration_s
        for j in jobs
        if j.request.time_limit_s and j.duration_s and j.request.time_limit_s > j.duration_s
    ]
    assert ratios and max(ratios) <= 1.5 * 1.1 + 3600 / min(j.duration_s for j in jobs if j.duration_s)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--skew", "vision:B200:2"], "--skew needs TENANT:MODEL:K"),
        (["--skew", "vision"], "expected TENANT:MODEL:K"),
        (["--tightness", "1.5"], "--tightness must be in (0, 1]"),
        (["--limit-over", "3"], "expected LO,HI"),
    ],
)
def test_a_bad_knob_is_refused_with_its_name(tmp_path: Path, args: list[str], message: str) -> None:
    cmd = [sys.executable, "-m", "scheduling.sim", "generate", "--out", str(tmp_path), "--seed", "1"]
    done = subprocess.run([*cmd, "--days", "1", "--load", "1", *args], capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr

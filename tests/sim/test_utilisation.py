"""The simulator's utilisation profiles: drawn ones, the serving model against the real trace."""

from __future__ import annotations

import csv
import gzip
import statistics

from hypothesis import given
from hypothesis import strategies as st

from agent import profiles
from agent.metrics import trace_path
from scheduling.engine.types import JobRequest
from scheduling.sim.traces import TraceJob
from scheduling.sim.utilisation import Demand, draw, wholly_idle


def job(job_id: str, kind: str, gpus: float = 1, checkpoint_s: float | None = None, **kw) -> TraceJob:
    req = JobRequest(id=job_id, tenant="t", kind=kind, gpus=gpus, checkpoint_s=checkpoint_s, **kw)
    return TraceJob(req, 0.0, 7200.0)


def test_the_serving_model_matches_the_real_pods_median_and_idle_share():
    path = trace_path()
    assert path is not None
    pods: dict[str, list[float]] = {}
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            pods.setdefault(row["pod"], []).append(float(row["gpu_util_pct"]))
    real = [statistics.mean(v) for v in pods.values()]
    model = [statistics.mean(profiles.util("serving", f"j{i}", m) for m in range(600)) for i in range(400)]
    assert abs(statistics.median(model) - statistics.median(real)) < 1.0  # percent
    under = [sum(x < 5 for x in xs) / len(xs) for xs in (real, model)]
    assert abs(under[0] - under[1]) < 0.08  # pods averaging under the idle threshold


@given(n=st.integers(0, 10**6))
def test_a_drawn_profile_never_idles_a_job_that_a_requeue_would_restart_from_nothing(n):
    for kind in ("training", "finetune", "batch"):
        risky = job(f"j{n}", kind)  # preemptible, no checkpoints
        assert not wholly_idle(draw(risky))
        assert draw(risky) == draw(job(f"j{n}", kind))  # a pure function of the job
    assert draw(job(f"j{n}", "inference", preemptible=False)) == "serving"


@given(w0=st.floats(0, 5000), length=st.floats(0, 5000), gpus=st.sampled_from([0.5, 1, 2, 8]))
def test_busy_work_is_the_demand_integrated_over_the_work(w0, length, gpus):
    d = Demand("busy", "j1", gpus)
    middle = w0 + length / 2
    assert abs(d.busy(w0, w0 + length) - (d.busy(w0, middle) + d.busy(middle, w0 + length))) < 1e-6
    share = gpus if gpus < 1 else 1.0
    ranks = max(1, int(gpus))
    assert (
        0.8 * share * ranks * length - 1e-6 <= d.busy(w0, w0 + length) <= 0.98 * share * ranks * length + 1e-6
    )

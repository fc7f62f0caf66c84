"""Replay scores the start estimates a user would first have seen, when asked (--eta)."""

from __future__ import annotations

from pathlib import Path

from scheduling.engine.types import Estimate
from scheduling.sim.eta_score import score
from scheduling.sim.generate import generate
from scheduling.sim.runner import run_replay


def test_the_score_counts_jobs_that_waited_and_whether_they_started_in_their_band():
    events = [
        {"t": 0, "event": "submit", "job": "a"},
        {"t": 0, "event": "submit", "job": "b"},
        {"t": 0, "event": "submit", "job": "c"},
        {"t": 10, "event": "start", "job": "c"},  # waited 10 s: not scored
        {"t": 600, "event": "start", "job": "a"},
        {"t": 900, "event": "start", "job": "b"},
    ]
    first = {"a": Estimate(500, 400, 700, "", 1, 0), "b": None, "c": None}
    got = score(events, first)
    assert got["eta_coverage"] == 0.5 and got["eta_within_band"] == 1.0
    assert got["eta_median_error_s"] == 100 and got["eta_median_band_s"] == 300
    assert got["median_wait_s"] == 750


def test_a_replay_scores_estimates_only_when_asked(tmp_path: Path):
    generate(tmp_path / "w", 2, 0.2, 1.3, 32)
    w = tmp_path / "w"
    args = (w / "nodes.csv", w / "jobs.csv", w / "quotas.csv", "tessera")
    plain = run_replay(*args, tmp_path / "plain", show_progress=False)
    scored = run_replay(*args, tmp_path / "eta", show_progress=False, estimates=True)
    assert plain["eta_coverage"] is None
    assert scored["eta_coverage"] is not None and 0 < scored["eta_coverage"] <= 1
    assert plain["avg_jct_s"] == scored["avg_jct_s"]  # estimating decides nothing


def test_each_estimate_goal_is_judged_against_the_median_wait():
    from scheduling.sim.eta_score import eta_goals, eta_table

    summary = {"eta_coverage": 0.95, "eta_within_band": 0.7, "eta_median_band_s": 900.0,
               "eta_median_error_s": 300.0, "median_wait_s": 1000.0}  # fmt: skip
    got = {goal: met for goal, _, met in eta_goals(summary)}
    assert list(got.values()) == [True, False, True, False]  # 95% covered, 70% in band, 0.9×, 0.3×
    assert eta_goals({"eta_coverage": None}) == []
    table = eta_table({"tessera": summary, "greedy": {"eta_coverage": None}})
    assert "| tessera | started inside their band ≥ 80% | 70% | **no** |" in table and "greedy" not in table

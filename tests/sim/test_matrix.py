"""The scenario matrix: every policy on every chosen scenario, each goal judged and every miss named."""

from __future__ import annotations

import json
from pathlib import Path

from scheduling.sim import matrix
from scheduling.sim.matrix import SCENARIOS, Case, goals


def test_the_matrix_has_at_least_twelve_scenarios_with_and_without_quotas():
    assert len(SCENARIOS) >= 12 and len({c.name for c in SCENARIOS}) == len(SCENARIOS)
    assert any(not c.quotas for c in SCENARIOS) and any(c.scenario.skew_factor for c in SCENARIOS)


def test_a_small_matrix_writes_each_policys_figures_and_judges_every_goal(tmp_path: Path):
    argv = [str(tmp_path), "--gpus", "64", "--days", "0.2", "--seeds", "1", "--processes", "1"]
    assert matrix.main([*argv, "--only", "base-1.2,no-quotas-1.0"]) == 0
    text = (tmp_path / "matrix.md").read_text()
    for policy in matrix.POLICIES:
        assert f"| {policy} |" in text
    assert "| alloc ≥ min(greedy-quota + 0.03, ceiling − 0.02) |" in text
    assert "| avg JCT ≤ 0.5 × fcfs-device's |" in text
    assert "| started inside their band ≥ 80% (seed 1) |" in text  # tessera's estimates, scored
    misses = text.count("| **no** |")
    assert ("All goals met." in text) == (misses == 0)
    assert text.count("\n- ") == misses  # one line per miss, naming it
    digest = (tmp_path / "compare.md").read_text()  # the table docs/evaluation.md shows
    assert "| base-1.2 |" in digest and "| no-quotas-1.0 |" in digest
    assert digest.count("\n- ") == misses


def test_each_goal_is_judged_against_the_fair_reference_of_its_case():
    fig = {"alloc": 0.80, "ceiling": 0.95, "jct": 100.0, "avoidable_max_h": 13.0, "inference_p99_s": 900.0,
           "inference_p99_fit_s": 0.0, "lost": 0.0, "violations": 0}  # fmt: skip
    f = {p: dict(fig) for p in matrix.POLICIES}
    f["greedy-quota"]["alloc"] = 0.78
    got = {g: met for g, _, met in goals(Case("x", 1.2), f)}
    assert got["alloc ≥ min(greedy-quota + 0.03, ceiling − 0.02)"] is False  # 0.80 < 0.81
    assert got["longest avoidable wait ≤ 12 h"] is False
    # inference that waited only while its tenant's own non-preemptible work filled the guarantee
    assert got["inference p99 queue within its guarantee ≤ 60 s"] is True
    f["tessera"]["inference_p99_fit_s"] = 61.0
    got = {g: met for g, _, met in goals(Case("x", 1.2), f)}
    assert got["inference p99 queue within its guarantee ≤ 60 s"] is False
    f["fcfs-device"]["jct"] = 250.0
    got = {g: met for g, _, met in goals(Case("y", 1.0, quotas=False), f)}
    assert got["avg JCT ≤ 0.5 × fcfs-device's"] is True


def test_the_matrix_digest_fills_its_block_and_leaves_the_targets_alone(tmp_path: Path):
    """Regenerating docs/evaluation.md from a matrix run alone (no pack or replay results) fills
    the matrix's block and keeps every other block, the targets' table included, as it was."""
    from scheduling.sim.evaldoc import fill

    doc = tmp_path / "evaluation.md"
    targets = (
        "<!-- eval:targets -->\n| target | measured | |\n| --- | --- | --- |\n| x | 1 | met |\n"
        "<!-- /eval:targets -->\n"
    )
    doc.write_text(targets + "<!-- eval:eval-matrix -->\nold\n<!-- /eval:eval-matrix -->\n")
    (tmp_path / "var" / "eval-matrix").mkdir(parents=True)
    (tmp_path / "var" / "eval-matrix" / "compare.md").write_text("| scenario |\n| --- |\n| base-1.0 |\n")
    missing = fill(doc, tmp_path / "var", tmp_path / "images")
    text = doc.read_text()
    assert text.startswith(targets) and "| base-1.0 |" in text and "old" not in text
    assert "targets" in missing


def test_a_run_alike_in_its_inputs_to_another_is_replayed_once_and_gives_the_same_results(
    tmp_path: Path, capsys
):
    from scheduling.sim.runner import run_replay

    argv = [str(tmp_path), "--gpus", "64", "--days", "0.2", "--seeds", "1", "--processes", "1"]
    assert (
        matrix.main([*argv, "--only", "base-1.2,no-quotas-1.2"]) == 0
    )  # the same jobs; greedy reads no quotas
    assert "matrix: 7/7 " in capsys.readouterr().err  # 8 runs, greedy's alike: replayed once
    copied, first = tmp_path / "no-quotas-1.2-1" / "greedy", tmp_path / "base-1.2-1" / "greedy"
    work = tmp_path / "no-quotas-1.2-1" / "workload"
    assert (copied / "events.jsonl").read_bytes() == (first / "events.jsonl").read_bytes()
    summary = json.loads((copied / "summary.json").read_text())
    assert summary["jobs_file"] == str(work / "jobs.csv") and summary["quotas"] is None
    alone = run_replay(
        work / "nodes.csv", work / "jobs.csv", None, "greedy", tmp_path / "alone", seed=1, plots=False
    )
    assert (tmp_path / "alone" / "events.jsonl").read_bytes() == (copied / "events.jsonl").read_bytes()
    timing = {"wall_s", "cpu_s", "policy_s", "driver_s", "metrics_s"}
    assert {k: v for k, v in alone.items() if k not in timing} == {
        k: v for k, v in summary.items() if k not in timing
    }

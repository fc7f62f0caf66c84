"""docs/evaluation.md's targets: a checker violation is a miss, except for the reference that
ignores quotas by design (greedy replayed on a workload's quota file)."""

from __future__ import annotations

import json
from pathlib import Path

from scheduling.sim.evaldoc import targets


def _run(results: Path, policy: str, violations: int) -> None:
    d = results / "replay-1.2" / policy
    d.mkdir(parents=True)
    check = {"ok": violations == 0, "violations": violations}
    (d / "summary.json").write_text(json.dumps({"check": check}), encoding="utf-8")


def test_greedys_quota_violations_are_reported_not_missed(tmp_path: Path) -> None:
    _run(tmp_path, "greedy", 17)
    _run(tmp_path, "greedy-quota", 0)
    table = targets(tmp_path)
    assert table is not None
    assert "| load 1.2: greedy ignores quotas by design (report) | 17 violations | – |" in table
    assert "| load 1.2: checker passes every policy | greedy-quota | met |" in table
    assert "missed" not in table


def test_a_violation_of_any_other_policy_is_a_miss(tmp_path: Path) -> None:
    _run(tmp_path, "greedy-quota", 2)
    table = targets(tmp_path)
    assert table is not None
    assert "| load 1.2: checker passes greedy-quota | 2 violations | **missed** |" in table
    assert "every policy" not in table

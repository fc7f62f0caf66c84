"""The seed matrix: every seed and load replayed, one row each, the mean and the worst after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduling.sim import seedmatrix
from scheduling.sim.evaldoc import seed_rows
from scheduling.sim.seedmatrix import main, parse_seeds


def test_seeds_parse_as_ranges_or_lists() -> None:
    assert parse_seeds("1-3") == [1, 2, 3]
    assert parse_seeds("4,2") == [4, 2]


def test_one_row_per_seed_then_mean_and_worst(tmp_path: Path) -> None:
    out = tmp_path / "m"
    assert main([str(out), "--seeds", "1-2", "--loads", "1.0", "--gpus", "64", "--days", "0.3",
                 "--processes", "1"]) == 0  # fmt: skip
    rows = [line for line in (out / "compare.md").read_text().splitlines() if line.startswith("| 1.0 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1", "2", "**mean**", "**worst**"]
    waits = []
    for seed in (1, 2):
        t = json.loads((out / f"1.0-{seed}" / "tessera" / "summary.json").read_text())
        assert (out / f"1.0-{seed}" / "fcfs-device" / "summary.json").exists()
        assert t["check"]["ok"]
        waits.append(t["max_queue_s"] / 3600)
    worst = rows[3].split("|")[5].strip()
    assert worst == f"{max(waits):.1f}"  # the worst longest wait is the larger of the two seeds'
    # The evaluation's targets read the same runs: met only if met on every seed.
    longest = next(r for r in seed_rows(out) if "longest wait" in r[0])
    assert longest[0] == "load 1.0, seeds 1–2: longest wait ≤ 12 h"
    assert longest[1].startswith(f"1: {waits[0]:.1f} h, 2: {waits[1]:.1f} h")
    assert longest[2] == ("met" if max(waits) <= 12 else "**missed**")
    # A second run keeps the runs already there (it only rewrites the table).
    before = (out / "1.0-1" / "tessera" / "summary.json").stat().st_mtime_ns
    assert main([str(out), "--seeds", "1", "--loads", "1.0", "--gpus", "64", "--days", "0.3"]) == 0
    assert (out / "1.0-1" / "tessera" / "summary.json").stat().st_mtime_ns == before


def test_a_workload_appears_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replays of one workload run side by side in a pool (tessera and its references; adjust
    off and on): one that finds the workload missing must never read another's half-written
    ``jobs.csv`` — it is generated aside and moved into place whole."""
    real = seedmatrix.generate
    seen: list[bool] = []

    def generate(work: Path, **kw: object) -> object:
        info = real(work, **kw)  # type: ignore[arg-type]
        # Written, not yet in place: a concurrent reader of the workload's path finds nothing.
        seen.append((seedmatrix.workload_dir(tmp_path, "1.0", 3) / "jobs.csv").exists())
        return info

    monkeypatch.setattr(seedmatrix, "generate", generate)
    work = seedmatrix.ensure_workload((tmp_path, "1.0", 3, 0.1, 32))
    assert seen == [False]
    assert work == seedmatrix.workload_dir(tmp_path, "1.0", 3)
    assert {p.name for p in work.iterdir()} >= {"jobs.csv", "nodes.csv", "quotas.csv"}
    assert [p.name for p in tmp_path.iterdir()] == [work.name]  # no scratch folder left
    # Already there: kept as it is.
    before = (work / "jobs.csv").stat().st_mtime_ns
    seedmatrix.ensure_workload((tmp_path, "1.0", 3, 0.1, 32))
    assert (work / "jobs.csv").stat().st_mtime_ns == before and seen == [False]

"""docs/formats.md documents the columns and keys the simulator and export_trace really use."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from scheduling.services.export import export_trace
from scheduling.sim.events import EVENT_TYPES
from scheduling.sim.generate import Scenario, generate
from scheduling.sim.runner import run_replay
from scheduling.sim.traces import (
    JOB_ADJUST,
    JOB_COLUMNS,
    JOB_OPTIONAL,
    JOB_PREFER,
    JOB_RECURRING,
    NODE_COLUMNS,
    QUOTA_COLUMNS,
)

FORMATS_DOC = Path(__file__).resolve().parents[2] / "docs" / "formats.md"


def section(title: str) -> str:
    """The text of the doc's section whose heading starts with ``title``, up to the next one."""
    text = FORMATS_DOC.read_text(encoding="utf-8")
    match = re.search(rf"^##+ {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match is not None, f"docs/formats.md has no section {title!r}"
    return match.group(1)


def table(title: str) -> dict[str, str]:
    """First column (backticked name) → second column of the tables of a section."""
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", section(title), re.M)
    return {name: second.strip() for name, second in rows}


def header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as fh:
        return next(csv.reader(fh))


def test_the_documented_node_columns_are_the_readers_required_ones_and_its_optional_ones():
    columns = table("nodes.csv")
    assert [c for c, required in columns.items() if required == "yes"] == NODE_COLUMNS
    assert {c for c, required in columns.items() if required == "no"} == {"kind", "labels"}


def test_the_documented_job_columns_are_the_readers_required_ones_and_its_optional_ones():
    columns = table("jobs.csv")
    assert [c for c, required in columns.items() if required == "yes"] == JOB_COLUMNS
    assert [c for c, required in columns.items() if required == "no"] == [
        *JOB_OPTIONAL,
        JOB_PREFER,
        *JOB_RECURRING,
    ]


def test_the_documented_adjustment_columns_are_the_ones_replay_reads():
    assert tuple(table("Utilisation and `--adjust`")) == JOB_ADJUST


def test_the_documented_quota_columns_are_the_readers_ones():
    assert list(table("quotas.csv")) == QUOTA_COLUMNS


def test_the_documented_event_types_are_the_ones_the_events_reader_accepts():
    documented = set(table("events.jsonl"))
    keys = {"t", "event", "job", "allocations", "reason", "lost_gpu_seconds", "level", "idle_s"}
    assert documented - keys == set(EVENT_TYPES)


def test_what_generate_writes_has_the_documented_columns(tmp_path: Path):
    generate(tmp_path, 1, 0.1, 0.5, 32)
    assert header(tmp_path / "nodes.csv") == [*NODE_COLUMNS, "labels"]
    assert header(tmp_path / "jobs.csv") == [*JOB_COLUMNS, *JOB_OPTIONAL]
    assert header(tmp_path / "quotas.csv") == QUOTA_COLUMNS
    generate(tmp_path / "recurring", 1, 0.1, 0.5, 32, Scenario(recurring=0.5))
    assert header(tmp_path / "recurring" / "jobs.csv") == [*JOB_COLUMNS, *JOB_OPTIONAL, *JOB_RECURRING]


@pytest.mark.django_db
def test_what_export_trace_writes_has_every_documented_column(tmp_path: Path):
    export_trace(tmp_path)
    assert header(tmp_path / "nodes.csv") == list(table("nodes.csv"))
    assert header(tmp_path / "jobs.csv") == list(table("jobs.csv"))
    assert header(tmp_path / "quotas.csv") == list(table("quotas.csv"))


def test_every_key_of_a_replays_summary_is_documented(tmp_path: Path):
    generate(tmp_path / "w", 1, 0.1, 0.5, 32)
    w = tmp_path / "w"
    summary = run_replay(
        w / "nodes.csv", w / "jobs.csv", w / "quotas.csv", "tessera", tmp_path / "r", show_progress=False
    )
    written = json.loads((tmp_path / "r" / "summary.json").read_text(encoding="utf-8"))
    assert written.keys() == summary.keys()
    text = section("What `replay` writes")
    missing = [key for key in written if f"`{key}`" not in text]
    assert missing == [], f"docs/formats.md does not describe summary.json keys {missing}"
    files = {p.name for p in (tmp_path / "r").iterdir()}
    assert files - {"check.txt"} <= set(table("What `replay` writes"))

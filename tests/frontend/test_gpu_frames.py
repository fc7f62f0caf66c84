"""The dashboard socket's GPU frames: sent at once while the cluster is calm, batched (each GPU's
latest row only) once it churns, so a page at 8,000 GPUs gets about one frame a second."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from frontend.consumers import FRAME_ROWS, GpuFrames, in_parts


def rows(*keys: tuple[str, int], state: str = "free") -> list[dict[str, Any]]:
    return [{"node": node, "index": index, "state": state} for node, index in keys]


def test_a_calm_cluster_gets_every_change_at_once() -> None:
    frames = GpuFrames(window_s=1.0, calm_rows=10)
    for t in range(20):
        assert frames.take(rows(("n1", t % 4)), now=t * 0.2)  # 5 rows a second: under 10


def test_a_churning_cluster_is_sent_one_frame_a_window_with_each_gpus_latest_row() -> None:
    frames = GpuFrames(window_s=1.0, calm_rows=10)
    assert frames.take(rows(*[("n1", i) for i in range(8)]), now=0.0)
    assert not frames.take(rows(("n1", 0), ("n1", 1), ("n1", 2)), now=0.1)  # 11 > 10 in the window
    assert not frames.take(rows(("n1", 0), state="allocated"), now=0.2)
    assert frames.wait(now=0.2) == 0.8  # one window after the last frame
    sent = frames.flush(now=1.0)
    assert sorted((r["index"], r["state"]) for r in sent) == [(0, "allocated"), (1, "free"), (2, "free")]
    assert frames.flush(now=1.1) == []


def test_a_churning_seconds_rows_go_out_in_frames_a_page_parses_quickly() -> None:
    """At 8,000 GPUs a tenth change each second: the kept 800 rows leave in frames of at most
    FRAME_ROWS rows (one 110 KB frame was one long task on the page), none lost, in order."""
    frames = GpuFrames(window_s=1.0, calm_rows=FRAME_ROWS)
    assert not frames.take(rows(*[(f"n{i // 8}", i % 8) for i in range(800)]), now=0.0)
    kept = frames.flush(now=1.0)
    parts = in_parts(kept)
    assert len(parts) == 4 and all(len(part) <= FRAME_ROWS for part in parts)
    assert [row for part in parts for row in part] == kept
    assert in_parts([]) == []


@given(
    st.lists(st.tuples(st.floats(0, 0.5), st.lists(st.integers(0, 15), min_size=1, max_size=12)), max_size=40)
)
def test_no_gpus_latest_row_is_ever_lost(steps: list[tuple[float, list[int]]]) -> None:
    """Whatever the timing, what was sent, then flushed, ends with every GPU's last row."""
    frames = GpuFrames(window_s=1.0, calm_rows=10)
    now, latest, delivered = 0.0, {}, {}
    for step, (gap, indexes) in enumerate(steps):
        now += gap
        batch = [{"node": "n", "index": i, "state": f"s{step}"} for i in indexes]
        for row in batch:
            latest[row["index"]] = row["state"]
        if frames.take(batch, now):
            delivered.update({row["index"]: row["state"] for row in batch})
        elif frames.wait(now) == 0:
            delivered.update({row["index"]: row["state"] for row in frames.flush(now)})
    delivered.update({row["index"]: row["state"] for row in frames.flush(now + 2)})
    assert delivered == latest

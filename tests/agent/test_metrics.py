"""The agent's DCGM-style /metrics: the three series, their labels, replayed utilisation."""

from __future__ import annotations

import gzip
import os
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.inventory import simulated_inventory
from agent.metrics import GpuCollector, GpuUse, UtilProfiles, make_registry, serve, trace_path
from agent.spec import parse_spec

SERIES = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_FB_USED")


@pytest.fixture(scope="module")
def profiles() -> UtilProfiles:
    return UtilProfiles.load()


def samples(registry) -> dict[str, dict[str, tuple[dict, float]]]:
    """{series: {gpu: (labels, value)}} parsed back from the exposition text."""
    text = generate_latest(registry).decode()
    found: dict[str, dict[str, tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[sample.labels["gpu"]] = (sample.labels, sample.value)
    return found


def collector(profiles, uses, speed: float = 1.0) -> GpuCollector:
    inventory = simulated_inventory("sim-07", parse_spec("4xH100,nvlink=4"))
    return GpuCollector(inventory, lambda: uses, lambda: profiles, speed)


def test_the_packaged_trace_has_busy_profiles(profiles):
    path = trace_path()
    assert path is not None and path.name == "pod_gpu_util.csv.gz"
    assert len(profiles.pods) > 100
    assert all(max(profiles.series[p]) > 0 for p in profiles.pods)


def test_the_packaged_trace_is_a_copy_of_the_published_one():
    traces = os.environ.get("TESSERA_TRACES")
    original = Path(traces) / "gpu_util" / "pod_gpu_util.csv.gz" if traces else None
    if original is None or not original.is_file():
        pytest.skip(
            "set TESSERA_TRACES to the traces folder (README.md, 'Traces') to compare with the original"
        )
    path = trace_path()
    assert path is not None
    assert gzip.decompress(path.read_bytes()) == gzip.decompress(original.read_bytes())


def test_an_idle_node_exposes_the_three_series_at_zero_with_every_label(profiles):
    found = samples(make_registry(collector(profiles, {})))
    assert set(SERIES) <= set(found)
    for name in SERIES:
        assert sorted(found[name]) == ["0", "1", "2", "3"]
        for labels, value in found[name].values():
            assert set(labels) == {"gpu", "UUID", "Hostname", "modelName", "job"}
            assert labels["Hostname"] == "sim-07" and labels["modelName"] == "H100"
            assert labels["UUID"].startswith("GPU-") and labels["job"] == "" and value == 0


def test_a_running_simulated_job_shows_nonzero_utilisation_on_its_gpus_only(profiles):
    uses = {1: [GpuUse(42, 3.0)], 2: [GpuUse(42, 3.0)]}
    found = samples(make_registry(collector(profiles, uses)))
    for gpu in ("1", "2"):
        labels, util = found["DCGM_FI_DEV_GPU_UTIL"][gpu]
        assert labels["job"] == "42" and 0 < util <= 100
        sm_active = found["DCGM_FI_PROF_SM_ACTIVE"][gpu][1]
        assert 0 < sm_active <= 1 and abs(sm_active - 0.85 * util / 100) < 1e-3
        assert 0.35 * 80 * 1024 <= found["DCGM_FI_DEV_FB_USED"][gpu][1] <= 80 * 1024
    assert found["DCGM_FI_DEV_GPU_UTIL"]["0"][1] == 0 and found["DCGM_FI_DEV_GPU_UTIL"]["0"][0]["job"] == ""


def test_the_profile_is_chosen_by_job_id_and_replayed_one_sample_a_minute(profiles):
    pod = profiles.pod_for(42)
    assert pod == profiles.pod_for(42)  # deterministic
    assert len({profiles.pod_for(j) for j in range(1, 200)}) > 20  # jobs get different pods
    series, first = profiles.series[pod], profiles.first_busy[pod]
    assert profiles.util(42, 0) == series[first] > 0
    assert profiles.util(42, 59) == series[first]
    assert profiles.util(42, 60) == series[(first + 1) % len(series)]
    assert profiles.util(42, 1, speed=120) == series[(first + 2) % len(series)]  # --util-speed


def test_utilisation_changes_over_job_time_faster_with_util_speed(profiles):
    values = {profiles.util(42, t, speed=600) for t in range(0, 120, 2)}
    assert len(values) > 3


def test_the_metrics_are_served_over_http_on_a_free_port(profiles):
    server = serve(make_registry(collector(profiles, {0: [GpuUse(5, 1.0)]})), 0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'DCGM_FI_DEV_GPU_UTIL{Hostname="sim-07",UUID="GPU-' in text
    assert 'gpu="0",job="5",modelName="H100"' in text


def test_a_missing_trace_is_a_clear_error_naming_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_GPU_UTIL_TRACE", str(tmp_path / "nope.csv.gz"))
    with pytest.raises(FileNotFoundError, match=r"nope.csv.gz does not exist \(set TESSERA_GPU_UTIL_TRACE"):
        UtilProfiles.load()


def test_the_profiles_are_loaded_once_by_the_first_scrape_of_a_busy_gpu(profiles):
    loads = []
    uses: dict[int, list[GpuUse]] = {}
    inventory = simulated_inventory("sim-07", parse_spec("4xH100,nvlink=4"))
    registry = make_registry(GpuCollector(inventory, lambda: uses, lambda: loads.append(1) or profiles))
    samples(registry)
    assert loads == []  # an idle node's scrape (and the agent's start) parses nothing
    uses[1] = [GpuUse(42, 3.0)]
    assert samples(registry)["DCGM_FI_DEV_GPU_UTIL"]["1"][1] > 0
    samples(registry)
    assert loads == [1]


def test_a_trace_without_a_needed_column_is_refused_at_the_check_naming_it(tmp_path):
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(gzip.compress(b"pod,t_s,util\r\npod-000,0,1.0\r\n"))
    with pytest.raises(ValueError, match="no column gpu_util_pct"):
        UtilProfiles.check(bad)


@pytest.mark.parametrize("columns", [(0, 1, 2), (2, 0, 1)], ids=["pod first", "pod last"])
def test_a_trace_in_any_row_and_column_order_replays_the_same_profiles(tmp_path, columns):
    # Out of order, pods interleaved, one never busy, quoted names among them where pods come last.
    rows = [
        ("pod-1", "120", "0.0"),
        ("pod-10", "0", "7.5"),
        ("pod-1", "0", "0.0"),
        ("pod-2", "0", "0.0"),
        ("pod-10", "60", "0.0"),
        ("pod-1", "60", "30.0"),
        ("pod-10", "120", "12.0"),
    ]
    header = ("pod", "t_s", "gpu_util_pct")
    quote = columns[0] != 0
    lines = [",".join(header[i] for i in columns)] + [
        ",".join(f'"{r[i]}"' if quote and i == 0 else r[i] for i in columns) for r in rows
    ]
    path = tmp_path / "trace.csv.gz"
    path.write_bytes(gzip.compress(("\r\n".join(lines) + "\r\n").encode()))
    loaded = UtilProfiles.load(path)
    assert loaded.pods == ["pod-1", "pod-10"]
    assert dict(loaded.series) == {"pod-1": [0.0, 30.0, 0.0], "pod-10": [7.5, 0.0, 12.0]}
    assert dict(loaded.first_busy) == {"pod-1": 1, "pod-10": 0}
    expected = UtilProfiles({"pod-1": [0.0, 30.0, 0.0], "pod-2": [0.0], "pod-10": [7.5, 0.0, 12.0]})
    assert [loaded.util(j, s) for j in range(20) for s in (0, 60, 130)] == [
        expected.util(j, s) for j in range(20) for s in (0, 60, 130)
    ]

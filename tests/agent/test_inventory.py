"""What a node reports: the --simulate SPEC, simulated GPUs, NVML names and NVML's absence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.inventory import ModelMap, NoGPUs, nvml_inventory, simulated_inventory
from agent.spec import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[2]


def test_a_full_spec_is_parsed():
    spec = parse_spec("8xA100,nvlink=4,rack=r2,cpus=96,memory_gib=1024,labels=zone:a;tier:gold")
    assert (spec.count, spec.model, spec.nvlink, spec.rack) == (8, "A100", 4, "r2")
    assert (spec.cpus, spec.memory_gib) == (96, 1024)
    assert spec.labels == {"zone": "a", "tier": "gold"}


def test_a_bare_spec_gets_plausible_defaults():
    spec = parse_spec("4xT4")
    assert (spec.count, spec.model, spec.nvlink, spec.rack, spec.labels) == (4, "T4", 1, "default", {})
    assert spec.cpus > 0 and spec.memory_gib > 0 and spec.gpu_memory_gib == 16


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", "empty spec"),
        ("A100", "is not COUNTxMODEL"),
        ("0xA100", "between 1 and"),
        ("8xA1 00", "is not COUNTxMODEL"),
        ("8xA100!", "letters, digits"),
        ("8xA100,nvlink=3", "must divide"),
        ("8xA100,nvlink=16", "must divide"),
        ("8xA100,nvlink=four", "not a whole number"),
        ("8xA100,rack=", "rack ''"),
        ("8xA100,cpus=-2", "positive"),
        ("8xA100,memory_gib=lots", "not a number"),
        ("8xA100,labels=zone", "not key:value"),
        ("8xA100,colour=red", "unknown option 'colour'"),
        ("8xA100,rack=r1,rack=r2", "given twice"),
        ("8xA100,nvlink", "not key=value"),
    ],
)
def test_a_bad_spec_is_refused_with_a_message_saying_what_is_wrong(spec, words):
    with pytest.raises(SpecError, match=words.replace("(", r"\(")):
        parse_spec(spec)


def test_the_agent_exits_2_with_a_clear_message_on_a_bad_spec():
    result = subprocess.run(
        [sys.executable, "-m", "agent", "--server", "http://127.0.0.1:9", "--simulate", "8xA100,nvlink=3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TESSERA_JOIN_TOKEN": "x"},
    )
    assert result.returncode == 2
    assert "bad --simulate spec '8xA100,nvlink=3': nvlink=3 must divide the GPU count 8" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_simulated_inventory_has_stable_distinct_uuids_and_the_specs_shape():
    spec = parse_spec("8xA100,nvlink=4,rack=r2")
    first, again = simulated_inventory("sim-01", spec), simulated_inventory("sim-01", spec)
    other = simulated_inventory("sim-02", spec)
    body = first.register_body("http://h:1/metrics")
    assert [d["index"] for d in body["devices"]] == list(range(8))
    assert {d["model"] for d in body["devices"]} == {"A100"} and body["devices"][0]["memory_gib"] == 80
    assert (body["name"], body["rack"], body["nvlink_domain"]) == ("sim-01", "r2", 4)
    uuids = [d.uuid for d in first.devices]
    assert len(set(uuids)) == 8 and uuids == [d.uuid for d in again.devices]
    assert not set(uuids) & {d.uuid for d in other.devices}


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10G"),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("Tesla V100-SXM2-32GB", "V100"),
    ],
)
def test_nvml_names_map_to_short_models(nvml_name, model):
    assert ModelMap().short(nvml_name) == model


def test_operators_extend_the_model_table_with_a_json_file(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"NVIDIA Future GPU 9000": "FG9K", "RTX PRO 6000": "RTXPRO6000"}))
    table = ModelMap.from_file(str(path))
    assert table.short("NVIDIA Future GPU 9000") == "FG9K"
    assert table.short("NVIDIA RTX PRO 6000 Blackwell") == "RTXPRO6000"
    assert table.short("NVIDIA H100 80GB HBM3") == "H100"  # the built-in table still applies
    assert ModelMap().short("NVIDIA Future GPU 9000") == "Future-GPU-9000"  # unknown: a usable name


def test_a_broken_model_table_is_refused(tmp_path):
    path = tmp_path / "models.json"
    path.write_text('["not", "an", "object"]')
    with pytest.raises(ValueError, match="expected a JSON object"):
        ModelMap.from_file(str(path))


def _has_nvidia_gpu() -> bool:
    try:
        nvml_inventory("probe", ModelMap())
    except NoGPUs:
        return False
    return True


@pytest.mark.skipif(_has_nvidia_gpu(), reason="this machine has an NVIDIA GPU")
def test_without_a_gpu_the_agent_says_no_nvidia_gpus_found_and_exits_nonzero():
    with pytest.raises(NoGPUs, match=r"no NVIDIA GPUs found \(NVML: .+\)"):
        nvml_inventory("probe", ModelMap())
    result = subprocess.run(
        [sys.executable, "-m", "agent", "--server", "http://127.0.0.1:9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TESSERA_JOIN_TOKEN": "x"},
    )
    assert result.returncode == 2
    assert "no NVIDIA GPUs found (NVML: " in result.stderr and "--simulate" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.gpu
def test_nvml_discovers_the_real_gpus_with_short_models():
    if not _has_nvidia_gpu():
        pytest.skip("needs an NVIDIA GPU")
    inventory = nvml_inventory("real", ModelMap())
    assert inventory.devices and not inventory.simulated
    for i, device in enumerate(inventory.devices):
        assert device.index == i and device.uuid.startswith("GPU-") and device.memory_gib > 1
        assert device.model and " " not in device.model and not device.model.startswith("NVIDIA")
    from agent.metrics import nvml_reader

    util, sm_active, fb_used = nvml_reader()(0)
    assert 0 <= util <= 100 and 0 <= sm_active <= 1 and fb_used >= 0

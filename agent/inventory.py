"""What a node has: a simulated inventory from a SPEC, or the real GPUs found through NVML.

NVML reports long names (``NVIDIA H100 80GB HBM3``); the scheduler matches short models (``H100``).
:class:`ModelMap` maps one to the other with a built-in table that operators extend with a JSON
file (``--model-map``): ``{"NVIDIA Some GPU 96GB": "SOMEGPU", "Quadro X": "QX"}``. Their entries
are tried first, each as an exact name and then as a substring, case-insensitively.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from agent.spec import SimSpec

log = logging.getLogger("tessera.agent")

# Short models, most specific first: each matches as a whole token of the NVML name, so
# "L40S" never reads as "L40" or "L4", and "A100" never as "A10".
BUILTIN_MODELS = (
    "GB200",
    "B200",
    "B100",
    "GH200",
    "H200",
    "H100",
    "H800",
    "H20",
    "A100",
    "A800",
    "A10G",
    "A10",
    "A16",
    "A2",
    "A30",
    "A40",
    "L40S",
    "L40",
    "L4",
    "T4",
    "V100",
    "P100",
    "P40",
    "P4",
    "K80",
    "A6000",
    "A5000",
    "A4000",
    "RTX6000",
)
_NAMESPACE = uuid.UUID("6f1c3b52-6a8e-4cf5-9a0c-7f7e2c0d5b11")


class NoGPUs(RuntimeError):
    """NVML found no GPU (or is not there); the message names NVML's own words."""


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    uuid: str
    model: str
    memory_gib: float
    device_file: str | None = None  # /dev/nvidiaN (N: NVML's minor number); simulated: a stand-in or None


@dataclass
class Inventory:
    name: str
    rack: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    kind: str = "gpu"
    cpus: float = 0.0
    memory_gib: float = 0.0
    nvlink_domain: int = 1
    devices: list[DeviceInfo] = field(default_factory=list)
    simulated: bool = True
    price_per_gpu_hour: float | None = None  # None: not sent (the operator sets it)
    checkpoint_root: str = ""  # the shared checkpoint root's identifier ("": node-local)

    def register_body(self, metrics_url: str, address: str = "") -> dict[str, Any]:
        priced = {} if self.price_per_gpu_hour is None else {"price_per_gpu_hour": self.price_per_gpu_hour}
        return {
            **priced,
            "name": self.name,
            "rack": self.rack,
            "labels": dict(self.labels),
            "kind": self.kind,
            "cpus": self.cpus,
            "memory_gib": self.memory_gib,
            "nvlink_domain": self.nvlink_domain,
            "metrics_url": metrics_url,
            "address": address,
            "checkpoint_root": self.checkpoint_root,
            "devices": [
                {"index": d.index, "uuid": d.uuid, "model": d.model, "memory_gib": d.memory_gib}
                for d in self.devices
            ],
        }


def simulated_inventory(name: str, spec: SimSpec) -> Inventory:
    """A node of ``spec.count`` GPUs of ``spec.model``; UUIDs stable for a node name."""
    devices = [
        DeviceInfo(
            i,
            f"GPU-{uuid.uuid5(_NAMESPACE, f'{name}/{i}')}",
            spec.model,
            spec.gpu_memory_gib,
            device_file=f"{spec.devices}/nvidia{i}" if spec.devices else None,
        )
        for i in range(spec.count)
    ]
    return Inventory(
        name=name,
        rack=spec.rack,
        labels=dict(spec.labels),
        cpus=spec.cpus,
        memory_gib=spec.memory_gib,
        nvlink_domain=spec.nvlink,
        devices=devices,
        simulated=True,
    )


class ModelMap:
    """NVML name → short model."""

    def __init__(self, extra: dict[str, str] | None = None):
        self.extra = {k.strip().lower(): v.strip() for k, v in (extra or {}).items()}

    @classmethod
    def from_file(cls, path: str | None) -> ModelMap:
        if not path:
            return cls()
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--model-map {path}: {exc}") from None
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k.strip() and v.strip() for k, v in data.items()
        ):
            raise ValueError(f"--model-map {path}: expected a JSON object of NVML name → short model")
        return cls(data)

    def short(self, nvml_name: str) -> str:
        name = nvml_name.strip()
        lowered = name.lower()
        if lowered in self.extra:
            return self.extra[lowered]
        for pattern, model in self.extra.items():
            if pattern in lowered:
                return model
        for model in BUILTIN_MODELS:
            if re.search(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![A-Za-z0-9])", name, re.IGNORECASE):
                return model
        fallback = re.sub(r"^(NVIDIA|Tesla)\s+", "", name, flags=re.IGNORECASE)
        fallback = re.sub(r"[^A-Za-z0-9._-]+", "-", fallback).strip("-")[:64] or "unknown"
        log.warning("unknown GPU %r: calling it %r (add it to a --model-map file)", name, fallback)
        return fallback


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def nvml_inventory(name: str, model_map: ModelMap, nvlink: int | None = None) -> Inventory:
    """The node's real GPUs; raises :class:`NoGPUs` saying why when there are none."""
    try:
        import pynvml  # only on a node with NVIDIA GPUs: a simulated agent never loads NVML
    except ImportError as exc:  # nvidia-ml-py is a dependency; this is a broken install
        raise NoGPUs(f"no NVIDIA GPUs found (NVML: nvidia-ml-py is not installed: {exc})") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoGPUs(f"no NVIDIA GPUs found (NVML: {exc})") from None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise NoGPUs("no NVIDIA GPUs found (NVML: 0 devices)")
        devices, linked = [], 0
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
            devices.append(
                DeviceInfo(
                    i,
                    _text(pynvml.nvmlDeviceGetUUID(handle)),
                    model_map.short(_text(pynvml.nvmlDeviceGetName(handle))),
                    round(memory, 1),
                    f"/dev/nvidia{pynvml.nvmlDeviceGetMinorNumber(handle)}",
                )
            )
            linked += _has_active_nvlink(pynvml, handle)
    except pynvml.NVMLError as exc:
        raise NoGPUs(f"no usable NVIDIA GPUs (NVML: {exc})") from None
    # Without a flag: all GPUs linked → one island (NVSwitch systems), otherwise none.
    domain = nvlink or (count if linked == count and count > 1 else 1)
    return Inventory(
        name=name,
        cpus=float(os.cpu_count() or 0),
        memory_gib=_host_memory_gib(),
        nvlink_domain=domain,
        devices=devices,
        simulated=False,
    )


def _has_active_nvlink(pynvml: Any, handle: Any) -> bool:  # NVML ships no types
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                return True
        except pynvml.NVMLError:
            return False
    return False


def _host_memory_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0

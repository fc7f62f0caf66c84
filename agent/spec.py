"""The ``--simulate`` SPEC: ``COUNTxMODEL`` with optional ``,nvlink=N``, ``,rack=R``, ``,cpus=N``,
``,memory_gib=N`` and ``,labels=k:v;k:v`` (docs/agent.md), e.g.
``8xA100,nvlink=4,rack=r2``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAX_GPUS = 1024
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
RACK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,63}$")

# Memory of one GPU by model (GiB), for simulated inventories; unknown models get DEFAULT_GPU_GIB.
GPU_MEMORY_GIB = {
    "B200": 192,
    "H200": 141,
    "GH200": 96,
    "H100": 80,
    "H800": 80,
    "A100": 80,
    "A800": 80,
    "L40S": 48,
    "L40": 48,
    "A40": 48,
    "A30": 24,
    "A10": 24,
    "A10G": 24,
    "L4": 24,
    "V100": 32,
    "T4": 16,
    "P100": 16,
}
DEFAULT_GPU_GIB = 16
# A simulated node's host resources per GPU when the SPEC does not say.
CPUS_PER_GPU = 16
MEMORY_GIB_PER_GPU = 128


class SpecError(ValueError):
    """The SPEC cannot be used; the message says what is wrong and what is expected."""


@dataclass(frozen=True)
class SimSpec:
    count: int
    model: str
    nvlink: int = 1
    rack: str = "default"
    cpus: float = 0.0
    memory_gib: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    # Stand-ins for the GPUs' device files, DIR/nvidia<index> (``devices=DIR``): what a job may
    # open of them is what it may of real ones (agent/sandbox.py); "" = none.
    devices: str = ""

    @property
    def gpu_memory_gib(self) -> float:
        return float(GPU_MEMORY_GIB.get(self.model, DEFAULT_GPU_GIB))


EXPECTED = "expected COUNTxMODEL[,nvlink=N][,rack=R][,cpus=N][,memory_gib=N][,labels=k:v;k:v][,devices=DIR]"


def parse_spec(text: str) -> SimSpec:
    """Parse a SPEC or raise :class:`SpecError` with a message a person can act on."""
    parts = [p.strip() for p in text.strip().split(",")]
    if not parts or not parts[0]:
        raise SpecError(f"empty spec; {EXPECTED}, e.g. 8xA100,nvlink=4,rack=r2")
    head = re.fullmatch(r"(\d+)\s*[xX]\s*(\S+)", parts[0])
    if head is None:
        raise SpecError(f"{parts[0]!r} is not COUNTxMODEL; {EXPECTED}")
    count, model = int(head.group(1)), head.group(2)
    if not 1 <= count <= MAX_GPUS:
        raise SpecError(f"GPU count {count} must be between 1 and {MAX_GPUS}")
    if not MODEL_RE.match(model):
        raise SpecError(f"model {model!r}: letters, digits, '.', '_' and '-' only (e.g. A100)")
    options: dict[str, str] = {}
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"{part!r} is not key=value; {EXPECTED}")
        if key in options:
            raise SpecError(f"{key} given twice")
        options[key] = value.strip()
    unknown = set(options) - {"nvlink", "rack", "cpus", "memory_gib", "labels", "devices"}
    if unknown:
        raise SpecError(f"unknown option {sorted(unknown)[0]!r}; {EXPECTED}")
    nvlink = _int(options, "nvlink", 1)
    if not 1 <= nvlink <= count or count % nvlink:
        raise SpecError(f"nvlink={nvlink} must divide the GPU count {count} (islands of equal size)")
    rack = options.get("rack", "default")
    if not RACK_RE.match(rack):
        raise SpecError(f"rack {rack!r}: letters, digits, '.', '_' and '-' only")
    cpus = _number(options, "cpus", float(CPUS_PER_GPU * count))
    memory_gib = _number(options, "memory_gib", float(MEMORY_GIB_PER_GPU * count))
    labels = parse_labels(options.get("labels", ""))
    devices = options.get("devices", "")
    if devices and not devices.startswith("/"):
        raise SpecError(f"devices={devices!r} must be an absolute directory")
    return SimSpec(count, model, nvlink, rack, cpus, memory_gib, labels, devices)


def parse_labels(text: str) -> dict[str, str]:
    """``k:v;k:v`` → a dict (an empty text → no labels)."""
    labels: dict[str, str] = {}
    for item in filter(None, (i.strip() for i in text.split(";"))):
        key, sep, value = item.partition(":")
        if not sep or not LABEL_KEY_RE.match(key.strip()):
            raise SpecError(f"label {item!r} is not key:value (labels=k:v;k:v)")
        if not value.strip().isprintable() or len(value.strip()) > 128:
            raise SpecError(f"label {key.strip()!r}: value must be printable, at most 128 characters")
        labels[key.strip()] = value.strip()
    return labels


def _int(options: dict[str, str], key: str, default: int) -> int:
    if key not in options:
        return default
    try:
        return int(options[key])
    except ValueError:
        raise SpecError(f"{key}={options[key]!r} is not a whole number") from None


def _number(options: dict[str, str], key: str, default: float) -> float:
    if key not in options:
        return default
    try:
        value = float(options[key])
    except ValueError:
        raise SpecError(f"{key}={options[key]!r} is not a number") from None
    if not math.isfinite(value) or value <= 0 or value > 1e6:
        raise SpecError(f"{key}={options[key]!r} must be a positive number")
    return value

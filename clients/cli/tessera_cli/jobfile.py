"""Job files: the API's job body in YAML (or JSON, which is YAML too), plus the spelling of
Kubernetes that users know — ``resources.limits`` (``nvidia.com/gpu``, ``cpu``, ``memory``) and
``metadata.name``. Everything else goes to the server as written, which names any field it
refuses (an unknown one included), so the file is validated by the server's own rules.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from tessera_cli import outcome
from tessera_cli.errors import CliError

GPU_KEYS = ("nvidia.com/gpu", "amd.com/gpu", "gpu")
_BINARY = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1.0, "Ti": 2**10, "Pi": 2**20}
_DECIMAL = {"k": 1e3 / 2**30, "M": 1e6 / 2**30, "G": 1e9 / 2**30, "T": 1e12 / 2**30, "": 1 / 2**30}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]i|[kMGT]?)\s*$")


def read(path: str) -> tuple[dict[str, Any], bytes]:
    """The body a job file describes, and the file's bytes (for the idempotency key)."""
    try:
        raw = Path(path).read_bytes() if path != "-" else _stdin()
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror}", outcome.BAD_INPUT) from None
    return parse(raw, path), raw


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing a mapping that gives one key twice (YAML reads the
    last; the API refuses such JSON, so a job file that did would submit another job than the
    same body sent as JSON)."""


def _mapping_once_each(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: list[Any] = []
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {key!r} is given more than once", key_node.start_mark
            )
        seen.append(key)
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_once_each)


def _stdin() -> bytes:
    import sys

    return sys.stdin.buffer.read()


def parse(raw: bytes, name: str = "job file") -> dict[str, Any]:
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except UnicodeDecodeError:
        raise CliError(f"{name}: not UTF-8 text", outcome.BAD_INPUT) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise CliError(f"{name}: malformed YAML{where}: {exc.problem}", outcome.BAD_INPUT) from None
    except yaml.YAMLError as exc:
        raise CliError(f"{name}: malformed YAML: {exc}", outcome.BAD_INPUT) from None
    if not isinstance(data, dict):
        raise CliError(f"{name}: a job file is a mapping of the job's fields", outcome.BAD_INPUT)
    _check_json(data, name, "")
    return translate(data, name)


def _check_json(value: Any, name: str, where: str) -> None:
    """Refuse, naming where it is, what YAML reads but a JSON body cannot carry: a date or time
    (``name: 2024-01-01``, unquoted), ``!!binary``, a key that is not text, NaN or infinity."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CliError(f"{name}: {where}{key}: a key must be text; quote it", outcome.BAD_INPUT)
            _check_json(item, name, f"{where}{key}.")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, name, f"{where.removesuffix('.')}[{index}].")
    elif isinstance(value, float) and not math.isfinite(value):
        raise CliError(f"{name}: {where.removesuffix('.')}: must be a finite number", outcome.BAD_INPUT)
    elif value is not None and not isinstance(value, str | int | float):  # bool is an int
        what = type(value).__name__
        raise CliError(
            f"{name}: {where.removesuffix('.')}: YAML read a {what} ({value!r:.40}), which JSON has not; "
            "quote it to send it as text",
            outcome.BAD_INPUT,
        )


def translate(data: dict[str, Any], name: str = "job file") -> dict[str, Any]:
    """The API's body from a job file's mapping (Kubernetes spellings turned into the API's)."""
    body = dict(data)
    metadata = body.pop("metadata", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or set(metadata) - {"name"}:
            raise CliError(f"{name}: metadata may hold only name", outcome.BAD_INPUT)
        if "name" in metadata:
            body.setdefault("name", metadata["name"])
    resources = body.pop("resources", None)
    if resources is not None:
        body.update(_resources(resources, name))
    return body


def _resources(resources: Any, name: str) -> dict[str, Any]:
    if not isinstance(resources, dict) or set(resources) - {"limits", "requests"}:
        raise CliError(f"{name}: resources holds limits (and requests, read the same)", outcome.BAD_INPUT)
    limits = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    if not isinstance(limits, dict):
        raise CliError(f"{name}: resources.limits must be a mapping", outcome.BAD_INPUT)
    out: dict[str, Any] = {}
    for key, value in limits.items():
        where = f"{name}: resources.limits.{key}"
        if key in GPU_KEYS:
            out["gpus"] = _number(value, where)
        elif key == "cpu":
            out["cpus"] = _cpu(value, where)
        elif key == "memory":
            out["memory_gib"] = _memory_gib(value, where)
        else:
            raise CliError(f"{where}: unknown resource (nvidia.com/gpu, cpu, memory)", outcome.BAD_INPUT)
    return out


def _number(value: Any, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise CliError(f"{where}: must be a number", outcome.BAD_INPUT)
    try:
        number = float(value)
    except ValueError:
        raise CliError(f"{where}: must be a number", outcome.BAD_INPUT) from None
    return int(number) if number.is_integer() else number


def _cpu(value: Any, where: str) -> float:
    if isinstance(value, str) and value.endswith("m"):
        return _number(value[:-1], where) / 1000
    return float(_number(value, where))


def _memory_gib(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) / 2**30  # a bare number is bytes, as in Kubernetes
    match = _QUANTITY.match(value) if isinstance(value, str) else None
    if match is None:
        raise CliError(f"{where}: a quantity such as 64Gi or 500M", outcome.BAD_INPUT)
    amount, unit = float(match.group(1)), match.group(2)
    factor = _BINARY[unit] if unit in _BINARY else _DECIMAL[unit]
    return round(amount * factor, 6)


def body_digest(body: dict[str, Any]) -> str:
    """A digest of the body as it will be sent (key order does not matter)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()

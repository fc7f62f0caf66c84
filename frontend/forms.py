"""The submit form: every field of the job body as text a person types, turned into the API's body.

The form does no validation of its own beyond reading the text into JSON values: the body goes
through the API's own serializer (``JobSubmitSerializer``), so a field's message on the page is
the one the API would answer. Typed text that is not a number is passed on as it is, so that the
serializer says what it says to a client sending a string (``must be an integer``).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml
from django import forms

from scheduling.choices import JobKind, Topology

# Field name -> kind of text: the order is the form's.
INT_FIELDS = (
    "replicas",
    "min_available",
    "priority",
    "grace_seconds",
    "checkpoint_seconds",
    "time_limit_seconds",
    "max_retries",
)
FLOAT_FIELDS = ("gpus", "cpus", "memory_gib")
MAP_FIELDS = ("env", "node_selector", "prefer_labels")
JOB_FILE_MAX_BYTES = 256 * 1024 + 64 * 1024

# Presets per kind: a starting point a researcher edits (values as the form's text).
PRESETS: dict[str, dict[str, str]] = {
    "inference": {"kind": "inference", "gpus": "1", "preemptible": "false", "grace_seconds": "10"},
    "training": {
        "kind": "training",
        "gpus": "8",
        "topology": "nvlink",
        "checkpoint_seconds": "600",
        "max_retries": "2",
    },
    "finetune": {"kind": "finetune", "gpus": "4", "topology": "node", "checkpoint_seconds": "900"},
    "batch": {"kind": "batch", "gpus": "1", "time_limit_seconds": "3600", "max_retries": "1"},
}


def _choices(values: list[str], blank: str) -> list[tuple[str, str]]:
    return [("", blank), *((v, v) for v in values)]


class JobForm(forms.Form):
    """Text in, the API's job body out (:meth:`body`); errors come from the API's serializer."""

    job_file = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"})
    )
    upload = forms.FileField(required=False)
    tenant = forms.CharField(required=False)
    name = forms.CharField(required=False)
    kind = forms.ChoiceField(required=False, choices=_choices(list(JobKind.values), "—"))
    command = forms.CharField(required=False)
    gpus = forms.CharField(required=False)
    replicas = forms.CharField(required=False)
    min_available = forms.CharField(required=False)
    accelerators = forms.CharField(required=False)
    topology = forms.ChoiceField(required=False, choices=_choices(list(Topology.values), "default (any)"))
    priority = forms.CharField(required=False)
    preemptible = forms.ChoiceField(
        required=False, choices=[("", "default for the kind"), ("true", "yes"), ("false", "no")]
    )
    grace_seconds = forms.CharField(required=False)
    checkpoint_seconds = forms.CharField(required=False)
    time_limit_seconds = forms.CharField(required=False)
    cpus = forms.CharField(required=False)
    memory_gib = forms.CharField(required=False)
    env = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}))
    node_selector = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    prefer_labels = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    max_retries = forms.CharField(required=False)
    interactive = forms.ChoiceField(
        required=False, choices=[("", "no (default)"), ("true", "yes"), ("false", "no")]
    )
    idle_reclaim = forms.ChoiceField(
        required=False, choices=[("", "never (default)"), ("never", "never"), ("allow", "allow")]
    )
    elastic_min_gpus = forms.CharField(required=False)
    elastic_max_gpus = forms.CharField(required=False)

    read_so_far: dict[str, Any] | None = None

    def body(self) -> dict[str, Any] | None:
        """The job body (a dict for the serializer), or None with the form's errors set."""
        data = self.cleaned_data
        file_text = self._file_text()
        if file_text is None:
            return None
        if file_text.strip():
            return self._from_file(file_text)
        body: dict[str, Any] = {}
        for name in ("tenant", "name", "kind", "topology"):
            if data.get(name):
                body[name] = data[name]
        command = data.get("command") or ""
        if command.strip():
            try:
                body["command"] = shlex.split(command)
            except ValueError as why:  # an unclosed quote
                self.add_error("command", f"cannot be split into arguments: {why}")
        for name in INT_FIELDS + FLOAT_FIELDS:
            text = (data.get(name) or "").strip()
            if text:
                body[name] = number(text)
        for name in ("preemptible", "interactive"):
            if data.get(name):
                body[name] = data[name] == "true"
        if data.get("idle_reclaim"):
            body["idle_reclaim"] = data["idle_reclaim"]
        accelerators = [a.strip() for a in (data.get("accelerators") or "").split(",") if a.strip()]
        if accelerators:
            body["accelerators"] = accelerators
        for name in MAP_FIELDS:
            text = data.get(name) or ""
            if text.strip():
                parsed = key_values(text)
                if isinstance(parsed, str):
                    self.add_error(name, parsed)
                else:
                    body[name] = parsed
        low, high = (data.get(f"elastic_{k}_gpus", "").strip() for k in ("min", "max"))
        if low or high:
            body["elastic"] = {
                "min_gpus": number(low) if low else None,
                "max_gpus": number(high) if high else None,
            }
            body["elastic"] = {k: v for k, v in body["elastic"].items() if v is not None}
        # What could be read, for the API's messages on the other fields (``read_so_far``).
        self.read_so_far = body
        return None if self.errors else body

    def _file_text(self) -> str | None:
        upload = self.cleaned_data.get("upload")
        if upload is None:
            return self.cleaned_data.get("job_file") or ""
        if upload.size > JOB_FILE_MAX_BYTES:
            self.add_error("upload", f"is larger than {JOB_FILE_MAX_BYTES // 1024} KiB")
            return None
        try:
            return upload.read().decode("utf-8")
        except UnicodeDecodeError:
            self.add_error("upload", "is not UTF-8 text")
            return None

    def _from_file(self, text: str) -> dict[str, Any] | None:
        """A YAML or JSON job file (JSON is YAML): the API's body, as the CLI reads it."""
        try:
            body = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
        except RecursionError:
            self.add_error("job_file", "is nested too deeply")
            return None
        except yaml.YAMLError as why:
            mark = getattr(why, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = (
                getattr(why, "problem", None) if isinstance(why, yaml.constructor.ConstructorError) else None
            )
            self.add_error(
                "job_file", f"is not valid YAML or JSON{where}" + (f": {problem}" if problem else "")
            )
            return None
        if not isinstance(body, dict):
            self.add_error("job_file", "must hold one job: a mapping of the body's fields")
            return None
        return body


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


def number(text: str) -> Any:
    """``"2"`` → 2, ``"0.5"`` → 0.5; anything else stays text (the serializer then refuses it)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if value == value and value not in (float("inf"), float("-inf")) else text


def key_values(text: str) -> dict[str, str] | str:
    """``KEY=VALUE`` lines → a dict, or the problem in words."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            return f"line {n}: write KEY=VALUE"
        out[key.strip()] = value.strip()
    return out


def initial_from_job(job: Any) -> dict[str, str]:
    """A stored job's body as the form's text (resubmit as a copy).

    Where the fields cannot carry the body as it is (a map value with a line break, or spaces
    at an end, is not one ``KEY=VALUE`` line), the copy is the job file instead: a copy that
    differs from its source would be submitted without anyone seeing the difference.
    """
    out = {
        "name": job.name,
        "kind": job.kind,
        "command": shlex.join(job.command),
        "gpus": number_text(job.gpus),
        "replicas": str(job.replicas),
        "min_available": str(job.min_available),
        "accelerators": ", ".join(job.accelerators),
        "topology": job.topology,
        "priority": str(job.priority),
        "preemptible": "true" if job.preemptible else "false",
        "grace_seconds": str(job.grace_seconds),
        "checkpoint_seconds": str(job.checkpoint_seconds or ""),
        "time_limit_seconds": str(job.time_limit_seconds or ""),
        "cpus": number_text(job.cpus) if job.cpus else "",
        "memory_gib": number_text(job.memory_gib) if job.memory_gib else "",
        "max_retries": str(job.max_retries),
        "elastic_min_gpus": str(job.elastic_min_gpus or ""),
        "elastic_max_gpus": str(job.elastic_max_gpus or ""),
        "interactive": "true" if job.interactive else "false",
        "idle_reclaim": job.idle_reclaim,
    }
    lossless = True
    for name in MAP_FIELDS:
        mapping = dict(getattr(job, name) or {})
        out[name] = "\n".join(f"{k}={v}" for k, v in mapping.items())
        lossless = lossless and key_values(out[name]) == mapping
    if not lossless:
        return {"job_file": body_as_json(job_body(job))}
    return out


def job_body(job: Any) -> dict[str, Any]:
    """A stored job as the API's job body (what resubmitting it sends)."""
    body: dict[str, Any] = {
        "name": job.name,
        "kind": job.kind,
        "command": list(job.command),
        "gpus": job.gpus if not float(job.gpus).is_integer() else int(job.gpus),
        "replicas": job.replicas,
        "min_available": job.min_available,
        "accelerators": list(job.accelerators),
        "topology": job.topology,
        "priority": job.priority,
        "preemptible": job.preemptible,
        "grace_seconds": job.grace_seconds,
        "checkpoint_seconds": job.checkpoint_seconds,
        "time_limit_seconds": job.time_limit_seconds,
        "max_retries": job.max_retries,
        "env": dict(job.env or {}),
        "node_selector": dict(job.node_selector or {}),
        "prefer_labels": dict(job.prefer_labels or {}),
        "interactive": job.interactive,
        "idle_reclaim": job.idle_reclaim,
    }
    if job.cpus:
        body["cpus"] = job.cpus
    if job.memory_gib:
        body["memory_gib"] = job.memory_gib
    if job.elastic_min_gpus is not None or job.elastic_max_gpus is not None:
        body["elastic"] = {"min_gpus": job.elastic_min_gpus, "max_gpus": job.elastic_max_gpus}
    return body


def number_text(value: float) -> str:
    """A stored number as text that reads back as the same number (``f"{x:g}"`` keeps only six
    digits: 1.2345678 came back as 1.23457)."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def body_as_json(body: dict[str, Any]) -> str:
    return json.dumps(body, indent=2, ensure_ascii=False)

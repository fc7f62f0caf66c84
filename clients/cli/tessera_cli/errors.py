"""The one exception the commands raise: a message for a person and the exit code to leave with."""

from __future__ import annotations

from typing import Any


class CliError(Exception):
    def __init__(self, message: str, code: int, body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.body = body  # the server's error body, when there was one (``-o json`` prints it)


def describe_api_error(status: int, body: Any) -> str:
    """One line from an error body in the API's shapes: ``{"detail": "..."}`` or
    ``{"field": ["reason", ...], ...}`` (each field named, as the server named it)."""
    if isinstance(body, dict):
        if isinstance(body.get("detail"), str) and len(body) == 1:
            return body["detail"]
        parts = []
        for field, reasons in body.items():
            text = "; ".join(_flat(r) for r in reasons) if isinstance(reasons, list) else _flat(reasons)
            parts.append(text if field == "detail" else f"{field}: {text}")
        if parts:
            return "; ".join(parts)
    if isinstance(body, str) and body.strip():
        return body.strip().splitlines()[0][:300]
    return f"HTTP {status}"


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_flat(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "; ".join(_flat(v) for v in value)
    return str(value)

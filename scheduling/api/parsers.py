"""A JSON parser that refuses what the contract refuses: oversized bodies (413), bytes that are
not UTF-8, bodies that are not JSON objects, and objects that give one key twice (400 with
``detail``: ``{"gpus": 8, ..., "gpus": 1}`` read as its last value would quietly start a
1-GPU job for a client that merged two bodies wrongly)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser

from scheduling.api.fields import json_safe


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body is too large."
    default_code = "payload_too_large"


def _reject_constant(name: str) -> Any:
    raise ParseError(f"JSON parse error: {name} is not a valid JSON value.")


SHOWN_KEY_CHARS = 64


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a ParseError naming a key given twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            shown = json_safe(key if len(key) <= SHOWN_KEY_CHARS else key[:SHOWN_KEY_CHARS] + "…")
            raise ParseError(
                f"JSON parse error: the key {json.dumps(shown)} is given more than once in one object."
            )
        seen.add(key)
    return dict(pairs)


class StrictJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"Request body is larger than {limit} bytes.")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ParseError("Request body is not valid UTF-8.") from None
        if not text.strip():
            raise ParseError("Request body is empty; a JSON object is expected.")
        try:
            data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_once_each)
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error: {exc}") from None
        if not isinstance(data, dict):
            raise ParseError("Request body must be a JSON object.")
        return data

"""Parsing what a URL or query string names, so that no input reaches SQL unchecked.

An absurd id (``/jobs/99999999999999999999999/``) overflows PostgreSQL's bigint; a non-number
would be a type error: both are simply "not found" here.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import NotFound, ValidationError

MAX_PK = 2**63 - 1

# URLs take the id as text (so that a malformed one is our JSON 404); the schema says integer.
ID_PARAMETER = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH, description="the object's id")


def parse_pk(raw: object, what: str) -> int:
    """A URL's object id, or 404."""
    text = str(raw)
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > MAX_PK:
        raise NotFound(f"No such {what}.")
    return int(text)


def parse_nonnegative(value: str | None, field: str, default: int, maximum: int) -> int:
    """A query parameter that must be a decimal integer in ``[0, maximum]`` (400 naming it)."""
    if value is None or value == "":
        return default
    if not (value.isascii() and value.isdigit()) or len(value) > 20 or int(value) > maximum:
        raise ValidationError({field: [f"must be an integer from 0 to {maximum}"]})
    return int(value)

"""Limit/offset pagination with bounds, so that no query parameter can overflow the database, and
strict, so that a bad one is a 400 naming it rather than silently the default.

DRF's stock class passes any ``offset`` to SQL (10**30 overflows PostgreSQL's bigint and SQLite's
integer: a 500), and reads ``offset=null``, ``limit=false`` or a repeated parameter as if it were
absent. Here each is a decimal integer given at most once: ``offset`` from 0 to ``MAX_OFFSET``,
``limit`` from 0 (0: the default page) to ``MAX_OFFSET``, at most ``max_limit`` used.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

from scheduling.api.lookups import parse_nonnegative

MAX_OFFSET = 2**62


def query_integer(request, name: str, default: int, maximum: int) -> int:
    """The query parameter ``name``: absent → ``default``; once, a decimal integer in
    ``[0, maximum]``; anything else a 400 naming it."""
    values = request.query_params.getlist(name)
    if len(values) > 1:
        raise ValidationError({name: ["give it at most once"]})
    if values and values[0] == "":
        raise ValidationError({name: [f"must be an integer from 0 to {maximum}"]})
    return parse_nonnegative(values[0] if values else None, name, default, maximum)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    def get_limit(self, request) -> int:
        limit = query_integer(request, self.limit_query_param, self.default_limit, MAX_OFFSET)
        return min(limit or self.default_limit, self.max_limit)

    def get_offset(self, request) -> int:
        return query_integer(request, self.offset_query_param, 0, MAX_OFFSET)

    def get_schema_operation_parameters(self, view) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"] = {**parameter["schema"], "minimum": 0, "maximum": MAX_OFFSET}
        return parameters

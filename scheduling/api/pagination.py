"""Limit/offset pagination with bounds, so that no query parameter can overflow the database.

DRF's stock class passes any ``offset`` to SQL; 10**30 overflows PostgreSQL's bigint (and
SQLite's integer) and would answer 500.
"""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination

MAX_OFFSET = 2**62


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    def get_offset(self, request) -> int:
        return min(super().get_offset(request), MAX_OFFSET)

"""The lists' pages: limit/offset with bounds, so that no query parameter can overflow the database,
and strict, so that a bad one is a 400 naming it rather than silently the default; and keyset
pages (a ``cursor``) for the lists that change while a client reads them (jobs, a job's events).

DRF's stock class passes any ``offset`` to SQL (10**30 overflows PostgreSQL's bigint and SQLite's
integer: a 500), and reads ``offset=null``, ``limit=false`` or a repeated parameter as if it were
absent. Here each is a decimal integer given at most once: ``offset`` from 0 to ``MAX_OFFSET``,
``limit`` from 0 (0: the default page) to ``MAX_OFFSET``, at most ``max_limit`` used.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

from django.db.models import Q
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import BasePagination, Cursor, CursorPagination, LimitOffsetPagination
from rest_framework.response import Response

from scheduling.api.lookups import parse_nonnegative
from scheduling.api.query_params import refuse_unknown

MAX_OFFSET = 2**62
REPEATED = "give it at most once"


def query_integer(request, name: str, default: int, maximum: int) -> int:
    """The query parameter ``name``: absent → ``default``; once, a decimal integer in
    ``[0, maximum]``; anything else a 400 naming it."""
    values = request.query_params.getlist(name)
    if len(values) > 1:
        raise ValidationError({name: [REPEATED]})
    if values and values[0] == "":
        raise ValidationError({name: [f"must be an integer from 0 to {maximum}"]})
    return parse_nonnegative(values[0] if values else None, name, default, maximum)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    def paginate_queryset(self, queryset, request, view=None) -> list[Any] | None:
        refuse_unknown(request, view, self.query_params())
        return super().paginate_queryset(queryset, request, view)

    def query_params(self) -> set[str]:
        """The query parameters these pages read."""
        return {self.limit_query_param, self.offset_query_param}

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


def _id_position(text: str) -> object:
    return int(text) if text.isascii() and text.isdigit() and int(text) < 2**63 else None


def _time_position(text: str) -> object:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None  # the server's cursors carry their zone


BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
BAD_CURSOR = "not a cursor this list gave: start again without it, then follow `next`"


class KeysetPagination(CursorPagination):
    """Pages that follow a key (``ordering``), not a count of rows: ``next`` carries a ``cursor``
    naming the last row given, and the next page starts after it. A row that leaves the filtered
    set (a pending job starts) or arrives (a new job, newest first: before the cursor) between
    two pages moves no other row, so every row that stays in the set is given exactly once.

    The answer keeps the shape of the other lists: ``count`` (the set as it is now), ``next``,
    ``previous``, ``results``; ``limit`` sets the page size as there. ``position``: parses the
    cursor's key (None: not one), so that a forged cursor is a 400 naming ``cursor``, not SQL's
    error."""

    ordering: Any = "-id"
    page_size = 100
    max_page_size = 1000
    page_size_query_param = "limit"
    position: Callable[[str], object] = staticmethod(_id_position)

    def get_page_size(self, request) -> int:
        limit = query_integer(request, self.page_size_query_param, self.page_size, MAX_OFFSET)
        return min(limit or self.page_size, self.max_page_size)

    def decode_cursor(self, request) -> Cursor | None:
        if len(request.query_params.getlist(self.cursor_query_param)) > 1:
            raise ValidationError({self.cursor_query_param: [REPEATED]})
        if request.query_params.get(self.cursor_query_param) == "":
            return None  # empty: none, the first page (as an empty filter filters nothing)
        given = request.query_params.get(self.cursor_query_param)
        if given is not None and not BASE64.fullmatch(given):
            # b64decode drops what is not base64, so "!!!" or NULs would read as the first page
            raise ValidationError({self.cursor_query_param: [BAD_CURSOR]})
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            raise ValidationError({self.cursor_query_param: [BAD_CURSOR]}) from None
        if cursor is not None and cursor.position is not None and self.position(str(cursor.position)) is None:
            raise ValidationError({self.cursor_query_param: [BAD_CURSOR]})
        return cursor

    def paginate_queryset(self, queryset, request, view=None) -> list[Any] | None:
        self.count = queryset.count()
        return super().paginate_queryset(queryset, request, view)

    def get_paginated_response(self, data: Any) -> Response:
        return Response(
            {
                "count": self.count,
                "next": self.get_next_link(),
                "previous": self.get_previous_link(),
                "results": data,
            }
        )

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        answer = super().get_paginated_response_schema(schema)
        answer["required"] = ["count", "results"]
        answer["properties"] = {"count": {"type": "integer", "example": 123}, **answer["properties"]}
        return answer

    def get_schema_operation_parameters(self, view) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}
        return parameters


def _event_position(text: str) -> tuple[datetime, int] | None:
    """An events cursor's key, ``<at>|<id>`` (None: not one the server gave)."""
    at, bar, pk = text.rpartition("|")
    when, number = _time_position(at), _id_position(pk)
    if not bar or not isinstance(when, datetime) or not isinstance(number, int):
        return None
    return when, number


class EventPagination(KeysetPagination):
    """A job's events, oldest first: one page holds the history of nearly every job.

    The cursor names the last event given by its whole key, ``(at, id)``: many events may share
    one ``at`` (a bulk write, a coarse clock), and DRF's cursor, which keeps only the first
    ordering field and a count of the rows after it (capped at 1,000), repeated or skipped
    events once more than a page shared one timestamp."""

    ordering = ("at", "id")
    page_size = 1000
    position = staticmethod(_event_position)

    def paginate_queryset(self, queryset, request, view=None) -> list[Any] | None:
        self.count = queryset.count()
        self.request = request
        self.page_size = self.get_page_size(request)
        self.base_url = request.build_absolute_uri()
        self.cursor = self.decode_cursor(request)
        reverse = self.cursor is not None and self.cursor.reverse
        key = _event_position(str(self.cursor.position)) if self.cursor and self.cursor.position else None
        if key is not None:
            at, pk = key
            after = Q(at__lt=at) | Q(at=at, id__lt=pk) if reverse else Q(at__gt=at) | Q(at=at, id__gt=pk)
            queryset = queryset.filter(after)
        queryset = queryset.order_by("-at", "-id") if reverse else queryset.order_by("at", "id")
        rows = list(queryset[: self.page_size + 1])
        more, self.page = len(rows) > self.page_size, rows[: self.page_size]
        if reverse:
            self.page.reverse()
        # Forward: more rows after this page, and (from a cursor) some before it; reverse: the
        # other way round.
        self.has_next, self.has_previous = (key is not None, more) if reverse else (more, key is not None)
        self.has_previous = self.has_previous and bool(self.page)
        self.has_next = self.has_next and bool(self.page)
        return self.page

    def _cursor(self, event: Any, reverse: bool) -> str:
        position: Any = f"{event.at.isoformat()}|{event.id}"  # DRF's stubs say int; any text works
        return self.encode_cursor(Cursor(offset=0, reverse=reverse, position=position))

    def get_next_link(self) -> str | None:
        if not self.has_next:
            return None
        return self._cursor(cast(list[Any], self.page)[-1], reverse=False)

    def get_previous_link(self) -> str | None:
        if not self.has_previous:
            return None
        return self._cursor(cast(list[Any], self.page)[0], reverse=True)


class KeysetOrOffsetPagination(BasePagination):
    """Keyset pages (:class:`KeysetPagination`), or, for a request that names an ``offset`` (the
    clients written before cursors), the limit/offset pages it was given before, which may skip
    or repeat a row that moves between two requests."""

    keyset_class: type[KeysetPagination] = KeysetPagination

    def __init__(self) -> None:
        self.keyset = self.keyset_class()
        self.offset = BoundedLimitOffsetPagination()
        self.chosen: BasePagination = self.keyset

    def paginate_queryset(self, queryset, request, view=None) -> list[Any] | None:
        refuse_unknown(request, view, self.query_params())
        if self.offset.offset_query_param in request.query_params:
            if request.query_params.get(self.keyset.cursor_query_param):
                raise ValidationError({"cursor": ["give either `cursor` or `offset`, not both"]})
            self.chosen = self.offset
            queryset = queryset.order_by(*_ordering(self.keyset.ordering))
            return self.offset.paginate_queryset(queryset, request, None)  # parameters checked above
        return self.keyset.paginate_queryset(queryset, request, view)

    def get_paginated_response(self, data: Any) -> Response:
        return self.chosen.get_paginated_response(data)

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return self.keyset.get_paginated_response_schema(schema)

    def get_schema_operation_parameters(self, view) -> list[dict[str, Any]]:
        offset = [p for p in self.offset.get_schema_operation_parameters(view) if p["name"] == "offset"]
        offset[0]["description"] = (
            "for older clients: rows from this one on (may skip or repeat a row that moves)"
        )
        return self.keyset.get_schema_operation_parameters(view) + offset

    def query_params(self) -> set[str]:
        """The query parameters these pages read."""
        return {
            self.keyset.cursor_query_param,
            self.keyset.page_size_query_param,
            self.offset.offset_query_param,
        }


def _ordering(ordering: Any) -> tuple[str, ...]:
    return (ordering,) if isinstance(ordering, str) else tuple(ordering)


class EventOrOffsetPagination(KeysetOrOffsetPagination):
    """A job's events: paged only when the request names ``limit``, ``cursor`` or ``offset``;
    otherwise the view answers the contract's one plain list. The schema says both."""

    keyset_class = EventPagination

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {"oneOf": [schema, super().get_paginated_response_schema(schema)]}

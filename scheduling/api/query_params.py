"""A list's query parameters are the ones it reads: any other is a 400 naming it.

django-filter and DRF ignore a parameter they do not know, so ``GET /jobs/?stat=running`` (a typo
of ``state``) answered every job, and a CI script then cancelled the wrong ones. Every list
endpoint pages, so its paginator refuses the unknown ones (:func:`refuse_unknown`) before it
reads a row: what a list reads is its filters (the view's FilterSet, where the view filters with
it, and ``query_filters``, the names a view reads itself), its paginator's parameters and DRF's
``format``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.settings import api_settings

from scheduling.api.fields import json_safe

SHOWN_NAME_CHARS = 64  # an error names an unknown parameter by at most this many characters


def known_to(view: Any, paging: Iterable[str]) -> set[str]:
    """The query parameters the list ``view`` reads, besides its paginator's ``paging``."""
    known = set(paging) | set(getattr(view, "query_filters", ()))
    if api_settings.URL_FORMAT_OVERRIDE:
        known.add(api_settings.URL_FORMAT_OVERRIDE)
    filterset = getattr(view, "filterset_class", None)
    if filterset is not None and getattr(view, "filter_backends", None):
        known |= set(filterset.base_filters)
    return known


def refuse_unknown(request: Any, view: Any, paging: Iterable[str]) -> None:
    """A 400 naming each query parameter of ``request`` that the list ``view`` does not read."""
    if view is None:
        return
    known = known_to(view, paging)
    unknown = [name for name in request.query_params if name not in known]
    if unknown:
        takes = ", ".join(sorted(known))
        raise ValidationError(
            {
                json_safe(_shown(name)): [f"unknown query parameter; this list takes: {takes}"]
                for name in unknown
            }
        )


def _shown(name: str) -> str:
    return name if len(name) <= SHOWN_NAME_CHARS else name[:SHOWN_NAME_CHARS] + "…"

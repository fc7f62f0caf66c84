"""An endpoint's query parameters are the ones it reads: any other is a 400 naming it.

django-filter and DRF ignore a parameter they do not know, so ``GET /jobs/?stat=running`` (a typo
of ``state``) answered every job, and a CI script then cancelled the wrong ones. Every list
endpoint pages, so its paginator refuses the unknown ones (:func:`refuse_unknown`) before it
reads a row: what a list reads is its filters (the view's FilterSet, where the view filters with
it, and ``query_filters``, the names a view reads itself), its paginator's parameters and DRF's
``format``.

The other endpoints (one job, a submit, a cancel, a node, a quota, the cluster...) refuse them
likewise (:class:`ReadsItsQueryParams`, checked once the caller is authenticated): a
``GET /jobs/7/?wiat=30`` that answered at once, as if no wait had been asked, or a
``POST /jobs/?dryrun=true`` that stored a job instead of trying it, misled a script as much.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

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
    refuse_others(request, known_to(view, paging), "list")


def refuse_others(request: Any, known: set[str], what: str) -> None:
    """A 400 naming each query parameter of ``request`` not in ``known``; ``what`` words it."""
    unknown = [name for name in request.query_params if name not in known]
    if unknown:
        takes = ", ".join(sorted(known))
        raise ValidationError(
            {
                json_safe(_shown(name)): [f"unknown query parameter; this {what} takes: {takes}"]
                for name in unknown
            }
        )


class ReadsItsQueryParams:
    """A view mixin: each action (a viewset's) or method (an ``APIView``'s) reads the query
    parameters ``query_params_taken`` names for it, and ``format``; any other is a 400 naming it.
    The paged actions (``paged_actions``) are left to their paginator, which knows their filters."""

    query_params_taken: ClassVar[Mapping[str, Iterable[str]]] = {}
    paged_actions: ClassVar[frozenset[str]] = frozenset({"list"})

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]  # after authentication
        method = request.method.lower()
        if method not in self.http_method_names or getattr(self, method, None) is None:  # type: ignore[attr-defined]
            return  # a method it does not take: DRF's 405, whatever the query
        name = getattr(self, "action", None) or method
        if request.method == "OPTIONS" or name in self.paged_actions:
            return
        known = set(self.query_params_taken.get(name, ()))
        if api_settings.URL_FORMAT_OVERRIDE:
            known.add(api_settings.URL_FORMAT_OVERRIDE)
        refuse_others(request, known, "endpoint")


def _shown(name: str) -> str:
    return name if len(name) <= SHOWN_NAME_CHARS else name[:SHOWN_NAME_CHARS] + "…"

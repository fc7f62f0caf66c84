"""Content negotiation whose unknown ``?format=`` is a 400 naming ``format``.

DRF answers a ``format`` no renderer has (``?format=xml``) with a bare 404 "Not found.", which
reads as a wrong path or a job that does not exist; it is a bad query parameter.
"""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer


class NamedFormatNegotiation(DefaultContentNegotiation):
    def filter_renderers(self, renderers: Iterable[BaseRenderer], format: str) -> list[BaseRenderer]:
        renderers = list(renderers)
        chosen = [renderer for renderer in renderers if renderer.format == format]
        if not chosen:
            known = ", ".join(sorted({renderer.format for renderer in renderers}))
            raise ValidationError({"format": [f"must be one of: {known}"]})
        return chosen

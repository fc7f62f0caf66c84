"""daphne's HTTP requests without Twisted's form parsing, which daphne never uses.

Twisted's ``Request`` parses the body of a POST with a form content type into ``request.args``
and, to tell which, parses every POST's ``Content-Type`` header with the ``email`` package. daphne
hands the ASGI application the raw body and never reads ``args``, yet that header parsing alone
was a measurable share of the web processes' CPU under ``make bench-e2e`` (the figure:
docs/benchmarks/e2e.md). Twisted's own switch for it
(``parsePOSTFormSubmission``, a keyword of ``twisted.web.http.Request``) is turned off for the
requests daphne builds; the body reaches the application unchanged.
"""

from __future__ import annotations

import sys
from typing import Any


def skip_form_parsing() -> None:
    """Where daphne serves this process: its requests no longer parse forms (see the module)."""
    protocol: Any = sys.modules.get("daphne.http_protocol")  # daphne ships no types
    if protocol is None or getattr(protocol.WebRequest, "tessera_no_form_parsing", False):
        return

    class WebRequest(protocol.WebRequest):
        tessera_no_form_parsing = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("parsePOSTFormSubmission", False)
            super().__init__(*args, **kwargs)

    protocol.WebRequest = WebRequest  # what daphne's HTTPFactory.buildProtocol instantiates

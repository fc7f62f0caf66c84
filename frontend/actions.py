"""The portal's actions (cancel, hold, release, bulk cancel, revoke): POST only, but a GET of an
action's URL goes to the page the action is on.

A person whose session ended before they pressed the button is sent to sign in with the action's
URL as ``next``, and signing in brings them back there with a GET: ``require_POST`` answered that
with a blank 405. A GET still changes nothing; it only lands on the page, where they press the
button again, with the state as it is now before them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect

View = Callable[..., HttpResponse]


def post_action(page: Callable[..., str]) -> Callable[[View], View]:
    """POST runs the view; GET or HEAD redirects to ``page(request, *args, **kwargs)``."""

    def decorate(view: View) -> View:
        @wraps(view)
        def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method in ("GET", "HEAD"):
                return redirect(page(request, *args, **kwargs))
            if request.method != "POST":
                return HttpResponseNotAllowed(["POST"])
            return view(request, *args, **kwargs)

        return inner

    return decorate

"""Sign-in throttling (django-axes): the account is locked after too many wrong passwords.

Axes counts failed sign-ins per username and per client address on every page that signs people
in with a password — the portal's ``/login/`` and the admin's ``/admin/login/`` — and, at
``TESSERA_LOGIN_FAILURE_LIMIT`` (15) failures of a username or of an address, refuses it for
``TESSERA_LOGIN_LOCKOUT_MINUTES`` (15), right password or not, with a page saying so (HTTP 429).
The address is the connection's (``REMOTE_ADDR``): behind a proxy that does not pass it on, every
client shares the proxy's.
A successful sign-in resets the count. An operator lifts a lockout early in the admin (Axes →
access attempts: delete the row) or with ``manage.py axes_reset_username NAME``.

API tokens are not passwords and are not counted here (the API has its own rate limits).
"""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


class LoginThrottleBackend(AxesStandaloneBackend):
    """Axes' lockout check, for sign-ins that arrive with a request (over HTTP).

    ``authenticate()`` without a request (a management command, a shell, a test) is no sign-in
    attempt from the network; axes would raise for it, so it is passed on to the next backend.
    """

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ):
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)


def locked_out(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """The page a locked-out sign-in gets (``AXES_LOCKOUT_CALLABLE``): 429, saying for how long."""
    minutes = max(1, round(settings.AXES_COOLOFF_TIME.total_seconds() / 60))
    return render(request, "registration/locked_out.html", {"minutes": minutes}, status=429)

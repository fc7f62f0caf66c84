"""The people-facing pages: login, logout and the live dashboard (heatmap and queue).

The dashboard is plain server-rendered HTML; its script loads ``state.json`` (the snapshot) and
then applies the deltas pushed over ``/ws/dashboard/``.
"""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from frontend.redaction import viewer_for
from frontend.state import dashboard_state


class LoginView(auth_views.LoginView):
    template_name = "registration/login.html"
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    """POST only (Django 5): the dashboard's header holds the form."""


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    viewer = viewer_for(request.user)
    return render(request, "frontend/dashboard.html", {"viewer": viewer})


@require_GET
@never_cache
def state_json(request: HttpRequest) -> HttpResponse:
    # A JSON endpoint answers 401 rather than redirecting a script to the login page.
    if not request.user.is_authenticated:
        return JsonResponse({"detail": "Authentication credentials were not provided."}, status=401)
    viewer = viewer_for(request.user)
    return JsonResponse(dashboard_state(request.user, viewer))

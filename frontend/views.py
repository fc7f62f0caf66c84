"""The people-facing pages: login, logout, the live dashboard (heatmap and queue), the team page.
The job pages are in ``frontend.jobs``.

The dashboard is plain server-rendered HTML; its script loads ``state.json`` (the snapshot) and
then applies the deltas pushed over ``/ws/dashboard/``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Max
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from frontend.redaction import viewer_for
from frontend.state import dashboard_state, team_usage, utilisation_problem
from scheduling.choices import JobState
from scheduling.models import Job, Tenant


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: a form posted with a stale token (signed in again in another tab,
    which rotates it) answers 403 in the portal's layout, with a way back to the page it came
    from (a path of this site only), rather than Django's bare "Request aborted"."""
    referer = urlsplit(request.META.get("HTTP_REFERER", ""))
    same_site = referer.netloc == request.get_host() and referer.path.startswith("/")
    back = referer.path if same_site and "//" not in referer.path else reverse("dashboard")
    viewer = viewer_for(request.user) if request.user.is_authenticated else None
    return render(request, "frontend/csrf_failure.html", {"back": back, "viewer": viewer}, status=403)


class LoginView(auth_views.LoginView):
    template_name = "registration/login.html"
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    """POST only (Django 5): the dashboard's header holds the form."""


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    viewer = viewer_for(request.user)
    context = {"viewer": viewer, "utilisation_problem": utilisation_problem()}
    return render(request, "frontend/dashboard.html", context)


@require_GET
@never_cache
def state_json(request: HttpRequest) -> HttpResponse:
    # A JSON endpoint answers 401 rather than redirecting a script to the login page.
    if not request.user.is_authenticated:
        return JsonResponse({"detail": "Authentication credentials were not provided."}, status=401)
    viewer = viewer_for(request.user)
    # Without the spaces json puts after "," and ":": a sixth of the bytes, and of the time.
    return JsonResponse(dashboard_state(request.user, viewer), json_dumps_params={"separators": (",", ":")})


@require_GET
@never_cache
def queue_json(request: HttpRequest) -> HttpResponse:
    """The viewer's pending jobs in the scheduler's order, each with its place in the whole queue
    (other tenants' jobs count, but are never named): the place the last pass stored with its
    start estimate, which the job's page, the jobs list and the API's ``queue_position`` show, so
    that the dashboard never says "place 4" of a job its page calls first. A job the pass gave no
    place (held, CPU-only, not estimated yet) is left out: the page lists it after the others."""
    if not request.user.is_authenticated:
        return JsonResponse({"detail": "Authentication credentials were not provided."}, status=401)
    ranked = Job.objects.filter(state=JobState.PENDING, queue_position__isnull=False)
    counted = ranked.aggregate(n=Count("id"), last=Max("queue_position"))
    mine = (
        Job.objects.visible_to(request.user)
        .filter(state=JobState.PENDING, queue_position__isnull=False)
        .order_by("queue_position", "id")
        .values_list("pk", "queue_position")
    )
    return JsonResponse(
        {
            "order": [{"id": pk, "position": place} for pk, place in mine],
            "total": max(counted["n"], counted["last"] or 0),
        }
    )


@require_GET
@login_required
def team(request: HttpRequest) -> HttpResponse:
    """The viewer's tenant (every tenant, for operators): quota rows and what is used now."""
    viewer = viewer_for(request.user)
    tenants = Tenant.objects.visible_to(request.user).prefetch_related("quotas")
    return render(request, "frontend/team.html", {"viewer": viewer, "teams": team_usage(tenants)})

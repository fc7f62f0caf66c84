"""The portal's job pages: the list (mine or my team's), one job, the submit form, cancel.

Every read starts from ``Job.objects.visible_to(user)``, so another tenant's job is a 404 here as
in the API. Every write goes through the services the API calls (``do_submit_job``,
``do_cancel_job``), with the API's serializer validating a submitted body: the page shows the
API's own messages. Forms are POSTs under Django's CSRF check.
"""

from __future__ import annotations

import math
import re
import shlex
import uuid
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.views.decorators.http import require_GET, require_http_methods
from rest_framework.exceptions import PermissionDenied, ValidationError

from frontend.actions import post_action
from frontend.forms import PRESETS, JobForm, body_as_json, initial_from_job, job_body
from frontend.redaction import viewer_for
from frontend.sparklines import sparklines
from monitoring.adjust import job_utilisation
from scheduling.api.fields import text_problem
from scheduling.api.job_serializers import model_fields, validated_submit
from scheduling.api.jobs import submit_tenant
from scheduling.api.throttling import over_limit
from scheduling.choices import TERMINAL_STATES, JobKind, JobState
from scheduling.models import Job, LogChunk, Tenant
from scheduling.services.dryrun import dry_run
from scheduling.services.history import placements_payload, with_history
from scheduling.services.holds import do_hold_job, do_release_job
from scheduling.services.jobs import IdempotencyConflict, NotAdmissible, do_cancel_job, do_submit_job
from scheduling.states import InvalidTransition

PAGE_SIZE = 50
TIMELINE_MAX = 200  # a job's page shows its latest events; the API lists them all
# The list counts at most this many jobs (and pages that far): past it the count says "more than"
# and filters narrow it. Counting all of a team's 100,000 jobs, and OFFSETs deep into them, were
# most of the list's time.
LIST_CAP = 10_000
SORTS = {
    "newest": ("-id",),
    "oldest": ("id",),
    "name": ("name", "-id"),
    "state": ("state", "-id"),
}
LIST_COLUMNS = (
    "id",
    "name",
    "kind",
    "gpus",
    "state",
    "pending_reason",
    "exit_code",
    "submitted_at",
    "owner",
    "tenant",
    "estimated_start",  # a pending row shows its estimate and queue place
    "estimate_basis",
    "queue_position",
)
# What the previous and the next page hold, in each sort's words (by name or state: just order).
PAGER_WORDS = {"newest": ("newer", "older"), "oldest": ("older", "newer")}
SINCE_HOURS = {"1h": 1, "24h": 24, "7d": 24 * 7}
CANCELLABLE = {JobState.PENDING, JobState.SCHEDULED, JobState.RUNNING, JobState.TERMINATING}


def visible_job(request: HttpRequest, pk: int) -> Job:
    job = Job.objects.visible_to(request.user).select_related("tenant", "owner").filter(pk=pk).first()
    if job is None:
        raise Http404("No such job.")
    return job


# ---- the list --------------------------------------------------------------------------------


def filtered_jobs(request: HttpRequest) -> tuple[QuerySet[Job], dict[str, str]]:
    """The viewer's jobs under the query's filters (unknown values are ignored, never a 500)."""
    params = request.GET
    chosen: dict[str, str] = {}
    qs = Job.objects.visible_to(request.user).select_related("tenant", "owner")
    if not request.user.is_staff:
        # The team's id as a value as well: PostgreSQL then reads the (tenant, state, id) and
        # (tenant, id) indexes in order instead of sorting every match of the visible_to
        # subquery (100,000 jobs: 7 ms for a state's first page, not 87; 13 ms 10,000 deep, not 230).
        qs = qs.filter(
            tenant_id__in=list(Tenant.objects.visible_to(request.user).values_list("pk", flat=True))
        )
    scope = params.get("scope", "team")
    if scope == "mine":
        qs = qs.filter(owner=request.user.pk)  # a signed-in user (login_required)
        chosen["scope"] = "mine"
    else:
        chosen["scope"] = "team"
    state = params.get("state", "")
    if state == "active":
        qs = qs.exclude(state__in=[str(s) for s in TERMINAL_STATES])
        chosen["state"] = state
    elif state in JobState.values:
        qs = qs.filter(state=state)
        chosen["state"] = state
    kind = params.get("kind", "")
    if kind in JobKind.values:
        qs = qs.filter(kind=kind)
        chosen["kind"] = kind
    name = params.get("name", "")[:128]
    if name and not text_problem(name):
        qs = qs.filter(name__icontains=name)
        chosen["name"] = name
    owner = params.get("owner", "")[:150]
    if owner and not text_problem(owner):
        qs = qs.filter(owner__username=owner)
        chosen["owner"] = owner
    since = params.get("since", "")
    if since in SINCE_HOURS:
        qs = qs.filter(submitted_at__gte=timezone.now() - timedelta(hours=SINCE_HOURS[since]))
        chosen["since"] = since
    sort = params.get("sort", "newest")
    chosen["sort"] = sort if sort in SORTS else "newest"
    return qs.order_by(*SORTS[chosen["sort"]]), chosen


@require_GET
@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    qs, chosen = filtered_jobs(request)
    # Only what a row shows: a job's command, environment and the rest stay in the table.
    qs = qs.only(*LIST_COLUMNS, "owner__username", "tenant__name")
    paginator = CappedPaginator(qs, PAGE_SIZE)
    page = paginator.get_page(request.GET.get("page"))
    context = {
        "viewer": viewer_for(request.user),
        "page": page,
        "jobs": page.object_list,
        "chosen": chosen,
        "query": query_without_page(chosen),
        "states": ["active", *JobState.values],
        "kinds": JobKind.values,
        "sorts": list(SORTS),
        "pager_words": PAGER_WORDS.get(chosen["sort"], ("previous", "next")),
        "since_choices": list(SINCE_HOURS),
        "cancellable": {str(s) for s in CANCELLABLE},
        "capped": paginator.count > LIST_CAP,
        "cap": LIST_CAP,
    }
    template = (
        "frontend/jobs/rows.html" if request.GET.get("fragment") == "rows" else "frontend/jobs/list.html"
    )
    return render(request, template, context)


class CappedPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        jobs = cast("QuerySet[Job]", self.object_list)  # this paginator is only given job querysets
        return jobs.order_by()[: LIST_CAP + 1].count()


def query_without_page(chosen: dict[str, str]) -> str:
    return urlencode(chosen)


@post_action(lambda request: reverse("jobs"))
@login_required
def bulk_cancel(request: HttpRequest) -> HttpResponse:
    ids = [int(i) for i in request.POST.getlist("job") if i.isdigit() and len(i) < 19]
    jobs = Job.objects.visible_to(request.user).filter(pk__in=ids)
    cancelled, finished = [], []
    for job in jobs:
        if job.state not in CANCELLABLE:
            finished.append(job.pk)
            continue
        try:
            do_cancel_job(job.pk, by=request.user)
            cancelled.append(job.pk)
        except InvalidTransition:  # it finished meanwhile
            finished.append(job.pk)
    if cancelled:
        messages.success(
            request, f"Cancelling {len(cancelled)} job(s): " + ", ".join(f"#{i}" for i in cancelled)
        )
    if finished:
        messages.warning(
            request, "Already finished, left as they are: " + ", ".join(f"#{i}" for i in sorted(finished))
        )
    if not cancelled and not finished:
        messages.warning(request, "No job was selected.")
    return redirect(safe_back(request, reverse("jobs")))


def safe_back(request: HttpRequest, default: str) -> str:
    """The list's own query to return to (only a path of this site)."""
    back = request.POST.get("back", "")
    return back if back.startswith("/jobs/") and "//" not in back and "\\" not in back else default


# ---- one job ---------------------------------------------------------------------------------


@require_GET
@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = visible_job(request, pk)
    job = with_history(Job.objects.filter(pk=job.pk).select_related("tenant", "owner")).get()
    # The latest events only: a job preempted and requeued for weeks gathers thousands, and the
    # status box is fetched again on each of its changes (20,000 events: 7.4 MB, 3.8 s a fetch).
    events = list(job.events.order_by("-at", "-id")[: TIMELINE_MAX + 1])[::-1]
    earlier = job.events.count() - TIMELINE_MAX if len(events) > TIMELINE_MAX else 0
    events = events[-TIMELINE_MAX:]
    replicas = range(job.replicas)
    found = job_utilisation(job)
    context = {
        "viewer": viewer_for(request.user),
        "job": job,
        "command_line": shlex.join(job.command),
        "placements": placements_payload(job),
        "events": events,
        "earlier_events": earlier,
        "replicas": replicas,
        "can_cancel": job.state in CANCELLABLE and job.stop_reason != "cancelled",
        "utilisation": found,
        "sparklines": sparklines(found) if found.gpus else [],
        "finished": job.state in TERMINAL_STATES,
    }
    template = (
        "frontend/jobs/status.html"
        if request.GET.get("fragment") == "status"
        else "frontend/jobs/detail.html"
    )
    return render(request, template, context)


@post_action(lambda request, pk: reverse("job", args=[pk]))
@login_required
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    job = visible_job(request, pk)
    seen = request.POST.get("seen_state", "")
    if job.state in TERMINAL_STATES:
        messages.warning(
            request,
            f"Job #{job.pk} {'had already ended' if seen == job.state else 'ended meanwhile'}: "
            f"it is {job.state}, so there was nothing to cancel.",
        )
    else:
        before = job.state  # what the cancel found: the cancel itself changes it
        try:
            job = do_cancel_job(job.pk, by=request.user)
        except InvalidTransition:
            job.refresh_from_db()
            messages.warning(request, f"Job #{job.pk} ended meanwhile ({job.state}): nothing was cancelled.")
        else:
            changed = (
                f" (it changed meanwhile: it was {seen} when you looked)" if seen and seen != before else ""
            )
            ending = (
                "cancelled" if job.state == JobState.CANCELLED else "stopping: it ends once its process exits"
            )
            messages.success(request, f"Job #{job.pk} {ending}{changed}.")
    return redirect("job", pk=job.pk)


@post_action(lambda request, pk: reverse("job", args=[pk]))
@login_required
def job_hold(request: HttpRequest, pk: int) -> HttpResponse:
    """Keep a waiting job from starting (``services.holds``, as ``POST /api/v1/jobs/{id}/hold/``)."""
    job = visible_job(request, pk)
    try:
        job = do_hold_job(job.pk)
    except InvalidTransition:
        job.refresh_from_db()
        messages.warning(request, f"Job #{job.pk} is {job.state} now: only a waiting job can be held.")
    else:
        messages.success(request, f"Job #{job.pk} held: it will not start until it is released.")
    return redirect("job", pk=job.pk)


@post_action(lambda request, pk: reverse("job", args=[pk]))
@login_required
def job_release(request: HttpRequest, pk: int) -> HttpResponse:
    job = visible_job(request, pk)
    was_held = job.held
    job = do_release_job(job.pk)
    messages.success(
        request,
        f"Job #{job.pk} released: the next scheduling pass places it or says why it waits."
        if was_held
        else f"Job #{job.pk} was not held (released meanwhile): nothing changed.",
    )
    return redirect("job", pk=job.pk)


@require_GET
@login_required
def job_log_download(request: HttpRequest, pk: int) -> StreamingHttpResponse:
    """The whole stored output of one replica, as a text file."""
    job = visible_job(request, pk)
    replica = request.GET.get("replica", "0")
    if not replica.isdigit() or int(replica) >= job.replicas:
        raise Http404("No such replica.")
    chunks = (
        LogChunk.objects.filter(job=job, replica=int(replica))
        .order_by("offset")
        .values_list("data", flat=True)
    )
    response = StreamingHttpResponse(
        (bytes(c) for c in chunks.iterator(chunk_size=64)), content_type="text/plain"
    )
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-replica-{int(replica)}.log"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


# ---- submit ----------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    viewer = viewer_for(request.user)
    context: dict[str, Any] = {
        "viewer": viewer,
        "presets": list(PRESETS),
        "tenants": list(Tenant.objects.visible_to(request.user).values_list("name", flat=True))
        if viewer.operator
        else [],
    }
    # One key per form shown, sent back with it: a second press of Submit (a double click, the
    # form sent again from history) gets the first press's job, not a second job.
    key = request.POST.get("submit_key", "")
    context["submit_key"] = key if SUBMIT_KEY.fullmatch(key) else new_submit_key()
    if request.method == "GET":
        initial: dict[str, str] = {}
        source = request.GET.get("from", "")
        if source.isdigit() and len(source) < 19:
            copied = visible_job(request, int(source))
            initial = initial_from_job(copied)
            if viewer.operator:  # an operator submits for a team: the copy's is the job's own
                if "job_file" in initial:
                    initial["job_file"] = body_as_json({"tenant": copied.tenant.name, **job_body(copied)})
                initial["tenant"] = copied.tenant.name
            context["copied"] = copied
            context["copied_as_file"] = "job_file" in initial
        preset = request.GET.get("preset", "")
        if preset in PRESETS:
            initial = {**PRESETS[preset], "command": "", **{"name": ""}}
            context["preset"] = preset
        context["form"] = JobForm(initial=initial)
        context["blank"] = not initial  # a draft kept in the tab may fill it (draft.js)
        return render(request, "frontend/jobs/new.html", context)

    form = JobForm(request.POST, request.FILES)
    context["form"] = form
    retry_after = over_limit(request.user, ["submit"])  # the API's submit budget, shared
    if retry_after is not None:
        form.add_error(None, f"Too many submissions: try again in {math.ceil(retry_after)} s.")
        response = render(request, "frontend/jobs/new.html", context, status=429)
        response["Retry-After"] = str(math.ceil(retry_after))
        return response
    body = form.body() if form.is_valid() else None
    if body is None:
        if form.read_so_far is not None:
            other_fields_errors(form, form.read_so_far)
        return render(request, "frontend/jobs/new.html", context, status=400)
    try:
        validated = validated_submit(body)
        tenant = submit_tenant(request.user, validated.get("tenant"))
        cleaned = model_fields(validated)
        if "dry_run" in request.POST:
            context["dry_run"] = dry_run(tenant, cleaned)
            context["body_json"] = body_as_json(body)
            return render(request, "frontend/jobs/new.html", context)
        job, created = do_submit_job(
            request.user, tenant, cleaned, body, idempotency_key=context["submit_key"], check_quota=True
        )
    except IdempotencyConflict:
        # This form submitted a job already and was sent again with other values (Back, edit,
        # Submit): say so, with a new key, so that a deliberate second job takes one more press.
        form.add_error(
            None,
            "This form already submitted a job, with other values. Press Submit again to submit "
            "this one as another job.",
        )
        context["submit_key"] = new_submit_key()
        return render(request, "frontend/jobs/new.html", context, status=409)
    except ValidationError as invalid:
        attach_errors(form, invalid.detail)
        return render(request, "frontend/jobs/new.html", context, status=400)
    except NotAdmissible as why:
        # The API names accelerators; with none typed, the size is what the person can change,
        # so the sentence goes beside the GPUs rather than beside an empty box.
        attach_errors(form, {"accelerators" if body.get("accelerators") else "gpus": [str(why)]})
        return render(request, "frontend/jobs/new.html", context, status=400)
    except PermissionDenied as denied:
        form.add_error(None, str(denied.detail))
        return render(request, "frontend/jobs/new.html", context, status=403)
    # "job-submitted": the tab's kept draft of the form is done with (draft.js).
    if created:
        messages.success(request, f"Job #{job.pk} submitted.", extra_tags="job-submitted")
    else:
        messages.info(
            request,
            f"Job #{job.pk} was submitted by this form already: not submitted twice.",
            extra_tags="job-submitted",
        )
    return redirect("job", pk=job.pk)


SUBMIT_KEY = re.compile(r"portal-[0-9a-f]{32}")


def new_submit_key() -> str:
    """An idempotency key for one shown form (the API's, in a namespace a client's keys may share
    only by choosing it: the key is the user's own)."""
    return f"portal-{uuid.uuid4().hex}"


def other_fields_errors(form: JobForm, read: dict[str, Any]) -> None:
    """The API's messages on the fields that were read, beside a field the form could not read
    (an unclosed quote, a line that is not KEY=VALUE): all of the body's problems in one answer,
    not one more each time the person presses Submit."""
    try:
        validated_submit(read)
    except ValidationError as invalid:
        if isinstance(invalid.detail, dict):
            attach_errors(
                form,
                {
                    key: problems
                    for key, problems in invalid.detail.items()
                    if FIELD_OF.get(str(key), str(key)) in form.fields
                    and not form.has_error(FIELD_OF.get(str(key), str(key)))
                },
            )


# Body keys whose messages belong beside another field of the form.
FIELD_OF = {"elastic": "elastic_min_gpus"}


def attach_errors(form: JobForm, detail: Any) -> None:
    """The serializer's ``{"field": ["message"]}`` beside the form's fields (the file's box when
    the body came from a file, since its fields are not the form's)."""
    from_file = (
        bool(form.cleaned_data.get("job_file", "").strip()) or form.cleaned_data.get("upload") is not None
    )
    if not isinstance(detail, dict):
        form.add_error(None, str(detail))
        return
    for key, problems in detail.items():
        texts = [str(p) for p in problems] if isinstance(problems, list) else [str(problems)]
        field = FIELD_OF.get(str(key), str(key))
        if key == "detail" or key == "non_field_errors":
            form.add_error(None, texts)
        elif from_file:
            form.add_error("job_file", [f"{key}: {t}" for t in texts])
        elif field in form.fields:
            form.add_error(field, texts)
        else:
            form.add_error(None, [f"{key}: {t}" for t in texts])

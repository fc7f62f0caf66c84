"""``/api/v1/jobs/``: submit, list, read and cancel jobs; their events and logs.

Every read goes through ``Job.objects.visible_to(user)``, so another tenant's job is simply not
found (404). Writes go through the services (``do_submit_job``, ``do_cancel_job``).

Who submits for whom: a tenant's user submits for their own tenant (the body may omit ``tenant``
or name that tenant; any other name is a 400). Operators (staff) belong to no tenant, so their
body must carry ``"tenant": "<name>"`` naming the tenant the job is for (400 naming ``tenant``
otherwise). A user with no tenant who is not an operator may not submit (403).

At submit the job is checked against its tenant's quotas (``services.quotas``, called by
``do_submit_job``): a job that no quota row could ever admit is a 400 naming ``accelerators``.
"""

from __future__ import annotations

from typing import Any, cast

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
)
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ParseError, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from monitoring.adjust import job_utilisation
from scheduling.api.errors import Unprocessable
from scheduling.api.filters import JobFilter
from scheduling.api.job_serializers import (
    DryRunSerializer,
    JobEventSerializer,
    JobSerializer,
    JobSubmitSerializer,
    LogPageSerializer,
    job_data,
    model_fields,
    validated_submit,
)
from scheduling.api.logs import MAX_OFFSET, read_log
from scheduling.api.lookups import ID_PARAMETER, parse_nonnegative, parse_pk
from scheduling.api.pagination import EventOrOffsetPagination, KeysetOrOffsetPagination
from scheduling.api.permissions import is_operator, tenant_of
from scheduling.api.query_params import ReadsItsQueryParams, refuse_unknown
from scheduling.models import Job, Tenant
from scheduling.services.dryrun import dry_run
from scheduling.services.history import with_history
from scheduling.services.holds import do_hold_job, do_release_job
from scheduling.services.jobs import IdempotencyConflict, NotAdmissible, do_cancel_job, do_submit_job

MAX_IDEMPOTENCY_KEY = 255


def submit_tenant(user, named: str | None, verb: str = "submit", made: str = "job") -> Tenant:
    """The tenant a submission is for: the user's own, or, for operators, the one they name.
    ``verb`` and ``made`` word the refusals: a webhook's tenant is chosen here too."""
    if is_operator(user) and named is not None:
        tenant = Tenant.objects.visible_to(user).filter(name=named).first()
        if tenant is None:
            raise ValidationError({"tenant": ["no such tenant"]})
        return tenant
    own = tenant_of(user)
    if own is None:
        if is_operator(user):
            raise ValidationError(
                {"tenant": [f"operators belong to no tenant: name the tenant to {verb} the {made} for"]}
            )
        raise PermissionDenied("You belong to no tenant; ask an operator to add you to one.")
    if named is not None and named != own.name:
        raise PermissionDenied(f"You may {verb} {made}s only for your own tenant.")
    return own


def idempotency_key(request: Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY or not key.isprintable() or not key.isascii():
        raise ValidationError(
            {"detail": f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters."}
        )
    return key


def dry_run_asked(request: Request) -> bool:
    value = request.query_params.get("dry_run")
    if value is None:
        return False
    if value not in ("true", "false", "1", "0"):
        raise ValidationError({"dry_run": ["must be true or false"]})
    return value in ("true", "1")


# A job's events are paged only when the client names one of these (else one plain list).
PAGING = frozenset(("limit", "cursor", "offset"))


@extend_schema_view(
    list=extend_schema(summary="The caller's tenant's jobs"),
    retrieve=extend_schema(
        summary="One job",
        parameters=[
            ID_PARAMETER,
            OpenApiParameter(
                "wait",
                OpenApiTypes.FLOAT,
                description="Long-poll: answer once the job's state changes, or after this many "
                "seconds (0 to 55), with the job as it is then. A job already in a final state "
                "answers at once.",
            ),
        ],
    ),
)
class JobViewSet(ReadsItsQueryParams, viewsets.GenericViewSet):
    query_params_taken = {"retrieve": ("wait",), "create": ("dry_run",), "logs": ("offset", "replica")}
    paged_actions = frozenset({"list", "events"})  # events: paged or refused in events()
    throttle_scope = "jobs"  # submissions (create) count against the "submit" rate limit
    serializer_class = JobSerializer
    pagination_class = KeysetOrOffsetPagination  # newest first, by a cursor (pagination.py)
    filterset_class = JobFilter  # the list's query filters (scheduling/api/filters.py)
    lookup_field = "pk"
    lookup_value_regex = "[^/]+"

    def get_queryset(self) -> QuerySet[Job]:
        # Every allocation row (active and released: ``placements``) and the events that ended
        # attempts, in two queries for a whole page.
        return with_history(Job.objects.visible_to(self.request.user).select_related("tenant", "owner"))

    def get_object(self) -> Job:
        job = self.get_queryset().filter(pk=parse_pk(self.kwargs.get("pk", ""), "job")).first()
        if job is None:
            raise NotFound("No such job.")
        return job

    def list(self, request: Request) -> Response:
        page = cast(list[Job], self.paginate_queryset(self.filter_queryset(self.get_queryset())))
        return self.get_paginated_response([job_data(job) for job in page])

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(job_data(self.get_object()))

    @extend_schema(
        summary="Submit a job",
        request=JobSubmitSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY, "pattern": "^[ -~]+$"},
                OpenApiParameter.HEADER,
                description="Makes retries safe: the same key and body within 24 h returns the first "
                "job (200); the same key with another body answers 422. Keys are per user.",
            ),
            OpenApiParameter(
                "dry_run",
                OpenApiTypes.BOOL,
                description="Validate and answer (200, a dry-run result) whether and where the job "
                "would start now, or why it would wait, with the estimate; stores nothing.",
            ),
        ],
        responses={
            201: JobSerializer,
            200: OpenApiResponse(
                PolymorphicProxySerializer(
                    component_name="JobOrDryRun",
                    serializers=[JobSerializer, DryRunSerializer],
                    resource_type_field_name=None,
                ),
                description="the first job of a retried Idempotency-Key, or a dry run's answer",
            ),
        },
    )
    def create(self, request: Request) -> Response:
        # parsed by StrictJSONParser: 400/413 for what is not a JSON object
        body = cast(dict[str, Any], request.data)
        if request.stream is None:  # no body at all: DRF would hand us an empty dict
            raise ParseError("Request body is empty; a JSON object is expected.")
        dry = dry_run_asked(request)
        key = idempotency_key(request)
        validated = validated_submit(body)
        tenant = submit_tenant(request.user, validated.get("tenant"))
        cleaned = model_fields(validated)
        if dry:
            try:
                return Response(DryRunSerializer(dry_run(tenant, cleaned)).data)
            except NotAdmissible as why:
                raise ValidationError({"accelerators": [str(why)]}) from None
        try:
            job, created = do_submit_job(
                request.user,
                tenant,
                cleaned,
                body,
                idempotency_key=key,
                check_quota=True,
            )
        except NotAdmissible as why:
            raise ValidationError({"accelerators": [str(why)]}) from None
        except IdempotencyConflict:
            raise Unprocessable("This Idempotency-Key was already used with another body.") from None
        if created:
            # just stored: nothing to read back (what with_history's prefetch would have set)
            job.all_allocations, job.ending_events = [], []  # type: ignore[attr-defined]
        else:
            job = self.get_queryset().get(pk=job.pk)  # the first submit's job, as it is now
        return Response(job_data(job), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        summary="Cancel a job",
        parameters=[ID_PARAMETER],
        description="Idempotent: cancelling a cancelled job returns it. 409 if it already succeeded "
        "or failed. A pending job ends `cancelled` at once. A bound (`scheduled`) or running job is "
        "sent its stop signal (`terminating`) and ends `cancelled` once its agent reports its process "
        "exited or never started; its GPUs stay held until then.",
        request=None,
        responses={200: JobSerializer},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        do_cancel_job(job.pk, by=request.user)
        return Response(job_data(self.get_object()))

    @extend_schema(
        summary="Hold a waiting job",
        parameters=[ID_PARAMETER],
        description="Keeps a pending job from starting (pending code `held`, event `held`) until "
        "it is released. Idempotent. 409 for a job that is not pending (cancel a bound or running "
        "one instead).",
        request=None,
        responses={200: JobSerializer},
    )
    @action(detail=True, methods=["post"])
    def hold(self, request: Request, pk: str) -> Response:
        do_hold_job(self.get_object().pk)
        return Response(job_data(self.get_object()))

    @extend_schema(
        summary="Release a held job",
        parameters=[ID_PARAMETER],
        description="Lets a held job start again (event `released`); the next pass places it or "
        "gives its pending reason. Idempotent: releasing a job that is not held returns it.",
        request=None,
        responses={200: JobSerializer},
    )
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str) -> Response:
        do_release_job(self.get_object().pk)
        return Response(job_data(self.get_object()))

    @extend_schema(
        summary="A job's history, in order: one list, or pages when `limit` or `cursor` is given",
        parameters=[ID_PARAMETER],
        filters=False,
        responses={200: JobEventSerializer(many=True)},
    )
    @action(detail=True, methods=["get"], pagination_class=EventOrOffsetPagination)
    def events(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        if not PAGING.intersection(request.query_params):
            # The contract's answer (CONTRACTS.md): the whole history, one plain list.
            refuse_unknown(request, self, ())
            events = job.events.order_by("at", "id")
            return Response(JobEventSerializer(events, many=True).data)
        page = self.paginate_queryset(job.events.all())  # oldest first: EventPagination's order
        return self.get_paginated_response(JobEventSerializer(page, many=True).data)

    @extend_schema(
        summary="A running job's per-GPU utilisation over the idle policy's window",
        parameters=[ID_PARAMETER],
        filters=False,
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"])
    def utilisation(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        return Response({"job": job.pk, **job_utilisation(job).as_json()})

    @extend_schema(
        summary="A job's output from a byte offset",
        parameters=[
            ID_PARAMETER,
            OpenApiParameter(
                "offset",
                {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
                description="byte offset to read from (0)",
            ),
            OpenApiParameter(
                "replica",
                {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                description="which replica's output (0)",
            ),
        ],
        responses={200: LogPageSerializer},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        params = request.query_params
        offset = parse_nonnegative(params.get("offset"), "offset", 0, MAX_OFFSET)
        replica = parse_nonnegative(params.get("replica"), "replica", 0, 2**31 - 1)
        if replica >= job.replicas:
            raise ValidationError({"replica": [f"must be less than the job's {job.replicas} replica(s)"]})
        return Response(read_log(job, replica, offset).as_dict())

    def get_serializer_class(self) -> type[serializers.BaseSerializer[Any]]:
        return JobSubmitSerializer if self.action == "create" else JobSerializer

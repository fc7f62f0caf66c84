"""The node agent's API (``/api/v1/agent/``): register, heartbeat, and per-job reports.

Only agents call these: every view authenticates with :mod:`scheduling.api.agent_auth` and nothing
else, and a node acts only for itself and the jobs bound to it (another node's job answers 404).
The protocol is described in ``docs/agent.md``; the write paths are in
``scheduling.services.agents``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, cast

from django.conf import settings
from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling.api.agent_auth import (
    IsNode,
    IsNodeOrJoin,
    JoinPrincipal,
    JoinTokenAuthentication,
    NodeCredentialAuthentication,
    NodePrincipal,
)
from scheduling.api.errors import Conflict
from scheduling.api.fields import (
    FieldTemplates,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    kept,
)
from scheduling.services import agents as svc
from scheduling.services.operators import MAX_PRICE_PER_GPU_HOUR
from scheduling.services.utilisation import GpuReport

MAX_INT = 2**31 - 1
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z"
# Patterns that the schema declares as they are checked (its ECMA-262 reads \\Z as $).
METRICS_URL_RE = r"^(https?://[^/?#\x00-\x20]+([/?#][^\x00-\x20]*)?)?\Z"
BASE64_RE = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?\Z"
NODE_KINDS = ("gpu", "tpu", "npu", "cpu")
EXIT_REASONS = ("", "time-limit", "disk-limit", "stopped", "lost", "spawn-failed")


# --- Bodies ------------------------------------------------------------------------------------


class DeviceIn(FieldTemplates, serializers.Serializer):
    index = StrictIntegerField(min_value=0, max_value=1023)
    uuid = StrictCharField(max_length=128)
    model = StrictCharField(max_length=64)
    memory_gib = StrictFloatField(min_value=0, max_value=1e6, default=0.0)


class RegisterIn(FieldTemplates, serializers.Serializer):
    name = StrictCharField(
        max_length=128,
        validators=[RegexValidator(NAME_RE, "Letters, digits, '.', '_' and '-' only.")],
    )
    rack = StrictCharField(max_length=64, default="default")
    labels = serializers.DictField(child=StrictCharField(max_length=128, allow_blank=True), default=dict)
    kind = StrictCharField(choices=NODE_KINDS, default="gpu")
    cpus = StrictFloatField(min_value=0, max_value=1e6, default=0.0)
    memory_gib = StrictFloatField(min_value=0, max_value=1e9, default=0.0)
    nvlink_domain = StrictIntegerField(min_value=1, max_value=1024, default=1)
    # What a GPU-hour on the node costs (α weighs it); left out: the node keeps the price it has.
    price_per_gpu_hour = StrictFloatField(min_value=0, max_value=MAX_PRICE_PER_GPU_HOUR, required=False)
    metrics_url = StrictCharField(
        max_length=256,
        allow_blank=True,
        default="",
        validators=[RegexValidator(METRICS_URL_RE, "An http:// or https:// URL, or empty.")],
    )
    # A host name or an IP address other nodes reach this one at (jobs' MASTER_ADDR).
    address = StrictCharField(
        allow_blank=True,
        default="",
        validators=[RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}\Z", "A host name or an IP address.")],
    )
    # The identifier of the checkpoint root the node shares with others (its agent's
    # --checkpoint-root); empty or left out: node-local. Nodes naming the same one reach each
    # other's checkpoints.
    checkpoint_root = StrictCharField(max_length=256, allow_blank=True, default="", printable=True)
    devices = serializers.ListField(child=DeviceIn(), max_length=1024, default=list)

    def validate_labels(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 64:
            raise serializers.ValidationError("At most 64 labels.")
        for key in value:
            if not key or len(key) > 64 or "\x00" in key or not key.isprintable():
                raise serializers.ValidationError(f"Bad label name {key[:64]!r}.")
        return value

    def validate_devices(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        indices = [d["index"] for d in value]
        if len(set(indices)) != len(indices):
            raise serializers.ValidationError("Device indices must be unique.")
        return value


class RunningIn(FieldTemplates, serializers.Serializer):
    job_id = StrictIntegerField(min_value=1, max_value=svc.MAX_DB_INT)
    attempt = StrictIntegerField(min_value=0, max_value=MAX_INT)
    replica = StrictIntegerField(min_value=0, max_value=MAX_INT)
    pid = StrictIntegerField(min_value=0, max_value=MAX_INT, default=0)


class UtilisationIn(FieldTemplates, serializers.Serializer):
    gpu = StrictIntegerField(min_value=0, max_value=4095)
    job_ids = serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=MAX_INT), max_length=64, default=list
    )
    util = StrictFloatField(min_value=0, max_value=100)
    sm_active = StrictFloatField(min_value=0, max_value=1, required=False, allow_null=True)


class HeartbeatIn(FieldTemplates, serializers.Serializer):
    running = serializers.ListField(child=RunningIn(), max_length=4096, default=list)
    utilisation = serializers.ListField(child=UtilisationIn(), max_length=4096, default=list)
    # Jobs whose checkpoints the node holds past their retention: which may still resume?
    checkpoints = serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=svc.MAX_DB_INT), max_length=1024, default=list
    )


class ReplicaIn(FieldTemplates, serializers.Serializer):
    attempt = StrictIntegerField(min_value=0, max_value=MAX_INT)
    replica = StrictIntegerField(min_value=0, max_value=MAX_INT, default=0)


class StartedIn(ReplicaIn):
    pid = StrictIntegerField(min_value=0, max_value=MAX_INT, default=0)
    # When the agent saw the process start (epoch seconds, its clock); clamped by the service.
    started_at = StrictFloatField(min_value=0, max_value=1e11, required=False, allow_null=True)


class CheckpointedIn(ReplicaIn):
    # When the agent saw the marker's new line (epoch seconds, its clock); clamped by the service.
    at = StrictFloatField(min_value=0, max_value=1e11)
    line = StrictCharField(max_length=256, allow_blank=True, default="", trim_whitespace=True)


class ExitedIn(ReplicaIn):
    exit_code = StrictIntegerField(min_value=-255, max_value=255, allow_null=True)
    reason = StrictCharField(choices=EXIT_REASONS, default="", allow_blank=True)
    # Set by an agent that sent no ``started`` report (the process ended at once): its start.
    started_at = StrictFloatField(min_value=0, max_value=1e11, required=False, allow_null=True)
    pid = StrictIntegerField(min_value=0, max_value=MAX_INT, default=0)


class ExitIn(ExitedIn):
    job_id = StrictIntegerField(min_value=1, max_value=svc.MAX_DB_INT)


class ExitsIn(FieldTemplates, serializers.Serializer):
    exits = serializers.ListField(child=ExitIn(), min_length=1, max_length=256)


class LogsIn(ReplicaIn):
    offset = StrictIntegerField(min_value=0, max_value=svc.MAX_DB_INT)
    # DRF's metaclass takes declared fields out of the class: Serializer.data stays the property.
    data = StrictCharField(  # type: ignore[assignment]
        allow_blank=True,
        help_text="base64 bytes",
        validators=[RegexValidator(BASE64_RE, "Not valid base64.")],
    )

    def validate_data(self, value: str) -> bytes:
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise serializers.ValidationError("Not valid base64.") from None


def _valid(serializer_class, request: Request) -> dict[str, Any]:
    """The body checked (a JSON object, StrictJSONParser): ``validated_data``, or the 400."""
    return kept(serializer_class).run_validation(request.data)


class AgentView(APIView):
    """Agent credential only; never a person's token or session."""

    authentication_classes = [NodeCredentialAuthentication]
    permission_classes = [IsNode]

    def node(self, request: Request):
        principal = cast(NodePrincipal, request.user)  # NodeCredentialAuthentication's user
        return principal.node


def _job_call(fn, *args):
    try:
        return fn(*args)
    except svc.NotYours:
        raise NotFound("No such job on this node.") from None
    except svc.Stale as exc:
        raise Conflict(str(exc)) from None


# --- Views -------------------------------------------------------------------------------------

_OK = inline_serializer("AgentOk", {"state": serializers.CharField()})


class RegisterView(APIView):
    authentication_classes = [JoinTokenAuthentication, NodeCredentialAuthentication]
    permission_classes = [IsNodeOrJoin]

    @extend_schema(
        request=RegisterIn,
        responses={
            201: inline_serializer(
                "Registered",
                {
                    "node": serializers.CharField(),
                    "node_id": serializers.IntegerField(),
                    "credential": serializers.CharField(),
                    "lease_seconds": serializers.FloatField(),
                },
            )
        },
    )
    def post(self, request: Request) -> Response:
        desc = _valid(RegisterIn, request)
        as_node = request.user.node if isinstance(request.user, NodePrincipal) else None
        join = request.user.token if isinstance(request.user, JoinPrincipal) else None
        try:
            node, credential, created = svc.do_register_node(desc, as_node, join)
        except svc.NameTaken:
            raise PermissionDenied("A node credential may only re-register its own node.") from None
        except svc.JoinRefused as exc:
            raise PermissionDenied(f"Registration refused: {exc}.") from None
        except svc.NameInUse as exc:
            raise Conflict(f"Registration refused: {exc}.") from None

        body = {
            "node": node.name,
            "node_id": node.pk,
            "credential": credential,
            "lease_seconds": settings.TESSERA["LEASE_S"],
        }
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class HeartbeatView(AgentView):
    @extend_schema(
        request=HeartbeatIn,
        responses={
            200: inline_serializer(
                "Orders",
                {
                    "node": serializers.CharField(),
                    "lease_seconds": serializers.FloatField(),
                    "report_utilisation": serializers.BooleanField(),
                    "start": serializers.ListField(child=serializers.DictField()),
                    "stop": serializers.ListField(child=serializers.DictField()),
                    "checkpoints": serializers.ListField(child=serializers.DictField(), required=False),
                },
            )
        },
    )
    def post(self, request: Request) -> Response:
        data = _valid(HeartbeatIn, request)
        running = [svc.Reported(**r) for r in data["running"]]
        utilisation = [
            GpuReport(u["gpu"], tuple(u["job_ids"]), u["util"], u.get("sm_active"))
            for u in data["utilisation"]
        ]
        return Response(svc.do_heartbeat(self.node(request), running, utilisation, data["checkpoints"]))


class StartedView(AgentView):
    @extend_schema(request=StartedIn, responses={200: _OK})
    def post(self, request: Request, job_id: str) -> Response:
        data = _valid(StartedIn, request)
        job = _job_call(
            svc.do_report_started,
            self.node(request),
            int(job_id),
            data["attempt"],
            data["replica"],
            data.get("started_at"),
        )
        return Response({"state": job.state})


class CheckpointedView(AgentView):
    @extend_schema(request=CheckpointedIn, responses={200: _OK})
    def post(self, request: Request, job_id: str) -> Response:
        data = _valid(CheckpointedIn, request)
        job = _job_call(
            svc.do_report_checkpoint,
            self.node(request),
            int(job_id),
            data["attempt"],
            data["at"],
            data["line"],
            data["replica"],
        )
        return Response({"state": job.state})


class ExitedView(AgentView):
    @extend_schema(request=ExitedIn, responses={200: _OK})
    def post(self, request: Request, job_id: str) -> Response:
        data = _valid(ExitedIn, request)
        job, recorded = _job_call(
            svc.do_report_exit,
            self.node(request),
            int(job_id),
            data["attempt"],
            data["replica"],
            data["exit_code"],
            data["reason"],
            data.get("started_at"),
        )
        return Response({"state": job.state, "recorded": recorded})


class ExitsView(AgentView):
    """Several exit reports in one request (an agent's replicas that ended together), settled
    together in one transaction and answered each on its own, as ``jobs/{id}/exited`` would."""

    @extend_schema(
        request=ExitsIn,
        responses={
            200: inline_serializer(
                "ExitsDone", {"results": serializers.ListField(child=serializers.DictField())}
            )
        },
    )
    def post(self, request: Request) -> Response:
        return Response({"results": exit_results(self.node(request), request.data)})


def exit_results(node, body: Any) -> list[dict[str, Any]]:
    """Settle an ``exits`` body's reports (validated: ValidationError names the field) for ``node``;
    one result per report, in order. Shared by ``POST exits`` and the agent's stream."""
    serializer = ExitsIn(data=body)
    serializer.is_valid(raise_exception=True)
    reports = [
        svc.ExitReport(
            item["job_id"],
            item["attempt"],
            item["replica"],
            item["exit_code"],
            item["reason"],
            item.get("started_at"),
        )
        for item in serializer.validated_data["exits"]
    ]
    results = []
    for outcome in svc.do_report_exits(node, reports):
        if isinstance(outcome, svc.NotYours):
            results.append({"status": 404, "detail": "No such job on this node."})
        elif isinstance(outcome, svc.Stale):
            results.append({"status": 409, "detail": str(outcome)})
        else:
            job, recorded = outcome
            results.append({"status": 200, "state": job.state, "recorded": recorded})
    return results


class LogsView(AgentView):
    @extend_schema(
        request=LogsIn,
        responses={
            200: inline_serializer(
                "LogStored",
                {
                    "stored": serializers.IntegerField(),
                    "next_offset": serializers.IntegerField(),
                    "truncated": serializers.BooleanField(),
                },
            )
        },
    )
    def post(self, request: Request, job_id: str) -> Response:
        data = _valid(LogsIn, request)
        result = _job_call(
            svc.do_append_log,
            self.node(request),
            int(job_id),
            data["attempt"],
            data["replica"],
            data["offset"],
            data["data"],
        )
        return Response(result)

"""``/api/v1/tenants/``: the tenants the caller may see (its own; operators: all), and each
tenant's idle-policy overrides."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling.api.fields import StrictFloatField
from scheduling.api.lookups import ID_PARAMETER, parse_pk
from scheduling.api.pagination import BoundedLimitOffsetPagination
from scheduling.api.permissions import OperatorWritesOnly
from scheduling.api.query_params import ReadsItsQueryParams
from scheduling.engine.adjust import OVERRIDABLE, OverrideRefused
from scheduling.models import Tenant
from scheduling.services import idle_policy


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "created_at"]
        read_only_fields = fields


@extend_schema_view(
    list=extend_schema(summary="Tenants visible to the caller"),
    retrieve=extend_schema(summary="One tenant", parameters=[ID_PARAMETER]),
)
class TenantViewSet(
    ReadsItsQueryParams, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    serializer_class = TenantSerializer
    pagination_class = BoundedLimitOffsetPagination
    lookup_value_regex = "[^/]+"

    def get_queryset(self) -> QuerySet[Tenant]:
        return Tenant.objects.visible_to(self.request.user).order_by("name")

    def get_object(self) -> Tenant:
        tenant = self.get_queryset().filter(pk=parse_pk(self.kwargs["pk"], "tenant")).first()
        if tenant is None:
            raise NotFound("No such tenant.")
        return tenant


class IdlePolicySerializer(serializers.Serializer):
    """A tenant's idle-policy overrides: each field a JSON number (not a string, not a boolean)
    inside the operator's bounds, or null for the operator's default (docs/api.md)."""

    threshold = StrictFloatField(required=False, allow_null=True)
    exempt_s = StrictFloatField(required=False, allow_null=True)
    act_after_s = StrictFloatField(required=False, allow_null=True)


def _idle_policy_body(tenant: Tenant) -> dict[str, Any]:
    return {
        "tenant": tenant.name,
        "overrides": tenant.idle_policy or {},
        "effective": idle_policy.as_json(idle_policy.effective(tenant)),
        "bounds": idle_policy.bounds_json(),
    }


class TenantIdlePolicyView(ReadsItsQueryParams, APIView):
    """``/api/v1/tenants/{id}/idle-policy/``: read by the tenant's members and operators; set
    (PUT, replacing every override) by operators only."""

    permission_classes = [OperatorWritesOnly]
    serializer_class = IdlePolicySerializer

    def _tenant(self, request: Request, pk: str) -> Tenant:
        tenant = Tenant.objects.visible_to(request.user).filter(pk=parse_pk(pk, "tenant")).first()
        if tenant is None:
            raise NotFound("No such tenant.")
        return tenant

    @extend_schema(
        summary="A tenant's idle policy", parameters=[ID_PARAMETER], responses={200: OpenApiTypes.OBJECT}
    )
    def get(self, request: Request, pk: str) -> Response:
        return Response(_idle_policy_body(self._tenant(request, pk)))

    @extend_schema(
        summary="Set a tenant's idle-policy overrides",
        parameters=[ID_PARAMETER],
        request=IdlePolicySerializer,
        responses={200: OpenApiTypes.OBJECT},
    )
    def put(self, request: Request, pk: str) -> Response:
        tenant = self._tenant(request, pk)
        if not isinstance(request.data, dict):
            raise ValidationError({"non_field_errors": ["Expected a JSON object."]})
        unknown = sorted(set(request.data) - set(OVERRIDABLE))
        if unknown:
            raise ValidationError({unknown[0]: [f"Not overridable (one of {', '.join(OVERRIDABLE)})."]})
        body = IdlePolicySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            tenant = idle_policy.do_set_idle_overrides(tenant, dict(body.validated_data), request.user)
        except OverrideRefused as exc:
            raise ValidationError({exc.field: [str(exc).split(": ", 1)[-1]]}) from None
        return Response(_idle_policy_body(tenant))

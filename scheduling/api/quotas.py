"""``/api/v1/quotas/``: read a tenant's quotas; operators create, change and delete them.

A tenant's user reads its own tenant's rows (another tenant's row answers 404); every write is for
operators only (403 for everyone else, before any lookup, so a 403 reveals nothing). Writes go
through ``scheduling.services.quotas``, which asks for a scheduling pass after commit.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api.errors import Conflict
from scheduling.api.fields import RejectsUnknownFields, StrictCharField, StrictFloatField
from scheduling.api.lookups import ID_PARAMETER, parse_pk
from scheduling.api.pagination import BoundedLimitOffsetPagination
from scheduling.api.permissions import OperatorWritesOnly
from scheduling.api.query_params import ReadsItsQueryParams
from scheduling.models import Quota, Tenant
from scheduling.services.quotas import (
    QuotaChanged,
    QuotaExists,
    check_quota,
    do_create_quota,
    do_delete_quota,
    do_update_quota,
)

MAX_GPUS = 1_000_000.0
MAX_WEIGHT = 1_000_000.0


def visible_quotas(user) -> QuerySet[Quota]:
    """Quotas of the tenants ``user`` may see (scoped through ``Tenant.objects.visible_to``)."""
    return Quota.objects.filter(tenant__in=Tenant.objects.visible_to(user))


class QuotaSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.name", read_only=True)

    class Meta:
        model = Quota
        fields = ["id", "tenant", "model", "guaranteed", "limit", "weight"]
        read_only_fields = fields


class QuotaWrittenSerializer(QuotaSerializer):
    """A created or changed row, with what an operator should know about it."""

    warnings = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta(QuotaSerializer.Meta):
        fields = [*QuotaSerializer.Meta.fields, "warnings"]
        read_only_fields = fields


class QuotaWriteSerializer(RejectsUnknownFields, serializers.Serializer):
    """A quota body: all fields on create; on PATCH only the numbers may change."""

    tenant = StrictCharField(max_length=64, help_text="the tenant's name")
    model = StrictCharField(
        min_length=1,
        max_length=64,
        printable=True,
        help_text="an accelerator model, or * for every model without its own row",
    )
    guaranteed = StrictFloatField(min_value=0, max_value=MAX_GPUS)
    limit = StrictFloatField(min_value=0, max_value=MAX_GPUS)
    weight = StrictFloatField(required=False, min_value=0, max_value=MAX_WEIGHT)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if self.instance is not None and isinstance(data, dict):
            fixed = [key for key in ("tenant", "model") if key in data]
            if fixed:
                raise ValidationError(
                    {key: ["cannot be changed; delete the row and create another"] for key in fixed}
                )
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        current = self.instance
        guaranteed = attrs.get("guaranteed", current.guaranteed if current else 0.0)
        limit = attrs.get("limit", current.limit if current else 0.0)
        weight = attrs.get("weight", current.weight if current else 1.0)
        if weight <= 0:
            raise ValidationError({"weight": ["must be greater than 0"]})
        if limit < guaranteed:
            field = "limit" if "limit" in attrs else "guaranteed"
            raise ValidationError({field: ["limit must be at least guaranteed"]})
        advice = check_quota(attrs.get("model", current.model if current else ""), guaranteed, limit, current)
        if advice.errors:
            raise ValidationError(advice.errors)
        self.warnings = advice.warnings
        if current is None:
            tenant = Tenant.objects.filter(name=attrs["tenant"]).first()
            if tenant is None:
                raise ValidationError({"tenant": ["no such tenant"]})
            attrs["tenant"] = tenant
            attrs.setdefault("weight", 1.0)
        return attrs


def with_warnings(quota: Quota, body: QuotaWriteSerializer) -> dict[str, Any]:
    """The stored row, and what an operator should know about it (an unknown model, guarantees
    above the cluster's capacity): kept, but said."""
    return {**QuotaSerializer(quota).data, "warnings": getattr(body, "warnings", [])}


@extend_schema_view(
    list=extend_schema(summary="Quotas of the tenants visible to the caller"),
    retrieve=extend_schema(summary="One quota", parameters=[ID_PARAMETER]),
    create=extend_schema(
        summary="Create a quota (operators only)",
        request=QuotaWriteSerializer,
        responses={201: QuotaWrittenSerializer},
    ),
    partial_update=extend_schema(
        summary="Change a quota's numbers (operators only)",
        parameters=[ID_PARAMETER],
        request=QuotaWriteSerializer,
        responses={200: QuotaWrittenSerializer},
    ),
    destroy=extend_schema(
        summary="Delete a quota (operators only)", parameters=[ID_PARAMETER], responses={204: None}
    ),
)
class QuotaViewSet(ReadsItsQueryParams, viewsets.GenericViewSet):
    serializer_class = QuotaSerializer
    permission_classes = [OperatorWritesOnly]
    pagination_class = BoundedLimitOffsetPagination
    lookup_value_regex = "[^/]+"

    def get_queryset(self) -> QuerySet[Quota]:
        return visible_quotas(self.request.user).select_related("tenant").order_by("tenant__name", "model")

    def get_object(self) -> Quota:
        quota = self.get_queryset().filter(pk=parse_pk(self.kwargs["pk"], "quota")).first()
        if quota is None:
            raise NotFound("No such quota.")
        return quota

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(QuotaSerializer(page, many=True).data)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(QuotaSerializer(self.get_object()).data)

    def create(self, request: Request) -> Response:
        body = QuotaWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            quota = do_create_quota(**body.validated_data, by=request.user)
        except QuotaExists:
            raise Conflict({"model": ["the tenant already has a quota for this model"]}) from None
        return Response(with_warnings(quota, body), status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, pk: str) -> Response:
        quota = self.get_object()
        body = QuotaWriteSerializer(quota, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        fields = {k: v for k, v in body.validated_data.items() if k in ("guaranteed", "limit", "weight")}
        try:
            quota = do_update_quota(quota, by=request.user, **fields)
        except QuotaChanged as changed:
            raise Conflict(changed.errors) from None
        quota.refresh_from_db()  # the row as stored: another operator's fields too
        return Response(with_warnings(quota, body))

    def destroy(self, request: Request, pk: str) -> Response:
        do_delete_quota(self.get_object(), by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

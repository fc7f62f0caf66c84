"""``/api/v1/audit/``: the audit log, for operators (403 for everyone else), newest first.

Filters (exact, combined): ``action`` (``quota.update``, ``node.cordon``, ...), ``object_type``
(``quota``, ``node``, ``apitoken``, ``jointoken``, ``job``, ...), ``object_id``, ``actor``
(``user admin``, ``node gpu-01``, ...). Entries are written by ``scheduling.services.audit``.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api.fields import text_problem
from scheduling.api.filters import REPEATED
from scheduling.api.pagination import BoundedLimitOffsetPagination
from scheduling.api.permissions import is_operator
from scheduling.api.query_params import ReadsItsQueryParams
from scheduling.models import AuditEntry

FILTERS = ("action", "object_type", "object_id", "actor")


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "at",
            "actor",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "before",
            "after",
            "note",
        ]
        read_only_fields = fields


class AuditViewSet(ReadsItsQueryParams, viewsets.GenericViewSet):
    serializer_class = AuditEntrySerializer
    pagination_class = BoundedLimitOffsetPagination
    query_filters = FILTERS  # read by list() itself; any other parameter is refused (query_params.py)

    def get_queryset(self) -> QuerySet[AuditEntry]:
        return AuditEntry.objects.visible_to(self.request.user)

    @extend_schema(
        summary="The audit log (operators only): who changed what, before and after",
        parameters=[OpenApiParameter(name, OpenApiTypes.STR, OpenApiParameter.QUERY) for name in FILTERS],
    )
    def list(self, request: Request) -> Response:
        if not is_operator(request.user):
            raise PermissionDenied("Only operators may read the audit log.")
        entries = self.get_queryset()
        for name in FILTERS:
            values = request.query_params.getlist(name)
            if not values:
                continue
            if len(values) > 1:
                raise ValidationError({name: [REPEATED]})
            value = values[0]
            problem = text_problem(value)
            if problem:
                raise ValidationError({name: [problem]})
            entries = entries.filter(**{name: value})
        page = self.paginate_queryset(entries)
        return self.get_paginated_response(AuditEntrySerializer(page, many=True).data)

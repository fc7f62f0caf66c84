"""``/api/v1/tenants/``: the tenants the caller may see (its own; operators: all)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.exceptions import NotFound

from scheduling.api.lookups import ID_PARAMETER, parse_pk
from scheduling.api.pagination import BoundedLimitOffsetPagination
from scheduling.models import Tenant


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "created_at"]
        read_only_fields = fields


@extend_schema_view(
    list=extend_schema(summary="Tenants visible to the caller"),
    retrieve=extend_schema(summary="One tenant", parameters=[ID_PARAMETER]),
)
class TenantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
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

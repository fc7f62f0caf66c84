"""``/api/v1/tokens/``: a person's named API tokens — list, create (the key shown once), revoke.

Everyone lists and revokes their own tokens (another user's answers 404); operators see and revoke
anyone's. A new token is always the caller's own. Writes go through ``scheduling.services.tokens``.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api.errors import Conflict
from scheduling.api.fields import RejectsUnknownFields, StrictCharField
from scheduling.api.lookups import ID_PARAMETER, parse_pk
from scheduling.api.pagination import BoundedLimitOffsetPagination
from scheduling.api.query_params import ReadsItsQueryParams
from scheduling.models import ApiToken
from scheduling.services.tokens import MAX_NAME, TokenNameTaken, do_create_api_token, do_revoke_api_token


class TokenSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "user", "created_at", "last_used_at"]
        read_only_fields = fields


class NewTokenSerializer(TokenSerializer):
    token = serializers.SerializerMethodField(help_text="the key: shown only in this answer")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]
        read_only_fields = fields

    def get_token(self, _obj: ApiToken) -> str:
        return self.context["key"]


class TokenCreateSerializer(RejectsUnknownFields, serializers.Serializer):
    name = StrictCharField(min_length=1, max_length=MAX_NAME, printable=True, help_text="e.g. ci, laptop")


@extend_schema_view(
    list=extend_schema(summary="Your API tokens (operators: everyone's)"),
    create=extend_schema(
        summary="Make a named API token for yourself; its key is in this answer only",
        request=TokenCreateSerializer,
        responses={201: NewTokenSerializer},
    ),
    destroy=extend_schema(
        summary="Revoke a token (your own; operators: anyone's)",
        parameters=[ID_PARAMETER],
        responses={204: None},
    ),
)
class TokenViewSet(ReadsItsQueryParams, viewsets.GenericViewSet):
    serializer_class = TokenSerializer
    pagination_class = BoundedLimitOffsetPagination

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.visible_to(self.request.user).select_related("user").order_by("id")

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(TokenSerializer(page, many=True).data)

    def create(self, request: Request) -> Response:
        body = TokenCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            token, key = do_create_api_token(request.user, body.validated_data["name"])
        except TokenNameTaken:
            raise Conflict({"name": ["you already have a token of this name"]}) from None
        data = NewTokenSerializer(token, context={"key": key}).data
        return Response(data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str) -> Response:
        token = self.get_queryset().filter(pk=parse_pk(pk, "token")).first()
        if token is None:
            raise NotFound("No such token.")
        do_revoke_api_token(token, by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

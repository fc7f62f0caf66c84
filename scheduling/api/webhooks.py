"""``/api/v1/webhooks/``: a tenant's webhooks, their deliveries, and redelivery.

A tenant's users list, make and delete their tenant's webhooks (another tenant's answer 404);
operators name the tenant (``"tenant": "<name>"``), as they do to submit. The secret that signs
the deliveries is in the answer to the create only. Writes go through ``services.webhooks``.
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api.errors import Conflict
from scheduling.api.fields import NOT_PRINTABLE, RejectsUnknownFields, StrictCharField
from scheduling.api.jobs import submit_tenant
from scheduling.api.lookups import ID_PARAMETER, parse_pk
from scheduling.api.pagination import BoundedLimitOffsetPagination
from scheduling.api.query_params import ReadsItsQueryParams
from scheduling.models import Webhook, WebhookDelivery
from scheduling.services.webhooks import (
    EVENTS,
    TargetRefused,
    TooManyWebhooks,
    do_create_webhook,
    do_delete_webhook,
    do_redeliver,
)

# What a webhook's URL looks like, as the schema declares it: http(s), a host name or IPv4 address
# (an IPv6 one in brackets is refused: its syntax is more than a pattern should hold; name the
# host) with no user or password, a port from 1 to 65535 (no leading zero), printable characters
# and no spaces. Where it may point (public addresses) is checked when it is made
# (services.webhooks.check_target).
_CHAR = f"[^{NOT_PRINTABLE} ]"
_HOST = f"[^{NOT_PRINTABLE} /?#@\\[\\]:]+"
_PORT = "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
URL_RE = f"^https?://{_HOST}(:{_PORT})?([/?#]{_CHAR}*)?\\Z"


class WebhookSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.name", read_only=True)
    url = serializers.CharField(read_only=True)  # as given (not always an RFC 3986 "uri": IRIs too)

    class Meta:
        model = Webhook
        fields = ["id", "tenant", "url", "events", "created_at"]
        read_only_fields = fields


class NewWebhookSerializer(WebhookSerializer):
    secret = serializers.SerializerMethodField(
        help_text="the HMAC key of the signatures: in this answer only"
    )

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]
        read_only_fields = fields

    def get_secret(self, _obj: Webhook) -> str:
        return self.context["secret"]


class WebhookCreateSerializer(RejectsUnknownFields, serializers.Serializer):
    url = StrictCharField(
        max_length=2000,
        printable=True,
        validators=[RegexValidator(URL_RE, "must be an http:// or https:// URL with a host")],
    )
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EVENTS), required=False, max_length=len(EVENTS)
    )
    tenant = StrictCharField(required=False, max_length=64, help_text="Operators only: the tenant's name.")


class DeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "event",
            "payload",
            "state",
            "attempts",
            "next_attempt_at",
            "last_status",
            "last_error",
            "created_at",
            "delivered_at",
        ]
        read_only_fields = fields


@extend_schema_view(
    list=extend_schema(summary="Your tenant's webhooks (operators: every tenant's)"),
    retrieve=extend_schema(summary="One webhook", parameters=[ID_PARAMETER]),
    create=extend_schema(
        summary="Register a URL for job events; the signing secret is in this answer only",
        request=WebhookCreateSerializer,
        responses={201: NewWebhookSerializer},
    ),
    destroy=extend_schema(summary="Delete a webhook", parameters=[ID_PARAMETER], responses={204: None}),
)
class WebhookViewSet(ReadsItsQueryParams, viewsets.GenericViewSet):
    paged_actions = frozenset({"list", "deliveries"})
    serializer_class = WebhookSerializer
    pagination_class = BoundedLimitOffsetPagination

    def get_queryset(self) -> QuerySet[Webhook]:
        return Webhook.objects.visible_to(self.request.user).select_related("tenant")

    def get_object(self) -> Webhook:
        hook = self.get_queryset().filter(pk=parse_pk(self.kwargs.get("pk", ""), "webhook")).first()
        if hook is None:
            raise NotFound("No such webhook.")
        return hook

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(WebhookSerializer(page, many=True).data)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(WebhookSerializer(self.get_object()).data)

    def create(self, request: Request) -> Response:
        body = WebhookCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        tenant = submit_tenant(request.user, data.get("tenant"), verb="register", made="webhook")
        try:
            hook, secret = do_create_webhook(tenant, data["url"], list(data.get("events", [])), request.user)
        except TargetRefused as refused:
            raise ValidationError({"url": [str(refused)]}) from None
        except TooManyWebhooks as too_many:
            raise Conflict(str(too_many)) from None
        return Response(
            NewWebhookSerializer(hook, context={"secret": secret}).data, status=status.HTTP_201_CREATED
        )

    def destroy(self, request: Request, pk: str) -> Response:
        do_delete_webhook(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        summary="A webhook's deliveries, newest first",
        parameters=[ID_PARAMETER],
        responses={200: DeliverySerializer(many=True)},
    )
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str) -> Response:
        page = self.paginate_queryset(self.get_object().deliveries.order_by("-id"))
        return self.get_paginated_response(DeliverySerializer(page, many=True).data)

    @extend_schema(
        summary="Send a delivery again (from its first attempt)",
        parameters=[ID_PARAMETER],
        request=None,
        responses={200: DeliverySerializer},
    )
    @action(detail=True, methods=["post"])
    def redeliver(self, request: Request, pk: str, delivery: str) -> Response:
        found = self.get_object().deliveries.filter(pk=parse_pk(delivery, "delivery")).first()
        if found is None:
            raise NotFound("No such delivery.")
        return Response(DeliverySerializer(do_redeliver(found)).data)

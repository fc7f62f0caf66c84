"""OpenAPI descriptions of the API's authentication schemes, for drf-spectacular.

Users send ``Authorization: Token <key>`` (DRF's own scheme, which drf-spectacular knows). Node
agents send ``Authorization: Node <credential>``, and ``Authorization: Join <token>`` to register;
those classes live in ``scheduling.api.agent_auth`` and are named here by path, so this module
loads whether or not that one exists.
"""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.contrib.django_filters import DjangoFilterExtension
from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
    OpenApiSerializerFieldExtension,
)


class StringListSchema(OpenApiSerializerFieldExtension):
    """A :class:`~scheduling.api.fields.StringListField` is an array of strings with its bounds."""

    target_class = "scheduling.api.fields.StringListField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        field = self.target
        items: dict[str, Any] = {"type": "string", "pattern": NO_NUL}
        if field.item_min_length:
            items["minLength"] = field.item_min_length
        if field.item_max_length is not None:
            items["maxLength"] = field.item_max_length
        schema: dict[str, Any] = {"type": "array", "items": items, "maxItems": field.max_items}
        if field.min_items:
            schema["minItems"] = field.min_items
        return schema


class StringMapSchema(OpenApiSerializerFieldExtension):
    """A :class:`~scheduling.api.fields.StringMapField` is an object of strings, with its bounds
    (its keys' bounds and its size in bytes are checked too, but OpenAPI 3.0 cannot state them)."""

    target_class = "scheduling.api.fields.StringMapField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": {"type": "string", "pattern": NO_NUL},
            "maxProperties": self.target.max_entries,
        }


class StrictCharSchema(OpenApiSerializerFieldExtension):
    """A :class:`~scheduling.api.fields.StrictCharField` declares what it refuses: its ``choices``
    as an enum, else a pattern: its validator's, or no NUL (printable ones: none of
    ``NOT_PRINTABLE``)."""

    target_class = "scheduling.api.fields.StrictCharField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        from scheduling.api.fields import PRINTABLE_PATTERN

        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        if self.target.choices is not None:
            schema["enum"] = list(self.target.choices)
        elif not any(isinstance(v, RegexValidator) for v in self.target.validators):
            schema["pattern"] = PRINTABLE_PATTERN if self.target.printable else NO_NUL
        return schema


class GpuCountSchema(OpenApiSerializerFieldExtension):
    """``gpus`` (:class:`~scheduling.api.fields.GpuCountField`): a whole number up to the largest
    job, or a fraction of one GPU in thousandths."""

    target_class = "scheduling.api.fields.GpuCountField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        from django.conf import settings

        limit = self.target.max_value
        limit = settings.TESSERA["MAX_JOB_GPUS"] if limit is None else limit
        return {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": limit},
                {"type": "number", "minimum": 0.001, "maximum": 0.999},
            ]
        }


class ClosedObjectSchema(OpenApiSerializerExtension):
    """A body that refuses unknown fields (:class:`~scheduling.api.fields.RejectsUnknownFields`)
    says so: ``additionalProperties: false``."""

    target_class = "scheduling.api.fields.RejectsUnknownFields"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["additionalProperties"] = False
        return schema


class FilterSchema(DjangoFilterExtension):
    """The list filters (``scheduling.api.filters``) as they behave: an empty value filters nothing
    (``allowEmptyValue``), and a text filter's longest value is declared."""

    priority = 1

    def resolve_filter_field(
        self, auto_schema: Any, model: Any, filterset_class: Any, field_name: str, filter_field: Any
    ) -> list[dict[str, Any]]:
        parameters = super().resolve_filter_field(
            auto_schema, model, filterset_class, field_name, filter_field
        )
        max_chars = filter_field.extra.get("max_chars")
        for parameter in parameters:
            parameter["allowEmptyValue"] = True
            if max_chars is not None:
                parameter["schema"] = {**parameter["schema"], "maxLength": max_chars}
        return parameters


class NodeCredentialScheme(OpenApiAuthenticationExtension):
    target_class = "scheduling.api.agent_auth.NodeCredentialAuthentication"
    name = "nodeCredential"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "A node agent's own credential: `Node <credential>` (issued at registration).",
        }


class JoinTokenScheme(OpenApiAuthenticationExtension):
    target_class = "scheduling.api.agent_auth.JoinTokenAuthentication"
    name = "joinToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "An operator-made join token: `Join <token>` (manage.py create_join_token).",
        }


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        'An error: {"detail": "reason"} where no field is to blame, else {"field": ["reason", ...]} '
        "naming each field (docs/api.md, Errors)."
    ),
    "additionalProperties": True,
}
NO_NUL = "^[^\\u0000]*$"
ERROR_WORDS = {
    "400": "the request is malformed or a field or parameter is invalid (named in the body)",
    "401": "no credential, or not a valid one",
    "403": "not allowed to the caller (operators only, or a user without a tenant)",
    "404": "no such object, or not the caller's to see",
    "409": "the object's state does not allow it",
    "413": "the body is larger than TESSERA_MAX_BODY_BYTES",
    "415": "the body is not JSON",
    "422": "an Idempotency-Key reused with another body",
    "429": "over a rate limit: retry after Retry-After seconds",
}
# (method, path) pairs whose extra error answers are not deduced from their shape below.
EXTRA_ERRORS: dict[tuple[str, str], tuple[str, ...]] = {
    ("post", "/api/v1/jobs/"): ("403", "422"),
    ("get", "/api/v1/audit/"): ("403",),
    ("post", "/api/v1/jobs/{id}/cancel/"): ("409",),
    ("post", "/api/v1/jobs/{id}/hold/"): ("409",),
    ("post", "/api/v1/jobs/{id}/release/"): ("409",),
    ("post", "/api/v1/agent/register/"): ("403", "409"),
    ("put", "/api/v1/tenants/{id}/idle-policy/"): ("403",),
    ("post", "/api/v1/webhooks/"): ("403", "409"),  # another tenant; the tenant has enough of them
    ("post", "/api/v1/tokens/"): ("409",),  # a name the user already has
    ("post", "/api/v1/quotas/"): ("409",),  # a model the tenant already has a row for
    ("patch", "/api/v1/quotas/{id}/"): ("409",),  # the row changed meanwhile (limit < guaranteed)
}


def _blank_or(node: Any) -> None:
    """drf-spectacular declares a blank-allowed text field with a pattern as ``oneOf`` [the
    pattern, ""]; when the pattern admits "" too, "" matches both and ``oneOf`` refuses it. The
    field means "either", which is ``anyOf``. (And a non-blank choice needs no ``minLength``.)"""
    if isinstance(node, dict):
        options = node.get("oneOf")
        if isinstance(options, list) and {"type": "string", "maxLength": 0} in options:
            node["anyOf"] = node.pop("oneOf")
        if "allOf" in node and node.pop("minLength", None) is not None and list(node) == ["allOf"]:
            # ENFORCE_NON_BLANK_FIELDS's minLength beside an enum's reference: the enum says it all
            (only,) = node.pop("allOf")
            node.update(only)
        for value in node.values():
            _blank_or(value)
    elif isinstance(node, list):
        for value in node:
            _blank_or(value)


def declare_errors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: every operation declares the error answers it gives,
    in the error shape: 401 everywhere; 400 where it takes a body or query parameters, and on the
    whole user API (an unknown query parameter); 404 where
    its path names an object; 413 and 415 where it takes a body; 403 for operators' writes; 429 on
    the user API (agents are never rate-limited); and what ``EXTRA_ERRORS`` lists."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    _blank_or(result)
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            codes = {"401"}
            has_body = "requestBody" in operation
            if has_body or method in ("post", "put", "patch"):
                codes |= {"400", "413", "415"}
            if any(p.get("in") == "query" for p in operation.get("parameters", [])):
                codes.add("400")
            if "{" in path:
                codes.add("404")
            if not path.startswith("/api/v1/agent/"):
                codes |= {"400", "429"}  # 400: a query parameter it does not read (query_params.py)
                if method != "get" and path.startswith("/api/v1/quotas/"):
                    codes.add("403")
            codes.update(EXTRA_ERRORS.get((method, path), ()))
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                if parameter.get("in") == "query" and schema.get("type") == "string" and "enum" not in schema:
                    schema.setdefault("pattern", NO_NUL)  # text with a NUL is refused (400), never stored
            responses = operation.setdefault("responses", {})
            for code in sorted(codes):
                responses.setdefault(
                    code,
                    {
                        "description": ERROR_WORDS[code],
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                    },
                )
    return result

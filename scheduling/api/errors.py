"""Errors in the contract's shapes: ``{"field": ["reason"]}`` or ``{"detail": "reason"}``.

Anything unexpected becomes a logged 500 with a plain ``detail`` (never a traceback page). Every
string in an error body is made UTF-8-encodable first: an error may name what the client sent.
"""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponsePermanentRedirect, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import status
from rest_framework.exceptions import (
    APIException,
    ErrorDetail,
    NotFound,
    ParseError,
    PermissionDenied,
    UnsupportedMediaType,
)
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from scheduling.api.fields import json_safe
from scheduling.states import InvalidTransition

log = logging.getLogger("tessera.api")


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the object's current state."
    default_code = "conflict"


class Unprocessable(APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "The request cannot be processed."
    default_code = "unprocessable"


def exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):
        return Response({"detail": "Request body is too large."}, status=413)
    if isinstance(exc, Http404):
        exc = NotFound()
    if isinstance(exc, UnsupportedMediaType):  # the contract answers 400 for any body it cannot read
        exc = ParseError("Content-Type must be application/json.")
    if isinstance(exc, InvalidTransition):
        exc = Conflict(f"job is {exc.current}; it cannot become {exc.target}")
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a real bug: Django logs it and answers 500
    data = response.data
    if isinstance(data, list):
        response.data = {"detail": " ".join(str(d) for d in data)}
    elif isinstance(data, ErrorDetail | str):
        response.data = {"detail": str(data)}
    if isinstance(exc, PermissionDenied) and response.status_code == 403:
        response.data.setdefault("detail", "Only operators may do this.")

    response.data = json_safe(response.data)
    return response


@csrf_exempt  # it changes nothing; without this a POST would get the CSRF middleware's HTML 403
def not_found(request: HttpRequest, *args, **kwargs):
    """Any path under ``/api/v1/`` that names no endpoint: a JSON 404 (or, for a GET without the
    trailing slash, a redirect to the endpoint that has it)."""
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.url_name != "api-not-found":
            if request.method in ("GET", "HEAD"):
                return HttpResponsePermanentRedirect(
                    request.get_full_path().replace(request.path, request.path + "/", 1)
                )
            return JsonResponse(
                {"detail": f"Not found; the endpoint is {request.path}/ (with a trailing slash)."}, status=404
            )
    return JsonResponse({"detail": "Not found."}, status=404)

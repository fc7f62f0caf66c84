"""Errors in the contract's shapes: ``{"field": ["reason"]}`` or ``{"detail": "reason"}``.

Anything unexpected becomes a logged 500 with a plain ``detail`` (never a traceback page)."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import status
from rest_framework.exceptions import APIException, ErrorDetail, NotFound, PermissionDenied
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

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
    return response

"""docs/api.md keeps up with the code: every choice value and every endpoint of the schema."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from django.db.models import TextChoices
from drf_spectacular.generators import SchemaGenerator

from scheduling import choices

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
METHODS = ("get", "post", "put", "patch", "delete")


def documented() -> str:
    return API_DOC.read_text(encoding="utf-8")


def choice_classes() -> list[type[TextChoices]]:
    return [
        cls
        for _, cls in inspect.getmembers(choices, inspect.isclass)
        if issubclass(cls, TextChoices) and cls.__module__ == choices.__name__
    ]


def schema_operations() -> list[str]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return [
        f"{method.upper()} {path}"
        for path, operations in schema["paths"].items()
        for method in operations
        if method in METHODS
    ]


def test_the_choices_module_has_the_classes_the_doc_describes():
    names = {cls.__name__ for cls in choice_classes()}
    described = {"JobKind", "JobState", "Topology", "EventType", "PendingCode", "NodeState", "DeviceState"}
    assert described <= names


@pytest.mark.parametrize("cls", choice_classes(), ids=lambda cls: cls.__name__)
def test_every_value_of_a_choice_class_is_in_the_api_doc(cls):
    text = documented()
    missing = [value for value in cls.values if f"`{value}`" not in text]
    assert missing == [], f"docs/api.md does not mention {cls.__name__} values {missing}"


def test_every_operation_of_the_schema_is_in_the_api_doc():
    operations = schema_operations()
    assert "POST /api/v1/jobs/" in operations  # the generator found the API at all
    text = documented()
    missing = [op for op in operations if f"`{op}`" not in text]
    assert missing == [], f"docs/api.md does not list {missing}"


def test_the_api_doc_lists_no_operation_the_schema_lacks():
    listed = set(re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE) /api/v1/[^`?]*)`", documented()))
    # async views, not in the OpenAPI schema: the agents' long-poll, the event streams
    outside_schema = {"GET /api/v1/agent/wait", "GET /api/v1/jobs/stream/", "GET /api/v1/jobs/{id}/stream/"}
    assert listed - outside_schema - set(schema_operations()) == set()

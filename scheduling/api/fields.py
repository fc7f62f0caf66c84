"""Strict serializer fields: JSON types exactly as the contract states them.

DRF's stock fields coerce (``"3"`` becomes 3, ``"true"`` becomes True) and some of their error
messages echo the input back. These do neither: an integer must be a JSON integer (not a string,
not a boolean), a boolean a JSON boolean, and every string — dict keys and list items included —
is refused when it carries a NUL character or a lone surrogate, which PostgreSQL cannot store and
UTF-8 cannot encode. Errors are flat lists of words (``{"field": ["reason"]}``), never nested.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeVar, cast

from django.conf import settings
from rest_framework import serializers


class FieldTemplates:
    """Serializer mixin: the fields are built once per class and copied shallowly per instance.

    DRF deep-copies every declared field for every serializer instance, re-running each field's
    ``__init__`` (and its validators'): a large share of a submit's CPU
    (docs/benchmarks/requests.md). Here the unbound fields are built once (for a
    ``ModelSerializer``, the model is introspected once too) with their validators, and each
    instance binds shallow copies. The fields used here keep no per-request state, so sharing their
    validators (and a list field's child) between copies is safe.
    """

    def get_fields(self) -> dict[str, serializers.Field]:
        if not settings.TESSERA["FIELD_TEMPLATES"]:  # DRF's way: every field built per instance
            return super().get_fields()  # type: ignore[misc]
        cls = type(self)
        templates = cls.__dict__.get("_field_templates")
        if templates is None:
            templates = super().get_fields()  # type: ignore[misc]  # fresh, unbound copies
            for field in templates.values():
                field.validators  # noqa: B018 - built now, once, and shared by the copies
            cls._field_templates = templates  # type: ignore[attr-defined]
        return {name: _shallow_copy(field) for name, field in templates.items()}


def _shallow_copy(field: serializers.Field) -> serializers.Field:
    """What ``copy.copy`` makes of a field (a new object sharing the template's attribute values),
    without its ``__reduce_ex__`` round, which costs more than the copy itself; a serializer copies
    ~30 fields (docs/benchmarks/requests.md)."""
    twin = object.__new__(type(field))
    twin.__dict__.update(field.__dict__)
    return twin


S = TypeVar("S", bound=serializers.BaseSerializer)


def kept(serializer_class: type[S]) -> S:
    """One instance of ``serializer_class`` per process, made without data or instance, its fields
    bound once: for ``to_representation(obj)`` (what ``.data`` gives) and ``run_validation(body)``
    (``validated_data``, or the ``ValidationError`` that ``is_valid(raise_exception=True)`` would
    raise), called from any thread.

    Each serializer instance binds a copy of every field to itself: for a job, that is most of
    the cost of rendering it or checking a submitted one (docs/benchmarks/requests.md). One
    instance may serve every request because neither call keeps anything on the serializer or its
    fields: they read their argument and return. Only for serializers whose fields and methods
    keep no state between calls and read no ``context``. Off with the field templates
    (``TESSERA_FIELD_TEMPLATES=0``): a fresh instance per call.
    """
    if not settings.TESSERA["FIELD_TEMPLATES"]:  # off with the field templates: DRF's way
        return serializer_class()
    serializer = _kept.get(serializer_class)
    if serializer is None:
        serializer = serializer_class()
        serializer.fields  # type: ignore[attr-defined]  # noqa: B018 - bound now, before threads share it
        serializer = _kept.setdefault(serializer_class, serializer)  # two threads at once: one wins
    return cast(S, serializer)


_kept: dict[type[serializers.BaseSerializer], serializers.BaseSerializer] = {}


# What ``printable`` refuses, as a character class that Python and JSON Schema (ECMA-262) read
# alike, so the schema declares exactly what is checked: control characters (C0, DEL, C1) and the
# invisible ones that make two names look alike or reorder their text (soft hyphen, zero-width and
# bidirectional marks, line and paragraph separators, word joiners, the byte-order mark).
NOT_PRINTABLE = (
    r"\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb"
)
PRINTABLE_PATTERN = f"^[^{NOT_PRINTABLE}]*$"
_PRINTABLE = re.compile(f"[^{NOT_PRINTABLE}]*")


def is_printable(value: str) -> bool:
    return _PRINTABLE.fullmatch(value) is not None


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (None when it can)."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must not contain lone surrogates"
    return None


def utf8_len(value: str) -> int:
    return len(value.encode("utf-8"))


def is_json_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_json_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


class RejectsUnknownFields:
    """Serializer mixin: the body is a JSON object naming only the serializer's fields; anything
    else is a 400 naming each unknown field. Its schema says ``additionalProperties: false``
    (``scheduling.api.schema.ClosedObjectSchema``)."""

    fields: Any

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"detail": "Request body must be a JSON object."})
        unknown = [key for key in data if key not in self.fields]
        if unknown:
            raise serializers.ValidationError({json_safe(k): ["unknown field"] for k in unknown})
        return super().to_internal_value(data)  # type: ignore[misc]


class StrictCharField(serializers.CharField):
    """A JSON string with no NUL or lone surrogate; ``printable`` also refuses control and invisible
    characters (``NOT_PRINTABLE``)."""

    def __init__(self, *, printable: bool = False, choices: tuple[str, ...] | None = None, **kwargs: Any):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)
        self.printable = printable
        self.choices = choices

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        problem = text_problem(data)
        if problem:
            raise serializers.ValidationError(problem)
        if self.printable and not is_printable(data):
            raise serializers.ValidationError("must contain printable characters only")
        if self.choices is not None and data not in self.choices:
            raise serializers.ValidationError("must be one of: " + ", ".join(self.choices))
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer (not a boolean, string or float), within the given bounds."""

    default_error_messages = {"invalid": "must be an integer"}

    def to_internal_value(self, data: Any) -> int:
        if not is_json_int(data):
            self.fail("invalid")
        if self.min_value is not None and data < self.min_value:
            raise serializers.ValidationError(f"must be at least {self.min_value}")
        limit = self.max_value if self.max_value is not None else settings.TESSERA["MAX_JOB_GPUS"]
        if data > limit:
            raise serializers.ValidationError(f"must be at most {limit}")
        return data


class StrictFloatField(serializers.FloatField):
    """A finite JSON number (integer or not, never a boolean or a string), within bounds."""

    default_error_messages = {"invalid": "must be a number"}

    def to_internal_value(self, data: Any) -> float:
        if not is_json_number(data):
            self.fail("invalid")
        value = float(data) if abs(data) < 1e300 else math.inf
        if not math.isfinite(value):
            self.fail("invalid")
        if self.min_value is not None and value < self.min_value:
            raise serializers.ValidationError(f"must be at least {self.min_value:g}")
        if self.max_value is not None and value > self.max_value:
            raise serializers.ValidationError(f"must be at most {self.max_value:g}")
        return value


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "must be true or false"}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StringListField(serializers.Field):  # its schema: scheduling.api.schema.StringListSchema
    """A JSON list of strings, bounded in items, bytes and item length."""

    def __init__(
        self,
        *,
        max_items: int,
        max_bytes: int,
        min_items: int = 0,
        item_max_length: int | None = None,
        item_min_length: int = 0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.max_items, self.max_bytes, self.min_items = max_items, max_bytes, min_items
        self.item_max_length, self.item_min_length = item_max_length, item_min_length

    def to_internal_value(self, data: Any) -> list[str]:
        if not isinstance(data, list):
            raise serializers.ValidationError("must be a list of strings")
        if len(data) > self.max_items:
            raise serializers.ValidationError(f"must have at most {self.max_items} items")
        if len(data) < self.min_items:
            raise serializers.ValidationError(f"must have at least {self.min_items} item(s)")
        total = 0
        for i, item in enumerate(data):
            if not isinstance(item, str):
                raise serializers.ValidationError(f"item {i} must be a string")
            problem = text_problem(item)
            if problem:
                raise serializers.ValidationError(f"item {i} {problem}")
            if len(item) < self.item_min_length:
                raise serializers.ValidationError(f"item {i} must not be empty")
            if self.item_max_length is not None and len(item) > self.item_max_length:
                raise serializers.ValidationError(
                    f"item {i} must be at most {self.item_max_length} characters"
                )
            total += utf8_len(item)
            if total > self.max_bytes:
                raise serializers.ValidationError(f"must be at most {self.max_bytes} bytes in all")
        return list(data)

    def to_representation(self, value: Any) -> list[str]:
        return list(value or [])


class StringMapField(serializers.Field):  # its schema: scheduling.api.schema.StringMapSchema
    """A JSON object of string → string, bounded in entries and bytes (keys plus values)."""

    def __init__(self, *, max_entries: int, max_bytes: int, key_max_length: int = 1024, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_entries, self.max_bytes, self.key_max_length = max_entries, max_bytes, key_max_length

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object of strings to strings")
        if len(data) > self.max_entries:
            raise serializers.ValidationError(f"must have at most {self.max_entries} entries")
        total = 0
        for key, value in data.items():
            problem = text_problem(key)
            if problem:
                raise serializers.ValidationError(f"keys {problem}")
            if not key or len(key) > self.key_max_length:
                raise serializers.ValidationError(f"keys must be 1 to {self.key_max_length} characters")
            if not isinstance(value, str):
                raise serializers.ValidationError("values must be strings")
            problem = text_problem(value)
            if problem:
                raise serializers.ValidationError(f"values {problem}")
            total += utf8_len(key) + utf8_len(value)
            if total > self.max_bytes:
                raise serializers.ValidationError(f"must be at most {self.max_bytes} bytes in all")
        return dict(data)

    def to_representation(self, value: Any) -> dict[str, str]:
        return dict(value or {})


class GpuCountField(serializers.Field):  # its schema: scheduling.api.schema.GpuCountSchema
    """``gpus``: an integer ≥ 0, or a fraction strictly between 0 and 1 (a share of one GPU).

    Fractions are kept to thousandths (the allocation unit), so one must be 0.001 to 0.999.
    """

    def __init__(self, *, max_value: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_value = max_value  # None: settings.TESSERA["MAX_JOB_GPUS"], read per request

    def to_internal_value(self, data: Any) -> float:
        if not is_json_number(data):
            raise serializers.ValidationError("must be a number")
        if data < 0:
            raise serializers.ValidationError("must be at least 0")
        limit = self.max_value if self.max_value is not None else settings.TESSERA["MAX_JOB_GPUS"]
        if data > limit:
            raise serializers.ValidationError(f"must be at most {limit}")
        if isinstance(data, float) and not data.is_integer():
            if data > 1:
                raise serializers.ValidationError(
                    "must be a whole number, or a fraction strictly between 0 and 1"
                )
            if data < 1 and not 1 <= round(data * 1000) <= 999:
                raise serializers.ValidationError("a fraction must be between 0.001 and 0.999")
            return round(data * 1000) / 1000  # the allocation's unit: what the job is given
        return float(data)

    def to_representation(self, value: float) -> int | float:
        return int(value) if float(value).is_integer() else float(value)


def json_safe(value: Any) -> Any:
    """``value`` with every string made encodable (lone surrogates escaped), keys included.

    Error bodies may name what the client sent (an unknown field's name); this keeps them from
    breaking the UTF-8 renderer.
    """
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value

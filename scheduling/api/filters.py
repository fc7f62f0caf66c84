"""The list endpoints' query filters, as django-filter FilterSets.

``GET /api/v1/jobs/?state=running&owner=alice`` and ``GET /api/v1/nodes/?rack=r1``: every filter is
an exact match, filters combine with AND, an unknown query parameter is a 400 naming it (the
paginator refuses it: ``scheduling/api/query_params.py``), and an empty value filters nothing. A
bad value is a 400 naming the parameter (``{"state": ["must be one of: ..."]}``), never an echo
of what was sent; so is a filter given twice (``state=pending&state=running`` read as its last
value alone would silently give a client meaning "either" one of them).
Filters only narrow what the caller may already see (``visible_to``): naming another tenant or
its users finds nothing, as a name that does not exist.
"""

from __future__ import annotations

from typing import Any

import django_filters as filters
from django import forms
from django.db.models import QuerySet

from scheduling.api.fields import text_problem
from scheduling.choices import QUEUE_LEVEL_NAMES, JobKind, JobState, NodeState
from scheduling.models import Job, Node


class TextField(forms.Field):
    """A query value matched exactly: storable text of at most ``max_chars`` characters."""

    def __init__(self, *, max_chars: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_chars = max_chars

    def validate(self, value: Any) -> None:
        super().validate(value)
        if value in self.empty_values:
            return
        problem = text_problem(value)
        if problem is None and len(value) > self.max_chars:
            problem = f"must be at most {self.max_chars} characters"
        if problem:
            raise forms.ValidationError(problem)


class TextFilter(filters.CharFilter):
    field_class = TextField


def text(field_name: str, max_chars: int, label: str, **kwargs: Any) -> TextFilter:
    return TextFilter(field_name=field_name, max_chars=max_chars, label=label, **kwargs)


def one_of(values: list[str], label: str, **kwargs: Any) -> filters.ChoiceFilter:
    return filters.ChoiceFilter(
        choices=[(v, v) for v in values],
        error_messages={"invalid_choice": "must be one of: " + ", ".join(values)},
        label=label,
        **kwargs,
    )


QUEUE_LEVELS = {name: level for level, name in QUEUE_LEVEL_NAMES.items()}

REPEATED = "give it at most once"


class OnceEach(filters.FilterSet):
    """A FilterSet whose every filter is given at most once (else a 400 naming it)."""

    def is_valid(self) -> bool:
        valid = super().is_valid()
        getlist = getattr(self.data, "getlist", None)
        if getlist is None:  # a plain dict: one value each
            return valid
        for name in self.filters:
            if len(getlist(name)) > 1:
                self.form.add_error(name, REPEATED)
                valid = False
        return valid


class JobFilter(OnceEach):
    state = one_of(list(JobState.values), "only jobs in this state")
    kind = one_of(list(JobKind.values), "only jobs of this kind")
    name = text("name", 128, "only jobs with exactly this name")
    tenant = text("tenant__name", 64, "only this tenant's jobs (an operator's filter: users see one)")
    owner = text("owner__username", 150, "only jobs submitted by this user (username)")
    queue = one_of(list(QUEUE_LEVELS), "only jobs in this queue level", method="filter_queue")

    class Meta:
        model = Job
        fields: list[str] = []

    def filter_queue(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        return queryset.filter(queue_level=QUEUE_LEVELS[value])


class NodeFilter(OnceEach):
    state = one_of(list(NodeState.values), "only nodes in this state")
    rack = text("rack", 64, "only nodes in this rack")
    kind = text("kind", 16, "only nodes of this kind (gpu, cpu)")
    # distinct: a node with several devices of the model is listed once
    model = text("devices__model", 64, "only nodes with a device of this model (e.g. H100)", distinct=True)

    class Meta:
        model = Node
        fields: list[str] = []

"""The scheduler's knobs as an operator sets them: the scheduler-settings record.

Each field overrides its environment default (``TESSERA_ENGINE_<KNOB>``) when set. The record is
checked whole against the engine (``engine.config.configure``) before it is saved, so a bad value
is refused with the knob's name and nothing is half-applied; every pass reads it with its
snapshot, so a change takes effect from the next pass, which a save asks for.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from scheduling.engine.config import KNOBS, KnobError, configure
from scheduling.models import SchedulerSettings
from scheduling.services import audit
from scheduling.services.jobs import request_pass_on_commit
from scheduling.services.passes import engine_config


def knobs_of(record: SchedulerSettings | dict[str, Any]) -> dict[str, Any]:
    """The knobs ``record`` sets (its blank fields left out)."""
    get = record.get if isinstance(record, dict) else lambda k: getattr(record, k)
    return {k: get(k) for k in KNOBS if get(k) is not None}


def _json(knobs: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in knobs.items()}


def check_knobs(knobs: dict[str, Any]) -> KnobError | None:
    """What is wrong with ``knobs`` on top of the environment's (None: nothing)."""
    try:
        configure(engine_config(), knobs)
    except KnobError as exc:
        return exc
    return None


def do_save_scheduler_settings(record: SchedulerSettings, user: Any) -> None:
    """Save ``record`` (checked whole first: :class:`KnobError` if a knob is bad), stamped with
    who and when, and ask for a pass to apply it."""
    error = check_knobs(knobs_of(record))
    if error is not None:
        raise error
    record.pk = 1
    stored = SchedulerSettings.objects.filter(pk=1).first()
    audit.record(
        "settings.update",
        record,
        by=user,
        before=_json(knobs_of(stored)) if stored is not None else None,
        after=_json(knobs_of(record)),
    )
    record.updated_by = user
    record.updated_at = timezone.now()
    record.save()
    request_pass_on_commit()

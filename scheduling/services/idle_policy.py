"""The idle policy's settings: the operator's defaults, and each tenant's overrides inside the
operator's bounds (the one write path for ``Tenant.idle_policy``).

An override names any of ``threshold`` (0..1), ``exempt_s`` and ``act_after_s`` (seconds); the
warnings scale with ``act_after_s`` (``scheduling.engine.adjust.with_overrides``). The bounds are
``TESSERA_IDLE_BOUNDS_THRESHOLD``, ``…_EXEMPT_S`` and ``…_ACT_AFTER_S`` (``low,high``). Every
change is in the audit log (``tenant.idle_policy``), with the overrides before and after.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.db import transaction

from scheduling.engine.adjust import OVERRIDABLE, Bounds, IdleSettings, OverrideRefused, with_overrides
from scheduling.models import Tenant
from scheduling.services import audit

log = logging.getLogger("tessera.adjust")

LONGEST_CACHE_S = 60.0  # how stale the longest window may be where reports are kept


def defaults() -> IdleSettings:
    """The operator's defaults (``TESSERA_IDLE_*``)."""
    t = settings.TESSERA
    out = IdleSettings(
        threshold=t["IDLE_THRESHOLD"],
        exempt_s=t["IDLE_EXEMPT_S"],
        warn_after_s=tuple(t["IDLE_WARN_S"]),
        act_after_s=t["IDLE_ACT_S"],
        step_s=t["IDLE_STEP_S"],
    )
    out.check()
    return out


def bounds() -> Bounds:
    """What the operator lets tenants set."""
    b = settings.TESSERA["IDLE_BOUNDS"]
    return Bounds(**{name: (float(b[name][0]), float(b[name][1])) for name in OVERRIDABLE})


def check_idle_overrides(overrides: Any) -> dict[str, float]:
    """``overrides`` as stored (a null value drops that override); :class:`OverrideRefused` naming
    the field that is unknown, not a number, or outside the bounds."""
    if not isinstance(overrides, Mapping):
        raise OverrideRefused("idle_policy", "must be an object")
    kept = {str(k): v for k, v in overrides.items() if v is not None}
    with_overrides(defaults(), kept, bounds())  # warnings scale with act_after_s: always valid
    return {k: float(v) for k, v in kept.items()}


def do_set_idle_overrides(tenant: Tenant, overrides: Any, by: Any) -> Tenant:
    """Replace ``tenant``'s overrides (``{}``: the operator's defaults again); audited."""
    kept = check_idle_overrides(overrides)
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        before = dict(locked.idle_policy or {})
        locked.idle_policy = kept
        locked.save(update_fields=["idle_policy"])
        audit.record("tenant.idle_policy", locked, by=by, before=before, after=kept)
    _longest.clear()
    return locked


def effective(tenant: Tenant) -> IdleSettings:
    """The settings the pass judges ``tenant``'s jobs by."""
    return for_tenants([tenant])[tenant.name]


def for_tenants(tenants: Iterable[Tenant]) -> dict[str, IdleSettings]:
    """Each tenant's settings by name. An override the operator's bounds have since moved past
    is dropped (the defaults apply) with a log line: the pass never fails on one."""
    base, limits = defaults(), bounds()
    out = {}
    for tenant in tenants:
        try:
            out[tenant.name] = with_overrides(base, tenant.idle_policy or {}, limits)
        except OverrideRefused as exc:
            log.warning("tenant %s: idle policy override ignored (%s): the defaults apply", tenant.name, exc)
            out[tenant.name] = base
    return out


def as_json(policy: IdleSettings) -> dict[str, Any]:
    out = asdict(policy)
    out["warn_after_s"] = list(policy.warn_after_s)
    return out


def bounds_json() -> dict[str, list[float]]:
    return {name: list(getattr(bounds(), name)) for name in OVERRIDABLE}


_longest: dict[str, tuple[float, float]] = {}


def longest_act_after_s() -> float:
    """The longest ``act_after_s`` any tenant's jobs are judged by (how much history the agents'
    reports must keep); read at most once a minute per process."""
    now = time.monotonic()
    cached = _longest.get("value")
    if cached is not None and now - cached[1] < LONGEST_CACHE_S:
        return cached[0]
    overrides = Tenant.objects.exclude(idle_policy={}).values_list("idle_policy", flat=True)
    found = [float(o["act_after_s"]) for o in overrides if isinstance(o, dict) and "act_after_s" in o]
    value = max([defaults().act_after_s, *found])
    _longest["value"] = (value, now)
    return value

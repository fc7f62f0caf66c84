"""Write paths for quotas, and the submit-time check that a tenant's quotas could ever admit a job.

Every quota change asks for a scheduling pass after commit: a raised limit may let pending jobs
start, a lowered guarantee may let others reclaim borrowed GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import IntegrityError, transaction

from scheduling.models import Quota, Tenant
from scheduling.services.jobs import request_pass_on_commit

ANY_MODEL = "*"


class QuotaExists(Exception):
    """The tenant already has a quota row for that model."""


def applicable_limits(quotas: Iterable[Quota], accelerators: Sequence[str]) -> list[float]:
    """The limits that could cover a job accepting ``accelerators`` (empty = any model).

    A row for a model covers that model; the ``*`` row covers every model without its own row.
    """
    by_model = {q.model: q.limit for q in quotas}
    if not accelerators:
        return list(by_model.values())
    limits = []
    for model in accelerators:
        if model in by_model:
            limits.append(by_model[model])
        elif ANY_MODEL in by_model:
            limits.append(by_model[ANY_MODEL])
    return limits


def check_job_admissible(tenant: Tenant, minimum_gpus: float, accelerators: Sequence[str]) -> str | None:
    """Why no quota of ``tenant`` could ever admit a job of ``minimum_gpus`` (None when one could).

    ``minimum_gpus`` is the least the job can start with (its gang's ``min_available`` replicas, or
    its elastic minimum). A CPU-only job uses no GPU model and so needs no quota row.
    """
    if minimum_gpus <= 0:
        return None
    limits = applicable_limits(Quota.objects.filter(tenant=tenant), accelerators)
    if not limits:
        which = ", ".join(accelerators) if accelerators else "any model"
        return f"tenant {tenant.name} has no quota for {which}"
    best = max(limits)
    if minimum_gpus > best:
        return (
            f"needs at least {minimum_gpus:g} GPUs but tenant {tenant.name}'s largest applicable "
            f"quota limit is {best:g}"
        )
    return None


def do_create_quota(tenant: Tenant, model: str, guaranteed: float, limit: float, weight: float) -> Quota:
    try:
        with transaction.atomic():
            quota = Quota.objects.create(
                tenant=tenant, model=model, guaranteed=guaranteed, limit=limit, weight=weight
            )
            request_pass_on_commit()
    except IntegrityError:
        if Quota.objects.filter(tenant=tenant, model=model).exists():
            raise QuotaExists() from None
        raise
    return quota


def do_update_quota(quota: Quota, **fields: float) -> Quota:
    """Change ``guaranteed``, ``limit`` or ``weight`` (already validated together)."""
    with transaction.atomic():
        for name, value in fields.items():
            setattr(quota, name, value)
        quota.save(update_fields=list(fields) or None)
        request_pass_on_commit()
    return quota


def do_delete_quota(quota: Quota) -> None:
    with transaction.atomic():
        quota.delete()
        request_pass_on_commit()

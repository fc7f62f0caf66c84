"""Write paths for quotas, and the submit-time check that a tenant's quotas could ever admit a job.

Every quota change asks for a scheduling pass after commit: a raised limit may let pending jobs
start, a lowered guarantee may let others reclaim borrowed GPUs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from django.db import IntegrityError, connection, transaction
from django.db.models import Count

from scheduling.engine.geometry import geometry
from scheduling.engine.types import MILLI, JobRequest
from scheduling.models import Device, Quota, Tenant
from scheduling.services import audit
from scheduling.services.snapshot import PreparedRead
from scheduling.services.triggers import request_pass_on_commit

ANY_MODEL = "*"


class QuotaRow(NamedTuple):
    model: str
    guaranteed: float
    limit: float


# Read on every submit: its SQL is built once (see PreparedRead).
_TENANT_QUOTAS = PreparedRead(
    lambda ids: Quota.objects.filter(tenant_id__in=ids).order_by().values_list(*QuotaRow._fields)
)


class QuotaExists(Exception):
    """The tenant already has a quota row for that model."""


class QuotaChanged(Exception):
    """A change checked against a row that someone changed meanwhile no longer holds with the row
    as it is now (``errors``: field → sentences)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors


def applicable_rows(quotas: Iterable[QuotaRow], accelerators: Sequence[str]) -> list[QuotaRow]:
    """The rows that could cover a job accepting ``accelerators`` (empty = any model).

    A row for a model covers that model; the ``*`` row covers every model without its own row.
    """
    by_model = {q.model: q for q in quotas}
    if not accelerators:
        return list(by_model.values())
    rows = []
    for model in accelerators:
        if model in by_model:
            rows.append(by_model[model])
        elif ANY_MODEL in by_model:
            rows.append(by_model[ANY_MODEL])
    return rows


def quota_charge(cleaned: dict[str, Any]) -> float:
    """The GPUs the smallest start of a job counts against a quota (its gang's ``min_available``
    replicas, or its elastic minimum), each replica's GPUs rounded up to the allocation block it
    takes. The engine's own geometry decides, so what is admitted here is what the engine admits.
    """
    job = JobRequest(
        id="new",
        tenant="",
        kind=cleaned["kind"],
        gpus=float(cleaned["gpus"]),
        replicas=cleaned["replicas"],
        min_available=cleaned["min_available"],
        topology=cleaned.get("topology", "any"),
        elastic_min_gpus=cleaned.get("elastic_min_gpus"),
        elastic_max_gpus=cleaned.get("elastic_max_gpus"),
    )
    if job.gpus <= 0:
        return 0.0
    geo = geometry(job)
    return geo.charge * geo.need / MILLI


def admission_sql() -> str:
    """The SQL form of "some quota of the tenant could admit the job" (:func:`check_job_admissible`,
    same rules), for the submit's INSERT to store the job only if it holds: the check and the store
    in one statement. Its one parameter: :func:`admission_params` (one JSON value, not four: the
    submit's statement stays within the parameters psycopg caches its parsing for)."""
    qn = connection.ops.quote_name
    table, tenant, model = qn(Quota._meta.db_table), qn("tenant_id"), qn("model")
    limit, guaranteed = qn("limit"), qn("guaranteed")
    job = (
        "SELECT (j->>'charge')::float8 AS charge, (j->>'tenant')::bigint AS tenant,"
        " (j->>'preemptible')::boolean AS preemptible,"
        " ARRAY(SELECT jsonb_array_elements_text(j->'names')) AS names FROM (SELECT %s::jsonb AS j) AS p"
    )
    # An applicable row: any, with no accelerator named; one named; or the ``*`` row while a named
    # model has no row of its own.
    return (
        f"EXISTS (SELECT 1 FROM ({job}) AS a WHERE a.charge <= 0 OR EXISTS (SELECT 1 FROM {table} q"
        f" WHERE q.{tenant} = a.tenant"
        f" AND (CASE WHEN a.preemptible THEN q.{limit} ELSE q.{guaranteed} END) >= a.charge"
        f" AND (cardinality(a.names) = 0 OR q.{model} = ANY(a.names)"
        f" OR (q.{model} = '{ANY_MODEL}' AND EXISTS (SELECT 1 FROM unnest(a.names) AS named(m)"
        f" WHERE NOT EXISTS (SELECT 1 FROM {table} o"
        f" WHERE o.{tenant} = a.tenant AND o.{model} = named.m))))))"
    )


def admission_params(tenant: Tenant, cleaned: dict[str, Any]) -> list[Any]:
    return [
        json.dumps(
            {
                "charge": quota_charge(cleaned),
                "tenant": tenant.pk,
                "preemptible": bool(cleaned.get("preemptible", True)),
                "names": list(cleaned.get("accelerators") or []),
            }
        )
    ]


def check_job_admissible(tenant: Tenant, cleaned: dict[str, Any]) -> str | None:
    """Why no quota of ``tenant`` could ever admit the job ``cleaned`` (None when one could).

    Admitting means some applicable row's limit — its guarantee, for a job that is not preemptible,
    since only preemptible jobs may borrow — holds the job's smallest start (``quota_charge``). A
    CPU-only job uses no GPU model and so needs no quota row.
    """
    charge = quota_charge(cleaned)
    if charge <= 0:
        return None
    accelerators = cleaned.get("accelerators") or []
    rows = applicable_rows(map(QuotaRow._make, _TENANT_QUOTAS.rows([tenant.pk])), accelerators)
    if not rows:
        which = ", ".join(accelerators) if accelerators else "any model"
        return f"tenant {tenant.name} has no quota for {which}"
    preemptible = cleaned.get("preemptible", True)
    best = max(q.limit if preemptible else q.guaranteed for q in rows)
    if charge > best:
        cap = "quota limit" if preemptible else "guarantee (a job that is not preemptible may not borrow)"
        return (
            f"needs at least {charge:g} GPUs but tenant {tenant.name}'s largest applicable {cap} is {best:g}"
        )
    return None


AUDITED = ("tenant_id", "model", "guaranteed", "limit", "weight")


def _audited(quota: Quota) -> dict[str, Any]:
    return {**audit.fields_of(quota, AUDITED[2:]), "tenant": quota.tenant.name, "model": quota.model}


def do_create_quota(
    tenant: Tenant, model: str, guaranteed: float, limit: float, weight: float, by: Any = None
) -> Quota:
    """A new quota row (:class:`QuotaExists` if the tenant has one for ``model``); ``by``: who, for
    the audit log."""
    try:
        with transaction.atomic():
            quota = Quota.objects.create(
                tenant=tenant, model=model, guaranteed=guaranteed, limit=limit, weight=weight
            )
            audit.record("quota.create", quota, by=by, after=_audited(quota))
            request_pass_on_commit()
    except IntegrityError:
        if Quota.objects.filter(tenant=tenant, model=model).exists():
            raise QuotaExists() from None
        raise
    return quota


def do_update_quota(quota: Quota, by: Any = None, **fields: float) -> Quota:
    """Change ``guaranteed``, ``limit`` or ``weight`` (already validated together); the audit log
    gets the stored values before (read from the row: an admin form has already set ``quota``'s)
    and after."""
    with transaction.atomic():
        stored = Quota.objects.select_for_update().select_related("tenant").get(pk=quota.pk)
        before = _audited(stored)
        # The caller checked ``fields`` against the row it read; another operator may have changed
        # the others since (two PATCHes, one of `guaranteed`, one of `limit`, each fine alone):
        # the pair is checked again here, under the row's lock, against the row as it is now.
        guaranteed = fields.get("guaranteed", stored.guaranteed)
        limit = fields.get("limit", stored.limit)
        if limit < guaranteed:
            field = "limit" if "limit" in fields else "guaranteed"
            raise QuotaChanged(
                {
                    field: [
                        f"The limit ({limit:g}) must be at least the guarantee ({guaranteed:g}): the "
                        "quota was changed meanwhile; read it again."
                    ]
                }
            )
        for name, value in fields.items():
            setattr(quota, name, value)
        quota.save(update_fields=list(fields) or None)
        audit.record("quota.update", quota, by=by, before=before, after=_audited(quota))
        request_pass_on_commit()
    return quota


def do_delete_quota(quota: Quota, by: Any = None) -> None:
    with transaction.atomic():
        before = _audited(Quota.objects.select_related("tenant").get(pk=quota.pk))
        audit.record("quota.delete", quota, by=by, before=before)
        quota.delete()
        request_pass_on_commit()


class QuotaAdvice(NamedTuple):
    """What :func:`check_quota` found: ``errors`` refuse the row (field → sentences);
    ``warnings`` are said and the row is kept."""

    errors: dict[str, list[str]]
    warnings: list[str]


def cluster_models() -> dict[str, int]:
    """Every GPU model a node has, with how many GPUs of it the cluster holds."""

    return dict(Device.objects.values_list("model").annotate(n=Count("id")).order_by())


def check_quota(model: str, guaranteed: float, limit: float, current: Quota | None = None) -> QuotaAdvice:
    """Check a quota row before it is stored, in sentences a person acts on.

    1. ``limit`` below ``guaranteed``: refused (the database's constraint, said in words).
    2. A model that matches a known one only by case (``h100`` for ``H100``): refused, since the
       scheduler compares names exactly and the row would silently cover nothing.
    3. A model no node has: a warning (a node may join later).
    4. Guarantees on the model, over every tenant, above the GPUs the cluster has of it: a warning
       with the numbers (the guarantees cannot all be honoured at once).
    """
    errors: dict[str, list[str]] = {}
    warnings: list[str] = []
    if limit < guaranteed:
        errors["limit"] = [f"The limit ({limit:g}) must be at least the guarantee ({guaranteed:g})."]
    models = cluster_models()
    if model != ANY_MODEL and model not in models:
        same = sorted(m for m in models if m.lower() == model.lower())
        if same:
            errors["model"] = [
                f"No node has “{model}”; did you mean “{same[0]}”? Model names must match exactly, "
                "capitals included."
            ]
        else:
            known = ", ".join(sorted(models)) or "none yet"
            warnings.append(
                f"No node has a GPU of model “{model}” (the cluster has: {known}): this quota covers "
                "nothing until such a node joins."
            )
    if not errors and (model == ANY_MODEL or model in models):
        others = Quota.objects.filter(model=model)
        if current is not None:
            others = others.exclude(pk=current.pk)
        total = guaranteed + sum(others.values_list("guaranteed", flat=True))
        capacity = sum(models.values()) if model == ANY_MODEL else models.get(model, 0)
        what = "every model (*)" if model == ANY_MODEL else model
        if total > capacity:
            warnings.append(
                f"Guarantees on {what} would add up to {total:g} GPUs over all teams, but the cluster "
                f"has {capacity:g}: they cannot all be honoured at once."
            )
    return QuotaAdvice(errors, warnings)

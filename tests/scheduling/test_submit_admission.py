"""The submit's quota check, done by its INSERT's condition on PostgreSQL, agrees with the rules
(``check_job_admissible``) on any set of quota rows and any job; a refused job stores nothing."""

from __future__ import annotations

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.models import IdempotencyKey, Job, JobEvent, Quota, Tenant
from scheduling.services.jobs import NotAdmissible, do_submit_job
from scheduling.services.quotas import admission_params, admission_sql, check_job_admissible

pytestmark = pytest.mark.postgresql(
    "the quota check is a condition of the submit's INSERT only on PostgreSQL"
)

MODELS = ["A100", "H100", "L4", "*"]

quota_rows = st.dictionaries(
    st.sampled_from(MODELS),
    st.tuples(st.sampled_from([0, 0.5, 1, 2, 4, 8, 16]), st.sampled_from([0, 1, 2, 3, 8, 16])),
    max_size=4,
)
jobs = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["training", "inference", "batch"]),
        "gpus": st.sampled_from([0, 0.25, 0.5, 1, 2, 3, 4, 8, 16]),
        "replicas": st.sampled_from([1, 2, 4]),
        "accelerators": st.lists(st.sampled_from(["A100", "H100", "L4", "B200"]), unique=True, max_size=3),
        "preemptible": st.booleans(),
    }
)


@pytest.fixture
def tenant(require_postgres, db):
    return Tenant.objects.create(name="t")


def cleaned_job(job: dict) -> dict:
    return {**job, "min_available": job["replicas"]}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=quota_rows, job=jobs)
def test_the_statements_condition_agrees_with_the_rules(tenant, rows, job):
    Quota.objects.filter(tenant=tenant).delete()
    for model, (guaranteed, extra) in rows.items():
        Quota.objects.create(tenant=tenant, model=model, guaranteed=guaranteed, limit=guaranteed + extra)
    cleaned = cleaned_job(job)
    with connection.cursor() as cur:
        cur.execute(f"SELECT {admission_sql()}", admission_params(tenant, cleaned))
        (admitted,) = cur.fetchone()
    assert admitted == (check_job_admissible(tenant, cleaned) is None), (rows, job)


def test_a_job_no_quota_admits_is_refused_with_the_reason_and_stores_nothing(tenant, django_user_model):
    user = django_user_model.objects.create(username="u")
    Quota.objects.create(tenant=tenant, model="A100", guaranteed=2, limit=4)
    job = {
        "name": "j",
        "command": ["true"],
        **cleaned_job(
            {"kind": "training", "gpus": 8, "replicas": 1, "accelerators": ["A100"], "preemptible": True}
        ),
    }
    with pytest.raises(NotAdmissible, match="largest applicable quota limit is 4"):
        do_submit_job(user, tenant, job, {"b": 1}, idempotency_key="k1", check_quota=True)
    assert (Job.objects.count(), JobEvent.objects.count(), IdempotencyKey.objects.count()) == (0, 0, 0)
    Quota.objects.filter(tenant=tenant).update(limit=8)  # raised: the same submit is stored now
    stored, created = do_submit_job(user, tenant, job, {"b": 1}, idempotency_key="k1", check_quota=True)
    assert created and Job.objects.get().pk == stored.pk and IdempotencyKey.objects.get().job_id == stored.pk
    Quota.objects.filter(tenant=tenant).update(limit=4)  # lowered: its retry still gets that job
    again, created = do_submit_job(user, tenant, job, {"b": 1}, idempotency_key="k1", check_quota=True)
    assert (again.pk, created) == (stored.pk, False)


def test_the_submit_statement_stays_one_psycopg_caches_the_parsing_of(tenant, django_user_model):
    """psycopg parses a statement's placeholders once and caches that only for statements of at
    most 50 parameters and 4,096 characters; one parameter more made every submit parse it again
    (~6% of a submit's CPU, measured). A new job column must not silently push it over."""
    from psycopg import _queries

    user = django_user_model.objects.create(username="u")
    Quota.objects.create(tenant=tenant, model="*", guaranteed=8, limit=8)
    job = {
        "name": "j",
        "command": ["true"],
        **cleaned_job(
            {"kind": "training", "gpus": 1, "replicas": 1, "accelerators": ["A100"], "preemptible": True}
        ),
    }
    seen = []

    def spy(execute, sql, params, many, context):
        if sql.startswith("WITH p AS (INSERT"):
            seen.append((len(sql), len(params)))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        do_submit_job(user, tenant, job, {"b": 1}, idempotency_key="k", check_quota=True)
    ((length, count),) = seen
    assert count <= _queries.MAX_CACHED_STATEMENT_PARAMS and length <= _queries.MAX_CACHED_STATEMENT_LENGTH

"""Property: no JSON body, however odd, makes the submit endpoint answer anything but 201 or 400
(never a 500), and a refused body stores nothing."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.models import Job
from tests.api.helpers import valid_body

# Text with anything in it: NUL, control characters, lone surrogates.
TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=20)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
FIELDS = sorted(
    valid_body(
        tenant="vision",
        replicas=1,
        min_available=1,
        accelerators=[],
        topology="any",
        priority=0,
        preemptible=True,
        grace_seconds=1,
        checkpoint_seconds=1,
        time_limit_seconds=1,
        cpus=1,
        memory_gib=1,
        env={},
        node_selector={},
        max_retries=0,
        elastic=None,
    )
)


def post(client, body) -> int:
    return client.generic(
        "POST", "/api/v1/jobs/", json.dumps(body).encode(), content_type="application/json"
    ).status_code


def answers(body: dict) -> tuple[int, ...]:
    """What a body may get: 201 or 400, or 403 when it names a tenant that is not the user's (a
    well-formed name of someone else's tenant is a permission matter, not a malformed field)."""
    other = isinstance(body.get("tenant"), str) and body["tenant"] != "vision"
    return (201, 400, 403) if other else (201, 400)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(body=st.dictionaries(TEXT | st.sampled_from(FIELDS), JSON, max_size=6))
def test_any_json_object_gets_a_201_or_a_400(world, body):
    before = Job.objects.count()
    code = post(world.client("alice"), body)
    assert code in answers(body)
    assert Job.objects.count() == before + (code == 201)


@FUZZ
@given(field=st.sampled_from(FIELDS), value=JSON)
def test_a_valid_body_with_one_field_replaced_gets_a_201_or_a_400(world, field, value):
    before = Job.objects.count()
    body = {**valid_body(), field: value}
    code = post(world.client("alice"), body)
    assert code in answers(body)
    assert Job.objects.count() == before + (code == 201)


QUOTA_FIELDS = ["tenant", "model", "guaranteed", "limit", "weight"]


@FUZZ
@given(
    body=st.dictionaries(
        TEXT | st.sampled_from(QUOTA_FIELDS), JSON | st.sampled_from(["nlp", "H100"]), max_size=6
    )
)
def test_any_json_object_as_a_quota_gets_a_201_or_a_400(world, body):
    from scheduling.models import Quota

    before = Quota.objects.count()
    response = world.client("admin").generic(
        "POST", "/api/v1/quotas/", json.dumps(body).encode(), content_type="application/json"
    )
    assert response.status_code in (201, 400)
    assert Quota.objects.count() == before + (response.status_code == 201)

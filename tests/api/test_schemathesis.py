"""The schema is the truth: schemathesis sends every operation of the OpenAPI schema generated
bodies, parameters and headers, valid and not, and runs all of its checks on the answers.

Each operation is sent with the credential its security names (alice's API token, a node's own
credential, a join token), in process, through Django's WSGI handler: the same views, middleware
and database as daphne's ASGI handler, inside the test's transaction. Each operation gets its own
world. Generation is derandomized, so a run is the same every time (CI is not flaky) and a failure
here reproduces on any machine.

The schema cannot say everything the API checks: OpenAPI 3.0 cannot state a rule across fields
(``replicas`` must divide ``gpus``), across a list's items (distinct device indices), on one item
of a list (a command's first, the program, is not blank) or on an object's keys (``propertyNames``
is 3.1's). The ``filter_case`` hooks below leave out the valid
(positive) bodies that break such a rule, each rule named, and nothing else: an answer that differs
from the schema in any other way fails this test.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

from scheduling.api.fields import text_problem

pytestmark = pytest.mark.slow

EXAMPLES = 20  # per operation: Hypothesis's budget across valid and invalid cases (~1,900 cases in all)

load_all_checks()
ALL_CHECKS = CHECKS.get_all()

schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
schema.app = WSGIHandler()


def _positive(case: Any) -> bool:
    return case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE


def job_body_breaks_a_cross_field_rule(body: dict[str, Any]) -> bool:
    """The rules of ``JobSubmitSerializer.validate`` between fields (each field alone is in the
    schema)."""
    gpus, replicas = body.get("gpus", 1), body.get("replicas", 1)
    if 0 < gpus < 1:
        if replicas != 1:  # a fraction of a GPU is one replica's
            return True
    elif int(gpus) % replicas:  # each replica gets gpus / replicas whole GPUs
        return True
    min_available = body.get("min_available")
    elastic = body.get("elastic")
    if elastic is not None:
        per = int(gpus / replicas)
        if gpus < 1 or not elastic["min_gpus"] <= gpus <= elastic["max_gpus"]:
            return True  # min_gpus ≤ gpus ≤ max_gpus
        if elastic["min_gpus"] % per or elastic["max_gpus"] % per:
            return True  # the bounds are whole replicas
        if min_available is not None and min_available != elastic["min_gpus"] // per:
            return True  # min_available, if given, is min_gpus in replicas
        min_available = elastic["min_gpus"] // per
    if (min_available or 0) > replicas:
        return True  # min_available ≤ replicas
    # an interactive job is never judged idle, so it cannot allow idle reclaim
    return bool(body.get("interactive") and body.get("idle_reclaim") == "allow")


def bad_keys(mapping: dict[str, str], key_max_length: int, max_bytes: int | None = None) -> bool:
    """A map's keys are 1 to ``key_max_length`` characters of storable text, and (``max_bytes``)
    its keys and values are at most so many bytes in all."""
    if any(not 1 <= len(key) <= key_max_length or text_problem(key) for key in mapping):
        return True
    total = sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
        for k, v in mapping.items()
    )
    return max_bytes is not None and total > max_bytes


# Idempotency-Key -> the body first sent with it, in the running test: a key is tied to that body
# (a rule across requests: another body with it answers 422, as the schema says).
sent_keys: dict[str, Any] = {}


@schema.hook("filter_case").apply_to(method="POST", path="/api/v1/jobs/")
def valid_jobs_keep_the_rules_across_fields(context: Any, case: Any) -> bool:
    if not _positive(case):
        return True
    body = case.body
    key = (case.headers or {}).get("Idempotency-Key")
    if key is not None and sent_keys.get(key, body) != body:
        return False
    maps = {"env": (1024, 64 * 1024), "node_selector": (253, 16 * 1024), "prefer_labels": (253, 16 * 1024)}
    if any(bad_keys(body.get(name, {}), *bounds) for name, bounds in maps.items()):
        return False
    if not body["command"][0].strip():
        return False  # the program, the first item, is not blank (a rule on one item's place)
    lists = {"command": 256 * 1024, "accelerators": 64 * 64}  # at most so many bytes in all
    if any(
        len("".join(body.get(name, [])).encode("utf-8", "surrogatepass")) > most
        for name, most in lists.items()
    ):
        return False
    return not job_body_breaks_a_cross_field_rule(body)


@schema.hook("filter_case").apply_to(method="POST", path="/api/v1/agent/register/")
def valid_registrations_keep_the_rules_across_items_and_keys(context: Any, case: Any) -> bool:
    """Label names are 1 to 64 printable characters; a node's devices have distinct indices
    (``uniqueItems`` compares whole items)."""
    if not _positive(case):
        return True
    labels = case.body.get("labels", {})
    if bad_keys(labels, 64) or not all(key.isprintable() for key in labels):
        return False
    indices = [device["index"] for device in case.body.get("devices", [])]
    return len(set(indices)) == len(indices)


@schema.hook("filter_case").apply_to(method="GET", path=["/api/v1/jobs/", "/api/v1/jobs/{id}/events/"])
def cursors_are_the_servers(context: Any, case: Any) -> bool:
    """A cursor is one a page's ``next`` gave (a rule across requests): a made-up one is a 400
    naming ``cursor``, as is one sent with an ``offset``."""
    return not _positive(case) or not (case.query or {}).get("cursor")


@pytest.fixture
def in_the_test_transaction() -> Iterator[None]:
    """Requests run inside the test's transaction: as Django's test client does, do not let the
    handler close the connection at each request's start and end."""
    sent_keys.clear()
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    logging.getLogger("django.request").setLevel(logging.ERROR)  # thousands of 4xx lines otherwise
    yield
    logging.getLogger("django.request").setLevel(logging.NOTSET)
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def public_dns(monkeypatch) -> None:
    """Every host name resolves to a public address (example.net's): a webhook's URL is checked
    against DNS when it is made, and the test must not depend on the network."""
    from scheduling.services import webhooks

    public = [(2, 1, 6, "", ("93.184.215.14", 443))]
    monkeypatch.setattr(webhooks.socket, "getaddrinfo", lambda *args, **kwargs: public)


@pytest.fixture
def credentials(world) -> dict[str, str]:
    """The ``Authorization`` header for each security scheme of the schema: alice's API token for
    the user API, a node's own credential and a join token for the agents' protocol."""
    from django.conf import settings as django_settings

    from scheduling.models import Quota
    from tests.agent import helpers as agent

    # A job that no quota of its tenant could ever admit is refused (400 naming accelerators): a
    # rule on the cluster's quotas, not on the body. Here alice's tenant may have the largest job.
    most = django_settings.TESSERA["MAX_JOB_GPUS"]
    Quota.objects.filter(tenant=world.vision).update(guaranteed=most, limit=most)
    join_token = agent.new_join_token("schemathesis")
    _, answer = agent.register(join_token, "gpu-st")
    return {
        "tokenAuth": f"Token {world.tokens['alice']}",
        "nodeCredential": f"Node {answer['credential']}",
        "joinToken": f"Join {join_token}",
    }


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_as_its_schema_says(case, credentials, public_dns, in_the_test_transaction):
    scheme = next(iter(case.operation.definition.raw["security"][0]))
    case.call_and_validate(headers={"Authorization": credentials[scheme]}, checks=ALL_CHECKS)
    key = (case.headers or {}).get("Idempotency-Key")
    if key is not None:
        sent_keys.setdefault(key, case.body)

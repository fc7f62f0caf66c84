"""The OpenAPI schema: it builds, lists the API, and its docs page is served."""

from __future__ import annotations


def test_the_schema_lists_the_jobs_endpoint_and_the_job_body(world):
    response = world.client("alice").get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert "/api/v1/jobs/" in schema["paths"]
    assert {"post", "get"} <= set(schema["paths"]["/api/v1/jobs/"])
    body = schema["components"]["schemas"]["JobSubmit"]
    assert {"name", "kind", "command"} <= set(body["required"])
    assert {"gpus", "elastic", "env", "tenant"} <= set(body["properties"])
    for path in ("/api/v1/jobs/{id}/logs/", "/api/v1/nodes/", "/api/v1/quotas/{id}/", "/api/v1/cluster/"):
        assert path in schema["paths"], path


def test_the_schema_builds_without_errors_or_warnings():
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    GENERATOR_STATS.reset()
    with GENERATOR_STATS.silence():
        SchemaGenerator().get_schema(request=None, public=True)
    assert list(GENERATOR_STATS._error_cache) == []
    assert list(GENERATOR_STATS._warn_cache) == []


def test_the_docs_page_is_served(world):
    assert world.client("alice").get("/api/docs/").status_code == 200

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


def schema_of(world) -> dict:
    return world.client("alice").get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()


def test_every_operation_declares_its_error_answers_in_the_error_shape(world):
    paths = schema_of(world)["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert "401" in codes, (method, path)
            if "{" in path:
                assert "404" in codes, (method, path)
            if path.startswith("/api/v1/") and not path.startswith("/api/v1/agent/"):
                assert "429" in codes, (method, path)
                assert "400" in codes, (method, path)  # an unknown query parameter, anywhere
            if "requestBody" in operation or any(p["in"] == "query" for p in operation.get("parameters", [])):
                assert "400" in codes, (method, path)
            error = operation["responses"]["401"]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/Error"}
    assert {"403", "422"} <= set(paths["/api/v1/jobs/"]["post"]["responses"])
    assert "409" in paths["/api/v1/jobs/{id}/cancel/"]["post"]["responses"]


def test_the_events_are_declared_as_the_pages_they_are(world, alice_job):
    operation = schema_of(world)["paths"]["/api/v1/jobs/{id}/events/"]["get"]
    names = sorted(p["name"] for p in operation["parameters"])
    assert names == ["cursor", "id", "limit", "offset"]  # pages, no job-list filters
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    answers = schema_of(world)["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]["oneOf"]
    whole, page = answers  # no paging asked: the contract's plain list; else a page
    assert whole["type"] == "array"
    assert {"count", "next", "previous", "results"} <= set(page["properties"])
    client = world.client("alice")
    assert isinstance(client.get(f"/api/v1/jobs/{alice_job.pk}/events/").json(), list)
    paged = client.get(f"/api/v1/jobs/{alice_job.pk}/events/", {"limit": 5}).json()
    assert set(paged) == set(page["properties"])


def test_the_job_body_declares_its_kinds_and_a_non_empty_command(world):
    schema = schema_of(world)
    body = schema["components"]["schemas"]["JobSubmit"]["properties"]
    kind = schema["components"]["schemas"][body["kind"]["$ref"].rsplit("/", 1)[1]]
    assert set(kind["enum"]) == {"inference", "training", "finetune", "batch"}
    assert body["command"]["minItems"] == 1 and body["command"]["items"]["type"] == "string"


def test_numeric_query_parameters_declare_their_minimums(world):
    paths = schema_of(world)["paths"]
    logs = {p["name"]: p["schema"] for p in paths["/api/v1/jobs/{id}/logs/"]["get"]["parameters"]}
    assert logs["replica"]["minimum"] == 0 and logs["offset"]["minimum"] == 0
    page = {p["name"]: p["schema"] for p in paths["/api/v1/jobs/"]["get"]["parameters"]}
    assert page["offset"]["minimum"] == 0 and page["limit"]["minimum"] == 0


def test_the_redoc_page_is_served_from_this_site(world):
    page = world.client("alice").get("/api/redoc/").content.decode()
    assert "/static/drf_spectacular_sidecar/redoc/" in page and "https://" not in page

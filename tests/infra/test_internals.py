"""Canaries for the workarounds inside frameworks (docs/internals.md): each fails when the library
it relies on changes what the workaround uses (a private method, attribute, signature or a copied
script), so that an upgrade past a pin is caught here, not in production. And each workaround's
off switch gives the library's own behaviour back.

The workarounds' behaviour is tested where they live (tests/api/test_pooled_handler.py,
tests/infra/test_daphne_requests.py, tests/scheduling/test_live_outlet.py,
tests/scheduling/test_prepared_read.py, tests/engine/test_collector.py); these only watch the
libraries' side.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


# --- the pooled request handler (controlplane/pooled_handler.py): Django's handler internals ------


def test_the_django_handler_internals_the_pooled_handler_overrides_or_calls_are_there():
    from django.core.handlers import asgi, base, exception
    from django.http import HttpResponse
    from django.utils import log

    assert _parameters(base.BaseHandler.resolve_request) == ["self", "request"]
    assert _parameters(base.BaseHandler.load_middleware) == ["self", "is_async"]
    assert _parameters(base.BaseHandler.get_response) == ["self", "request"]
    assert _parameters(asgi.ASGIHandler.read_body) == ["self", "receive"]
    assert _parameters(asgi.ASGIHandler.create_request) == ["self", "scope", "body_file"]
    assert _parameters(asgi.ASGIHandler.send_response) == ["self", "response", "send"]
    assert _parameters(asgi.ASGIHandler.handle) == ["self", "scope", "receive", "send"]
    assert _parameters(asgi.ASGIHandler.get_response_async) == ["self", "request"]
    assert _parameters(asgi.get_script_prefix) == ["scope"]
    assert _parameters(exception.response_for_exception) == ["request", "exc"]
    assert _parameters(log.log_response)[:2] == ["message", "args"]
    response = HttpResponse()
    assert response._resource_closers == []  # the bare view's answer closes its request through it
    # Django's own __call__ still runs the request through a per-request thread-sensitive context
    # and the request_started signal: what the pooled handler replaces.
    call = inspect.getsource(asgi.ASGIHandler.__call__) + inspect.getsource(asgi.ASGIHandler.handle)
    assert "ThreadSensitiveContext" in call and "request_started" in call


# --- daphne's requests (controlplane/daphne_requests.py) -----------------------------------------


def test_twisteds_form_parsing_switch_is_a_keyword_of_the_request_daphne_subclasses():
    from daphne import http_protocol
    from twisted.web import http

    assert issubclass(http_protocol.WebRequest, http.Request)
    assert "parsePOSTFormSubmission" in _parameters(http.Request.__init__)
    # daphne's HTTP factory still builds its requests from the module attribute the patch replaces
    assert "WebRequest" in inspect.getsource(http_protocol.HTTPFactory)


# --- the live outlet (scheduling/services/live.py): channels_redis private helpers, copied script --


def _lua(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines() if line.strip()]


def test_the_outlets_lua_script_is_the_installed_channels_redis_group_send_script():
    from channels_redis.core import RedisChannelLayer

    from scheduling.services.live import _GROUP_SEND_LUA

    source = inspect.getsource(RedisChannelLayer.group_send)
    found = re.search(r'group_send_lua = """(.*?)"""', source, re.S)
    assert found, "channels_redis's group_send no longer defines group_send_lua"
    assert _lua(found.group(1)) == _lua(_GROUP_SEND_LUA)


def test_group_send_still_takes_the_steps_the_outlet_repeats_with_the_layers_helpers():
    from channels_redis.core import RedisChannelLayer

    source = inspect.getsource(RedisChannelLayer.group_send)
    for step in ("self._group_key(", "zremrangebyscore(", "self._map_channel_keys_to_connection(", ".eval("):
        assert step in source, step


def test_the_channels_redis_helpers_the_outlet_calls_keep_their_signatures_and_answers():
    from channels_redis.core import RedisChannelLayer

    assert _parameters(RedisChannelLayer._map_channel_keys_to_connection) == [
        "self",
        "channel_names",
        "message",
    ]
    assert _parameters(RedisChannelLayer._group_key) == ["self", "group"]
    assert _parameters(RedisChannelLayer.connection) == ["self", "index"]
    assert _parameters(RedisChannelLayer.consistent_hash) == ["self", "value"]
    layer = RedisChannelLayer(hosts=["redis://127.0.0.1:6379/15"], prefix="canary")  # connects to nothing
    assert isinstance(layer.expiry, int) and isinstance(layer.group_expiry, int)
    assert layer._group_key("jobs.operators") == b"canary:group:jobs.operators"
    by_shard, payloads, capacities = layer._map_channel_keys_to_connection(
        ["specific.abc!one", "specific.abc!two"], {"type": "job.update"}
    )
    keys = [key for keys in by_shard.values() for key in keys]
    assert set(by_shard) <= set(range(len(layer.hosts))) and len(keys) == 1  # one key per process
    assert set(payloads) == set(capacities) == set(keys)
    assert isinstance(payloads[keys[0]], bytes) and isinstance(capacities[keys[0]], int)


# --- the ORM-compiler cache (scheduling/services/snapshot.py: PreparedRead) -----------------------


def test_the_sql_compiler_methods_prepared_reads_use_are_there(db):
    from django.db import connection
    from django.db.models.sql.compiler import SQLCompiler

    from scheduling.models import Job

    assert _parameters(SQLCompiler.as_sql)[:1] == ["self"]
    assert _parameters(SQLCompiler.get_converters) == ["self", "expressions"]
    assert _parameters(SQLCompiler.apply_converters) == ["self", "rows", "converters"]
    compiler = Job.objects.values_list("id", "node_selector").query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    assert sql.startswith("SELECT") and compiler.col_count == 2 and len(compiler.select) >= 2
    converters = compiler.get_converters([s[0] for s in compiler.select[: compiler.col_count]])
    assert isinstance(converters, dict)


# --- server-side prepared reads (scheduling/services/server_prepared.py): psycopg and Django ----


def test_psycopgs_pipeline_prepare_and_mogrify_and_djangos_cursor_wrapping_are_there():
    import psycopg
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.postgresql import base, operations

    assert _parameters(psycopg.Connection.pipeline) == ["self"]
    assert "prepare" in _parameters(psycopg.Cursor.execute)
    assert _parameters(psycopg.ClientCursor.mogrify) == ["self", "query", "params"]
    assert isinstance(psycopg.Connection.prepare_threshold, property)
    assert psycopg.Connection.prepare_threshold.fset is not None
    # Django turns psycopg's preparing off (for poolers): what the batch turns on for its time.
    assert '"prepare_threshold", None' in inspect.getsource(base.DatabaseWrapper.get_connection_params)
    assert _parameters(BaseDatabaseWrapper.make_cursor) == ["self", "cursor"]
    assert _parameters(BaseDatabaseWrapper.make_debug_cursor) == ["self", "cursor"]
    assert isinstance(BaseDatabaseWrapper.queries_logged, property)
    # The query log reads the text of a client-side cursor's last query from ``cursor._query``.
    assert "cursor._query.query" in inspect.getsource(operations.DatabaseOperations.last_executed_query)


# --- DRF field templates (scheduling/api/fields.py: FieldTemplates) -------------------------------


def test_drf_serializers_still_build_fields_through_get_fields_from_deep_copies():
    from rest_framework import serializers

    # ``fields`` binds what get_fields() gives (BindingDict); get_fields deep-copies every field
    assert "self.get_fields()" in inspect.getsource(serializers.Serializer.fields.func)
    assert "deepcopy" in inspect.getsource(serializers.Serializer.get_fields)
    assert _parameters(serializers.Field.bind) == ["self", "field_name", "parent"]
    field = serializers.CharField()
    assert not hasattr(type(field), "__slots__") and hasattr(field, "__dict__")  # copied by its __dict__


# --- the off switches -----------------------------------------------------------------------------

BODIES = [
    {"name": "ok", "kind": "batch", "command": ["true"], "gpus": 1},
    {"name": "", "kind": "nope", "command": "true", "gpus": -1, "extra": 1},
    {"name": "x" * 200, "kind": "training", "command": ["a\x00"], "gpus": 0.5, "priority": "3"},
]


@pytest.mark.parametrize("body", BODIES, ids=["valid", "bad-fields", "bad-values"])
def test_with_field_templates_off_a_submit_validates_exactly_as_with_them(settings, body):
    from scheduling.api.job_serializers import JobSubmitSerializer

    def validate() -> tuple[bool, object]:
        serializer = JobSubmitSerializer(data=body)
        ok = serializer.is_valid()
        return ok, json.loads(json.dumps(serializer.validated_data if ok else serializer.errors, default=str))

    with_templates = validate()
    settings.TESSERA = {**settings.TESSERA, "FIELD_TEMPLATES": False}
    assert validate() == with_templates


def test_with_field_templates_off_every_body_is_checked_by_a_serializer_of_its_own(settings):
    from scheduling.api.fields import kept
    from scheduling.api.job_serializers import JobSubmitSerializer

    assert kept(JobSubmitSerializer) is kept(JobSubmitSerializer)
    settings.TESSERA = {**settings.TESSERA, "FIELD_TEMPLATES": False}
    assert kept(JobSubmitSerializer) is not kept(JobSubmitSerializer)


def test_with_prepared_reads_off_reads_give_the_same_rows_through_the_orm(db, settings):
    from scheduling.services.snapshot import PreparedRead, read_together
    from tests.api.helpers import make_node

    for i in range(3):
        make_node(f"n{i}", "H100", 2)
    from scheduling.models import Node

    by_name = PreparedRead(
        lambda names: Node.objects.filter(name__in=names).order_by("name").values_list("name")
    )
    every = PreparedRead(lambda: Node.objects.order_by("name").values_list("name", "rack"))
    prepared = read_together((by_name, ["n2", "n0"]), (every,), (by_name, []))
    settings.TESSERA = {**settings.TESSERA, "PREPARED_READS": False}
    plain = read_together((by_name, ["n2", "n0"]), (every,), (by_name, []))
    assert [[tuple(r) for r in rows] for rows in plain] == [[tuple(r) for r in rows] for rows in prepared]
    assert plain[0] == [("n0",), ("n2",)] and plain[2] == []


SERVER_START = """
import gc, sys
import django
django.setup()
import daphne.http_protocol as protocol
from controlplane import asgi  # the web process's start-up: its workarounds applied (or not)
skipping = getattr(protocol.WebRequest, "tessera_no_form_parsing", False)
print(gc.get_threshold()[0], gc.get_freeze_count() > 0, skipping)
"""


@pytest.mark.parametrize("switch", ["on", "off"])
def test_the_web_process_tunes_gc_and_skips_form_parsing_unless_switched_off(switch):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TESSERA_", "PYTEST_", "DATABASE_", "REDIS_"))
    }
    env["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    env["TESSERA_PASS_LOOP"] = "0"
    if switch == "off":
        env.update(TESSERA_GC_TUNING="0", TESSERA_SKIP_FORM_PARSING="0")
    out = subprocess.run(
        [sys.executable, "-c", SERVER_START], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    from controlplane.gc_tuning import YOUNG_THRESHOLD

    if switch == "on":
        assert out == [str(YOUNG_THRESHOLD), "True", "True"]
    else:
        assert out[0] != str(YOUNG_THRESHOLD) and out[1:] == ["False", "False"]


def test_celerys_broker_outage_records_are_still_the_ones_the_worker_filter_recognises():
    """controlplane/celery_outage.py knows Celery's reconnection records by logger and message."""
    from celery import bootsteps
    from celery.worker.consumer import consumer

    from controlplane import celery_outage

    assert consumer.logger.name == celery_outage.CONSUMER_LOGGER
    assert bootsteps.logger.name == celery_outage.BOOTSTEPS_LOGGER
    assert consumer.CONNECTION_ERROR.startswith("consumer: Cannot connect to %s")
    lost = inspect.getsource(consumer.Consumer.on_connection_error_after_connected)
    assert "warn('%s (%r)', CONNECTION_RETRY, exc)" in lost
    assert celery_outage.CANCEL_NOTICE in consumer.CANCEL_TASKS_BY_DEFAULT
    assert "error(CONNECTION_ERROR," in inspect.getsource(consumer.Consumer.ensure_connected)

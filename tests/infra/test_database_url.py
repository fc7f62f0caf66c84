"""DATABASE_URL → Django's database settings (``controlplane/env.py``, parsed by dj-database-url).

What an operator relies on: a password with reserved characters works once percent-encoded as URLs
require; query options such as ``?sslmode=require`` reach psycopg; what the URL leaves out is
Tessera's documented default; a malformed URL stops the process with a message naming the
variable, not a traceback from deep in Django.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.env import ImproperlyConfiguredEnv, database_from_url

ROOT = Path(__file__).resolve().parents[2]


def test_a_percent_encoded_password_and_user_are_decoded():
    db = database_from_url("postgres://bob%40nlp:p%40ss%2Fw%3Ard%25@db.example:6543/tessera", "/srv")
    assert db["USER"] == "bob@nlp"
    assert db["PASSWORD"] == "p@ss/w:rd%"
    assert (db["HOST"], db["PORT"], db["NAME"]) == ("db.example", "6543", "tessera")


def test_query_options_reach_psycopg_in_options():
    db = database_from_url("postgresql://u:p@h/x?sslmode=require&connect_timeout=5", "/srv")
    assert db["OPTIONS"] == {"sslmode": "require", "connect_timeout": 5}
    assert db["ENGINE"] == "django.db.backends.postgresql"


def test_what_the_url_leaves_out_is_tesseras_default():
    db = database_from_url("postgres://db.example", "/srv")
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "postgres",
        "",
        "db.example",
        "5432",
        "tessera",
    )
    assert db["CONN_MAX_AGE"] == 0 and db["TEST"] == {"NAME": "test_tessera"}
    assert database_from_url("postgres:///alice_db", "/srv")["HOST"] == "127.0.0.1"


def test_the_test_database_is_named_after_the_database():
    assert database_from_url("postgres://postgres@127.0.0.1/tessera_ci", "/srv")["TEST"] == {
        "NAME": "test_tessera_ci"
    }


def test_sqlite_urls_name_an_absolute_file_and_no_url_the_embedded_one():
    assert database_from_url("sqlite:///tmp/a%20b.sqlite3", "/srv")["NAME"] == "/tmp/a b.sqlite3"
    embedded = database_from_url("", "/srv")
    assert embedded["NAME"] == os.path.join("/srv", "var", "tessera.sqlite3")
    assert embedded["OPTIONS"] == {"timeout": 20, "transaction_mode": "IMMEDIATE"}


def test_a_malformed_port_is_a_configuration_error_naming_the_variable():
    with pytest.raises(ImproperlyConfiguredEnv, match="DATABASE_URL"):
        database_from_url("postgres://u@h:notaport/x", "/srv")


def test_settings_keep_the_urls_options_beside_the_connection_pool():
    """The pool (on outside pytest) is added to OPTIONS; the URL's own options stay."""
    code = "from django.conf import settings; print(settings.DATABASES['default']['OPTIONS'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "PYTEST_"))}
    env.update(
        DATABASE_URL="postgres://u:p%40w@h/x?sslmode=require", DJANGO_SETTINGS_MODULE="controlplane.settings"
    )
    out = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "'sslmode': 'require'" in out and "'pool'" in out

"""The start every database benchmark here shares: Django on the PostgreSQL database that
``DATABASE_URL`` names, migrated and emptied (imported by the scripts beside it, which put this
checkout last on the path, after ``PYTHONPATH``: run with ``PYTHONPATH=OTHER``, a benchmark
measures that other checkout's code)."""

from __future__ import annotations

import os
import sys

import django


def fresh_postgres() -> bool:
    """Set Django up on ``DATABASE_URL``'s PostgreSQL database, migrate it and empty it; False,
    said on standard error, when ``DATABASE_URL`` names no PostgreSQL database."""
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print("DATABASE_URL must name a PostgreSQL database", file=sys.stderr)
        return False
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    return True

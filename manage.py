#!/usr/bin/env python
"""Django's command-line utility for Tessera."""

import os
import sys


def database_unreachable(exc: BaseException) -> str:
    """An operator's one line for a command that could not reach its database."""
    from django.conf import settings

    from controlplane.errors import first_line

    db = settings.DATABASES["default"]
    where = f"{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}"
    return f"{' '.join(sys.argv[:2])}: the database at {where} cannot be reached: {first_line(exc)}"


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.management import execute_from_command_line
    from django.db import InterfaceError, OperationalError

    try:
        execute_from_command_line(sys.argv)
    except (OperationalError, InterfaceError) as exc:
        # A database out of reach is the operator's to fix, not a bug: one line, not a
        # traceback (--traceback still shows it).
        if "--traceback" in sys.argv:
            raise
        sys.exit(database_unreachable(exc))


if __name__ == "__main__":
    main()

"""``manage.py create_join_token [--name N] [--expires-hours H]``: print a fresh agent join token.

Only the token's hash is stored; the token itself is printed once, on stdout alone (so a script
can capture it: ``TESSERA_JOIN_TOKEN=$(manage.py create_join_token)``).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from scheduling.services.agents import do_create_join_token


class Command(BaseCommand):
    help = "Create a join token with which node agents register (printed once; only its hash is kept)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", default="", help="a label for operators (max 64 characters)")
        parser.add_argument(
            "--expires-hours",
            type=float,
            default=None,
            help="hours until the token stops working (default: never; revoke it in the admin)",
        )

    def handle(self, *args, name: str, expires_hours: float | None, **options) -> None:
        if expires_hours is not None and not (0 < expires_hours <= 24 * 365 * 10):
            raise CommandError("--expires-hours must be a number of hours between 0 and 87600")
        if len(name) > 64:
            raise CommandError("--name must be at most 64 characters")
        token, raw = do_create_join_token(name, expires_hours)
        self.stdout.write(raw)
        when = f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "never expires"
        self.stderr.write(f"join token {token.pk} ({name or 'unnamed'}) {when}")

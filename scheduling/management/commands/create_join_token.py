"""``manage.py create_join_token [--name N] [--expires-hours H] [--max-nodes N] [--names PATTERNS]``:
print a fresh agent join token.

Only the token's hash is stored; the token itself is printed once, on stdout alone (so a script
can capture it: ``TESSERA_JOIN_TOKEN=$(manage.py create_join_token)``). By default it registers
one node (``--max-nodes 0``: any number) of any new name (``--names 'gpu-*,a100-0?'``: only those;
a token made for a name may also take over that name once its node has been silent past its lease
and fence margin — e.g. a reinstalled machine).
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
        parser.add_argument(
            "--max-nodes",
            type=int,
            default=1,
            help="how many nodes it may register (default 1: single use; 0: any number)",
        )
        parser.add_argument(
            "--names",
            default="",
            help="node names it may register: comma-separated patterns like 'gpu-*' (default: any new name)",
        )

    def handle(
        self, *args, name: str, expires_hours: float | None, max_nodes: int, names: str, **options
    ) -> None:
        if expires_hours is not None and not (0 < expires_hours <= 24 * 365 * 10):
            raise CommandError("--expires-hours must be a number of hours between 0 and 87600")
        if len(name) > 64:
            raise CommandError("--name must be at most 64 characters")
        if not 0 <= max_nodes <= 1_000_000:
            raise CommandError("--max-nodes must be 0 (any number) to 1000000")
        if len(names) > 256 or not names.isprintable():
            raise CommandError("--names must be at most 256 printable characters")
        if names and not any(p.strip() for p in names.split(",")):
            # An empty list of patterns is the token for *any* new name: not what was asked.
            raise CommandError(f"--names {names!r} holds no pattern (leave it out for any new name)")
        token, raw = do_create_join_token(name, expires_hours, max_nodes or None, names)
        self.stdout.write(raw)
        when = f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "never expires"
        count = f"{max_nodes} node(s)" if max_nodes else "any number of nodes"
        self.stderr.write(
            f"join token {token.pk} ({name or 'unnamed'}) {when}; {count}; names {names or 'any new'}"
        )

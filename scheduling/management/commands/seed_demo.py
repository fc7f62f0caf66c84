"""``manage.py seed_demo``: the demo cluster's tenants, quotas and users, and a join token.

Safe to run again: it converges on the same cluster, with fresh passwords, API tokens and join
token each time (printed, since only their hashes are stored). ``--credentials-file PATH`` writes
them to a file only its owner can read (0600) instead, for a process whose output is kept in a
log (docker-compose's ``web``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling.services.demo_seed import (
    DEMO_JOIN_TOKEN_NODES,
    do_mint_join_token,
    do_register_join_token,
    do_seed_demo_people,
    do_seed_simulated_nodes,
)


class Command(BaseCommand):
    help = "Seed the demo cluster: tenants vision and nlp with quotas; admin, alice, carol, bob."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
        parser.add_argument(
            "--nodes",
            type=int,
            default=0,
            metavar="N",
            help="also register N simulated 8-GPU nodes with no agent (sim-0001 …), e.g. 1000 for "
            "8,000 GPUs on the dashboard",
        )
        parser.add_argument(
            "--join-token-from-env",
            action="store_true",
            help="register $TESSERA_JOIN_TOKEN as the join token instead of minting a new one",
        )
        parser.add_argument(
            "--join-token-names",
            default="",
            metavar="PATTERNS",
            help="the node names the join token may register (e.g. 'agent-*'; a name it matches may "
            "also be taken over once its node is silent past its lease); empty: any new name",
        )
        parser.add_argument(
            "--join-token-nodes",
            type=int,
            default=DEMO_JOIN_TOKEN_NODES,
            metavar="N",
            help=f"how many nodes the join token may register (default {DEMO_JOIN_TOKEN_NODES})",
        )
        parser.add_argument(
            "--credentials-file",
            metavar="PATH",
            help="write the users' passwords and tokens to PATH (mode 0600, JSON) instead of printing them",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not 0 <= options["nodes"] <= 100_000:
            raise CommandError("--nodes: give a number from 0 to 100000")
        if not 1 <= options["join_token_nodes"] <= 100_000:
            raise CommandError("--join-token-nodes: give a number from 1 to 100000")
        names, count = options["join_token_names"], options["join_token_nodes"]
        if options["join_token_from_env"]:
            secret = os.environ.get("TESSERA_JOIN_TOKEN", "")
            if not secret.strip():
                raise CommandError("--join-token-from-env: TESSERA_JOIN_TOKEN is not set")
            seed = do_seed_demo_people()
            seed.join_token = do_register_join_token(secret, names, count)
        else:
            seed = do_seed_demo_people()
            seed.join_token = do_mint_join_token(count, names)
        added = do_seed_simulated_nodes(options["nodes"]) if options["nodes"] else 0
        if options["credentials_file"]:
            write_private(Path(options["credentials_file"]), json.dumps(seed.as_dict()))
            self.stdout.write(f"demo users' credentials written to {options['credentials_file']} (mode 0600)")
            return
        if options["json"]:
            self.stdout.write(json.dumps(seed.as_dict()))
            return
        for tenant, rows in seed.quotas.items():
            quota = ", ".join(f"{m} {g:g}/{lim:g}" for m, (g, lim) in rows.items())
            self.stdout.write(f"tenant {tenant}: quotas (guaranteed/limit) {quota}")
        for u in seed.users:
            role = "operator" if u.operator else f"tenant {u.tenant}"
            self.stdout.write(f"user {u.username:6} ({role}): password {u.password}  token {u.token}")
        if options["join_token_from_env"]:
            # The deployer chose it and has it; logs (docker-compose logs) need not repeat it.
            self.stdout.write("join token: the one in $TESSERA_JOIN_TOKEN")
        else:
            self.stdout.write(f"join token: {seed.join_token}")
        if options["nodes"]:
            self.stdout.write(f"simulated nodes: {added} added ({options['nodes']} asked for, 8 GPUs each)")


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, readable by its owner only (0600, even if the file existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)

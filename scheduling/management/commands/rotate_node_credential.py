"""``manage.py rotate_node_credential NODE [--credential-file PATH]``: give a node a new credential.

The old credential is refused from then on, the node's agent stream closed, the rotation recorded
in the audit log (``scheduling.services.node_credentials``). Without ``--credential-file`` a fresh
credential is made and printed once, on stdout alone; with it, the credential in that file (made
on the node and already written to the agent's ``STATE/credential``, so that the agent, refused,
switches to it and keeps its jobs: docs/operations.md, "Rotating a node's credential") is
stored, and nothing is printed.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from scheduling.models import Node
from scheduling.services.node_credentials import BadCredential, do_rotate_node_credential


class Command(BaseCommand):
    help = "Give a node a new agent credential; the old one is refused from then on."

    def add_arguments(self, parser) -> None:
        parser.add_argument("node", help="the node's name")
        parser.add_argument(
            "--credential-file",
            default=None,
            help="store the credential in this file (default: make a fresh one and print it)",
        )

    def handle(self, *args, node: str, credential_file: str | None, **options) -> None:
        target = Node.objects.filter(name=node).first()
        if target is None:
            raise CommandError(f"no node named {node!r}")
        given = None
        if credential_file is not None:
            try:
                with open(credential_file, encoding="ascii") as f:
                    given = f.read().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"--credential-file {credential_file}: {exc}") from None
        try:
            credential = do_rotate_node_credential(
                target, by="manage.py rotate_node_credential", credential=given
            )
        except BadCredential as exc:
            raise CommandError(f"--credential-file {credential_file}: {exc}") from None
        if given is None:
            self.stdout.write(credential)
        self.stderr.write(
            f"node {target.name}: new credential stored; the old one is refused from now on "
            "(write the new one to the agent's STATE/credential if it is not there yet)"
        )

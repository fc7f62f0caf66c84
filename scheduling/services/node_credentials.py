"""An operator rotates a node's credential without the agent registering again.

Registering again (an agent's restart) settles the node's running replicas as lost; a rotation
keeps them. It stores the new credential's hash in the node's row, so the old credential is
refused from then on (in the web process that saved it at once; in the others within
``agent_auth.CACHE_S``), records ``node.credential.rotate`` in the audit log, and after commit
sends the node's stream a wake that looks the credential up again, bypassing the cache: a stream
still holding the old one is closed (4401). The agent picks the new credential up from its
``STATE/credential`` file when the server refuses the old one (``agent/node.py``), so no job
stops when the file holds the new credential before the rotation (docs/operations.md, "Rotating
a node's credential").
"""

from __future__ import annotations

import re
from typing import Any

from django.db import transaction

from scheduling.models import Node, hash_secret, new_secret
from scheduling.services import audit, live

# What an agent can send in ``Authorization: Node <credential>`` and keep in its file: one token
# of URL-safe characters (new_secret's are 43), long enough to be unguessable.
_CREDENTIAL = re.compile(r"[A-Za-z0-9_\-.~+/=]{32,128}")


class BadCredential(ValueError):
    pass


def check_credential(credential: str) -> None:
    if not _CREDENTIAL.fullmatch(credential):
        raise BadCredential(
            "a node credential is 32 to 128 characters of A-Z a-z 0-9 and _-.~+/= "
            "(python -c 'import secrets; print(secrets.token_urlsafe(32))' makes one)"
        )
    if Node.objects.filter(credential_hash=hash_secret(credential)).exists():
        raise BadCredential("that credential is already a node's: make a new one")


def do_rotate_node_credential(node: Node, *, by: Any = None, credential: str | None = None) -> str:
    """Give ``node`` a new credential (``credential``, or a fresh one); returns it."""
    credential = credential or new_secret()
    check_credential(credential)
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        had = bool(locked.credential_hash)
        locked.credential_hash = hash_secret(credential)
        locked.save(update_fields=["credential_hash"])
        audit.record(
            "node.credential.rotate",
            locked,
            by=by,
            before={"had_credential": had},
            after={"had_credential": True},
        )
        live.recheck_agent(locked.pk)
    return credential

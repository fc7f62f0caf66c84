"""People's API tokens: made (the key shown once), looked up by key, revoked.

A key is ``tsr_`` and 40 random URL-safe characters. The database keeps its first
``ApiToken.PREFIX_LENGTH`` characters and its SHA-256; a key is found by its prefix and then
compared by hash in constant time (``hmac.compare_digest``), so neither the key nor anything that
would let one be recomputed is stored.
"""

from __future__ import annotations

import hmac
import secrets
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from scheduling.models import ApiToken, hash_secret
from scheduling.services import audit

KEY_PREFIX = "tsr_"
MAX_NAME = 64
# ``last_used_at`` is written at most this often per token (it is read, not a log of every call).
TOUCH_EVERY = timedelta(seconds=60)


class TokenNameTaken(Exception):
    """The user already has a token of that name."""


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(30)


def _audited(token: ApiToken) -> dict[str, Any]:
    return {"user": token.user.get_username(), "name": token.name, "prefix": token.prefix}


def do_create_api_token(user, name: str, by: Any = None) -> tuple[ApiToken, str]:
    """A new token for ``user`` (made by ``by``, default the user): returns the row (holding only
    prefix and hash) and the key."""
    key = new_key()
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                user=user,
                name=name[:MAX_NAME],
                prefix=key[: ApiToken.PREFIX_LENGTH],
                key_hash=hash_secret(key),
            )
            audit.record("api_token.create", token, by=by or user, after=_audited(token))
    except IntegrityError:
        raise TokenNameTaken(name) from None
    return token, key


def do_revoke_api_token(token: ApiToken, by: Any = None) -> None:
    """The key stops working at once in this process, within seconds in the others."""
    with transaction.atomic():
        audit.record("api_token.revoke", token, by=by, before=_audited(token))
        token.delete()


def token_for_key(key: str) -> ApiToken | None:
    """The token whose key is ``key`` (with its user, membership and tenant), or None."""
    if not key or len(key) > 256:
        return None
    digest = hash_secret(key)
    candidates = ApiToken.objects.select_related("user__membership__tenant").filter(
        prefix=key[: ApiToken.PREFIX_LENGTH]
    )
    found = None
    for token in candidates:
        if hmac.compare_digest(token.key_hash, digest):
            found = token
    return found


def do_touch(token: ApiToken) -> None:
    """Record that ``token`` was used, unless that was recorded less than ``TOUCH_EVERY`` ago."""
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= TOUCH_EVERY:
        # update(), not save(): no signal, so the token caches stay as they are.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now

"""People's API tokens: DRF's ``Authorization: Token <key>``, reading the user's tenant with it.

Every API request needs the caller's tenant (scoping, submits), so the token, its user and the
user's membership and tenant come in one query instead of three, and that answer is kept in the
process for ``CACHE_S`` seconds: a script submitting many jobs pays the query once, not per
request (it was ~8% of a web process's CPU under ``make bench-e2e``). A change to a token, a user,
a membership or a tenant empties this process's cache at once; in other web processes it takes
effect within ``CACHE_S`` (a deleted token or a deactivated user is refused by then).
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth.models import User
from django.db.models.signals import post_delete, post_save
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

from scheduling.models import Membership, Tenant

CACHE_S = 5.0
MAX_ENTRIES = 10_000

_cache: dict[str, tuple[float, Any, Any]] = {}  # key -> (expires, user, token)


def forget_tokens(**_: Any) -> None:
    _cache.clear()


for _model in (Token, User, Membership, Tenant):
    post_save.connect(
        forget_tokens, sender=_model, dispatch_uid=f"tessera-token-cache-save-{_model.__name__}"
    )
    post_delete.connect(
        forget_tokens, sender=_model, dispatch_uid=f"tessera-token-cache-del-{_model.__name__}"
    )


class TokenAuthentication(authentication.TokenAuthentication):
    def authenticate_credentials(self, key: str):
        now = time.monotonic()
        hit = _cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        model = self.get_model()
        try:
            token = model.objects.select_related("user__membership__tenant").get(key=key)
        except model.DoesNotExist:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        if len(_cache) >= MAX_ENTRIES:
            _cache.clear()
        _cache[key] = (now + CACHE_S, token.user, token)
        return token.user, token

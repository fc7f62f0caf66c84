"""People's API tokens: ``Authorization: Token <key>`` (DRF's scheme), reading the user's tenant with it.

The key is looked up by its prefix and hash (``scheduling.services.tokens``): the database holds
no key.

Every API request needs the caller's tenant (scoping, submits), so the token, its user and the
user's membership and tenant come in one query instead of three, and that answer is kept in the
process for ``CACHE_S`` seconds: a script submitting many jobs pays the query once, not per
request (a measurable share of a web process's CPU: docs/benchmarks/requests.md). A change to a
token, a user,
a membership or a tenant empties this process's cache at once; in other web processes it takes
effect within ``CACHE_S`` (a deleted token or a deactivated user is refused by then).
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models.signals import post_delete, post_save
from rest_framework import authentication, exceptions

from scheduling.api.process_cache import ProcessCache
from scheduling.models import ApiToken, Membership, Tenant, hash_secret
from scheduling.services.tokens import do_touch, token_for_key

CACHE_S = 5.0
_cache = ProcessCache(CACHE_S)  # SHA-256 of the key -> (user, token): no key kept in memory either

for _model in (ApiToken, User, Membership, Tenant):
    post_save.connect(
        _cache.forget, sender=_model, dispatch_uid=f"tessera-token-cache-save-{_model.__name__}"
    )
    post_delete.connect(
        _cache.forget, sender=_model, dispatch_uid=f"tessera-token-cache-del-{_model.__name__}"
    )


class TokenAuthentication(authentication.TokenAuthentication):
    def authenticate_credentials(self, key: str):
        digest = hash_secret(key)
        hit = _cache.get(digest)
        if hit is not None:
            return hit
        token = token_for_key(key)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        do_touch(token)
        _cache.put(digest, (token.user, token))
        return token.user, token

"""People's API tokens: DRF's ``Authorization: Token <key>``, reading the user's tenant with it.

Every API request needs the caller's tenant (scoping, submits), so the token, its user and the
user's membership and tenant come in one query instead of three.
"""

from __future__ import annotations

from rest_framework import authentication, exceptions


class TokenAuthentication(authentication.TokenAuthentication):
    def authenticate_credentials(self, key: str):
        model = self.get_model()
        try:
            token = model.objects.select_related("user__membership__tenant").get(key=key)
        except model.DoesNotExist:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        return (token.user, token)

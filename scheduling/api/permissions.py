"""Who may do what: operators (staff) for writes to shared settings; everyone else reads scoped data.

Reads are scoped by the models' ``visible_to`` querysets (the one place tenant scoping lives); the
classes here only decide whether an action is open to a non-operator at all (403 if not).
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from scheduling.models import Membership, Tenant


def is_operator(user) -> bool:
    return bool(getattr(user, "is_authenticated", False) and user.is_staff)


def tenant_of(user) -> Tenant | None:
    """The user's tenant (None for operators and for users who belong to none)."""
    try:
        return user.membership.tenant
    except Membership.DoesNotExist:
        return None


class OperatorWritesOnly(BasePermission):
    """Reads for every authenticated user; writes for operators only."""

    message = "Only operators may do this."

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or is_operator(request.user)

"""The audit log's one write path: who did what to which object, with its values before and after.

Every operator and security-relevant action records one entry here, in the transaction that makes
the change (so a change that rolls back leaves no entry): quotas, API tokens, join tokens, node
registrations, cordons, cancels of another user's job. ``by`` is a person (``User``), a node (an
agent's registration), or None for the system. Entries are never changed or deleted by the
application; operators read them in the API (``/api/v1/audit/``) and the admin.

Changes made where no service is called with the person acting (users and tenant memberships,
edited in the admin's own forms or from a shell: ``scheduling.services.user_audit``'s signals)
name the person whose request is being served: ``controlplane.audit_actor``'s middleware keeps the
request in a context variable for the request's duration (:func:`acting_user`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from scheduling.models import AuditEntry, JoinToken, Node

_request: ContextVar[Any] = ContextVar("tessera_audit_request", default=None)


@contextmanager
def acting_for(request: Any) -> Iterator[None]:
    """While it lasts, :func:`acting_user` is ``request``'s user (the middleware's context)."""
    token = _request.set(request)
    try:
        yield
    finally:
        _request.reset(token)


def acting_user() -> Any:
    """The signed-in user of the request being served, or None (a shell, a task, an anonymous
    request). Read when a change is recorded, not when the request arrived: the API authenticates
    in the view (DRF sets the Django request's ``user`` then), after the middleware has run."""
    user = getattr(_request.get(), "user", None)
    return user if getattr(user, "is_authenticated", False) else None


def actor_of(by: Any) -> tuple[Any, str]:
    """(the user or None, the words for who acted)."""
    if by is None:
        return None, "system"
    if isinstance(by, Node):
        return None, f"node {by.name}"
    if isinstance(by, JoinToken):
        return None, f"join token {by.pk} ({by.name or 'unnamed'})"
    if getattr(by, "is_authenticated", False) and getattr(by, "pk", None) is not None:
        return by, f"user {by.get_username()}"
    node = getattr(by, "node", None)  # an agent's principal
    if isinstance(node, Node):
        return None, f"node {node.name}"
    return None, str(by)[:150]


def record(
    action: str,
    obj: Any = None,
    *,
    by: Any = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    object_type: str = "",
    object_id: Any = "",
    object_repr: str = "",
    note: str = "",
) -> AuditEntry:
    """One entry: ``action`` (``quota.update``, ``node.cordon``, …) on ``obj`` by ``by``.

    ``before``/``after``: the fields that matter, as JSON (None for a creation's before and a
    deletion's after). Call it inside the change's transaction."""
    user, actor = actor_of(by)
    if obj is not None:
        object_type = object_type or obj._meta.model_name
        object_id = object_id or obj.pk
        object_repr = object_repr or str(obj)
    return AuditEntry.objects.create(
        actor_user=user,
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=str(object_id or ""),
        object_repr=object_repr[:200],
        before=before,
        after=after,
        note=note[:256],
    )


def fields_of(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """``obj``'s ``names`` as JSON values (dates as ISO text)."""
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(obj, name)
        out[name] = value.isoformat() if hasattr(value, "isoformat") else value
    return out

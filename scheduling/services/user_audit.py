"""People in the audit log: users made, changed (active, staff, superuser, name, password) and
deleted, and their tenant memberships, with who did it and the values before and after.

Users and memberships are edited by Django's own admin forms (and ``createsuperuser``, a shell, the
demo's seed), which call no service of ours, so these are signal receivers (CONVENTIONS.md 3:
signals for audit only), connected in ``SchedulingConfig.ready``. Who acted is the signed-in user
of the request being served (:func:`scheduling.services.audit.acting_user`), else the system.

A membership change is recorded on its user (``object_type`` ``user``), so one user's history reads
in one place: ``user.tenant`` with ``{"tenant": old}`` → ``{"tenant": new}`` (None: no tenant).
Saves that touch none of these fields (``last_login`` at each sign-in) read nothing and record
nothing. A password is never recorded, only that it changed.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save, pre_save

from scheduling.models import Membership
from scheduling.services import audit

USER_FIELDS = ("username", "is_active", "is_staff", "is_superuser")
_WATCHED = frozenset((*USER_FIELDS, "password"))
_BEFORE = "_tessera_audit_before"  # the stored values, kept on the instance from pre- to post-save


def _user_values(user: Any) -> dict[str, Any]:
    return {name: getattr(user, name) for name in USER_FIELDS}


def _user_before_save(
    sender: Any, instance: Any, raw: bool = False, update_fields: Any = None, **_: Any
) -> None:
    stored = None
    if not raw and instance.pk is not None and (update_fields is None or _WATCHED & set(update_fields)):
        stored = sender.objects.filter(pk=instance.pk).values(*_WATCHED).first()
    setattr(instance, _BEFORE, stored)


def _user_saved(sender: Any, instance: Any, created: bool, raw: bool = False, **_: Any) -> None:
    if raw:
        return
    if created:
        audit.record("user.create", instance, by=audit.acting_user(), after=_user_values(instance))
        return
    stored = getattr(instance, _BEFORE, None)
    if stored is None:
        return
    now = _user_values(instance)
    changed = [name for name in USER_FIELDS if stored[name] != now[name]]
    password_changed = stored["password"] != instance.password
    if changed or password_changed:
        audit.record(
            "user.update",
            instance,
            by=audit.acting_user(),
            before={name: stored[name] for name in changed},
            after={name: now[name] for name in changed},
            note="password changed" if password_changed else "",
        )


def _acting_on(user_id: int) -> Any:
    """Who acts on the user ``user_id``; as words alone when it is that user (a deletion of
    oneself: an entry referring to the deleted row could not be committed)."""
    by = audit.acting_user()
    return f"user {by.get_username()}" if by is not None and by.pk == user_id else by


def _user_deleted(sender: Any, instance: Any, **_: Any) -> None:
    audit.record("user.delete", instance, by=_acting_on(instance.pk), before=_user_values(instance))


def _membership_before_save(sender: Any, instance: Membership, raw: bool = False, **_: Any) -> None:
    stored = None
    if not raw and instance.pk is not None:
        stored = Membership.objects.filter(pk=instance.pk).values_list("tenant__name", flat=True).first()
    setattr(instance, _BEFORE, stored)


def _record_tenant(membership: Membership, before: str | None, after: str | None) -> None:
    audit.record(
        "user.tenant",
        membership.user,
        by=_acting_on(membership.user_id),
        before={"tenant": before},
        after={"tenant": after},
        object_type="user",
    )


def _membership_saved(sender: Any, instance: Membership, created: bool, raw: bool = False, **_: Any) -> None:
    if raw:
        return
    before = getattr(instance, _BEFORE, None)
    if created or before != instance.tenant.name:
        _record_tenant(instance, before, instance.tenant.name)


def _membership_deleted(sender: Any, instance: Membership, **_: Any) -> None:
    _record_tenant(instance, instance.tenant.name, None)


def connect() -> None:
    """Connect the receivers (once: each has a ``dispatch_uid``)."""
    user_model = get_user_model()
    pre_save.connect(_user_before_save, sender=user_model, dispatch_uid="tessera-audit-user-pre")
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="tessera-audit-user-save")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid="tessera-audit-user-delete")
    pre_save.connect(_membership_before_save, sender=Membership, dispatch_uid="tessera-audit-member-pre")
    post_save.connect(_membership_saved, sender=Membership, dispatch_uid="tessera-audit-member-save")
    post_delete.connect(_membership_deleted, sender=Membership, dispatch_uid="tessera-audit-member-delete")

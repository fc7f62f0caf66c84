"""The portal's template filters."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def without_code(reason: str | None, code: str | None) -> str:
    """A pending reason shown after its code: the scheduler's sentence mostly begins with the code
    already ("quota: vision uses …"), which is then left out so the code is said once."""
    text = reason or ""
    prefix = f"{code}:" if code else None
    return text[len(prefix) :].lstrip() if prefix and text.startswith(prefix) else text

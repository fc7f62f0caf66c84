"""Authentication for node agents, kept apart from people's.

An agent authenticates with ``Authorization: Node <credential>``: the per-node credential it got at
registration (only its hash is stored, in ``Node.credential_hash``). This class is listed ONLY on
the agent views (``scheduling/api/agents.py``); user endpoints keep the project defaults (Token and
Session authentication, ``IsAuthenticated``), which do not recognise the ``Node`` keyword, so an
agent's credential there answers 401. Conversely, the principal set here is not a ``User`` and the
agent views demand it, so a user's token cannot call them.

Registration authenticates with ``Authorization: Join <join token>`` (made by
``manage.py create_join_token``), or with the node's current credential when a node re-registers.

A credential's node is kept in the process for ``CACHE_S`` seconds, as people's tokens are
(``user_auth.py``): every agent request (a wait, an exit report) would otherwise read it. A node
saved (re-registered with a new credential, deleted) empties this process's cache at once; in
other web processes the old credential keeps working for at most ``CACHE_S`` more seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import F, Q
from django.db.models.signals import post_delete, post_save
from django.utils import timezone
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission

from scheduling.api.process_cache import ProcessCache
from scheduling.models import JoinToken, Node, hash_secret
from scheduling.services.snapshot import PreparedRead

NODE_KEYWORD = "Node"
JOIN_KEYWORD = "Join"


@dataclass
class NodePrincipal:
    """``request.user`` for an agent: a node, never a person (no tenant, not staff)."""

    node: Node
    is_authenticated: bool = True
    is_active: bool = True
    is_staff: bool = False
    is_superuser: bool = False
    is_anonymous: bool = False

    @property
    def pk(self) -> None:  # not a User: anything that looks a user up by pk finds nothing
        return None

    def __str__(self) -> str:
        return f"node {self.node.name}"


@dataclass
class JoinPrincipal:
    """``request.user`` while registering with a join token."""

    token: JoinToken
    is_authenticated: bool = True
    is_active: bool = True
    is_staff: bool = False
    is_superuser: bool = False
    is_anonymous: bool = False

    @property
    def pk(self) -> None:
        return None


def _secret_after(request, keyword: str) -> str | None:
    """The secret after ``keyword`` in the Authorization header, None if another scheme is used."""
    parts = get_authorization_header(request).split()
    if not parts or parts[0].lower() != keyword.lower().encode():
        return None
    if len(parts) != 2:
        raise AuthenticationFailed(f"Malformed {keyword} header: expected '{keyword} <secret>'.")
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise AuthenticationFailed("Invalid credential.") from None


_NODE_COLUMNS = tuple(f.attname for f in Node._meta.concrete_fields)
# Every agent request looks its node up: the SQL is built once (see PreparedRead).
_NODE_BY_CREDENTIAL = PreparedRead(
    lambda hashes: Node.objects.filter(credential_hash__in=hashes).order_by().values_list(*_NODE_COLUMNS)
)


CACHE_S = 5.0
_cache = ProcessCache(CACHE_S)  # credential hash -> node
post_save.connect(_cache.forget, sender=Node, dispatch_uid="tessera-node-credential-save")
post_delete.connect(_cache.forget, sender=Node, dispatch_uid="tessera-node-credential-delete")


def forget_cached_nodes() -> None:
    """Look every credential up again from now on (a rotation made in another process)."""
    _cache.forget()


def cached_node(secret: str) -> Node | None:
    """The credential's node if this process looked it up less than ``CACHE_S`` ago (no query)."""
    return _cache.get(hash_secret(secret))


def node_for_credential(secret: str) -> Node | None:
    digest = hash_secret(secret)
    node = _cache.get(digest)
    if node is not None:
        return node
    rows = _NODE_BY_CREDENTIAL.rows([digest])
    if not rows:
        return None
    node = Node.from_db("default", _NODE_COLUMNS, rows[0])
    _cache.put(digest, node)
    return node


def valid_join_token(secret: str) -> JoinToken | None:
    now = timezone.now()
    return (
        JoinToken.objects.filter(token_hash=hash_secret(secret), revoked=False)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .filter(Q(max_nodes__isnull=True) | Q(registrations__lt=F("max_nodes")))
        .first()
    )


class NodeCredentialAuthentication(BaseAuthentication):
    """``Authorization: Node <credential>`` → a :class:`NodePrincipal`."""

    def authenticate(self, request):
        secret = _secret_after(request, NODE_KEYWORD)
        if secret is None:
            return None
        node = node_for_credential(secret)
        if node is None:
            raise AuthenticationFailed("Invalid node credential.")
        return NodePrincipal(node), node

    def authenticate_header(self, request) -> str:
        return NODE_KEYWORD


class JoinTokenAuthentication(BaseAuthentication):
    """``Authorization: Join <token>`` → a :class:`JoinPrincipal` (registration only)."""

    def authenticate(self, request):
        secret = _secret_after(request, JOIN_KEYWORD)
        if secret is None:
            return None
        token = valid_join_token(secret)
        if token is None:
            raise AuthenticationFailed("Invalid, expired, revoked or used-up join token.")
        return JoinPrincipal(token), token

    def authenticate_header(self, request) -> str:
        return JOIN_KEYWORD


class IsNode(BasePermission):
    """Only an authenticated node agent."""

    message = "Only a node agent may call this endpoint."

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, NodePrincipal)


class IsNodeOrJoin(BasePermission):
    """A join token holder, or a node re-registering itself."""

    message = "A join token or the node's own credential is required."

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, NodePrincipal | JoinPrincipal)

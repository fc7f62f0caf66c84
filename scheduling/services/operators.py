"""Operators' actions from the admin console: cordon and uncordon nodes, set a node's price, revoke
join tokens.

A cordoned node keeps its running jobs but takes no new ones (the snapshot marks it unschedulable);
uncordoning it asks for a scheduling pass, since pending jobs may now fit.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models import F

from scheduling.choices import NodeState
from scheduling.models import JoinToken, Node
from scheduling.services import live
from scheduling.services.triggers import request_pass_on_commit


def do_cordon_nodes(node_ids: Iterable[int]) -> int:
    """Stop placing new work on these nodes (those ready or not-ready). Returns how many changed."""
    node_ids = list(node_ids)
    with transaction.atomic():
        changed = Node.objects.filter(
            pk__in=node_ids, state__in=[NodeState.READY, NodeState.NOT_READY]
        ).update(state=NodeState.CORDONED, version=F("version") + 1)
        live.publish_nodes(pk__in=node_ids)
    return changed


def do_uncordon_nodes(node_ids: Iterable[int]) -> int:
    """Make cordoned nodes schedulable again. Returns how many changed."""
    node_ids = list(node_ids)
    with transaction.atomic():
        # Uncordoning approves a node held for an operator (new, or its GPUs changed).
        changed = Node.objects.filter(pk__in=node_ids, state=NodeState.CORDONED).update(
            state=NodeState.READY, held_reason="", version=F("version") + 1
        )
        if changed:
            request_pass_on_commit()
            live.publish_nodes(pk__in=node_ids)
    return changed


def do_revoke_join_tokens(token_ids: Iterable[int]) -> int:
    """Revoked tokens register no more agents (nodes already registered keep their credentials)."""
    return JoinToken.objects.filter(pk__in=list(token_ids), revoked=False).update(revoked=True)


def do_set_node_price(node: Node, price_per_gpu_hour: float) -> None:
    """Set what a GPU-hour on ``node`` costs (α weighs it in placement, from the next pass)."""
    if not price_per_gpu_hour >= 0:
        raise ValueError("price_per_gpu_hour must be a number >= 0")
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(price_per_gpu_hour=price_per_gpu_hour)
        live.publish_nodes(pk__in=[node.pk])

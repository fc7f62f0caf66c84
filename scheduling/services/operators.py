"""Operators' actions from the admin console: cordon and uncordon nodes, set a node's price, revoke
join tokens.

A cordoned node keeps its running jobs but takes no new ones (the snapshot marks it unschedulable);
uncordoning it asks for a scheduling pass, since pending jobs may now fit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import F

from scheduling.choices import NodeState
from scheduling.models import JoinToken, Node
from scheduling.services import audit, live
from scheduling.services.triggers import request_pass_on_commit


def _change_states(node_ids: list[int], from_states: list[str], action: str, by: Any, **to: Any) -> int:
    """Move the nodes in ``from_states`` to ``to`` (locked, so the audit log's before is exact),
    one audit entry per node changed. Returns how many changed."""
    nodes = list(
        Node.objects.select_for_update().filter(pk__in=node_ids, state__in=from_states).order_by("pk")
    )
    for node in nodes:
        before = {"state": node.state, "held_reason": node.held_reason}
        after = {"state": to["state"], "held_reason": to.get("held_reason", node.held_reason)}
        audit.record(action, node, by=by, before=before, after=after)
    return Node.objects.filter(pk__in=[n.pk for n in nodes]).update(**to, version=F("version") + 1)


def do_cordon_nodes(node_ids: Iterable[int], by: Any = None) -> int:
    """Stop placing new work on these nodes (those ready or not-ready). Returns how many changed."""
    node_ids = list(node_ids)
    with transaction.atomic():
        changed = _change_states(
            node_ids, [NodeState.READY, NodeState.NOT_READY], "node.cordon", by, state=NodeState.CORDONED
        )
        live.publish_nodes(pk__in=node_ids)
    return changed


def do_uncordon_nodes(node_ids: Iterable[int], by: Any = None) -> int:
    """Make cordoned nodes schedulable again. Returns how many changed."""
    node_ids = list(node_ids)
    with transaction.atomic():
        # Uncordoning approves a node held for an operator (new, or its GPUs changed).
        changed = _change_states(
            node_ids, [NodeState.CORDONED], "node.uncordon", by, state=NodeState.READY, held_reason=""
        )
        if changed:
            request_pass_on_commit()
            live.publish_nodes(pk__in=node_ids)
    return changed


def do_revoke_join_tokens(token_ids: Iterable[int], by: Any = None) -> int:
    """Revoked tokens register no more agents (nodes already registered keep their credentials)."""
    with transaction.atomic():
        tokens = list(JoinToken.objects.select_for_update().filter(pk__in=list(token_ids), revoked=False))
        for token in tokens:
            audit.record(
                "join_token.revoke", token, by=by, before={"revoked": False}, after={"revoked": True}
            )
        return JoinToken.objects.filter(pk__in=[t.pk for t in tokens]).update(revoked=True)


# The most a GPU-hour may cost, as the agents' registration accepts it (scheduling/api/agents.py).
MAX_PRICE_PER_GPU_HOUR = 1e6


def do_set_node_price(node: Node, price_per_gpu_hour: float, by: Any = None) -> None:
    """Set what a GPU-hour on ``node`` costs (α weighs it in placement, from the next pass)."""
    if not 0 <= price_per_gpu_hour <= MAX_PRICE_PER_GPU_HOUR:
        raise ValueError(f"price_per_gpu_hour must be a number from 0 to {MAX_PRICE_PER_GPU_HOUR:g}")
    with transaction.atomic():
        stored = Node.objects.select_for_update().get(pk=node.pk)
        if stored.price_per_gpu_hour != price_per_gpu_hour:
            audit.record(
                "node.price",
                stored,
                by=by,
                before={"price_per_gpu_hour": stored.price_per_gpu_hour},
                after={"price_per_gpu_hour": price_per_gpu_hour},
            )
        Node.objects.filter(pk=node.pk).update(price_per_gpu_hour=price_per_gpu_hour)
        live.publish_nodes(pk__in=[node.pk])

"""Where a job's last checkpoint is, and whether the nodes of its next attempt can reach it.

Each agent registers its checkpoint root (``Node.checkpoint_root``): the identifier of a root it
shares with other nodes (``--checkpoint-root``, named by ``--checkpoint-root-name`` or else by its
path), or empty: node-local (``STATE/checkpoints`` on its own disk; an agent that does not say is
node-local). A checkpoint report records on the job the reporting node and its root
(``Job.checkpoint_place``: every node that reported one in that attempt, and the newest line). A
node reaches the checkpoint when it registered the same shared root as one of those nodes, or is
one of them and is node-local as it was then.

When the pass binds a job that has reported a checkpoint, its ``scheduled`` event says which
(:func:`binding_note`): ``resumes from its last checkpoint (step 40, at …): on …``, or
``starts from the beginning: its last checkpoint (…) is on node a's local disk, not reachable
from b``. Only the job decides what it loads; this is what its checkpoint directory will hold.
A start from the beginning loses the work the checkpoint had kept: the lost-work metric and
``sim check`` (through ``export_trace``'s ``start`` reason) count it (:data:`FRESH`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from scheduling.sim.traces import START_FROM_SCRATCH

# How a binding's reason begins when its checkpoint is out of reach (the trace format's word).
FRESH = START_FROM_SCRATCH
RESUMES = "resumes from its last checkpoint"
# A preempted job's ``requeued`` reason: where it resumes is known only once it is bound again.
REQUEUED_WITH_CHECKPOINT = "from its last checkpoint if its next nodes can reach it, else from the start"
REQUEUED_WITHOUT = "from the start: no checkpoint reported"
REASON_CHARS = 256  # JobEvent.reason
NAMED_NODES = 3  # nodes named in a reason; the rest counted


def recorded(
    place: dict[str, Any] | None, attempt: int, node: str, root: str, line: str | None
) -> dict[str, Any]:
    """``place`` after a checkpoint report of ``attempt`` from ``node`` (whose root is ``root``)
    with marker ``line`` (None: an older one than the last, whose line stays): a new attempt's
    first report replaces what an earlier one left."""
    same = place is not None and place.get("attempt") == attempt
    nodes = dict(place["nodes"]) if place is not None and same else {}
    nodes[node] = root
    kept = place.get("line", "") if place is not None and same else ""
    return {"attempt": attempt, "line": kept if line is None else line, "nodes": nodes}


def reaches(place: dict[str, Any], node: str, root: str) -> bool:
    """Whether ``node``, registered with checkpoint root ``root`` ("" node-local), sees the
    checkpoint ``place`` records."""
    return any(
        (r and r == root) or (not r and not root and name == node) for name, r in place["nodes"].items()
    )


def binding_note(at: datetime | None, place: dict[str, Any] | None, bound: Iterable[tuple[str, str]]) -> str:
    """The reason of the ``scheduled`` event of a job whose last checkpoint (at ``at``, where
    ``place`` says) is or is not reachable from the nodes it is bound to now (``bound``: name,
    checkpoint root); "" when it has reported none, or none with its place."""
    if at is None or not place or not place.get("nodes"):
        return ""
    nodes = {name: root for name, root in bound}
    missing = sorted(name for name, root in nodes.items() if not reaches(place, name, root))
    line = place.get("line") or ""
    what = f"{line + ', ' if line else ''}at {at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    where = _where(place)
    if not missing:
        note = f"{RESUMES} ({what}): on {where}"
    elif len(missing) == len(nodes):
        note = f"{FRESH}: its last checkpoint ({what}) is on {where}, not reachable from {_names(missing)}"
    else:
        reaching = sorted(set(nodes) - set(missing))
        note = (
            f"{RESUMES} ({what}) on {_names(reaching)} only: it is on {where}, "
            f"not reachable from {_names(missing)}"
        )
    return note[:REASON_CHARS]


def _where(place: dict[str, Any]) -> str:
    roots = sorted({root for root in place["nodes"].values() if root})
    local = sorted(name for name, root in place["nodes"].items() if not root)
    parts = [f"checkpoint root '{root}'" for root in roots]
    if len(local) == 1:
        parts.append(f"node {local[0]}'s local disk")
    elif local:
        parts.append(f"the local disks of {_names(local)}")
    return " and ".join(parts)


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMED_NODES])
    return shown if len(names) <= NAMED_NODES else f"{shown} and {len(names) - NAMED_NODES} more"

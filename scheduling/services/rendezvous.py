"""Where a job's replicas meet (PyTorch's ``env://`` rendezvous): each binding's ``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``, from the job's placements.

- ``RANK``: the replica's position among the job's placed replicas (0 is the master);
  ``WORLD_SIZE``: how many are placed; ``LOCAL_RANK``: its position among the job's replicas on
  its own node.
- ``MASTER_ADDR``: the address the master replica's node registered (its name where it registered
  none); ``127.0.0.1`` when every replica lies on one node.
- ``MASTER_PORT``, never the same for two jobs on one node: :data:`PORT_BASE` + the master
  replica's lowest GPU when it holds whole GPUs (a GPU is bound to one job at a time, so no other
  job on that node has that port); ``None`` when the job lies on one node without a whole GPU (a
  fraction, CPUs only): its agent then picks a port none of its running jobs has
  (``agent/node.py``); for a CPU-only gang across nodes, :data:`GANG_PORT_BASE` + its id modulo
  :data:`GANG_PORT_SPAN` (two such gangs whose masters share a node collide only if their ids
  are that many apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PORT_BASE = 29500
GANG_PORT_BASE = 30000
GANG_PORT_SPAN = 1000


@dataclass(frozen=True)
class Placed:
    """One allocation row of a job: its replica, node, the node's address, GPU and share."""

    replica: int
    node_id: int
    address: str
    gpu: int | None
    share_milli: int


def rendezvous(job_id: int, placed: list[Placed]) -> dict[int, dict[str, Any]]:
    """Each placed replica's rendezvous (the keys of a binding's ``rendezvous``)."""
    if not placed:
        return {}
    replicas = sorted({p.replica for p in placed})
    master = [p for p in placed if p.replica == replicas[0]]
    one_node = len({p.node_id for p in placed}) == 1
    whole = sorted(p.gpu for p in master if p.gpu is not None and p.share_milli >= 1000)
    if whole:
        port: int | None = PORT_BASE + whole[0]
    elif one_node:
        port = None
    else:
        port = GANG_PORT_BASE + job_id % GANG_PORT_SPAN
    address = "127.0.0.1" if one_node else master[0].address
    node_of = {p.replica: p.node_id for p in placed}
    out = {}
    for rank, replica in enumerate(replicas):
        here = [r for r in replicas if node_of[r] == node_of[replica]]
        out[replica] = {
            "master_addr": address,
            "master_port": port,
            "world_size": len(replicas),
            "rank": rank,
            "local_rank": here.index(replica),
        }
    return out

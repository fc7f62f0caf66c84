"""What one pass leaves for the next: the engine's memory, as plain data.

:class:`~.policy.TesseraScheduler` decides from the snapshot (the world as it is) and from what
its earlier passes decided: the reservations they made (nodes and start), the nodes each held
job was reserved last, the room a preemption is freeing for its job, each pending job's last
code, the request mix its fragmentation model was built from, and the jobs it has already
counted in that mix. The simulator keeps one scheduler for a whole trace, so this memory lives in
it; the live control plane builds a scheduler every pass, so it loads an :class:`EngineMemory`
before the pass and stores the one the pass gives back (``services/memory.py``). Both decide the
same, and ``tests/engine/test_memory_parity.py`` checks it pass for pass.

Nodes are named, not indexed: the live cluster's node list changes between passes (a node
joins), and an entry naming a node the snapshot lacks is dropped on load (its job is planned
again). Everything here is JSON-safe through :meth:`EngineMemory.to_json` and
:meth:`EngineMemory.from_json`, which refuses a malformed document with :class:`BadMemory`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from .fragmentation import Shape, TypicalRequest

# 2: the request mix (``recent``) as runs of equal shapes; a document of version 1 (each shape
# listed) is still read.
VERSION = 2
READABLE = (1, VERSION)
MAX_RUN = 1_000_000  # a run longer than any request mix is not one this engine wrote


class BadMemory(ValueError):
    """A stored memory document that is not one this engine wrote."""


@dataclass(frozen=True, slots=True)
class HeldReservation:
    """A reservation as the last pass left it (see :class:`~.backfill.Reservation`)."""

    job_id: str
    nodes: tuple[str, ...]
    start: float
    strict_level: int | None = None


@dataclass(frozen=True, slots=True)
class HeldRoom:
    """Room that preemptions are freeing for ``job_id``, held for it alone until ``until``."""

    job_id: str
    nodes: tuple[str, ...]
    until: float


@dataclass(frozen=True, slots=True)
class EngineMemory:
    """Everything :meth:`~.policy.TesseraScheduler.decide` reads from its own past.

    ``reservations`` are the last pass's, in the order it made them (the first of two equal
    starts on a node owns it); ``sticky`` the nodes each reserved job was given; ``room`` the
    rooms being freed, in the order they were made; ``last_codes`` each pending job's code in
    the last pass (a job held back by quotas does not make a model owed, ``note_owed``).
    ``rack_gang_gpus`` is the largest ``rack`` gang seen (racks that could hold it are kept
    clear of non-preemptible work). The fragmentation model's request mix: ``recent`` is the
    shape of each of the last ``frag_window`` jobs counted, oldest first; ``frag_changes`` how
    many were counted since the model was last built; ``frag_typical`` the model's typical
    requests (None: not built yet). ``noted_at`` and ``noted_ids``: the latest submission time
    counted, and the jobs submitted at that very time that were counted (a job is counted once,
    at the first pass that sees it). ``eta_first`` and ``eta_seen``: the start estimates' memory
    (:mod:`.eta_learnt`), each waiting job's first estimate (job, made at, played wait, class)
    and the ratios learnt per class, oldest first; a document without them (written before
    they were kept) reads as none learnt yet.
    """

    reservations: tuple[HeldReservation, ...] = ()
    sticky: tuple[tuple[str, tuple[str, ...]], ...] = ()
    room: tuple[HeldRoom, ...] = ()
    last_codes: tuple[tuple[str, str], ...] = ()
    rack_gang_gpus: float = 0.0
    recent: tuple[Shape, ...] = ()
    frag_changes: int = 0
    frag_typical: tuple[TypicalRequest, ...] | None = None
    noted_at: float = -math.inf
    noted_ids: tuple[str, ...] = ()
    eta_first: tuple[tuple[str, float, float, str], ...] = ()
    eta_seen: tuple[tuple[str, tuple[float, ...]], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON document (floats round-trip exactly through Python's ``json``)."""
        return {
            "version": VERSION,
            "reservations": [[r.job_id, list(r.nodes), r.start, r.strict_level] for r in self.reservations],
            "sticky": [[job, list(nodes)] for job, nodes in self.sticky],
            "room": [[r.job_id, list(r.nodes), r.until] for r in self.room],
            "last_codes": [[job, code] for job, code in self.last_codes],
            "rack_gang_gpus": self.rack_gang_gpus,
            # Runs of equal consecutive shapes, [cpu, milli, count, models, n]: the mix is the
            # last ``frag_window`` jobs (1,000), mostly of a few shapes, and the document is
            # written and read every pass that counts a job (it was 18 KB listed one by one).
            "recent": [[*_shape_json(s), len(list(run))] for s, run in itertools.groupby(self.recent)],
            "frag_changes": self.frag_changes,
            "frag_typical": None
            if self.frag_typical is None
            else [[t.cpu, t.milli, t.count, list(t.models), t.p] for t in self.frag_typical],
            "noted_at": None if self.noted_at == -math.inf else self.noted_at,
            "noted_ids": list(self.noted_ids),
            "eta_first": [[j, t, w, c] for j, t, w, c in self.eta_first],
            "eta_seen": [[c, list(q)] for c, q in self.eta_seen],
        }

    @classmethod
    def from_json(cls, doc: Any) -> EngineMemory:
        """The memory ``to_json`` wrote; :class:`BadMemory` for anything else."""
        try:
            if not isinstance(doc, dict) or doc.get("version") not in READABLE:
                raise BadMemory(f"not an engine memory of version {' or '.join(map(str, READABLE))}")
            runs = doc["recent"] if doc["version"] == VERSION else [[*s, 1] for s in doc["recent"]]
            typical = doc["frag_typical"]
            noted_at = doc["noted_at"]
            return cls(
                reservations=tuple(
                    HeldReservation(_s(j), _names(n), _f(t), None if lv is None else int(lv))
                    for j, n, t, lv in doc["reservations"]
                ),
                sticky=tuple((_s(j), _names(n)) for j, n in doc["sticky"]),
                room=tuple(HeldRoom(_s(j), _names(n), _f(t)) for j, n, t in doc["room"]),
                last_codes=tuple((_s(j), _s(c)) for j, c in doc["last_codes"]),
                rack_gang_gpus=_f(doc["rack_gang_gpus"]),
                recent=tuple(itertools.chain.from_iterable(_run(r) for r in runs)),
                frag_changes=int(doc["frag_changes"]),
                frag_typical=None
                if typical is None
                else tuple(
                    TypicalRequest(int(c), int(m), int(k), tuple(_s(x) for x in ms), _f(p))
                    for c, m, k, ms, p in typical
                ),
                noted_at=-math.inf if noted_at is None else _f(noted_at),
                noted_ids=tuple(_s(j) for j in doc["noted_ids"]),
                eta_first=tuple((_s(j), _f(t), _f(w), _s(c)) for j, t, w, c in doc.get("eta_first", ())),
                eta_seen=tuple((_s(c), tuple(_f(x) for x in q)) for c, q in doc.get("eta_seen", ())),
            )
        except BadMemory:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise BadMemory(f"malformed engine memory: {exc!r}") from None


def _shape_json(s: Shape) -> list[Any]:
    return [s[0], s[1], s[2], list(s[3])]


def _shape(v: Any) -> Shape:
    cpu, milli, count, models = v
    return (int(cpu), int(milli), int(count), tuple(_s(m) for m in models))


def _run(v: Any) -> list[Shape]:
    """A run of ``recent``: its shape, ``n`` times (n ≥ 1)."""
    *shape, n = v
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_RUN:
        raise ValueError(f"a run of {n!r} shapes")
    return [_shape(shape)] * n


def _s(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v


def _f(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"expected a number, got {v!r}")
    return float(v)


def _names(v: Any) -> tuple[str, ...]:
    return tuple(_s(x) for x in v)

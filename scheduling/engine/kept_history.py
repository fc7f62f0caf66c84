"""The runtime history's tables, kept from one pass to the next.

Each live pass builds a new engine (``TesseraScheduler.from_snapshot``), whose backfill
:class:`~.backfill.History` and start estimates' :class:`~.runtimes.RecentRuns` hold the latest
runs of each key of the pass's history read. A pass reads the same runs as the last but for the
few that ended since (and as many that fell out of the read), so :class:`KeptHistory` updates the
last pass's tables by those alone:

1. The runs that came and went are found by identity (the services build each read row's run
   once while the row stays in the read); a run read afresh but equal counts as gone and come
   again, which costs time, never correctness.
2. Each key keeps every entry of the runs read (how many runs give it), so the runs that went
   are taken out exactly.
3. Only the keys they touched are sorted and cut to the latest again, into new lists in new
   tables: a table handed out is never changed, so the engines given it share it (an engine that
   records a run, ``TesseraScheduler.release``, records it into copies of its own).

The tables are those :meth:`History.of` and :meth:`RecentRuns.of` build from the same runs (a
test checks it), so a worker that restarts, and builds them from its first read, decides as one
that kept them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .backfill import History
from .runtimes import KEEP, RecentRuns
from .types import PREDICTED_OUTCOMES, FinishedRun

Key = tuple[str, str]
Entry = tuple[float, str, float]  # (end, job, runtime), as the tables hold them
Counts = dict[Key, dict[Entry, int]]  # key -> entry -> the runs read that give it


@dataclass(frozen=True, slots=True)
class Runtimes:
    """The tables of one history read; shared, never changed."""

    history: History
    recent: RecentRuns


@dataclass(frozen=True, slots=True)
class _Kept:
    runs: dict[int, FinishedRun]  # by id(); held, so that no other run takes an id meanwhile
    kinds: Counts  # per (tenant, kind): History's and RecentRuns.kinds' entries
    named: Counts  # per (user, name): RecentRuns.named's
    built: Runtimes


class KeptHistory:
    """The tables of the last history read, updated to the next (see the module)."""

    def __init__(self) -> None:
        # Replaced whole, never changed: a pass that updates it while another reads it (a dry
        # run beside the pass) leaves each with tables of its own read.
        self._kept = _Kept({}, {}, {}, Runtimes(History(), RecentRuns()))

    def of(self, runs: Sequence[FinishedRun]) -> Runtimes:
        """The tables :meth:`History.of` and :meth:`RecentRuns.of` would build from ``runs``."""
        kept = self._kept
        now = dict(zip(map(id, runs), runs, strict=True))
        if len(now) < len(runs):  # one run given twice counts twice in History: build afresh
            return Runtimes(History.of(runs), RecentRuns.of(runs))
        came = [now[i] for i in now.keys() - kept.runs.keys()]
        went = [kept.runs[i] for i in kept.runs.keys() - now.keys()]
        if not came and not went:
            self._kept = _Kept(now, kept.kinds, kept.named, kept.built)
            return kept.built
        kinds, named = dict(kept.kinds), dict(kept.named)
        touched_kinds: set[Key] = set()
        touched_named: set[Key] = set()
        for step, changed in ((-1, went), (1, came)):
            for r in changed:
                if r.outcome not in PREDICTED_OUTCOMES:
                    continue
                entry = (r.ended_at, r.job_id, max(0.0, r.runtime_s))
                _count(kinds, touched_kinds, (r.tenant, r.kind), entry, step)
                if r.user and r.name:
                    _count(named, touched_named, (r.user, r.name), entry, step)
        keep = kept.built.history.keep
        history, recent = History(keep), RecentRuns()
        history.runs = dict(kept.built.history.runs)
        recent.kinds, recent.named = dict(kept.built.recent.kinds), dict(kept.built.recent.named)
        for key in touched_kinds:
            counts = kinds[key]
            if not counts:
                del kinds[key], history.runs[key], recent.kinds[key]
                continue
            latest = sorted(counts)
            recent.kinds[key] = latest[-KEEP:]
            if len(counts) == sum(counts.values()):
                history.runs[key] = latest[-keep:]
            else:
                history.runs[key] = [e for e in latest for _ in range(counts[e])][-keep:]
        for key in touched_named:
            counts = named[key]
            if not counts:
                del named[key], recent.named[key]
                continue
            recent.named[key] = sorted(counts)[-KEEP:]
        built = Runtimes(history, recent)
        self._kept = _Kept(now, kinds, named, built)
        return built


def _count(table: Counts, touched: set[Key], key: Key, entry: Entry, step: int) -> None:
    """Add ``step`` runs giving ``entry`` to ``key``'s counts, copied on their first change (the
    last read's stay as they were: another pass may be updating from them)."""
    if key not in touched:
        table[key] = dict(table.get(key, {}))
        touched.add(key)
    counts = table[key]
    n = counts.get(entry, 0) + step
    if n:
        counts[entry] = n
    else:
        del counts[entry]

"""The engine's knobs, in one frozen dataclass (defaults are what Tessera ships with)."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # Queue level by job kind: 0 is served first.
    levels: tuple[tuple[str, int], ...] = (
        ("inference", 0),
        ("training", 1),
        ("finetune", 2),
        ("batch", 2),
    )
    level_names: tuple[str, ...] = ("inference", "training", "finetune/batch")
    aging_s: float = 4 * 3600.0  # a job waiting longer is promoted to level 0 and reserved for
    max_reservations: int = 8  # reservations per pass (aged jobs first, then the blocked head;
    # last pass's still-waiting ones are carried over and count)
    preempt_min_run_s: float = 300.0  # a job runs this long before it can be preempted (again)
    # Kind levels whose jobs may preempt lower levels for priority (inference by default; other
    # levels wait or reclaim their guarantee: preempting training for training only churns).
    preemptor_levels: tuple[int, ...] = (0,)
    # A job reclaims its tenant's guarantee from borrowers only after waiting this long: most
    # capacity frees by itself within minutes, and every reclaim throws work away.
    reclaim_after_s: float = 1800.0
    # A borrower is reclaimed only within this long after its last checkpoint (or its start), so
    # a reclaim throws away at most this much of its work; a job that never checkpoints may be
    # reclaimed at any time (waiting saves it nothing). 0 = at any time. Reclaim is not urgent
    # (the owner has waited reclaim_after_s already); seniority preemption keeps to it for one
    # of the victim's checkpoint intervals (see starve_s); priority preemption ignores it.
    reclaim_checkpoint_window_s: float = 600.0
    # The room a preemption frees is held for the job it was made for, for the victims' grace
    # period plus this long: no other job (not even one ahead in the queue) may start there
    # meanwhile, so a preemption is never wasted on someone else and never repeated.
    room_hold_s: float = 300.0
    # Reclaim and starvation preemption spare a job whose hard time limit ends it within this
    # long: waiting for it costs little, preempting it throws work away.
    spare_ending_s: float = 3600.0
    # Aged jobs may preempt strictly lower kind levels. Off by default: on a generated 2-day
    # workload it cut the longest wait but threw away much of the work (docs/evaluation.md).
    aged_preempts: bool = False
    # Starvation bound: a job that has waited this long (since submit) comes first among the
    # promoted jobs (oldest first), may preempt preemptible jobs of its own or a lower kind level
    # that were submitted after it (seniority: the victims can never preempt it back; least lost
    # work first, sparing spare_ending_s; a victim that checkpoints, only within
    # reclaim_checkpoint_window_s of a checkpoint until the starving job has waited one of its
    # checkpoint intervals more) or that checkpoint and have run starve_s in their
    # current attempt (served: they have had their turn), may make quota room from such jobs of
    # its own tenant, may borrow even where owners wait, and once started is neither reclaimed
    # (its borrowing ends with it) nor preempted for seniority (no job it displaced takes its
    # place back). Its reservation counts what it may preempt as free now. What lets a gang
    # that needs a whole rack start within hours when every rack holds a long job. 0 = off.
    starve_s: float = 8 * 3600.0
    min_split_gpus: int = 1  # smallest buddy block a whole-GPU replica claims (power of two)
    # Preferred accelerators by kind, used when a job names none (earlier = preferred).
    kind_accelerators: tuple[tuple[str, tuple[str, ...]], ...] = field(default_factory=tuple)
    # Placement cost terms, in the placement score's units (docs/placement.md):
    alpha: float = 0.0  # weight of price per GPU-hour in the placement score
    # beta: weight of (1 - utilisation) of the node before the placement (consolidation: work
    # goes to busy nodes, idle ones stay whole). 0 by default: on openb's pod lists any positive
    # weight packs worse than fragmentation alone (docs/placement.md has the figures).
    beta: float = 0.0
    # gamma: cost per hour of waiting for a more preferred model, one preference step costing 1
    # (preference.py): a job waits for its first choice when that saves more steps than
    # gamma x the expected wait in hours. inf = never wait (start now on any acceptable model).
    gamma: float = math.inf
    # delta: data locality, score points for a node carrying all of a job's prefer_labels (a
    # share of them: that share of delta). 10 outweighs a fragmentation difference of up to 10
    # FGD steps (of 0-100) but never a better model (model preference is lexicographic). 0 =
    # prefer_labels ignored. Gangs' own locality is structural (topology.py), not this weight.
    delta: float = 10.0
    max_starts_per_pass: int = 100_000
    max_preemptions_per_pass: int = 256  # victims marked per pass (the rest wait a pass)
    max_preemption_attempts: int = 128  # victim searches per pass (each scans the cluster)
    default_runtime_s: float = 4 * 3600.0  # runtime assumed for reservations when nothing tells
    eta_max_jobs: int = 1000  # start estimates for the first N pending jobs in queue order (eta.py)
    frag_window: int = 1000  # typical requests from the last N submitted jobs
    reject_over_capacity: bool = False  # live: larger than the cluster stays pending (nodes join)
    preemption: bool = True
    backfill: bool = True
    # Resize running jobs: shrink elastic jobs to make room (step 4), grow elastic jobs and
    # partially started gangs into what is left (step 5), live and in the simulator alike.
    # Off: a running job keeps the size it started with and a job that needs its GPUs waits or
    # preempts it whole, as for any other job.
    resizes: bool = True
    # Fractional GPU shares have no memory isolation: a job can read what another job sharing
    # its GPU left in GPU memory. On: a fraction goes only to a GPU whose other fractions are
    # its own tenant's, else to a whole free GPU (what to run with tenants that do not trust
    # each other; docs/scheduler.md). Off: fractions of any tenants share a GPU.
    exclusive_gpu_shares: bool = False
    seed: int = 0  # the node order that breaks placement ties

    def level_of(self, kind: str) -> int:
        for k, lv in self.levels:
            if k == kind:
                return lv
        return max((lv for _, lv in self.levels), default=0)

    def level_name(self, level: int) -> str:
        if 0 <= level < len(self.level_names):
            return self.level_names[level]
        return f"level-{level}"

    def preferred(self, kind: str) -> tuple[str, ...]:
        for k, models in self.kind_accelerators:
            if k == kind:
                return models
        return ()


# -- the knobs an operator may set live (environment defaults, then the scheduler-settings record) --

KNOBS: tuple[str, ...] = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "aging_s",
    "starve_s",
    "reclaim_after_s",
    "reclaim_checkpoint_window_s",
    "room_hold_s",
    "preempt_min_run_s",
    "spare_ending_s",
    "max_reservations",
    "default_runtime_s",
    "min_split_gpus",
    "kind_accelerators",
    "preemptor_levels",
    "backfill",
    "preemption",
    "exclusive_gpu_shares",
)
# Number knobs and their least value (strict: must be above it).
_NUMBERS: dict[str, tuple[float, bool]] = {
    "alpha": (0.0, False),
    "beta": (0.0, False),
    "gamma": (0.0, False),
    "delta": (0.0, False),
    "aging_s": (0.0, True),
    "starve_s": (0.0, False),
    "reclaim_after_s": (0.0, False),
    "reclaim_checkpoint_window_s": (0.0, False),
    "room_hold_s": (0.0, False),
    "preempt_min_run_s": (0.0, False),
    "spare_ending_s": (0.0, False),
    "default_runtime_s": (0.0, True),
}
_KINDS = ("inference", "training", "finetune", "batch")


class KnobError(ValueError):
    """A knob's value the engine cannot run with; ``knob`` names it."""

    def __init__(self, knob: str, message: str):
        super().__init__(f"{knob}: {message}")
        self.knob = knob
        self.message = message


def configure(base: EngineConfig, values: Mapping[str, Any]) -> EngineConfig:
    """``base`` with ``values`` (knob name -> value, as JSON or an environment variable gives
    it: numbers, booleans, lists, or their text) applied. Every value is checked first, so the
    result is the whole new configuration or a :class:`KnobError` naming the first bad knob:
    nothing is ever half-applied."""
    changes: dict[str, Any] = {}
    for knob, raw in values.items():
        if knob not in KNOBS:
            raise KnobError(knob, f"not a scheduler knob (one of {', '.join(KNOBS)})")
        changes[knob] = _parse(knob, raw, base)
    return replace(base, **changes)


def _parse(knob: str, raw: Any, base: EngineConfig) -> Any:
    if isinstance(raw, str) and knob in ("kind_accelerators", "preemptor_levels"):
        # The environment's text, read as JSON; a text that is none (or a JSON string, as the
        # admin's JSON field gives "x") stays text and is refused below for what it must be.
        with contextlib.suppress(ValueError):
            raw = json.loads(raw)
    if knob in _NUMBERS:
        value = _number(knob, raw)
        least, strict = _NUMBERS[knob]
        if value < least or (strict and value == least):
            raise KnobError(knob, f"{raw!r} must be {'above' if strict else 'at least'} {least:g}")
        if math.isinf(value) and knob != "gamma":
            raise KnobError(knob, f"{raw!r} must be finite")
        return value
    if knob in ("max_reservations", "min_split_gpus"):
        value = _number(knob, raw)
        if not value.is_integer() or value < (knob == "min_split_gpus"):
            raise KnobError(
                knob, f"{raw!r} must be a whole number of at least {int(knob == 'min_split_gpus')}"
            )
        n = int(value)
        if knob == "min_split_gpus" and n & (n - 1):
            raise KnobError(knob, f"{raw!r} must be a power of two (1, 2, 4, 8, ...)")
        return n
    if knob in ("backfill", "preemption", "exclusive_gpu_shares"):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise KnobError(knob, f"{raw!r} must be true or false")
    if knob == "kind_accelerators":
        if not isinstance(raw, dict):
            raise KnobError(knob, 'must map job kinds to models, e.g. {"inference": ["T4", "A100"]}')
        out = []
        for kind in _KINDS:
            models = raw.get(kind)
            if models is None:
                continue
            if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
                raise KnobError(knob, f"{kind}: {models!r} must be a list of model names")
            out.append((kind, tuple(models)))
        unknown = sorted(set(raw) - set(_KINDS))
        if unknown:
            raise KnobError(knob, f"{unknown[0]!r} is not a job kind (one of {', '.join(_KINDS)})")
        return tuple(out)
    # preemptor_levels
    levels = sorted({lv for _, lv in base.levels})
    if not isinstance(raw, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
        raise KnobError(knob, f"{raw!r} must be a list of queue levels, e.g. [0]")
    bad = [v for v in raw if v not in levels]
    if bad:
        raise KnobError(knob, f"{bad[0]} is not a queue level (one of {', '.join(map(str, levels))})")
    return tuple(sorted(set(raw)))


def _number(knob: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise KnobError(knob, f"{raw!r} is not a number")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise KnobError(knob, f"{raw!r} is not a number") from None
    if math.isnan(value):
        raise KnobError(knob, f"{raw!r} is not a number")
    return value

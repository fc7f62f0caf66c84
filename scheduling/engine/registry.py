"""Every policy by name, behind one constructor (the replay driver uses exactly this)."""

from __future__ import annotations

from collections.abc import Sequence

from .baselines import BASELINES, BaselineScheduler
from .config import EngineConfig
from .policy import TesseraScheduler
from .types import NodeSpec, QuotaSpec, Scheduler

POLICIES: tuple[str, ...] = ("tessera", *BASELINES)


def make_scheduler(
    name: str,
    nodes: Sequence[NodeSpec],
    quotas: Sequence[QuotaSpec] = (),
    seed: int = 0,
    config: EngineConfig | None = None,
) -> Scheduler:
    """A fresh scheduler for ``name`` (one of :data:`POLICIES`) over ``nodes``."""
    if name == "tessera":
        if config is None:
            config = EngineConfig(seed=seed)
        return TesseraScheduler(tuple(nodes), tuple(quotas), config)
    if name in BASELINES:
        return BaselineScheduler(name, tuple(nodes), tuple(quotas), seed=seed)
    raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")

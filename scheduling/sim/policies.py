"""Where the simulator gets its policies: the engine's registry (``scheduling.engine.registry``).

The simulator never ships a policy of its own: ``tessera`` and the baselines all come from the
engine, so that what is measured offline is the code that runs online.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scheduling.engine.config import EngineConfig
from scheduling.engine.registry import POLICIES, make_scheduler
from scheduling.engine.types import NodeSpec, QuotaSpec, Scheduler

SchedulerFactory = Callable[[str, Sequence[NodeSpec], Sequence[QuotaSpec], int], Scheduler]


class PolicyError(ValueError):
    """An unknown policy name."""


def names() -> tuple[str, ...]:
    """The registered policy names."""
    return tuple(POLICIES)


def make(
    name: str,
    nodes: Sequence[NodeSpec],
    quotas: Sequence[QuotaSpec] = (),
    seed: int = 0,
    exclusive_gpu_shares: bool = False,
) -> Scheduler:
    """A fresh scheduler of policy ``name`` for ``nodes``; ``exclusive_gpu_shares``: tessera's
    option of that name (``EngineConfig``; the baselines have no such option)."""
    if name not in POLICIES:
        raise PolicyError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")
    if exclusive_gpu_shares:
        if name != "tessera":
            raise PolicyError(f"policy {name!r} has no exclusive GPU shares (tessera has)")
        config = EngineConfig(seed=seed, exclusive_gpu_shares=True)
        return make_scheduler(name, list(nodes), quotas=tuple(quotas), seed=seed, config=config)
    return make_scheduler(name, list(nodes), quotas=tuple(quotas), seed=seed)


def check_names(requested: Sequence[str], known: Sequence[str]) -> None:
    unknown = [n for n in requested if n not in known]
    if unknown:
        raise PolicyError(f"unknown policy {unknown[0]!r}; one of {', '.join(known)}")

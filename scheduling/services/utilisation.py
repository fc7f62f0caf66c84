"""The agents' own utilisation reports: how busy each GPU is, where no Prometheus scrapes them.

A heartbeat the server asked for one (:func:`reports_wanted`) carries, for every GPU a job holds
on the node, its jobs and how busy it is at that moment (``sm_active`` 0..1 where the driver has
it, else ``util`` percent). The server keeps, per
(job, GPU), the highest value in each policy step (``TESSERA_IDLE_STEP_S``) over the policy's
window — the same per-step maxima the adjustment pass reads from Prometheus
(``max_over_time(...[step])``), so the policy sees one shape from either source
(``monitoring/adjust.py``).

Where it is kept, and why not in PostgreSQL: 8,000 GPUs reporting every 15 s are 530 values a
second, almost all of which only raise or keep a step's maximum. A row per sample (or an upsert
per step) would be that many writes on the database every job's transition waits on. So the
maxima live in Redis when it is configured (one ``EVAL`` per report, one hash per (job, GPU)
with a field per step, expiring after the window: every web process writes and the Celery worker
reads the same data), else in this process's memory (the embedded default: the web process both
takes the heartbeats and runs the pass). The trade-off: the window is lost when Redis (or the
embedded web process) restarts, so after a restart no GPU is idle until a full window has been
seen again; a reclaim is delayed, never caused, by the loss.

A report naming a GPU the job does not hold on this node (a GPU it never had, another job's, or
an index the node does not have) is ignored with a log line; the node is the one the credential
belongs to, so no agent can report for another node's GPUs.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from scheduling.models import Node
from scheduling.services import idle_policy, redis_flags

log = logging.getLogger("tessera.adjust")

KEEP_STEPS = 3  # steps kept beyond the policy's window (a pass reads window + one step)
Sample = tuple[int, str, int, float]  # (job, GPU name, step number, value)


@dataclass(frozen=True)
class GpuReport:
    """One entry of a heartbeat's ``utilisation``."""

    gpu: int  # the device index on the reporting node
    job_ids: tuple[int, ...]
    util: float  # percent
    sm_active: float | None = None  # 0..1, where the driver has it

    @property
    def value(self) -> float:
        """What the idle policy compares with its threshold: SM active, else utilisation."""
        return self.sm_active if self.sm_active is not None else self.util / 100


class UtilisationUnreadable(RuntimeError):
    """The store of reports cannot be read (Redis down)."""


# A node is asked for a report at most this many times a policy step: the points a 15 s
# Prometheus scrape gives a 60 s step. More would only raise or keep the same maxima, at a
# report's cost on every heartbeat of every node (docs/benchmarks/e2e.md, Session 23).
REPORTS_PER_STEP = 4
_asked: dict[int, float] = {}  # node id -> when this process last asked it (monotonic seconds)
_asked_lock = threading.Lock()


def reports_wanted(node_id: int, now: float | None = None) -> bool:
    """Whether a heartbeat's answer asks the node to send a utilisation report with its next
    heartbeat: only where the adjustment pass reads the agents' reports (no Prometheus
    configured), and at most :data:`REPORTS_PER_STEP` times a step, whatever the node's
    heartbeat rate. Each web process counts for itself, so a node whose heartbeats reach several
    is asked a little more often; a step's points stay well inside the gap that would end an
    idle span (two steps)."""
    if getattr(settings, "PROMETHEUS_URL", ""):
        return False
    at = time.monotonic() if now is None else now
    with _asked_lock:
        last = _asked.get(node_id)
        if last is not None and at - last < _step_s() / REPORTS_PER_STEP:
            return False
        _asked[node_id] = at
        return True


def forget_asked() -> None:
    """Forget when nodes were last asked (tests: node ids repeat between tests on SQLite)."""
    with _asked_lock:
        _asked.clear()


def _step_s() -> float:
    return float(settings.TESSERA["IDLE_STEP_S"])


def _keep_s(step_s: float) -> float:
    """How much history is kept: the longest window any tenant's jobs are judged by."""
    return idle_policy.longest_act_after_s() + KEEP_STEPS * step_s


def gpu_name(node: str, index: int) -> str:
    """A GPU as the policy and its events name it (Prometheus's ``Hostname``/``gpu``)."""
    return f"{node}/{index}"


def do_record_utilisation(
    node: Node, reports: Sequence[GpuReport], held: Mapping[int, set[int]], now: float | None = None
) -> int:
    """Keep ``reports`` of ``node`` whose jobs hold the GPU they name (``held``: device index →
    the jobs holding it there); log and drop the rest. Returns how many values were kept."""
    now = time.time() if now is None else now
    step = _step_s()
    bucket = math.ceil(now / step)
    samples: list[Sample] = []
    for r in reports:
        holders = held.get(r.gpu, set())
        for job_id in r.job_ids:
            if job_id in holders:
                samples.append((job_id, gpu_name(node.name, r.gpu), bucket, r.value))
            else:
                log.warning(
                    "ignored: node %s reported utilisation of job %s on GPU %s, which it does not hold",
                    node.name,
                    job_id,
                    r.gpu,
                )
    if samples:
        store().add(samples, step, _keep_s(step), now)
    return len(samples)


def read_series(
    wanted: Iterable[tuple[int, str, float]], window_s: float, step_s: float, now: float | None = None
) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """Per (job, GPU) in ``wanted`` (job, GPU name, the attempt's start): its per-step maxima
    ``(end of step, value)`` over the last ``window_s`` and after the start, oldest first; a
    (job, GPU) with none is left out. Raises :class:`UtilisationUnreadable`."""
    now = time.time() if now is None else now
    wanted = list(wanted)
    found = store().read([(job, gpu) for job, gpu, _ in wanted], step_s)
    out: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for job, gpu, started in wanted:
        points = sorted(
            (b * step_s, v)
            for b, v in found.get((job, gpu), {}).items()
            if now - window_s < b * step_s <= now and b * step_s > started
        )
        if points:
            out[(job, gpu)] = points
    return out


# --- where the maxima live ------------------------------------------------------------------------


class MemoryStore:
    """The embedded default's: this process's memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maxima: dict[tuple[float, int, str], dict[int, float]] = {}
        self._swept = 0.0

    def add(self, samples: Sequence[Sample], step_s: float, keep_s: float, now: float) -> None:
        cutoff = math.ceil((now - keep_s) / step_s)
        with self._lock:
            for job, gpu, bucket, value in samples:
                steps = self._maxima.setdefault((step_s, job, gpu), {})
                if bucket not in steps:
                    for old in [b for b in steps if b < cutoff]:
                        del steps[old]
                steps[bucket] = max(value, steps.get(bucket, value))
            if now - self._swept >= step_s:  # forget GPUs of jobs that ended, once a step
                self._swept = now
                for key in [k for k, steps in self._maxima.items() if max(steps, default=0) < cutoff]:
                    del self._maxima[key]

    def read(self, keys: Sequence[tuple[int, str]], step_s: float) -> dict[tuple[int, str], dict[int, float]]:
        with self._lock:
            return {k: dict(self._maxima[(step_s, *k)]) for k in keys if (step_s, *k) in self._maxima}


# Per sample: keep the step's maximum; on a step's first value, drop steps older than the window.
_ADD = """
local ttl = tonumber(ARGV[1])
local cutoff = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local step = ARGV[2 * i + 1]
  local value = tonumber(ARGV[2 * i + 2])
  local old = redis.call('hget', key, step)
  if not old then
    redis.call('hset', key, step, value)
    for _, f in ipairs(redis.call('hkeys', key)) do
      if tonumber(f) < cutoff then redis.call('hdel', key, f) end
    end
  elseif tonumber(old) < value then
    redis.call('hset', key, step, value)
  end
  redis.call('expire', key, ttl)
end
return 0
"""


class RedisStore:
    """The services' store: shared by every web process and the Celery worker."""

    @staticmethod
    def _key(step_s: float, job: int, gpu: str) -> str:
        return redis_flags.key(f"util:{step_s:g}:{job}:{gpu}")

    def add(self, samples: Sequence[Sample], step_s: float, keep_s: float, now: float) -> None:
        keys = [self._key(step_s, job, gpu) for job, gpu, _, _ in samples]
        args: list[Any] = [math.ceil(keep_s), math.ceil((now - keep_s) / step_s)]
        for _, _, bucket, value in samples:
            args += [bucket, repr(float(value))]
        try:
            redis_flags.client().eval(_ADD, len(keys), *keys, *args)
        except redis.RedisError as exc:  # a lost report delays a reclaim, never causes one
            log.warning("utilisation reports not kept: Redis: %s", exc)

    def read(self, keys: Sequence[tuple[int, str]], step_s: float) -> dict[tuple[int, str], dict[int, float]]:
        try:
            pipe = redis_flags.client().pipeline(transaction=False)
            for job, gpu in keys:
                pipe.hgetall(self._key(step_s, job, gpu))
            answers = pipe.execute()
        except redis.RedisError as exc:
            raise UtilisationUnreadable(
                f"the agents' utilisation reports cannot be read: Redis: {exc}"
            ) from exc
        return {
            key: {int(b): float(v) for b, v in steps.items()}
            for key, steps in zip(keys, answers, strict=True)
            if steps
        }


_memory = MemoryStore()


def store() -> MemoryStore | RedisStore:
    """Redis when configured, else this process's memory."""
    return RedisStore() if settings.REDIS_URL else _memory

"""Expected fragmentation of free GPU capacity for the observed request mix.

This is FGD's definition (Weng et al., USENIX ATC'23), as docs/evaluation.md states it:

* a *request shape* is (CPU, GPU share per GPU, GPU count, acceptable models);
* the *typical requests* are the most frequent shapes that together cover at least 95% of the
  requests seen, renormalised to probabilities ``p_m``;
* for a node ``n``, ``f_m(n)`` is the free GPU capacity that request ``m`` could not use: all of it
  when ``m`` does not fit on ``n`` (CPU, model, GPUs) or is CPU-only, otherwise the free capacity of
  the GPUs that are each too small for ``m``;
* ``F(n) = sum_m p_m * f_m(n)``, and the cluster's rate is ``sum F(n) / sum free``.

Everything here works on a node's *state key* ``(model, cpu_free, gpu_free)`` where ``gpu_free`` is
the sorted tuple of free milli-GPU per healthy GPU, so ``F`` is memoised per distinct state: nodes
in the same state share one entry and a change of one node costs one dictionary look-up.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .types import MILLI, JobRequest

UNTRACKED = 1 << 60  # a resource of capacity 0 in the inputs is not tracked: never the limit

StateKey = tuple[str, int, tuple[int, ...]]  # (model, cpu_free milli-CPU, sorted free milli/GPU)
Shape = tuple[int, int, int, tuple[str, ...]]  # (cpu milli, milli per GPU, GPU count, models)


def to_milli(value: float) -> int:
    """Round a float quantity (GPUs, CPUs) to integer thousandths."""
    return int(round(value * MILLI))


def shape_of(job: JobRequest) -> Shape:
    """The per-replica request shape of a job, as FGD groups its typical requests."""
    replicas = max(job.replicas, 1)
    per = job.gpus / replicas
    cpu = to_milli(job.cpus / replicas)
    if per <= 0:
        return (cpu, 0, 0, job.accelerators)
    if per < 1:
        return (cpu, to_milli(per), 1, job.accelerators)
    return (cpu, MILLI, int(round(per)), job.accelerators)


@dataclass(frozen=True, slots=True)
class TypicalRequest:
    cpu: int  # milli-CPU
    milli: int  # share of each GPU in milli (1000 = whole GPUs; 0 = CPU-only)
    count: int  # GPUs per replica (1 for a fraction, 0 for CPU-only)
    models: tuple[str, ...]  # () = any
    p: float


def typical_requests(shapes: Iterable[Shape], coverage: float = 0.95) -> tuple[TypicalRequest, ...]:
    """The most frequent shapes covering ``coverage`` of ``shapes``, with probabilities.

    Ties in frequency are broken by the shape itself so that the result never depends on the
    order of the input or on hashing.
    """
    counts = Counter(shapes)
    total = sum(counts.values())
    if not total:
        return ()
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    chosen: list[tuple[Shape, int]] = []
    covered = 0
    for shape, n in ranked:
        chosen.append((shape, n))
        covered += n
        if covered >= coverage * total:
            break
    return tuple(
        TypicalRequest(cpu=s[0], milli=s[1], count=s[2], models=s[3], p=n / covered) for s, n in chosen
    )


def unusable(req: TypicalRequest, model: str, cpu_free: int, gpu_free: tuple[int, ...]) -> int:
    """``f_m(n)``: the free milli-GPU of a node that request ``req`` could not use."""
    total = sum(gpu_free)
    if req.count == 0 or req.cpu > cpu_free or (req.models and model not in req.models):
        return total
    if req.milli < MILLI:
        if any(v >= req.milli for v in gpu_free):
            return sum(v for v in gpu_free if v < req.milli)
        return total
    full = 0
    partial = 0
    for v in gpu_free:
        if v >= MILLI:
            full += 1
        else:
            partial += v
    return partial if full >= req.count else total


class FragmentationModel:
    """``F(n)`` for one request mix, memoised per node state key."""

    __slots__ = ("typical", "_cache", "_cpus", "_agg")

    def __init__(self, typical: tuple[TypicalRequest, ...]):
        self.typical = typical
        self._cache: dict[tuple[Any, ...], float] = {}
        # F(n) depends on the free CPU only through which typical requests it can hold: nodes
        # whose free CPU falls between the same two request sizes share one cache entry.
        self._cpus = sorted({r.cpu for r in typical})
        self._agg: dict[tuple[str, int], tuple[Any, ...]] = {}

    @classmethod
    def from_jobs(cls, jobs: Iterable[JobRequest], coverage: float = 0.95) -> FragmentationModel:
        return cls(typical_requests((shape_of(j) for j in jobs), coverage))

    @classmethod
    def from_shapes(cls, shapes: Iterable[Shape], coverage: float = 0.95) -> FragmentationModel:
        return cls(typical_requests(shapes, coverage))

    @property
    def cpu_sizes(self) -> list[int]:
        """The distinct CPU sizes of the typical requests, sorted: F depends on a node's free CPU
        only through how many of them it holds (``bisect_right(cpu_sizes, cpu_free)``)."""
        return self._cpus

    def node(self, model: str, cpu_free: int, gpu_free: tuple[int, ...]) -> float:
        """``F(n)`` in milli-GPU; ``gpu_free`` must be sorted (it is the cache key)."""
        key = (model, bisect_right(self._cpus, cpu_free), gpu_free)
        value = self._cache.get(key)
        if value is None:
            value = self._compute(model, cpu_free, gpu_free)
            if len(self._cache) > 500_000:  # bound memory on very long runs
                self._cache.clear()
            self._cache[key] = value
        return value

    def _compute(self, model: str, cpu_free: int, gpus: tuple[int, ...]) -> float:
        """Same as summing :func:`unusable` over the typical requests, with prefix sums and the
        requests aggregated per (model, CPU class): one term per distinct share or GPU count."""
        prefix = [0]
        for v in gpus:
            prefix.append(prefix[-1] + v)
        total = prefix[-1]
        full = len(gpus) - bisect_left(gpus, MILLI)
        partial = total - MILLI * full
        p_all, shares, counts = self._terms(model, bisect_right(self._cpus, cpu_free))
        value = p_all * total
        n = len(gpus)
        for milli, p in shares:
            i = bisect_left(gpus, milli)
            value += p * (prefix[i] if i < n else total)
        for count, p in counts:
            value += p * (partial if full >= count else total)
        return value

    def _terms(
        self, model: str, cpu_class: int
    ) -> tuple[float, list[tuple[int, float]], list[tuple[int, float]]]:
        """For nodes of ``model`` whose free CPU holds the ``cpu_class`` smallest typical CPU
        sizes: the probability of requests that can use none of the free GPUs, and the
        probabilities of the others by share per GPU (fractions) and by GPU count (whole)."""
        key = (model, cpu_class)
        hit = self._agg.get(key)
        if hit is None:
            fits_cpu = set(self._cpus[:cpu_class])
            p_all = 0.0
            shares: dict[int, float] = {}
            counts: dict[int, float] = {}
            for req in self.typical:
                if req.count == 0 or req.cpu not in fits_cpu or (req.models and model not in req.models):
                    p_all += req.p
                elif req.milli < MILLI:
                    shares[req.milli] = shares.get(req.milli, 0.0) + req.p
                else:
                    counts[req.count] = counts.get(req.count, 0.0) + req.p
            hit = self._agg[key] = (p_all, sorted(shares.items()), sorted(counts.items()))
        return hit


def cluster_rate(total_f: float, total_free: int) -> float:
    """The cluster's fragmentation rate: fragmented over free capacity (0 when nothing is free)."""
    return total_f / total_free if total_free > 0 else 0.0

"""DCGM-style GPU metrics on the agent's own ``/metrics``.

Series (as NVIDIA's dcgm-exporter names them): ``DCGM_FI_DEV_GPU_UTIL`` (percent),
``DCGM_FI_PROF_SM_ACTIVE`` (0..1), ``DCGM_FI_DEV_FB_USED`` (MiB), each with the labels ``gpu``,
``UUID``, ``Hostname``, ``modelName`` and ``job`` (the running job's id; empty when idle).

Simulated GPUs replay real utilisation: the per-minute profiles of inference pods in
``pod_gpu_util.csv.gz`` (Alibaba GenAI trace). A job gets one pod's profile, chosen from its id
(stable across restarts and agents), starting at the profile's first busy sample; it advances one
sample per minute of job time times ``util_speed``. SM activity and framebuffer use are derived
from utilisation (SM active ≈ 0.85 × util; memory ≈ 35% of the GPU plus a share that follows util),
and everything is 0 on an idle GPU. A job whose env sets ``TESSERA_UTIL_PROFILE`` to a
synthetic profile (``agent/profiles.py``: busy, bursty, stalling, idle, idle-after-N,
half-idle-after-N) replays that instead. Real GPUs are read through NVML (SM activity is a profiling
metric NVML does not expose; it is approximated from utilisation there too).
"""

from __future__ import annotations

import csv
import functools
import gzip
import logging
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agent import profiles as synthetic
from agent.inventory import Inventory

log = logging.getLogger("tessera.agent")

LABELS = ["gpu", "UUID", "Hostname", "modelName", "job"]
TRACE_ENV = "TESSERA_GPU_UTIL_TRACE"
COLUMNS = ("pod", "t_s", "gpu_util_pct")
PROFILE_ENV = "TESSERA_UTIL_PROFILE"
_V = TypeVar("_V")
# A run of consecutive lines of one pod (its name the first field): the trace is grouped by pod.
_RUN = re.compile(r"^([^,\r\n]*),[^\n]*(?:\n\1,[^\n]*)*", re.MULTILINE)


@dataclass(frozen=True)
class GpuUse:
    """One job's use of one GPU, as the metrics see it."""

    job_id: int
    elapsed_s: float
    share: float = 1.0
    profile: str = ""  # a synthetic profile (agent/profiles.py); "" = the serving-pod trace
    rank: int = 0  # this GPU's place among the job's GPUs (replica × its GPUs + index)


@dataclass(frozen=True)
class Reading:
    """One GPU's values at one moment."""

    index: int
    uuid: str
    model: str
    job_ids: tuple[int, ...]
    util_pct: float
    sm_active: float
    fb_used_mib: float


def util_profile(binding: dict[str, Any]) -> str:
    """The synthetic profile a job's env asks its simulated GPUs to replay ("" = none or unknown)."""
    env = binding.get("env") or {}
    name = env.get(PROFILE_ENV, "") if isinstance(env, dict) else ""
    return name if isinstance(name, str) and synthetic.is_profile(name) else ""


def trace_path() -> Path | None:
    """``$TESSERA_GPU_UTIL_TRACE``, else the copy packaged with the agent."""
    env = os.environ.get(TRACE_ENV)
    if env:
        return Path(env)
    packaged = resources.files("agent").joinpath("data/pod_gpu_util.csv.gz")
    return Path(str(packaged)) if packaged.is_file() else None


class UtilProfiles:
    """Per-pod utilisation series (percent, one sample a minute)."""

    def __init__(self, profiles: Mapping[str, Sequence[float]], pods: Iterable[str] | None = None):
        """``pods``: those of ``profiles`` with a busy sample, if the caller knows them (then a
        lazy ``profiles`` is read only as far as the jobs ask)."""
        if pods is None:
            pods = (p for p, series in profiles.items() if any(v > 0 for v in series))
        self.pods = sorted(pods)
        self.series: Mapping[str, Sequence[float]] = _Lazy(self.pods, profiles.__getitem__)
        self.first_busy: Mapping[str, int] = _Lazy(
            self.pods, lambda p: next(i for i, v in enumerate(self.series[p]) if v > 0)
        )

    @staticmethod
    def check(path: Path | None = None) -> Path:
        """The trace's path, once its header is read: what the agent checks at its start (parsing
        its rows is a large part of an agent's start-up CPU, which only the first scrape of a busy
        GPU needs: docs/benchmarks/e2e.md)."""
        path = path or trace_path()
        if path is None or not path.is_file():
            where = f"{path} does not exist" if path is not None else "no packaged copy"
            raise FileNotFoundError(f"GPU utilisation trace: {where} (set {TRACE_ENV} to its path)")
        with gzip.open(path, "rt", encoding="utf-8", newline="") as text:
            header = next(csv.reader(text), [])
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(missing)}")
        return path

    @classmethod
    def load(cls, path: Path | None = None) -> UtilProfiles:
        """The trace's profiles; a pod's rows are parsed when a job first replays it (parsing all
        of them was most of an agent's start-up CPU: docs/benchmarks/e2e.md)."""
        path = cls.check(path)
        # Decompressed whole, then decoded: a third of the CPU of reading it as a text stream.
        text = gzip.decompress(path.read_bytes()).decode("utf-8")
        first, _, body = text.partition("\n")
        header = next(csv.reader([first]))
        pod, t_s, util = (header.index(c) for c in COLUMNS)
        runs: dict[str, list[str]] = {}  # pod -> its runs of consecutive lines
        grouped = pod == 0 and '"' not in body  # by its first field, as the packaged trace is
        if grouped:
            for match in _RUN.finditer(body):
                runs.setdefault(match.group(1), []).append(match.group(0))
        else:
            for line in body.splitlines():
                row = next(csv.reader([line]), None)
                if row:
                    runs.setdefault(row[pod], []).append(line)
        if grouped and util == len(header) - 1:  # busy: a line whose last field is above zero
            busy = (name for name in runs if any(_busy_run(run) for run in runs[name]))
        else:
            busy = (name for name in runs if any(float(r[util]) > 0 for r in _rows(runs, name)))
        return cls(_Lazy(list(runs), functools.partial(_series, runs, t_s, util)), busy)

    def pod_for(self, job_id: int) -> str:
        return self.pods[zlib.crc32(str(job_id).encode()) % len(self.pods)]

    def util(self, job_id: int, elapsed_s: float, speed: float = 1.0) -> float:
        """The job's utilisation (percent) ``elapsed_s`` seconds into its run."""
        pod = self.pod_for(job_id)
        series = self.series[pod]
        step = self.first_busy[pod] + int(max(0.0, elapsed_s) * speed / 60.0)
        return series[step % len(series)]


def _rows(runs: Mapping[str, list[str]], name: str) -> Iterator[list[str]]:
    return (row for run in runs[name] for row in csv.reader(run.splitlines()) if row)


def _series(runs: Mapping[str, list[str]], t_s: int, util: int, name: str) -> list[float]:
    """A pod's utilisation samples in time order."""
    return [v for _, v in sorted((float(r[t_s]), float(r[util])) for r in _rows(runs, name))]


# A line's last field when it is not written as zero ("0", "0.0", ".00"...): a candidate sample
# above zero (checked as a number: the regex only skips what cannot be).
_NONZERO_LAST = re.compile(r",(?!(?:0+\.?0*|\.0+)\r?$)([^,\r\n]+)\r?$", re.MULTILINE)


def _busy_run(run: str) -> bool:
    """Has a line of ``run`` a last field above zero? (Most of a pod's samples are never
    converted: a third of loading the packaged trace was telling its busy pods this way.)"""
    for match in _NONZERO_LAST.finditer(run):
        try:
            if float(match.group(1)) > 0:
                return True
        except ValueError:
            continue
    return False


class _Lazy(Mapping[str, _V]):
    """``keys`` mapped by ``make``, each value made when first read, then kept."""

    def __init__(self, keys: Sequence[str], make: Callable[[str], _V]):
        self._keys = dict.fromkeys(keys)
        self._make = make
        self._made: dict[str, _V] = {}

    def __getitem__(self, key: str) -> _V:
        try:
            return self._made[key]
        except KeyError:
            if key not in self._keys:
                raise
        # Two threads may make the same value at once: each the same (a pure function).
        value = self._made[key] = self._make(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def derived(util_pct: float, memory_gib: float) -> tuple[float, float]:
    """(SM active 0..1, framebuffer used MiB) that go with a utilisation, for a busy GPU."""
    util = max(0.0, min(100.0, util_pct))
    total_mib = memory_gib * 1024
    return round(0.85 * util / 100, 4), round(total_mib * (0.35 + 0.45 * util / 100), 1)


class GpuCollector(Collector):
    """Builds the three series at scrape time from the agent's view of its GPUs."""

    def __init__(
        self,
        inventory: Inventory,
        uses: Callable[[], dict[int, list[GpuUse]]],
        profiles: Callable[[], UtilProfiles] | None = None,
        util_speed: float = 1.0,
        nvml_reader: Callable[[int], tuple[float, float, float]] | None = None,
    ):
        """``profiles``: loads the simulated GPUs' profiles, called once, by the first scrape that
        finds a job on a simulated GPU."""
        self.inventory = inventory
        self.uses = uses
        self.load_profiles = profiles
        self._profiles: UtilProfiles | None = None
        self._load_lock = threading.Lock()
        self.util_speed = util_speed
        self.nvml_reader = nvml_reader

    def collect(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=LABELS)
        sm = GaugeMetricFamily(
            "DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least 1 warp assigned.", labels=LABELS
        )
        fb = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=LABELS)
        for r in self.readings():
            job = ",".join(str(j) for j in r.job_ids)
            labels = [str(r.index), r.uuid, self.inventory.name, r.model, job]
            util.add_metric(labels, r.util_pct)
            sm.add_metric(labels, r.sm_active)
            fb.add_metric(labels, r.fb_used_mib)
        yield util
        yield sm
        yield fb

    def readings(self) -> list[Reading]:
        """Every GPU's values now: what a scrape exports and a heartbeat reports."""
        uses = self.uses()
        out = []
        for device in self.inventory.devices:
            on_it = uses.get(device.index, [])
            jobs = tuple(sorted({u.job_id for u in on_it}))
            values = self._values(device.index, device.memory_gib, on_it)
            out.append(Reading(device.index, device.uuid, device.model, jobs, *values))
        return out

    def report(self) -> list[dict[str, Any]]:
        """The heartbeat's ``utilisation``: each GPU a job holds, with its jobs and how busy it is
        now (docs/agent.md): the server's own view of utilisation where no Prometheus scrapes."""
        return [
            {"gpu": r.index, "job_ids": list(r.job_ids), "util": r.util_pct, "sm_active": r.sm_active}
            for r in self.readings()
            if r.job_ids
        ]

    def profiles(self) -> UtilProfiles:
        with self._load_lock:
            if self._profiles is None:
                assert self.load_profiles is not None
                self._profiles = self.load_profiles()
            return self._profiles

    def _values(self, index: int, memory_gib: float, on_it: list[GpuUse]) -> tuple[float, float, float]:
        if self.nvml_reader is not None:
            try:
                return self.nvml_reader(index)
            except Exception:  # a GPU that fell off the bus must not break the whole scrape
                log.warning("NVML read of GPU %d failed", index, exc_info=True)
                return 0.0, 0.0, 0.0
        if not on_it:
            return 0.0, 0.0, 0.0
        if self.load_profiles is None and not all(u.profile for u in on_it):
            return 0.0, 0.0, 0.0
        total = sum(self._util(u) * u.share for u in on_it)
        total = min(100.0, total)
        sm_active, fb_used = derived(total, memory_gib)
        return total, sm_active, fb_used

    def _util(self, use: GpuUse) -> float:
        if use.profile:
            minute = use.elapsed_s * self.util_speed / 60.0
            return synthetic.util(use.profile, use.job_id, minute, use.rank)
        return self.profiles().util(use.job_id, use.elapsed_s, self.util_speed)


def nvml_reader() -> Callable[[int], tuple[float, float, float]]:
    """Read utilisation and memory of a real GPU (NVML already initialised by discovery)."""
    import pynvml  # only on a node with NVIDIA GPUs: a simulated agent never loads NVML

    def read(index: int) -> tuple[float, float, float]:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        util = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        used_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        return util, round(util / 100, 4), round(used_mib, 1)

    return read


def make_registry(collector: GpuCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def serve(registry: CollectorRegistry, port: int, addr: str) -> WSGIServer:
    """Serve ``/metrics`` on a daemon thread; returns the server (``server_port`` is the real port)."""
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server

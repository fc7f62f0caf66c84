"""Generate a dynamic workload: ``nodes.csv``, ``jobs.csv`` and ``quotas.csv`` (docs/formats.md).

openb gives real request sizes but no load over time; this module writes the workloads it cannot:
tenants with quotas, inference services, multi-node gangs, fine-tunes, short batch jobs. The shapes
follow what the Philly (ATC'19), Helios (SC'21) and PAI (NSDI'22) trace studies report: most jobs
ask for one GPU and run minutes, most GPU-time goes to a few large, long jobs, users' time
estimates are mostly far too long, and arrivals follow the working day. Everything is drawn from
``random.Random(seed)``: the same arguments write the same files.

Cluster (``--gpus``, default 600): three pools of racks — H100 nodes (8 GPUs, one NVLink island
of 8, label ``net:ib``), A100 nodes (8 GPUs, islands of 4), T4 nodes (4 PCIe GPUs, islands of 1) —
in the ratio ~48 : 45 : 7 of GPUs, 8 nodes a rack (2 below 300 GPUs).

Tenants: ``prod`` (weight 2), ``vision``, ``nlp``, ``speech``, ``research``. On every model each
is guaranteed its fixed fraction (30/25/20/15/10%) of the model's GPUs — the guarantees sum to the
cluster — and may use up to 2.5× its guarantee (at most the model's whole capacity).

Jobs (fractions of the number of jobs; durations are lognormal with the given median and σ of
the log, capped; ``work`` is ``duration_s`` on the GPUs asked for):

| kind | share | GPUs | median, σ, cap | other |
| --- | --- | --- | --- | --- |
| batch | 50% | 1 (77%), 2 (10%), ½ (10%), 0 (3%) | 12 min, 1.4, 12 h | priority 0; ckpt 10 min (20%) |
| inference | 10% | ¼ (20%), ½ (25%), 1 (40%), 2 (15%) | 3 h, 1.0, 2 d | not preemptible, prio 100 |
| finetune | 22% | 1/2/4/8 (35/25/25/15%) | 80 min, 1.0, 2 d | `nvlink` 40% of multi-GPU; ckpt 15/30 min |
| training, one node | 13.5% | 1/2/4/8 (20/20/25/35%) | 3 h, 1.2, 7 d | checkpoint 30/60 min |
| training, gang | 4.5% | 8 (2×4), 16, 32, 64 (8 a replica) | 2 h, 1.1, 7 d | `rack` 40%, elastic 30% |

Gangs: elastic ones range from half their GPUs to all of them; 10% ask `net:ib` (H100 only).
Models (chosen so that each pool's share of the demand is about its share of the GPUs):
batch any (50%), T4 (20%), A100|T4 (30%) (CPU-only ones: any); inference T4|A100 (50%), any (25%),
A100 (15%), H100 (10%); fine-tunes of 1–2 GPUs H100|A100 (40%), A100|T4 (30%), A100 (15%), H100
(15%), larger ones H100|A100 (50%), A100 (25%), H100 (25%; every 8-GPU `nvlink` one: H100);
training H100|A100 (50%), H100 (25%), A100 (25%), a fifth of the one-node ones of ≤ 4 GPUs T4|A100.
CPUs 4–8 and memory 32 GiB per GPU (2 CPUs, 8 GiB for a fraction).

Time limits (the user's estimate): missing for 20% (60% of inference), too short for 10%
(0.5–0.9× the duration: the job fails with `time-limit`), too long for the rest (1.2–5×, rounded
up to the hour). Arrivals: a Poisson process whose rate follows the day, peaking at 14:00 at 3× the
04:00 trough.

Load: jobs are drawn until Σ(GPUs × duration) reaches ``load`` × cluster GPUs × arrival span, the
last one trimmed; then every duration is scaled by the tiny factor that makes the realised load —
measured on the written file, span = last submit − first submit — equal ``load``.

Scenarios (:class:`Scenario`, ``generate --skew``, ``--steady-share`` …) bend that workload the
ways held-out workloads differ from it; their defaults leave it as above, file for file. Their own
draws come from a second generator (seeded from ``seed``), so the base draws stay the same:

- *demand skew*: one tenant's training on one model is made its own (and not preemptible) until it
  asks ``k`` times its guarantee there (Σ GPUs × duration ÷ span), taken from the other tenants;
- *non-preemptible share*: that share of the training and fine-tune jobs is not preemptible;
- *guarantee tightness*: the guarantees of every model sum to that fraction of its GPUs;
- *gang share*: that share of training jobs are multi-node gangs (default 25%);
- *limit overestimate*: time limits are drawn ``lo``–``hi`` × the duration (default 1.2–5);
- *burstiness*: each job arrives with the one before it with that chance (bursts of submits);
- *recurring jobs*: every job gets a user (one of :data:`USERS` of its tenant) and a name, and
  that share of the jobs rerun an earlier job of their tenant: the same user, name and shape, a
  duration within about a fifth of the first run's (lognormal, σ 0.2) and its time limit. Only
  then does ``jobs.csv`` get the ``user`` and ``name`` columns.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from scheduling.sim.traces import JOB_COLUMNS, JOB_OPTIONAL, JOB_RECURRING, NODE_COLUMNS, QUOTA_COLUMNS

DAY = 86_400.0
TENANTS = (("prod", 0.30, 2.0), ("vision", 0.25, 1.0), ("nlp", 0.20, 1.0),
           ("speech", 0.15, 1.0), ("research", 0.10, 1.0))  # fmt: skip
LIMIT_FACTOR = 2.5
#: model -> (GPUs a node, NVLink island, CPUs, memory GiB, GPU memory GiB, price per GPU-hour)
MODELS = {
    "H100": (8, 8, 128, 2048, 80, 4.0),
    "A100": (8, 4, 96, 1024, 80, 2.0),
    "T4": (4, 1, 48, 256, 16, 0.5),
}


@dataclass(frozen=True)
class Scenario:
    """Knobs bending the default workload (module docstring); the defaults leave it as it is."""

    skew_tenant: str = ""
    skew_model: str = ""
    skew_factor: float = 0.0  # 0: no skew
    steady_share: float = 0.0
    tightness: float = 1.0
    gang_share: float = 0.25
    limit_over: tuple[float, float] = (1.2, 5.0)
    burst: float = 0.0
    recurring: float = 0.0

    def check(self) -> None:
        tenants = [name for name, _, _ in TENANTS]
        if self.skew_factor and (self.skew_tenant not in tenants or self.skew_model not in MODELS):
            raise ValueError(
                f"--skew needs TENANT:MODEL:K with a tenant of {tenants} and a model of {list(MODELS)}"
            )
        if self.skew_factor < 0:
            raise ValueError("--skew: K must be positive")
        for name in ("steady_share", "gang_share", "burst", "recurring"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"--{name.replace('_', '-')} must be between 0 and 1")
        if not 0 < self.tightness <= 1:
            raise ValueError("--tightness must be in (0, 1]")
        lo, hi = self.limit_over
        if not 0 < lo <= hi:
            raise ValueError("--limit-over must be LO,HI with 0 < LO <= HI")


DEFAULT = Scenario()


@dataclass
class Job:
    kind: str
    gpus: float
    duration: float
    replicas: int = 1
    model: str = ""
    priority: int = 0
    preemptible: bool = True
    topology: str = ""
    min_gpus: int | None = None
    max_gpus: int | None = None
    checkpoint: float | None = None
    grace: float | None = None
    selector: str = ""
    tenant: str = ""
    submit: float = 0.0
    limit: float | None = None
    cpus: float = 0.0
    memory: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)
    user: str = ""
    name: str = ""
    rerun_of: int = -1  # index of the job it reruns (recurring jobs), -1: none


@dataclass(frozen=True)
class Cluster:
    nodes: list[dict[str, object]]
    gpus_by_model: dict[str, int]

    @property
    def gpus(self) -> int:
        return sum(self.gpus_by_model.values())


def make_cluster(gpus: int = 600) -> Cluster:
    """Racks of H100, A100 and T4 nodes adding up to about ``gpus`` GPUs."""
    if gpus < 8:
        raise ValueError("--gpus must be at least 8")
    per_rack = 8 if gpus >= 300 else 2
    h100 = max(per_rack, round(gpus * 0.48 / 8))
    a100 = max(per_rack, round(gpus * 0.45 / 8))
    t4 = max(1, round((gpus - 8 * h100 - 8 * a100) / 4))
    nodes: list[dict[str, object]] = []
    counts = {"H100": h100, "A100": a100, "T4": t4}
    rack_no = 0
    for model, count in counts.items():
        for i in range(count):
            if i % per_rack == 0:
                rack_no += 1
            nodes.append(node_row(model, i, rack_no))
    return Cluster(nodes, {m: c * MODELS[m][0] for m, c in counts.items()})


def size_host_share(rng: random.Random, job: Job) -> None:
    """The CPUs and memory ``job`` asks beside its GPUs (4 or 8 CPUs and 32 GiB a GPU; a
    fraction of a GPU: 2 CPUs, 8 GiB)."""
    per_gpu_cpu = float(rng.choice((4, 8)))
    if 0 < job.gpus < 1:
        job.cpus, job.memory = 2.0, 8.0
    else:
        job.cpus = max(1.0, job.gpus * per_gpu_cpu)
        job.memory = max(8.0, job.gpus * 32.0)


def node_row(model: str, index: int, rack: int) -> dict[str, object]:
    """The ``nodes.csv`` row of the ``index``-th (from 0) node of ``model`` in rack ``rack``."""
    size, island, cpus, mem, gmem, price = MODELS[model]
    return {
        "node": f"{model.lower()}-{index + 1:03d}", "rack": f"r{rack:02d}", "gpus": size,
        "model": model, "gpu_memory_gib": gmem, "nvlink_domain": island, "cpus": cpus,
        "memory_gib": mem, "price_per_gpu_hour": price,
        "labels": "net:ib" if model == "H100" else "",
    }  # fmt: skip


def _pick(rng: random.Random, table: list[tuple[object, float]]) -> object:
    x, acc = rng.random(), 0.0
    for value, p in table:
        acc += p
        if x < acc:
            return value
    return table[-1][0]


def _lognormal(rng: random.Random, median: float, sigma: float, cap: float) -> float:
    return min(cap, max(30.0, median * math.exp(rng.gauss(0.0, sigma))))


def draw_job(rng: random.Random, max_gang: int, gang_share: float = 0.25) -> Job:
    """One job's shape (everything but tenant, arrival and time limit)."""
    kind = _pick(rng, [("batch", 0.50), ("inference", 0.10), ("finetune", 0.22),
                       ("training", 0.18)])  # fmt: skip
    if kind == "batch":
        gpus = float(_pick(rng, [(1, 0.77), (2, 0.10), (0.5, 0.10), (0, 0.03)]))  # type: ignore[arg-type]
        job = Job("batch", gpus, _lognormal(rng, 720, 1.4, 12 * 3600))
        job.model = str(_pick(rng, [("", 0.5), ("T4", 0.2), ("A100|T4", 0.3)]))
        if gpus == 0:
            job.model = ""  # a CPU-only job names no GPU model
        if rng.random() < 0.2:
            job.checkpoint = 600.0
        return job
    if kind == "inference":
        gpus = float(_pick(rng, [(0.25, 0.2), (0.5, 0.25), (1, 0.4), (2, 0.15)]))  # type: ignore[arg-type]
        job = Job("inference", gpus, _lognormal(rng, 3 * 3600, 1.0, 2 * DAY))
        job.model = str(_pick(rng, [("T4|A100", 0.5), ("", 0.25), ("A100", 0.15), ("H100", 0.1)]))
        job.priority, job.preemptible = 100, False
        return job
    if kind == "finetune":
        gpus = float(_pick(rng, [(1, 0.35), (2, 0.25), (4, 0.25), (8, 0.15)]))  # type: ignore[arg-type]
        job = Job("finetune", gpus, _lognormal(rng, 4800, 1.0, 2 * DAY), priority=5)
        if gpus <= 2:
            job.model = str(
                _pick(rng, [("H100|A100", 0.4), ("A100|T4", 0.3), ("A100", 0.15), ("H100", 0.15)])
            )
        else:
            job.model = str(_pick(rng, [("H100|A100", 0.5), ("A100", 0.25), ("H100", 0.25)]))
        if gpus > 1 and rng.random() < 0.4:
            job.topology = "nvlink"
            if gpus > 4:
                job.model = "H100"
        job.checkpoint = float(rng.choice((900, 1800)))
        return job
    job = Job("training", 1.0, 0.0, priority=10, grace=float(rng.choice((60, 120))))
    job.checkpoint = float(rng.choice((1800, 3600)))
    job.model = str(_pick(rng, [("H100|A100", 0.5), ("H100", 0.25), ("A100", 0.25)]))
    if rng.random() < gang_share and max_gang >= 8:
        sizes = [s for s in (8, 16, 32, 64) if s <= max_gang]
        weights = {8: 0.2, 16: 0.3, 32: 0.3, 64: 0.2}
        gpus = float(_pick(rng, [(s, weights[s] / sum(weights[x] for x in sizes)) for s in sizes]))  # type: ignore[arg-type]
        job.gpus, job.replicas = gpus, (2 if gpus == 8 else int(gpus) // 8)
        job.duration = _lognormal(rng, 2 * 3600, 1.1, 7 * DAY)
        if rng.random() < 0.4:
            job.topology = "rack"
        if rng.random() < 0.3:
            per = int(gpus) // job.replicas
            job.min_gpus, job.max_gpus = max(per, int(gpus) // 2 // per * per), int(gpus)
        if rng.random() < 0.1:
            job.selector, job.model = "net:ib", "H100"
    else:
        job.gpus = float(_pick(rng, [(1, 0.2), (2, 0.2), (4, 0.25), (8, 0.35)]))  # type: ignore[arg-type]
        job.duration = _lognormal(rng, 3 * 3600, 1.2, 7 * DAY)
        if job.gpus <= 4 and rng.random() < 0.2:
            job.model = "T4|A100"
    return job


def _time_limit(rng: random.Random, job: Job, over: tuple[float, float] = (1.2, 5.0)) -> float | None:
    if rng.random() < (0.6 if job.kind == "inference" else 0.2):
        return None
    if rng.random() < 0.125:  # 10% of all jobs: too short
        return round(job.duration * rng.uniform(0.5, 0.9))
    return math.ceil(job.duration * rng.uniform(*over) / 3600) * 3600


def _arrivals(rng: random.Random, count: int, span: float) -> list[float]:
    """``count`` sorted arrival times in [0, span) from a day-shaped rate (peak 14:00, 3× 04:00)."""
    out: list[float] = []
    while len(out) < count:
        t = rng.random() * span
        rate = 0.5 + 0.25 * math.cos(2 * math.pi * ((t % DAY) / DAY - 14 / 24))  # 0.25..0.75
        if rng.random() * 0.75 < rate:
            out.append(round(t, 1))
    out.sort()
    return out


def realised_load(jobs: list[Job], cluster_gpus: int) -> float:
    """Σ(GPUs × duration) ÷ (cluster GPUs × (last submit − first submit))."""
    span = max(j.submit for j in jobs) - min(j.submit for j in jobs)
    work = sum(j.gpus * j.duration for j in jobs)
    return work / (cluster_gpus * span) if span > 0 else float("inf")


def generate_workload(
    seed: int, days: float, load: float, gpus: int = 600, scenario: Scenario = DEFAULT
) -> tuple[Cluster, list[Job]]:
    """The cluster and its jobs, in submit order, with the realised load equal to ``load``."""
    if days <= 0 or load <= 0:
        raise ValueError("--days and --load must be positive")
    scenario.check()
    rng = random.Random(seed)
    knobs = random.Random(f"scenario-{seed}")
    cluster = make_cluster(gpus)
    span = days * DAY
    target = load * cluster.gpus * span
    max_gang = min(64, cluster.gpus_by_model["H100"] // 2)
    jobs: list[Job] = []
    work = 0.0
    while work < target:
        job = draw_job(rng, max_gang, scenario.gang_share)
        if job.gpus * job.duration + work > target and job.gpus > 0:
            job.duration = max(60.0, (target - work) / job.gpus)  # trim the last one
        work += job.gpus * job.duration
        jobs.append(job)
    if len(jobs) < 2:
        raise ValueError("the load and span are too small to draw two jobs")
    arrivals = _arrivals(rng, len(jobs), span)
    for i in range(1, len(arrivals)):
        if scenario.burst and knobs.random() < scenario.burst:
            arrivals[i] = arrivals[i - 1]
    for job, t in zip(jobs, arrivals, strict=True):
        job.submit = t
        tenant = _pick(rng, [(name, share) for name, share, _ in TENANTS])
        job.tenant = "prod" if job.kind == "inference" and rng.random() < 0.5 else str(tenant)
    if scenario.recurring:
        _recur(knobs, jobs, scenario.recurring)
    realised = realised_load(jobs, cluster.gpus)
    if not math.isfinite(realised):  # no span to measure a load over, nor to scale durations to
        raise ValueError(
            "every job would arrive at one instant (no span between the first and last submit); "
            "lower --burst or raise --days"
        )
    scale = load / realised
    for job in jobs:
        job.duration = min(7 * DAY, max(1.0, round(job.duration * scale, 1)))
        job.limit = _time_limit(rng, job, scenario.limit_over)
        if job.rerun_of >= 0:
            job.limit = jobs[job.rerun_of].limit  # a rerun keeps its first run's time limit
        size_host_share(rng, job)
    if scenario.steady_share:
        for job in jobs:
            if job.kind in ("training", "finetune") and knobs.random() < scenario.steady_share:
                job.preemptible = False
    if scenario.skew_factor:
        _skew(knobs, cluster, jobs, scenario, span)
    return cluster, jobs


def _skew(rng: random.Random, cluster: Cluster, jobs: list[Job], scenario: Scenario, span: float) -> None:
    """Give ``skew_tenant`` other tenants' training jobs, moved to ``skew_model`` (those that
    accepted it first) and not preemptible, until its demand there is ``skew_factor`` × its
    guarantee."""
    share = dict((name, s) for name, s, _ in TENANTS)[scenario.skew_tenant]
    model = scenario.skew_model
    want = scenario.skew_factor * cluster.gpus_by_model[model] * share * scenario.tightness * span
    mine = [j for j in jobs if j.tenant == scenario.skew_tenant and j.kind == "training" and j.model == model]
    for j in mine:
        j.preemptible = False
    have = sum(j.gpus * j.duration for j in mine)
    pool = [
        j
        for j in jobs
        if j.kind == "training" and not (j.tenant == scenario.skew_tenant and j.model == model)
    ]
    rng.shuffle(pool)
    pool.sort(key=lambda j: model not in j.model.split("|"))  # jobs that ran there already first
    for j in pool:
        if have >= want:
            break
        j.tenant, j.model, j.preemptible = scenario.skew_tenant, model, False
        if j.selector == "net:ib" and model != "H100":
            j.selector = ""
        have += j.gpus * j.duration


USERS = 6  # users per tenant (recurring jobs)
RERUN_SIGMA = 0.2
_SHAPE = ("kind", "gpus", "replicas", "model", "priority", "preemptible", "topology", "min_gpus",
          "max_gpus", "checkpoint", "grace", "selector")  # fmt: skip


def _recur(rng: random.Random, jobs: list[Job], share: float) -> None:
    """Users and names; ``share`` of the jobs rerun an earlier first run of their tenant."""
    firsts: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        earlier = firsts.get(job.tenant, [])
        if earlier and rng.random() < share:
            index = rng.choice(earlier)
            first = jobs[index]
            for attr in _SHAPE:
                setattr(job, attr, getattr(first, attr))
            job.user, job.name, job.rerun_of = first.user, first.name, index
            job.duration = min(7 * DAY, max(30.0, first.duration * math.exp(rng.gauss(0.0, RERUN_SIGMA))))
            continue
        job.user = f"{job.tenant}-{rng.randrange(USERS) + 1}"
        job.name = f"{job.kind}-{i + 1}"
        firsts.setdefault(job.tenant, []).append(i)


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:.10g}"


def write_workload(
    out: str | Path, cluster: Cluster, jobs: list[Job], scenario: Scenario = DEFAULT
) -> dict[str, float]:
    """Write the three files into ``out`` and return a few facts about them."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "nodes.csv", "w", newline="", encoding="utf-8") as fh:
        nodes_w = csv.DictWriter(fh, fieldnames=[*NODE_COLUMNS, "labels"])
        nodes_w.writeheader()
        nodes_w.writerows(cluster.nodes)
    with open(out / "jobs.csv", "w", newline="", encoding="utf-8") as fh:
        rows_w = csv.writer(fh)
        recurring = [*JOB_RECURRING] if scenario.recurring else []
        rows_w.writerow([*JOB_COLUMNS, *JOB_OPTIONAL, *recurring])
        for i, j in enumerate(jobs):
            named = [j.user, j.name] if recurring else []
            rows_w.writerow([
                f"j{i + 1}", j.tenant, j.kind, _fmt(j.submit), _fmt(j.duration), _fmt(j.gpus),
                j.replicas, j.model, j.priority, str(j.preemptible).lower(), _fmt(j.limit),
                _fmt(j.cpus), _fmt(j.memory), j.topology, _fmt(j.min_gpus), _fmt(j.max_gpus),
                _fmt(j.checkpoint), _fmt(j.grace), "", j.selector, *named,
            ])  # fmt: skip
    with open(out / "quotas.csv", "w", newline="", encoding="utf-8") as fh:
        rows_w = csv.writer(fh)
        rows_w.writerow(QUOTA_COLUMNS)
        for name, share, weight in TENANTS:
            for model, total in cluster.gpus_by_model.items():
                limit = min(float(total), round(round(total * share, 2) * LIMIT_FACTOR, 2))
                guaranteed = round(total * share * scenario.tightness, 2)
                rows_w.writerow([name, model, _fmt(guaranteed), _fmt(limit), _fmt(weight)])
    return {
        "jobs": len(jobs),
        "gpus": cluster.gpus,
        "load": realised_load(jobs, cluster.gpus),
    }


def generate(
    out: str | Path, seed: int, days: float, load: float, gpus: int = 600, scenario: Scenario = DEFAULT
) -> dict:
    cluster, jobs = generate_workload(seed, days, load, gpus, scenario)
    return write_workload(out, cluster, jobs, scenario)

"""Shared builders for the engine tests: small clusters and workloads, no database."""

from __future__ import annotations

from hypothesis import strategies as st

from scheduling.engine.runtimes import KEEP
from scheduling.engine.types import FinishedRun, JobRequest, NodeSpec, QuotaSpec

MODELS = ("H100", "A100", "T4")


def node(
    name: str,
    model: str = "H100",
    gpus: int = 8,
    nvlink: int = 8,
    rack: str = "r0",
    cpus: float = 64,
    memory_gib: float = 512,
    **kw,
) -> NodeSpec:
    labels = tuple(sorted({("rack", rack), *kw.pop("labels", ())}))
    return NodeSpec(
        name, rack, model, gpus, nvlink_domain=nvlink, cpus=cpus, memory_gib=memory_gib, labels=labels, **kw
    )


@st.composite
def clusters(draw, max_nodes: int = 6) -> list[NodeSpec]:
    n = draw(st.integers(1, max_nodes))
    out = []
    for i in range(n):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        nvlink = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= gpus]))
        model = draw(st.sampled_from(MODELS))
        zone = draw(st.sampled_from(["a", "b"]))
        out.append(
            node(
                f"n{i:02d}",
                model,
                gpus,
                nvlink,
                rack=f"r{i // 2}",
                cpus=draw(st.sampled_from([0, 32, 96])),
                labels=(("zone", zone),),
            )
        )
    return out


@st.composite
def jobs(draw, count: int = 12) -> list[JobRequest]:
    out = []
    n = draw(st.integers(1, count))
    for i in range(n):
        kind = draw(st.sampled_from(["inference", "training", "finetune", "batch"]))
        shape = draw(st.sampled_from(["frac", "one", "two", "four", "eight", "cpu", "gang"]))
        replicas = 1
        gpus: float = {"frac": 0.25, "one": 1, "two": 2, "four": 4, "eight": 8, "cpu": 0, "gang": 4}[shape]
        if shape == "frac":
            gpus = draw(st.sampled_from([0.25, 0.5, 0.46, 0.75]))
        if shape == "gang":
            replicas = draw(st.sampled_from([2, 4]))
            gpus = replicas * draw(st.sampled_from([1, 2]))
        topology = draw(st.sampled_from(["any", "any", "node", "nvlink", "rack"]))
        if gpus < 1:
            topology = "any"
        accel = draw(st.sampled_from([(), (), ("H100",), ("A100", "H100"), ("T4",)]))
        selector = draw(st.sampled_from([(), (), (("zone", "a"),)]))
        elastic = shape == "gang" and draw(st.booleans())
        out.append(
            JobRequest(
                id=f"j{i:03d}",
                tenant=draw(st.sampled_from(["vision", "nlp", "speech"])),
                kind=kind,
                gpus=gpus,
                replicas=replicas,
                accelerators=accel,
                topology=topology,
                priority=draw(st.integers(0, 3)),
                preemptible=kind != "inference",
                cpus=draw(st.sampled_from([0, 4, 16])),
                node_selector=selector,
                time_limit_s=draw(st.sampled_from([None, 600.0, 3600.0])),
                elastic_min_gpus=int(gpus // replicas) if elastic else None,
                elastic_max_gpus=int(gpus) * 2 if elastic else None,
                submitted_at=float(i),
            )
        )
    return out


@st.composite
def quota_sets(draw) -> list[QuotaSpec]:
    if draw(st.booleans()):
        return []
    out = []
    for t in ("vision", "nlp", "speech"):
        g = draw(st.integers(0, 8))
        out.append(QuotaSpec(t, "*", g, g + draw(st.integers(0, 16)), 1.0))
    return out


# Few values of each field, so that keys share runs, runs tie on their end, and the same run
# comes twice (a live read overlapping what was recorded).
finished_runs = st.lists(
    st.builds(
        FinishedRun,
        job_id=st.sampled_from([f"j{i}" for i in range(6)]),
        tenant=st.sampled_from(["a", "b"]),
        kind=st.sampled_from(["batch", "training"]),
        runtime_s=st.sampled_from([-5.0, 0.0, 30.0, 60.0, 600.0, 7200.0]),
        ended_at=st.sampled_from([0.0, 1.0, 2.0, 50.0]),
        outcome=st.sampled_from(["succeeded", "failed", "preempted", "cancelled"]),
        user=st.sampled_from(["", "u1", "u2"]),
        name=st.sampled_from(["", "train"]),
    ),
    max_size=3 * KEEP,
)

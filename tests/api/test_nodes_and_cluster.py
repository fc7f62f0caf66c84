"""Nodes with their devices, and the cluster's totals."""

from __future__ import annotations

import pytest

from scheduling.models import Device, Node
from tests.api.helpers import bind, make_node, run, submit


def test_nodes_list_their_devices_and_states(world, alice_job):
    Device.objects.filter(node__name="n02", index=3).update(healthy=False)
    nodes = {n["name"]: n for n in world.client("admin").get("/api/v1/nodes/").json()["results"]}
    assert set(nodes) == {"n01", "n02"}
    n01 = nodes["n01"]
    assert (n01["rack"], n01["gpus"], n01["models"], n01["nvlink_domain"]) == ("r1", 8, ["H100"], 8)
    states = [d["state"] for d in n01["devices"]]
    assert states == ["allocated"] * 2 + ["free"] * 6
    assert n01["devices"][0]["jobs"] == [
        {"job_id": alice_job.pk, "tenant": "vision", "share": 1.0, "replica": 0}
    ]
    assert [d["state"] for d in nodes["n02"]["devices"]] == ["free"] * 3 + ["unhealthy"]


def test_a_shared_gpu_shows_each_tenants_use_and_hides_the_others(world, cluster):
    mine = submit(world.alice, world.vision, gpus=0.5)
    theirs = submit(world.bob, world.nlp, gpus=0.25)
    bind(mine, cluster["n02"], [0], share=0.5)
    bind(theirs, cluster["n02"], [0], share=0.25)
    device = world.client("alice").get("/api/v1/nodes/n02/").json()["devices"][0]
    assert device["state"] == "shared" and device["used"] == 0.75
    assert sorted(device["jobs"], key=lambda j: j["share"]) == [
        {"job_id": None, "tenant": None, "share": 0.25, "replica": None},
        {"job_id": mine.pk, "tenant": "vision", "share": 0.5, "replica": 0},
    ]


def test_an_unknown_node_is_a_404(world, cluster):
    client = world.client("alice")
    assert client.get("/api/v1/nodes/n99/").status_code == 404
    assert client.get("/api/v1/nodes/" + "n" * 300 + "/").status_code == 404


def test_nodes_filter_by_state_rack_kind_and_device_model(world, cluster):
    make_node("n03", "H100", 2, "r2")
    Node.objects.filter(name="n02").update(state="cordoned")
    client = world.client("carol")

    def names(**params: str) -> list[str]:
        page = client.get("/api/v1/nodes/", params).json()
        assert page["count"] == len(page["results"])
        return [n["name"] for n in page["results"]]

    assert names(rack="r2") == ["n02", "n03"]
    assert names(model="H100") == ["n01", "n03"]  # n01 has 8 of them: listed once
    assert names(state="cordoned") == ["n02"]
    assert names(rack="r2", model="H100") == ["n03"]
    assert names(kind="gpu") == ["n01", "n02", "n03"] and names(kind="cpu") == []


@pytest.mark.parametrize("param", [{"state": "asleep"}, {"rack": "r\x00"}, {"model": "m" * 65}])
def test_a_bad_node_filter_is_a_400_naming_it(world, cluster, param):
    response = world.client("alice").get("/api/v1/nodes/", param)
    assert response.status_code == 400 and list(response.json()) == list(param)


def test_listing_nodes_takes_a_fixed_number_of_queries(world, cluster, django_assert_max_num_queries):
    for i in range(3, 13):
        make_node(f"n{i:02}", "T4", 4)
    job = submit(world.alice, world.vision, gpus=2)
    bind(job, cluster["n01"], [0, 1])
    with django_assert_max_num_queries(8):  # with the token's first use (written once a minute)
        nodes = world.client("carol").get("/api/v1/nodes/").json()
    assert nodes["count"] == 12


def test_cluster_totals_count_gpus_by_model_and_state_and_queues(world, cluster):
    running = submit(world.alice, world.vision, gpus=4)
    bind(running, cluster["n01"], [0, 1, 2, 3])
    run(running)
    shared = submit(world.bob, world.nlp, gpus=0.5)
    bind(shared, cluster["n02"], [0], share=0.5)
    submit(world.alice, world.vision, kind="inference")
    submit(world.bob, world.nlp, kind="batch")
    submit(world.bob, world.nlp, kind="batch")
    Device.objects.filter(node__name="n02", index=3).update(healthy=False)
    totals = world.client("bob").get("/api/v1/cluster/").json()
    assert totals["gpus"] == 12
    assert totals["gpus_by_model"]["H100"] == {
        "total": 8,
        "free": 4,
        "allocated": 4,
        "shared": 0,
        "unhealthy": 0,
        "allocated_capacity": 4.0,
    }
    assert (
        totals["gpus_by_model"]["A100"]["shared"] == 1 and totals["gpus_by_model"]["A100"]["unhealthy"] == 1
    )
    assert totals["allocated_gpus"] == 4.5
    assert totals["allocation_rate"] == pytest.approx(4.5 / 11)
    assert totals["queue_lengths"] == {"inference": 1, "training": 0, "finetune-batch": 2}
    assert totals["jobs_by_state"]["running"] == 1 and totals["jobs_by_state"]["scheduled"] == 1
    assert totals["nodes_by_state"]["ready"] == 2
    assert 0 <= totals["fragmentation_rate"] <= 1


def test_fragmentation_counts_free_gpus_the_typical_request_cannot_use(world, cluster):
    # The typical request is 4 whole GPUs on one node (one replica). n01 has 8 free: all usable.
    for _ in range(3):
        submit(world.alice, world.vision, gpus=4)
    assert world.client("alice").get("/api/v1/cluster/").json()["fragmentation_rate"] == pytest.approx(0.0)
    # Leave 3 free GPUs on each node. The mix is now 4,4,4,5,1 GPUs: the 4- and 5-GPU requests
    # (p = 0.6 + 0.2) fit nowhere and cannot use any of the 6 free GPUs; the 1-GPU one (p = 0.2)
    # can use them all. Rate = (0.8 * 6 + 0.2 * 0) / 6.
    blocker = submit(world.bob, world.nlp, gpus=5)
    bind(blocker, cluster["n01"], [0, 1, 2, 3, 4])
    small = submit(world.bob, world.nlp, gpus=1)
    bind(small, cluster["n02"], [0])
    assert world.client("alice").get("/api/v1/cluster/").json()["fragmentation_rate"] == pytest.approx(0.8)


def test_cluster_totals_take_a_fixed_number_of_queries(world, cluster, django_assert_max_num_queries):
    for i in range(3, 13):
        make_node(f"n{i:02}", "T4", 4)
    for i in range(4):
        job = submit(world.alice, world.vision, gpus=1)
        bind(job, cluster["n01"], [i])
    submit(world.bob, world.nlp, gpus=2)
    # token (and its first use), devices, allocations, pending by level, jobs by state, nodes by
    # state, recent jobs, ready nodes, CPU use of holding jobs
    with django_assert_max_num_queries(10):
        totals = world.client("bob").get("/api/v1/cluster/").json()
    assert totals["gpus"] == 52 and totals["allocated_gpus"] == 4


def test_an_empty_cluster_has_zero_rates(world):
    totals = world.client("alice").get("/api/v1/cluster/").json()
    assert (totals["gpus"], totals["allocation_rate"], totals["fragmentation_rate"]) == (0, 0.0, 0.0)
    assert Node.objects.count() == 0

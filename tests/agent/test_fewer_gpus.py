"""An agent restarted with fewer GPUs than its node had, while jobs are bound to its GPUs.

The device rows stay while history holds them (``_sync_devices``: unhealthy, or deleted when
nothing ever held them), so a node's devices may leave gaps in their indices, and an operator
may mark a device a job holds unhealthy. The scheduling pass must go on with such a node: it used
to raise (an index past the node's GPUs, or ``GPU 1 of gpu-01 has 0 milli free``) on every pass
that had a job to place, for the whole cluster, until the holder ended. And a job bound to a GPU
the agent no longer has goes back to the queue: its binding could not start there.
"""

from __future__ import annotations

from scheduling.choices import EventType, JobState
from scheduling.models import Device, Job
from scheduling.services.passes import run_pass
from tests.agent import helpers as h


def test_passes_go_on_with_a_gap_in_a_nodes_gpus_and_a_held_gpu_marked_unhealthy(world, join_token):
    _, node = h.register(join_token, "gpu-01", gpus=4)
    h.bind(h.submit(world.alice, world.vision, gpus=1), "gpu-01", [3])
    kept = h.bind(h.submit(world.alice, world.vision, gpus=1), "gpu-01", [1])
    h.reregister(node["credential"], "gpu-01", gpus=2)  # GPUs 2 (never held) and 3 are gone
    Device.objects.filter(index=1).update(healthy=False)  # as an operator would, in the admin
    assert sorted(Device.objects.values_list("index", "healthy")) == [(0, True), (1, False), (3, False)]
    waiting = [h.submit(world.bob, world.nlp, gpus=1) for _ in range(2)]

    result = run_pass()

    assert result is not None and len(result.bound) == 1, result
    (placed,) = Job.objects.filter(pk__in=[j.pk for j in waiting], state=JobState.SCHEDULED)
    assert [a.device.index for a in placed.allocations.all()] == [0]  # never 1 (unhealthy), 2, 3
    assert Job.objects.get(pk=kept.pk).allocations.get(released_at__isnull=True).device.index == 1


def test_a_job_bound_to_a_gpu_the_restarted_agent_no_longer_has_goes_back_to_the_queue(world, join_token):
    _, node = h.register(join_token, "gpu-01", gpus=4)
    gone = h.bind(h.submit(world.alice, world.vision, gpus=2), "gpu-01", [1, 3])
    stays = h.bind(h.submit(world.alice, world.vision, gpus=1), "gpu-01", [0])
    agent, _ = h.reregister(node["credential"], "gpu-01", gpus=2)

    gone.refresh_from_db()
    assert (gone.state, gone.attempts) == (JobState.PENDING, 1)
    assert gone.events.filter(type=EventType.REQUEUED, reason="node-lost").count() == 1
    assert not gone.allocations.filter(released_at__isnull=True).exists()
    starts = h.heartbeat(agent)["start"]
    assert [(s["job_id"], s["gpus"]) for s in starts] == [(stays.pk, [0])]

"""An agent restarted with fewer GPUs than its node had, while a job holds one it no longer has.

The device rows stay while history holds them (``_sync_devices``: unhealthy, or deleted when
nothing ever held them), so a node's devices may leave gaps in their indices and include an
unhealthy one a job still holds. The scheduling pass must go on with such a node: it used to
raise (``GPU 3 of gpu-01 has 0 milli free``, or an index past the node's GPUs) on every pass
that had a job to place, for the whole cluster, until the holder ended.
"""

from __future__ import annotations

from scheduling.choices import JobState
from scheduling.models import Device, Job
from scheduling.services.passes import run_pass
from tests.agent import helpers as h


def test_passes_go_on_when_a_held_gpu_leaves_its_nodes_inventory(world, join_token):
    _, node = h.register(join_token, "gpu-01", gpus=4)
    bound = h.bind(h.submit(world.alice, world.vision, gpus=1), "gpu-01", [3])
    h.reregister(node["credential"], "gpu-01", gpus=2)  # GPUs 2 and 3 are gone
    assert sorted(Device.objects.values_list("index", "healthy")) == [(0, True), (1, True), (3, False)]
    waiting = [h.submit(world.bob, world.nlp, gpus=1) for _ in range(3)]

    result = run_pass()

    assert result is not None and len(result.bound) == 2, result
    placed = {
        job.pk: [a.device.index for a in job.allocations.filter(released_at__isnull=True)]
        for job in Job.objects.filter(pk__in=[j.pk for j in waiting], state=JobState.SCHEDULED)
    }
    assert sorted(i for gpus in placed.values() for i in gpus) == [0, 1]  # never 2 (gone) or 3
    assert Job.objects.get(pk=bound.pk).allocations.get().device.index == 3

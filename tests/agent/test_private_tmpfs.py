"""A job's private /tmp, /var/tmp and /dev/shm are tmpfs, i.e. the node's memory: each is at most
what the scheduler handed the job, through a real agent (``python -m agent``).

The node (simulated) has 4 GPUs, 8 CPUs and 1 GiB of memory; ``--job-disk-mb 512``. A job that
asks for memory gets its private tmpfs mounts of that size (its memory cgroup charges them too);
one that does not gets its share of the node's memory by its share of the node's GPUs (of its
CPUs, CPU-only); never more than the disk bound.
"""

from __future__ import annotations

import json
import os

import pytest

from agent import sandbox
from agent.identity import RunAs
from scheduling.choices import TERMINAL_STATES, JobState
from scheduling.models import Job
from tests.agent import agent_process as processes
from tests.agent import fakes
from tests.agent import helpers as h

SIZES = r"""
import json, os
sizes = {}
for path in ("/tmp", "/var/tmp", "/dev/shm"):
    st = os.statvfs(path)
    sizes[path] = st.f_blocks * st.f_frsize >> 20
print(json.dumps(sizes), flush=True)
"""


def test_a_replicas_tmpfs_is_its_memory_else_its_share_of_the_nodes_and_at_most_the_disk_bound():
    node = sandbox.NodeSize(memory_mb=1024, gpus=4, cpus=8)
    box = sandbox.Sandbox(False, disk_mb=512, node=node)
    assert box.tmpfs_mb(gpus=1, share=1.0, cpus=0, memory_gib=0) == 256  # a GPU of 4: a quarter
    assert box.tmpfs_mb(gpus=2, share=1.0, cpus=1, memory_gib=0.125) == 128  # what it asked for
    assert box.tmpfs_mb(gpus=1, share=0.5, cpus=0, memory_gib=0) == 128  # half a GPU
    assert box.tmpfs_mb(gpus=0, share=1.0, cpus=2, memory_gib=0) == 256  # CPU-only: 2 CPUs of 8
    assert box.tmpfs_mb(gpus=4, share=1.0, cpus=0, memory_gib=0) == 512  # the disk bound
    assert box.tmpfs_mb(gpus=1, share=1.0, cpus=0, memory_gib=4) == 512
    assert sandbox.Sandbox(False, disk_mb=512).tmpfs_mb(1, 1.0, 0, 0) == 512  # node unknown


def test_a_replicas_process_bound_is_its_share_of_the_nodes_and_the_chain_sets_it():
    """The same share bounds a replica's processes (``RLIMIT_NPROC`` of its uid): the GPU jobs
    filling a node together hold ``--job-max-tasks`` at most, not that many each."""
    node = sandbox.NodeSize(memory_mb=1024, gpus=4, cpus=8)
    box = sandbox.Sandbox(False, max_tasks=8192, node=node)
    assert box.tasks(gpus=1, share=1.0, cpus=0) == 2048  # a GPU of 4: a quarter
    assert box.tasks(gpus=4, share=1.0, cpus=0) == 8192  # the whole node
    assert box.tasks(gpus=0, share=1.0, cpus=2) == 2048  # CPU-only: 2 CPUs of 8
    assert box.tasks(gpus=1, share=0.01, cpus=0) == sandbox.MIN_TASKS  # a sliver: the floor
    # CPU-only without a number of CPUs: one CPU, as the scheduler counts it (8 such jobs fill
    # the node's CPUs), not a GPU's share each, which 8 of them held twice over
    assert box.tasks(gpus=0, share=1.0, cpus=0) == 1024
    cpu_node = sandbox.Sandbox(False, max_tasks=8192, node=sandbox.NodeSize(1024, gpus=0, cpus=32))
    assert cpu_node.tasks(gpus=0, share=1.0, cpus=0) == 256  # 32 of them: the whole bound
    assert sandbox.Sandbox(False, max_tasks=40, node=node).tasks(1, 1.0, 0) == 40  # less than the floor
    assert sandbox.Sandbox(False, max_tasks=8192).tasks(1, 1.0, 0) == 8192  # node unknown
    assert sandbox.Sandbox(False, node=node).tasks(1, 1.0, 0) is None  # no bound at all
    if sandbox.setpriv() is not None and box.prlimit:
        chain = box.prefix(RunAs("job", 200001, 200001), [0], max_tasks=box.tasks(1, 1.0, 0))
        assert "--nproc=2048" in chain


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="private mounts need an agent running as root")
def test_a_jobs_private_tmpfs_holds_at_most_the_memory_it_was_handed(live_server, world, state_dir):
    if sandbox.namespaces_unavailable() is not None:
        pytest.skip("private /tmp and /dev/shm need a mount namespace")
    token_file = state_dir / "join-token"
    token_file.write_text(h.new_join_token())
    spec = ["--simulate", "4xA100,cpus=8,memory_gib=1", "--job-disk-mb", "512"]
    agent = processes.start_agent(live_server.url, state_dir, "--join-token-file", str(token_file), *spec)
    try:
        processes.registered(state_dir)
        command = ["python", "-c", SIZES]
        unasked = h.bind(h.submit(world.bob, world.nlp, command=command, gpus=1), "cli-node", [0])
        asked = h.submit(world.alice, world.vision, command=command, gpus=2, memory_gib=0.125)
        asked = h.bind(asked, "cli-node", [1, 2])
        for job in (unasked, asked):
            ended = Job.objects.filter(pk=job.pk, state__in=TERMINAL_STATES)
            assert fakes.wait_for(ended.exists, 30), h.output_of(job)
            assert ended.get().state == JobState.SUCCEEDED, h.output_of(job)
        expected = {"unasked": 256, "asked": 128}  # MB: a quarter of the node's GiB; its own 128
        for name, job in (("unasked", unasked), ("asked", asked)):
            sizes = json.loads(h.output_of(job).splitlines()[0])
            assert sizes == dict.fromkeys(("/tmp", "/var/tmp", "/dev/shm"), expected[name]), name
    finally:
        processes.stop_agent(agent)


def test_a_replicas_disk_bounds_are_its_share_of_the_nodes_pool_unless_the_operator_set_them():
    """Without ``--job-disk-mb`` / ``--job-max-files`` a replica gets its share of half the
    node's free space and inodes (at most the whole-node bound, at least the floor); a bound the
    operator set is each replica's whole."""
    node = sandbox.NodeSize(memory_mb=1024, gpus=4, cpus=8)
    pooled = sandbox.Sandbox(
        False, disk_mb=100 << 10, max_files=1_000_000, node=node, disk_pool_mb=40_000, files_pool=400_000
    )
    assert pooled.bounds(gpus=1, share=1.0, cpus=0) == (10_000, 100_000)  # a GPU of 4: a quarter
    assert pooled.bounds(gpus=4, share=1.0, cpus=0) == (40_000, 400_000)  # the whole node
    assert pooled.bounds(gpus=1, share=0.01, cpus=0) == (sandbox.MIN_DISK_MB, sandbox.MIN_FILES)
    big = sandbox.Sandbox(False, disk_mb=100 << 10, node=node, disk_pool_mb=10 << 20)
    assert big.bounds(gpus=4, share=1.0, cpus=0)[0] == 100 << 10  # never past the whole bound
    set_by_operator = sandbox.Sandbox(False, disk_mb=16, max_files=500, node=node)
    assert set_by_operator.bounds(gpus=1, share=1.0, cpus=0) == (16, 500)
    # the replica's bound is what the chain sets for one file, and what its tmpfs may hold
    assert pooled.tmpfs_mb(1, 1.0, 0, 0, disk_mb=10_000) == 256  # its memory share is less
    assert sandbox.Sandbox(False, disk_mb=100 << 10).tmpfs_mb(1, 1.0, 0, 0, disk_mb=300) == 300

"""Fixtures for the REST API tests: a small cluster and alice's running job.

The world is ``tests/conftest.py``'s: alice and carol in ``vision``, bob in ``nlp``, admin an
operator. The helpers the fixtures and tests use are in ``tests/api/helpers.py``.
"""

from __future__ import annotations

import pytest

from scheduling.models import Job, Node
from tests.api.helpers import add_log, bind, make_node, run, submit


@pytest.fixture
def cluster(db) -> dict[str, Node]:
    return {"n01": make_node("n01", "H100", 8, "r1", 8), "n02": make_node("n02", "A100", 4, "r2", 4)}


@pytest.fixture
def alice_job(world, cluster) -> Job:
    """alice's running 2-GPU job on n01, with some output."""
    job = submit(world.alice, world.vision, name="alice-train")
    bind(job, cluster["n01"], [0, 1])
    run(job)
    add_log(job, b"epoch 1\n")
    return Job.objects.get(pk=job.pk)

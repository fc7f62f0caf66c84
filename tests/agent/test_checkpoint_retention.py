"""A checkpoint is kept while its job can still resume, through a real agent (``python -m agent``).

With ``--checkpoint-retention-hours 0`` every checkpoint directory not in use is past its
retention at once, and the agent asks the server, in its heartbeats, which of their jobs can still
resume. alice's job checkpoints and fails, to be retried: requeued (pending), its checkpoint stays,
while that of bob's job, which succeeded, goes; once alice's job is cancelled, hers goes too.
bob's job cannot make the agent keep or drop hers (it cannot plant a directory beside its own).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services.jobs import do_cancel_job
from tests.agent import agent_process as processes
from tests.agent import fakes
from tests.agent import helpers as h

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per job needs an agent running as root"),
]

CHECKPOINTS_THEN_FAILS = r"""
import os, pathlib, sys
ck = os.environ["TESSERA_CHECKPOINT_DIR"]
pathlib.Path(ck, "model.ckpt").write_text("alice-weights")
print(ck, flush=True)
sys.exit(1)
"""

CHECKPOINTS_AND_MEDDLES = (
    fakes.ATTEMPT
    + r"""
import json, os, pathlib, sys, time
ck = os.environ["TESSERA_CHECKPOINT_DIR"]
pathlib.Path(ck, "model.ckpt").write_text("bob-weights")
parent, alices = os.path.dirname(ck), sys.argv[1]

print(json.dumps({"checkpoint": ck, "results": {
    "plant a checkpoint directory for her job": attempt(lambda: os.mkdir(f"{parent}/{alices}-x")),
    "touch the checkpoints directory": attempt(lambda: os.utime(parent)),
    "list the checkpoints directory": attempt(lambda: os.listdir(parent)),
}}), flush=True)
while not os.path.exists("done"):
    time.sleep(0.05)
"""
)


def test_a_checkpoint_stays_while_its_job_can_resume_and_goes_once_it_cannot(live_server, world, state_dir):
    token_file = state_dir / "join-token"
    token_file.write_text(h.new_join_token())
    retention = ["--checkpoint-retention-hours", "0"]
    agent = processes.start_agent(
        live_server.url, state_dir, "--join-token-file", str(token_file), *retention
    )
    try:
        processes.registered(state_dir)
        alices = h.submit(
            world.alice, world.vision, command=["python", "-c", CHECKPOINTS_THEN_FAILS], gpus=1, max_retries=1
        )
        h.bind(alices, "cli-node", [0])
        job = Job.objects.filter(pk=alices.pk)
        assert fakes.wait_for(lambda: job.filter(state=JobState.PENDING, attempts=1).exists(), 30), (
            h.output_of(alices)
        )
        hers = Path(h.output_of(alices).splitlines()[0])
        command = ["python", "-c", CHECKPOINTS_AND_MEDDLES, str(alices.pk)]
        bobs = h.bind(h.submit(world.bob, world.nlp, command=command, gpus=1), "cli-node", [1])
        assert fakes.wait_for(lambda: "\n" in h.output_of(bobs), 30), h.output_of(bobs)
        said = json.loads(h.output_of(bobs).splitlines()[0])
        assert set(said["results"].values()) == {"PermissionError"}, said["results"]
        (workdir,) = state_dir.glob(f"jobs/{bobs.pk}-*")
        (workdir / "done").touch()
        his = Path(said["checkpoint"])
        # bob's job succeeded: its checkpoint goes (the retention is 0) ...
        assert fakes.wait_for(lambda: not his.exists(), 30), os.listdir(state_dir / "checkpoints")
        assert Job.objects.get(pk=bobs.pk).state == JobState.SUCCEEDED
        # ... alice's can still resume: it was asked about in the same heartbeats, and stays
        assert (hers / "model.ckpt").read_text() == "alice-weights"
        assert job.get().state == JobState.PENDING
        do_cancel_job(alices.pk)  # now it cannot: it goes
        assert fakes.wait_for(lambda: not hers.exists(), 30), os.listdir(state_dir / "checkpoints")
    finally:
        processes.stop_agent(agent)

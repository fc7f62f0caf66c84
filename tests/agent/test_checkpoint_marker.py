"""A job's checkpoint marker: read safely, reported at once and at most once a minute, and asked
for ("checkpoint now") before a preemption.

Real job processes; only the control plane is the recording fake (the HTTP edge).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent.checkpoints import TAIL_BYTES, Ignored, MarkerWatch, read_marker
from agent.identity import resolve_run_as
from agent.process import JobProcess, job_path
from tests.agent import fakes

UID = os.geteuid()


def test_a_marker_is_read_as_its_last_line_of_text(tmp_path: Path):
    marker = tmp_path / "m"
    marker.write_bytes(b"step 100\nstep 200\n\n")
    assert read_marker(str(marker), UID) == "step 200"
    marker.write_bytes(b"x" * (10 * TAIL_BYTES) + b"\nstep 300\n")  # a huge file: its tail only
    assert read_marker(str(marker), UID) == "step 300"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda m, t: m.write_bytes(b"step \xff\xfe\n"), "not UTF-8"),
        (lambda m, t: m.write_bytes(b"step 1\x1b[2J\n"), "control characters"),
        (lambda m, t: m.write_bytes(b"\n\n"), "no line"),
        (lambda m, t: (t.write_text("step 9\n"), m.symlink_to(t)), "symbolic link"),
        (lambda m, t: (t.write_text("step 9\n"), os.link(t, m)), "2 links"),
        (lambda m, t: os.mkfifo(m), "not a regular file"),
        (lambda m, t: m.mkdir(), "not a regular file"),
    ],
)
def test_a_marker_that_is_not_a_plain_file_of_text_is_ignored_with_the_reason(tmp_path, make, reason):
    marker, target = tmp_path / "m", tmp_path / "target"
    make(marker, target)
    with pytest.raises(Ignored, match=reason):
        read_marker(str(marker), UID)  # a FIFO with no writer does not block the agent either


def test_a_marker_owned_by_another_uid_is_ignored(tmp_path):
    marker = tmp_path / "m"
    marker.write_text("step 1\n")
    with pytest.raises(Ignored, match="not the job's"):
        read_marker(str(marker), UID + 1)


def test_a_watch_reports_the_first_checkpoint_at_once_and_then_at_most_once_a_minute(tmp_path):
    marker = tmp_path / "m"
    watch = MarkerWatch(str(marker), 7, UID)
    assert not watch.look() and watch.due(1000.0) is None  # no marker yet
    marker.write_text("step 1\n")
    assert watch.look() and not watch.look()  # read once per change
    first = watch.due(1000.0)
    assert first is not None and first.line == "step 1"
    watch.reported(first, 1000.0)
    with marker.open("a") as f:
        f.write("step 2\n")
    assert watch.look() and watch.due(1030.0) is None  # within the minute: held back
    later = watch.due(1060.0)
    assert later is not None and later.line == "step 2" and watch.count == 2


# --- with real job processes -------------------------------------------------------------------


@pytest.fixture
def node():
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        yield fakes.FakeServer(), state_dir, run_as, job_path(state_dir, run_as)


def _start(node, command: list[str], **binding) -> tuple[JobProcess, fakes.FakeServer]:
    server, state_dir, run_as, path = node
    process = JobProcess(fakes.binding(command=command, **binding), server, state_dir, run_as, path)
    process.start()
    return process, server


WRITES_TWICE = """
import os, time
marker = os.environ["TESSERA_CHECKPOINT_MARKER"]
with open(marker, "a") as f:
    f.write("step 100\\n")
time.sleep(1.0)
with open(marker, "a") as f:
    f.write("step 200\\n")
"""


def test_a_jobs_checkpoint_is_reported_within_seconds_and_its_last_one_before_its_exit(node):
    process, server = _start(node, ["python", "-c", WRITES_TWICE], job_id=21)
    reported = fakes.wait_for(lambda: server.checkpoints(21), timeout=5)
    assert reported == ["step 100"]  # within 5 s of the write
    assert server.exit_of(21)["exit_code"] == 0
    # The second came within the minute: held back, then sent before the exit report
    assert server.checkpoints(21) == ["step 100", "step 200"]
    whats = [what for what, body in server.calls if body.get("job_id") == 21]
    assert whats.index("exited") > max(i for i, w in enumerate(whats) if w == "checkpointed")


CHECKPOINTS_ON_SIGNAL = """
import os, signal, sys, time
marker = os.environ["TESSERA_CHECKPOINT_MARKER"]
def write(line):
    with open(marker, "a") as f:
        f.write(line + "\\n")
def now(signum, frame):
    print("checkpoint asked", flush=True)
    time.sleep(0.5)  # saving it
    write("step 150 (asked)")
def term(signum, frame):
    print("terminated", flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, now)
signal.signal(signal.SIGTERM, term)
write("step 100")
while True:
    time.sleep(0.05)
"""


def test_a_preempted_job_that_checkpoints_is_asked_to_checkpoint_now_and_then_terminated(node):
    process, server = _start(node, ["python", "-c", CHECKPOINTS_ON_SIGNAL], job_id=22, grace_seconds=20)
    fakes.wait_for(lambda: server.checkpoints(22), timeout=5)
    asked = time.monotonic()
    process.stop("preempted: for a test", 20)
    assert server.exit_of(22)["exit_code"] == 0
    took = time.monotonic() - asked
    assert server.checkpoints(22) == ["step 100", "step 150 (asked)"]  # reported at once, not in a minute
    out = server.output(22).decode()
    assert out.index("checkpoint asked") < out.index("checkpoint written: SIGTERM") < out.index("terminated")
    assert took < 5, f"SIGTERM waited {took:.1f}s: it should follow the new marker line"


def test_the_checkpoint_a_stop_asked_for_is_sent_again_until_the_server_takes_it(node):
    # The server does not answer the first three reports of it: the agent keeps sending it (not
    # held back by the once-a-minute bound), and only then reports the exit, after which the
    # server would refuse it (that attempt no longer runs) and the requeue would resume the job
    # from its older checkpoint.
    process, server = _start(node, ["python", "-c", CHECKPOINTS_ON_SIGNAL], job_id=24, grace_seconds=20)
    fakes.wait_for(lambda: server.checkpoints(24), timeout=5)
    server.unreachable_checkpoints = 3
    process.stop("preempted: for a test", 20)
    assert server.exit_of(24)["exit_code"] == 0
    assert server.checkpoints(24) == ["step 100", "step 150 (asked)"]
    whats = [what for what, body in server.calls if body.get("job_id") == 24]
    assert whats.count("checkpoint-unanswered") == 3
    assert whats.index("exited") > whats.index("checkpointed", whats.index("checkpoint-unanswered"))


def test_a_preempted_job_that_never_wrote_its_marker_is_not_sent_the_checkpoint_signal(node):
    # SIGUSR1's default action would kill a job that does not handle it: such a job gets SIGTERM
    command = [
        "python",
        "-c",
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('terminated'), sys.exit(3)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)",
    ]
    process, server = _start(node, command, job_id=23)
    fakes.wait_for(lambda: b"ready" in server.output(23), timeout=10)
    process.stop("preempted: for a test", 20)
    assert server.exit_of(23)["exit_code"] == 3
    assert "terminated" in server.output(23).decode() and server.checkpoints(23) == []

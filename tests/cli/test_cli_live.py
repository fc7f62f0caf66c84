"""The real ``tessera`` command (the installed console script, a process of its own) against a
live server (pytest-django's ``live_server``, on the test database).

The jobs' lives are moved by the real services from the test while the command waits (what a
scheduling pass and an agent would do; ``tests/cli/test_pipeline_step.py`` runs a whole stack
with a real agent). Every failure must be one line on stderr and a documented exit code.

PostgreSQL only: on SQLite the live server shares the test's one in-memory connection, and a
write from the test while the server reads fails with "database table is locked".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from django.db import transaction

from scheduling.models import ApiToken, Job
from scheduling.services.jobs import begin_stop, do_cancel_job
from tests.api.helpers import add_log, bind, finish, make_node, run
from tests.support import free_port

TESSERA = shutil.which("tessera", path=str(Path(sys.executable).parent)) or "tessera"
CI_VARIABLES = ("GITHUB_", "GITLAB_", "CI_", "JENKINS_", "BUILD_TAG", "STAGE_NAME", "TESSERA_")


pytestmark = pytest.mark.postgresql(
    "the live server: on SQLite it shares the test's one in-memory connection ('table is locked')"
)
# The log stream is an async iterator (served by daphne in a deployment); pytest-django's live
# server is WSGI, where Django warns that it consumes such an iterator synchronously. The stream
# is what is under test, not the server's way of serving it.
SYNC_SERVED_STREAM = pytest.mark.filterwarnings(
    "ignore:StreamingHttpResponse must consume asynchronous iterators:Warning"
)


@pytest.fixture
def cli(require_postgres, live_server, world, tmp_path):
    """``cli(*args, who="alice", env=None)``: run ``tessera`` as ``who``, like a CI step would."""
    node = make_node("cli-n1", "H100", 8)

    def run_cli(*args: str, who: str | None = "alice", env: dict[str, str] | None = None, **popen):
        environment = {k: v for k, v in os.environ.items() if not k.startswith(CI_VARIABLES)}
        environment.update(
            HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"), TESSERA_URL=live_server.url
        )
        if who is not None:
            environment["TESSERA_TOKEN"] = world.tokens[who]
        environment.update(env or {})
        if popen.pop("background", False):
            return subprocess.Popen(
                [TESSERA, *args], env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        return subprocess.run([TESSERA, *args], env=environment, capture_output=True, text=True, timeout=60)

    run_cli.node = node  # type: ignore[attr-defined]
    return run_cli


def newest_job(previous: int = 0, timeout: float = 20) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = Job.objects.filter(pk__gt=previous).order_by("-pk").first()
        if job is not None:
            return job
        time.sleep(0.05)
    raise AssertionError("the command submitted no job")


def ended(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text


def run_to_exit(job: Job, node, exit_code: int) -> None:
    bind(job, node, [0])
    run(job)
    finish(job, exit_code)


# --- submit --wait: the job's exit code becomes the step's --------------------------------------


@pytest.mark.parametrize("exit_code", [0, 3])
def test_submit_wait_exits_with_the_jobs_own_exit_code(cli, exit_code):
    proc = cli("submit", "--gpus", "1", "--wait", "--", "python", "train.py", background=True)
    job = newest_job()
    time.sleep(0.5)  # the command is waiting now (on the long-poll)
    run_to_exit(job, cli.node, exit_code)
    code, out, err = ended(proc)
    assert code == exit_code, err
    assert f"job {job.pk} {'succeeded' if exit_code == 0 else 'failed'}" in err
    assert Job.objects.get(pk=job.pk).command == ["python", "train.py"]
    no_traceback(out, err)


def test_submit_wait_exits_210_for_a_cancelled_job_and_says_so_in_json(cli):
    proc = cli("submit", "--wait", "-o", "json", "--", "sleep", "100", background=True)
    job = newest_job()
    time.sleep(0.3)
    do_cancel_job(job.pk)
    code, out, err = ended(proc)
    assert code == 210, err
    answer = json.loads(out)
    assert answer["outcome"] == "cancelled" and answer["cli_exit_code"] == 210
    assert answer["job"]["id"] == job.pk and answer["job"]["state"] == "cancelled"


def test_submit_wait_exits_211_for_a_job_stopped_at_its_time_limit(cli):
    proc = cli("submit", "--wait", "--time-limit", "60", "--", "sleep", "100", background=True)
    job = newest_job()
    bind(job, cli.node, [0])
    run(job)
    with transaction.atomic():
        begin_stop(Job.objects.select_for_update().select_related("tenant").get(pk=job.pk), "time-limit")
    finish(job, -15)
    code, _, err = ended(proc)
    assert code == 211, err
    assert "time-limit" in err


def test_wait_timeout_exits_204_and_leaves_the_job_running(cli):
    started = time.monotonic()
    result = cli("submit", "--wait", "--wait-timeout", "1.5", "-o", "json", "--", "sleep", "100")
    assert result.returncode == 204, result.stderr
    assert 1.5 <= time.monotonic() - started < 15
    answer = json.loads(result.stdout)
    assert answer["outcome"] == "wait-timeout" and answer["job"]["state"] == "pending"


@SYNC_SERVED_STREAM
def test_follow_streams_the_output_and_ends_with_the_jobs_exit_code(cli):
    proc = cli("submit", "--follow", "--", "python", "train.py", background=True)
    job = newest_job()
    bind(job, cli.node, [0])
    run(job)
    add_log(job, b"epoch 1\n")
    time.sleep(1.5)
    add_log(job, b"epoch 2\n")
    finish(job, 0)
    code, out, err = ended(proc)
    assert code == 0, err
    assert out == "epoch 1\nepoch 2\n"


@SYNC_SERVED_STREAM
def test_logs_follow_streams_a_running_job_and_ends_at_eof(cli):
    code, out, err = follow_a_running_job(cli)
    assert (code, out) == (0, "one\ntwö\n"), err


def follow_a_running_job(cli, *options: str) -> tuple[int, str, str]:
    """``logs -f OPTIONS`` on a running job that writes ``one``, then ``twö``, then ends (still
    following until then): what the command exited with and wrote."""
    cli("submit", "--", "python", "x.py")
    job = newest_job()
    bind(job, cli.node, [0])
    run(job)
    add_log(job, b"one\n")
    proc = cli("logs", "-f", str(job.pk), *options, background=True)
    time.sleep(1.0)
    add_log(job, "twö\n".encode())
    time.sleep(1.0)
    assert proc.poll() is None, "logs -f ended before the job did"
    finish(job, 0)
    return ended(proc)


# --- idempotency in CI ---------------------------------------------------------------------------

GITHUB = {
    "GITHUB_ACTIONS": "true",
    "GITHUB_REPOSITORY": "vision/train",
    "GITHUB_RUN_ID": "4242",
    "GITHUB_RUN_ATTEMPT": "1",
    "GITHUB_JOB": "train",
    "GITHUB_ACTION": "submit",
}


def test_a_retried_ci_step_submits_one_job_and_another_step_its_own(cli, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: nightly\nkind: batch\ncommand: [python, eval.py]\ngpus: 1\n")
    first = cli("submit", str(job_file), "-o", "json", env=GITHUB)
    again = cli("submit", str(job_file), "-o", "json", env=GITHUB)
    other_step = cli("submit", str(job_file), "-o", "json", env={**GITHUB, "GITHUB_JOB": "eval"})
    assert first.returncode == again.returncode == other_step.returncode == 0, first.stderr
    ids = [json.loads(r.stdout)["id"] for r in (first, again, other_step)]
    assert ids[0] == ids[1] != ids[2]
    assert Job.objects.filter(name="nightly").count() == 2


def test_an_explicit_idempotency_key_makes_one_job_outside_ci(cli):
    for _ in range(2):
        result = cli("submit", "--idempotency-key", "release-7", "--", "python", "x.py")
        assert result.returncode == 0, result.stderr
    assert Job.objects.count() == 1


# --- job files ------------------------------------------------------------------------------------


def test_a_job_file_in_the_kubernetes_spelling_is_submitted_as_the_api_body(cli, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        yaml.safe_dump(
            {
                "metadata": {"name": "k8s-style"},
                "kind": "training",
                "command": ["python", "train.py"],
                "resources": {"limits": {"nvidia.com/gpu": 4, "cpu": "8", "memory": "64Gi"}},
            }
        )
    )
    result = cli("submit", str(job_file), "-o", "yaml")
    assert result.returncode == 0, result.stderr
    job = Job.objects.get(pk=yaml.safe_load(result.stdout)["id"])
    assert (job.name, job.gpus, job.cpus, job.memory_gib) == ("k8s-style", 4, 8, 64)


@pytest.mark.parametrize(
    "text, words",
    [
        ("name: [unclosed\n", ["malformed YAML", "line"]),
        (
            "name: x\nkind: batch\ncommand: [a]\ngpus: 8\ngpus: 1\n",
            ["line 5", "'gpus' is given more than once"],
        ),
        ("- just\n- a list\n", ["mapping"]),
        ("name: x\nkind: batch\ncommand: [a]\ngpu: 2\n", ["gpu: unknown field"]),
        ("name: x\nkind: batch\ncommand: [a]\ngpus: -1\n", ["gpus"]),
        ("name: x\nkind: nope\ncommand: [a]\n", ["kind"]),
        ("name: x\ncommand: [a]\nresources: {limits: {memory: lots}}\n", ["resources.limits.memory"]),
    ],
)
def test_a_bad_job_file_is_one_line_naming_the_problem_and_exit_200(cli, tmp_path, text, words):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(text)
    result = cli("submit", str(job_file))
    assert result.returncode == 200, (result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for word in words:
        assert word in result.stderr
    no_traceback(result.stderr)
    assert Job.objects.count() == 0


def test_a_job_no_quota_can_admit_is_refused_with_212(cli):
    result = cli("submit", "--gpus", "65", "--wait", "-o", "json", "--", "python", "x.py")
    assert result.returncode == 212, result.stderr
    assert json.loads(result.stdout)["outcome"] == "refused"
    assert "accelerators" in result.stderr


# --- faults ----------------------------------------------------------------------------------------


def test_a_wrong_token_exits_201(cli):
    result = cli("ls", env={"TESSERA_TOKEN": "not-a-token"})
    assert result.returncode == 201 and "Invalid token" in result.stderr
    no_traceback(result.stderr)


def test_no_token_at_all_exits_201(cli):
    result = cli("ls", who=None)
    assert result.returncode == 201 and "TESSERA_TOKEN" in result.stderr


def test_an_unreachable_server_exits_202_after_retrying(cli):
    result = cli("ls", env={"TESSERA_URL": f"http://127.0.0.1:{free_port()}", "TESSERA_RETRIES": "1"})
    assert result.returncode == 202 and "cannot reach" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    no_traceback(result.stderr)


def test_bob_cannot_see_or_cancel_alices_job(cli):
    cli("submit", "--", "python", "x.py")
    job = newest_job()
    for args in (("status", str(job.pk)), ("cancel", str(job.pk)), ("logs", str(job.pk))):
        result = cli(*args, who="bob")
        assert result.returncode == 203, (args, result.stderr)
        assert "no such job" in result.stderr.lower()
    assert Job.objects.get(pk=job.pk).state == "pending"


@SYNC_SERVED_STREAM
def test_watching_a_job_bob_cannot_see_is_a_203_not_a_silent_wait(cli):
    cli("submit", "--", "python", "x.py")
    job = newest_job()
    started = time.monotonic()
    for jid in (str(job.pk), "999999"):  # alice's, and one that does not exist: the same answer
        result = cli("watch", "--job", jid, "--timeout", "20", who="bob")
        assert result.returncode == 203, (jid, result.stdout, result.stderr)
        assert "no such job" in result.stderr.lower() and result.stdout == ""
    assert time.monotonic() - started < 15  # at once, not at the end of --timeout


@pytest.mark.parametrize(
    "args", [("status", "abc"), ("submit", "--gpus", "two", "--", "x"), ("ls", "--nope")]
)
def test_bad_arguments_exit_200_without_a_traceback(cli, args):
    result = cli(*args)
    assert result.returncode == 200, result.stderr
    no_traceback(result.stderr)


# --- reading and changing, in every format ----------------------------------------------------------


def test_ls_status_why_events_in_every_format(cli):
    cli("submit", "--name", "listed", "--", "python", "x.py")
    job = newest_job()
    for fmt, load in (("json", json.loads), ("yaml", yaml.safe_load)):
        listed = cli("ls", "-o", fmt)
        assert [j["name"] for j in load(listed.stdout)] == ["listed"]
        assert load(cli("status", str(job.pk), "-o", fmt).stdout)["state"] == "pending"
        assert load(cli("why", str(job.pk), "-o", fmt).stdout)["id"] == job.pk
        assert [e["type"] for e in load(cli("events", str(job.pk), "-o", fmt).stdout)] == ["submitted"]
    assert json.loads(cli("ls", "--owner", "alice", "-o", "json").stdout)[0]["id"] == job.pk
    assert json.loads(cli("ls", "--owner", "carol", "-o", "json").stdout) == []
    bad = cli("ls", "--state", "sleeping")
    assert bad.returncode == 200 and "state: must be one of" in bad.stderr
    table = cli("ls").stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "NAME", "OWNER", "KIND", "STATE"]
    assert table[1].split()[1] == "listed"
    assert "submitted" in cli("events", str(job.pk)).stdout
    assert "state:" in cli("status", str(job.pk)).stdout


def test_cancel_takes_several_jobs_and_carol_may_cancel_her_teammates(cli):
    for _ in range(2):
        cli("submit", "--", "python", "x.py")
    ids = [str(pk) for pk in Job.objects.values_list("pk", flat=True)]
    result = cli("cancel", *ids, "-o", "json", who="carol")
    assert result.returncode == 0, result.stderr
    assert {j["state"] for j in json.loads(result.stdout)} == {"cancelled"}


def test_quota_and_nodes_list_what_the_server_has(cli):
    quotas = json.loads(cli("quota", "-o", "json").stdout)
    assert [(q["tenant"], q["model"]) for q in quotas] == [("vision", "*")]
    assert "cli-n1" in cli("nodes").stdout
    assert "cli-n1" in cli("nodes", "--model", "H100").stdout
    assert "cli-n1" not in cli("nodes", "--rack", "r9").stdout


def test_login_checks_the_token_and_saves_it_readable_by_its_owner_only(cli, world, live_server, tmp_path):
    result = subprocess.run(
        [TESSERA, "login", "--url", live_server.url, "--token-stdin"],
        input=world.tokens["carol"] + "\n",
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "PATH": os.environ["PATH"]},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    saved = tmp_path / "config" / "tessera" / "config.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    stored = json.loads(saved.read_text())
    assert stored["url"] == live_server.url and stored["token"] != world.tokens["carol"]
    made = ApiToken.objects.get(user=world.carol, name__startswith="tessera-cli@")  # its own token
    assert made.prefix in result.stdout and stored["token"].startswith(made.prefix)
    listed = cli("ls", "-o", "json", who=None, env={"TESSERA_URL": ""})  # the file's url and token
    assert listed.returncode == 0, listed.stderr
    kept = subprocess.run(
        [TESSERA, "login", "--url", live_server.url, "--token-stdin", "--keep-token"],
        input=world.tokens["carol"] + "\n",
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "PATH": os.environ["PATH"]},
        timeout=60,
    )
    assert kept.returncode == 0, kept.stderr
    assert json.loads(saved.read_text())["token"] == world.tokens["carol"]


def test_login_with_a_wrong_token_saves_nothing(cli, live_server, tmp_path):
    result = subprocess.run(
        [TESSERA, "login", "--url", live_server.url, "--token-stdin"],
        input="wrong\n",
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "PATH": os.environ["PATH"]},
        timeout=60,
    )
    assert result.returncode == 201
    assert not (tmp_path / "config" / "tessera" / "config.json").exists()


def test_hold_and_release_through_the_command(cli):
    cli("submit", "--", "python", "x.py")
    job = newest_job()
    held = cli("hold", str(job.pk), "-o", "json")
    assert held.returncode == 0, held.stderr
    assert json.loads(held.stdout)[0]["held"] is True
    assert "held" in cli("why", str(job.pk)).stdout
    released = cli("release", str(job.pk), "-o", "json", who="carol")
    assert released.returncode == 0 and json.loads(released.stdout)[0]["held"] is False
    bind(job, cli.node, [0])
    refused = cli("hold", str(job.pk))
    assert refused.returncode == 203 and "scheduled" in refused.stderr
    no_traceback(refused.stderr)


def test_logs_in_json_give_the_output_and_where_it_ended(cli):
    cli("submit", "--", "python", "x.py")
    job = newest_job()
    bind(job, cli.node, [0])
    run(job)
    add_log(job, b"hello\n")
    answer = json.loads(cli("logs", str(job.pk), "-o", "json").stdout)
    assert answer == {"data": "hello\n", "next_offset": 6, "eof": False, "truncated": False}
    assert cli("logs", str(job.pk)).stdout == "hello\n"


# A job's output as a hostile tenant writes it for the operator who reads it: the clipboard
# (OSC 52), the window's title, a cleared screen, the cursor moved up, C1's CSI, a NUL.
HOSTILE_OUTPUT = (
    b"\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07\x1b]0;pwned\x07\x1b[2J\x1b[1A\xc2\x9b6n\x00done\tok\n"
)


@SYNC_SERVED_STREAM
def test_logs_write_out_the_control_characters_a_job_would_send_the_readers_terminal(cli):
    cli("submit", "--", "python", "x.py")
    job = newest_job()
    bind(job, cli.node, [0])
    run(job)
    add_log(job, HOSTILE_OUTPUT)
    finish(job, 0)
    shown = (
        "\\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\\x07\\x1b]0;pwned\\x07"
        "\\x1b[2J\\x1b[1A\\x9b6n\\x00done\tok\n"
    )
    for args in (("logs", str(job.pk)), ("logs", "-f", str(job.pk))):
        done = cli(*args)
        assert (done.returncode, done.stdout) == (0, shown), (args, done.stderr)
    # as the job wrote it, on request (its colours), and in JSON (escaped there)
    assert cli("logs", "--raw", str(job.pk)).stdout == HOSTILE_OUTPUT.decode()
    assert cli("logs", "-f", "--raw", str(job.pk)).stdout == HOSTILE_OUTPUT.decode()
    assert json.loads(cli("logs", str(job.pk), "-o", "json").stdout)["data"] == HOSTILE_OUTPUT.decode()


def test_status_writes_out_the_control_characters_a_tenant_put_in_its_jobs_fields(cli, tmp_path):
    """A job's command and env are the tenant's text: C1's CSI (U+009B, ESC [ on terminals that
    honour C1), DEL and a carriage return came through ``status``'s table and ``-o json`` raw
    (JSON escapes ESC and the rest of C0 itself), onto the operator's terminal."""
    body = {"command": ["python", "-c", "\x9b2J\x7f"], "env": {"NOTE": "\x9b]0;pwned\x07"}, "gpus": 0}
    (tmp_path / "job.json").write_text(json.dumps({"name": "odd", "kind": "batch", **body}))
    submitted = cli("submit", str(tmp_path / "job.json"))
    assert submitted.returncode == 0, submitted.stderr
    job = newest_job()
    assert job.command[2] == "\x9b2J\x7f"
    for args in (("status", str(job.pk)), ("status", str(job.pk), "-o", "json")):
        shown = cli(*args).stdout
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", shown), (args, shown)
    said = json.loads(cli("status", str(job.pk), "-o", "json").stdout)
    assert said["command"][2] == "\x9b2J\x7f" and said["env"] == {"NOTE": "\x9b]0;pwned\x07"}


def test_why_and_status_show_the_start_estimate_its_band_basis_and_place_in_the_queue(cli):
    from datetime import UTC, datetime

    cli("submit", "--", "python", "x.py")
    job = newest_job()
    at = [datetime(2026, 1, 1, h, tzinfo=UTC) for h in (9, 10, 12)]
    basis = "3 job(s) ahead of it and the running jobs' predicted ends; its runtime from 5 earlier runs"
    Job.objects.filter(pk=job.pk).update(  # as a pass stores them (scheduling/services/passes.py)
        pending_code="capacity", pending_reason="capacity: no room for it now", estimated_start=at[1],
        estimated_start_earliest=at[0], estimated_start_latest=at[2], estimate_basis=basis,
        queue_position=4, jobs_ahead=3,
    )  # fmt: skip
    why = json.loads(cli("why", str(job.pk), "-o", "json").stdout)
    assert why["estimated_start"].startswith("2026-01-01T10:00")
    assert why["estimated_start_earliest"].startswith("2026-01-01T09:00")
    assert why["estimated_start_latest"].startswith("2026-01-01T12:00")
    assert (why["estimate_basis"], why["queue_position"], why["jobs_ahead"]) == (basis, 4, 3)
    table = cli("why", str(job.pk)).stdout
    assert "5 earlier runs" in table and "queue_position" in table
    assert json.loads(cli("status", str(job.pk), "-o", "json").stdout)["jobs_ahead"] == 3


# --- webhooks and the tenant's event stream ------------------------------------------------------


def test_webhooks_are_added_listed_delivered_redelivered_and_removed_through_the_command(cli, settings):
    from scheduling.models import WebhookDelivery
    from scheduling.services.webhooks import deliver_due

    dead = f"http://127.0.0.1:{free_port()}/ci"  # nothing listens: every attempt fails
    refused = cli("webhooks", "add", dead)
    assert refused.returncode == 200 and refused.stderr.count("\n") == 1, refused.stderr
    assert "url:" in refused.stderr and "TESSERA_WEBHOOK_ALLOWLIST" in refused.stderr

    settings.TESSERA = {
        **settings.TESSERA,
        "WEBHOOK_ALLOWLIST": ["127.0.0.1"],
        "WEBHOOK_BACKOFF_S": 0.0,
        "WEBHOOK_ATTEMPTS": 2,
    }
    added = cli("webhooks", "add", dead, "--event", "cancelled", "-o", "json")
    assert added.returncode == 0, added.stderr
    hook = json.loads(added.stdout)
    assert hook["events"] == ["cancelled"] and len(hook["secret"]) >= 32
    listed = cli("webhooks", "ls", "-o", "yaml", who="carol")  # her team's
    assert [h["url"] for h in yaml.safe_load(listed.stdout)] == [dead]
    assert "secret" not in listed.stdout
    assert cli("webhooks", "ls", "-o", "json", who="bob").stdout.strip() == "[]"

    job = Job.objects.get(pk=json.loads(cli("submit", "-o", "json", "--", "sleep", "1").stdout)["id"])
    assert cli("cancel", str(job.pk)).returncode == 0
    deliver_due()
    (delivery,) = WebhookDelivery.objects.all()
    table = cli("webhooks", "deliveries", str(hook["id"]))
    assert table.returncode == 0 and "failed" in table.stdout and "cancelled" in table.stdout, table.stdout
    again = cli("webhooks", "redeliver", str(hook["id"]), str(delivery.pk), "-o", "json")
    assert again.returncode == 0 and json.loads(again.stdout)["state"] == "pending", again.stderr
    assert cli("webhooks", "redeliver", str(hook["id"]), "999999").returncode == 203
    assert cli("webhooks", "rm", str(hook["id"]), who="bob").returncode == 203  # not his tenant's
    assert cli("webhooks", "rm", str(hook["id"])).returncode == 0
    assert cli("webhooks", "ls", "-o", "json").stdout.strip() == "[]"
    assert cli("webhooks", "deliveries", "x1").returncode == 200


def test_a_token_revoked_while_submit_waits_exits_201_saying_how_to_store_a_new_one(cli, world):
    from scheduling.services.tokens import do_create_api_token, do_revoke_api_token

    token, key = do_create_api_token(world.alice, "ci-step")
    proc = cli(
        "submit", "--wait", "-o", "json", "--", "sleep", "100", background=True, env={"TESSERA_TOKEN": key}
    )
    job = newest_job()
    do_revoke_api_token(token)
    bind(job, cli.node, [0])  # a change: the long-poll answers, and the next read is refused
    code, out, err = ended(proc)
    no_traceback(out, err)
    assert code == 201, err
    assert err.endswith("(HTTP 401; `tessera login` stores a new token)\n") and err.count("\n") == 1
    answer = json.loads(out)
    assert answer["outcome"] == "error" and answer["cli_exit_code"] == 201
    assert answer["job"]["id"] == job.pk  # the job it was waiting for, as last read


@SYNC_SERVED_STREAM
def test_logs_follow_in_json_prints_one_object_a_line_a_script_can_parse(cli):
    """``logs -f -o json`` printed the output's bare text, which no JSON reader could parse."""
    code, out, err = follow_a_running_job(cli, "-o", "json")
    assert code == 0, err
    pieces = [json.loads(line) for line in out.splitlines()]
    assert "".join(p["data"] for p in pieces) == "one\ntwö\n"
    assert pieces[0]["offset"] == 0 and pieces[-1]["next_offset"] == len("one\ntwö\n".encode())

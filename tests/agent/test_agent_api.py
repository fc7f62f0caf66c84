"""The agent protocol on the server: registration, heartbeats, and a job's reports to its end."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from scheduling.choices import JobState, NodeState
from scheduling.models import Allocation, Device, Job, JoinToken, LogChunk, Node, hash_secret
from scheduling.services.jobs import do_cancel_job
from tests.agent import helpers as h

AGENT = h.AGENT


def _types(job: Job) -> list[str]:
    return [e.type for e in job.events.order_by("at", "id")]


# --- Join tokens and registration --------------------------------------------------------------


def test_create_join_token_prints_a_token_and_stores_only_its_hash(db):
    out, err = io.StringIO(), io.StringIO()
    call_command("create_join_token", "--name", "rack r1", "--expires-hours", "2", stdout=out, stderr=err)
    raw = out.getvalue().strip()
    token = JoinToken.objects.get()
    assert len(raw) >= 32 and token.token_hash == hash_secret(raw) and raw not in token.token_hash
    assert token.name == "rack r1" and token.expires_at > timezone.now() + timedelta(minutes=119)
    assert raw not in err.getvalue()


def test_create_join_token_refuses_a_bad_expiry(db):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="expires-hours"):
        call_command("create_join_token", "--expires-hours", "-1", stdout=io.StringIO())


def test_an_agent_registers_with_a_join_token_and_gets_its_own_credential(join_token):
    answer = h.client_with(f"Join {join_token}").post(
        AGENT + "register", h.node_body("gpu-01"), format="json"
    )
    assert answer.status_code == 201, answer.content
    node = Node.objects.get(name="gpu-01")
    credential = answer.data["credential"]
    assert credential != join_token and node.credential_hash == hash_secret(credential)
    assert node.state == NodeState.READY and node.last_heartbeat is not None
    assert (node.rack, node.labels, node.nvlink_domain) == ("r1", {"zone": "a"}, 4)
    assert node.metrics_url == "http://127.0.0.1:9400/metrics"
    islands = list(Device.objects.filter(node=node).order_by("index").values_list("nvlink_island", flat=True))
    assert islands == [0, 0, 0, 0, 1, 1, 1, 1]


def test_an_agent_gives_its_price_per_gpu_hour_and_without_one_the_operators_price_stays(join_token):
    join = h.client_with(f"Join {join_token}")
    answer = join.post(
        AGENT + "register", {**h.node_body("gpu-01"), "price_per_gpu_hour": 2.5}, format="json"
    )
    assert answer.status_code == 201, answer.content
    assert Node.objects.get(name="gpu-01").price_per_gpu_hour == 2.5
    Node.objects.filter(name="gpu-01").update(price_per_gpu_hour=4.0)  # the operator's, in the admin
    node = h.client_with(f"Node {answer.data['credential']}")
    again = node.post(AGENT + "register", h.node_body("gpu-01"), format="json")
    assert again.status_code == 200
    assert Node.objects.get(name="gpu-01").price_per_gpu_hour == 4.0
    node = h.client_with(f"Node {again.data['credential']}")
    refused = node.post(
        AGENT + "register", {**h.node_body("gpu-01"), "price_per_gpu_hour": -1}, format="json"
    )
    assert refused.status_code == 400 and "price_per_gpu_hour" in refused.data


def test_the_agents_price_flag_goes_into_its_registration_and_a_bad_one_stops_it():
    from agent.cli import Fatal, build_parser, inventory_from

    args = build_parser().parse_args(["--simulate", "2xT4", "--name", "t4-01", "--price-per-gpu-hour", "0.4"])
    assert inventory_from(args).register_body("")["price_per_gpu_hour"] == 0.4
    plain = build_parser().parse_args(["--simulate", "2xT4", "--name", "t4-01"])
    assert "price_per_gpu_hour" not in inventory_from(plain).register_body("")
    bad = build_parser().parse_args(["--simulate", "2xT4", "--price-per-gpu-hour", "-3"])
    with pytest.raises(Fatal, match="price-per-gpu-hour"):
        inventory_from(bad)


def test_an_agent_says_which_checkpoint_root_it_shares_and_one_that_does_not_say_is_node_local(
    join_token, tmp_path
):
    from agent.cli import Fatal, build_parser, checkpoint_root_name, checkpoint_root_of, inventory_from

    shared = build_parser().parse_args(["--simulate", "2xT4", "--checkpoint-root", str(tmp_path)])
    root = checkpoint_root_of(shared.checkpoint_root)
    assert checkpoint_root_name(shared.checkpoint_root_name, root) == str(tmp_path.resolve())
    assert checkpoint_root_name("nfs-a", root) == "nfs-a"
    assert checkpoint_root_name("", None) == ""
    with pytest.raises(Fatal, match="give that too"):
        checkpoint_root_name("nfs-a", None)
    inventory = inventory_from(shared)
    inventory.checkpoint_root = "nfs-a"
    assert inventory.register_body("")["checkpoint_root"] == "nfs-a"

    _, answer = h.register(join_token, "gpu-01", checkpoint_root="nfs-a")
    assert Node.objects.get(name="gpu-01").checkpoint_root == "nfs-a"
    body = h.node_body("gpu-01")  # without checkpoint_root, as an older agent's
    again = h.client_with(f"Node {answer['credential']}").post(AGENT + "register", body, format="json")
    assert again.status_code == 200, again.content
    assert Node.objects.get(name="gpu-01").checkpoint_root == ""


@pytest.mark.parametrize("auth", [None, "Join wrong-token", "Join", "Token abc", "Node abc", "Join a b"])
def test_registration_without_a_valid_join_token_is_refused(join_token, auth):
    answer = h.client_with(auth).post(AGENT + "register", h.node_body(), format="json")
    assert answer.status_code == 401, answer.content
    assert not Node.objects.exists()


def test_an_expired_or_revoked_join_token_is_refused(db):
    expired = h.new_join_token()
    JoinToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    revoked = h.new_join_token("revoked")
    JoinToken.objects.filter(name="revoked").update(revoked=True, expires_at=None)
    for token in (expired, revoked):
        answer = h.client_with(f"Join {token}").post(AGENT + "register", h.node_body(), format="json")
        assert answer.status_code == 401
    assert not Node.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", ""),
        ("name", "bad name!"),
        ("name", "x\x00y"),
        ("name", 7 * [1]),
        ("rack", "r\ud800"),
        ("labels", ["a"]),
        ("labels", {"k": "v\x00"}),
        ("kind", "quantum"),
        ("cpus", -1),
        ("cpus", "many"),
        ("memory_gib", float("inf")),
        ("nvlink_domain", 0),
        ("metrics_url", "ftp://x/metrics"),
        ("checkpoint_root", "nfs\n-a"),
        ("checkpoint_root", "x" * 257),
        ("devices", "eight"),
        ("devices", [{"index": 0, "uuid": "a", "model": "A100"}, {"index": 0, "uuid": "b", "model": "A100"}]),
        ("devices", [{"index": -1, "uuid": "a", "model": "A100"}]),
        ("devices", [{"index": 0, "uuid": "a"}]),
    ],
)
def test_a_bad_registration_body_is_refused_naming_the_field(join_token, field, value):
    import json

    body = h.node_body()
    body[field] = value
    raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    answer = h.client_with(f"Join {join_token}").generic(
        "POST", AGENT + "register", raw, content_type="application/json"
    )
    assert answer.status_code == 400, answer.content
    assert field in answer.json() or "detail" in answer.json()
    if "detail" not in answer.json():
        assert list(answer.json()) == [field]
    assert not Node.objects.exists()


def test_a_body_without_a_name_is_refused_naming_it(join_token):
    body = h.node_body()
    del body["name"]
    answer = h.client_with(f"Join {join_token}").post(AGENT + "register", body, format="json")
    assert answer.status_code == 400 and "name" in answer.json()


def test_reregistering_issues_a_new_credential_and_the_old_one_stops_working(join_token):
    first, data1 = h.register(join_token, "gpu-01")
    again = first.post(AGENT + "register", h.node_body("gpu-01", gpus=4), format="json")
    assert again.status_code == 200
    second, data2 = h.client_with(f"Node {again.data['credential']}"), again.data
    assert data1["credential"] != data2["credential"]
    assert first.post(AGENT + "heartbeat", {}, format="json").status_code == 401
    assert second.post(AGENT + "heartbeat", {}, format="json").status_code == 200
    assert Device.objects.filter(node__name="gpu-01").count() == 4


def test_a_node_may_reregister_itself_with_its_credential_but_not_another_node(join_token):
    node_a, _ = h.register(join_token, "gpu-01")
    h.register(join_token, "gpu-02")
    again = node_a.post(AGENT + "register", h.node_body("gpu-01"), format="json")
    assert again.status_code == 200 and again.data["credential"]
    renewed = h.client_with(f"Node {again.data['credential']}")
    steal = renewed.post(AGENT + "register", h.node_body("gpu-02"), format="json")
    assert steal.status_code == 403


# --- Heartbeats and a job's life ---------------------------------------------------------------


def test_a_heartbeat_renews_the_lease_and_brings_a_not_ready_node_back(join_token):
    node, _ = h.register(join_token)
    Node.objects.update(state=NodeState.NOT_READY, last_heartbeat=timezone.now() - timedelta(hours=1))
    answer = h.heartbeat(node)
    assert answer["start"] == [] and answer["stop"] == [] and answer["lease_seconds"] > 0
    refreshed = Node.objects.get()
    assert refreshed.state == NodeState.READY
    assert refreshed.last_heartbeat > timezone.now() - timedelta(seconds=5)


def test_a_heartbeat_does_not_undo_a_cordon(join_token):
    node, _ = h.register(join_token)
    Node.objects.update(state=NodeState.CORDONED)
    h.heartbeat(node)
    assert Node.objects.get().state == NodeState.CORDONED


def test_a_job_goes_from_binding_to_success_through_the_agents_reports(world, join_token):
    node, _ = h.register(join_token, "gpu-01")
    job = h.submit(world.alice, world.vision, env={"MODE": "x"}, time_limit_seconds=60)
    h.bind(job, "gpu-01", [2, 3])
    (binding,) = h.heartbeat(node)["start"]
    assert binding["job_id"] == job.pk and binding["gpus"] == [2, 3] and binding["attempt"] == 0
    assert binding["command"] == ["python", "-c", "print(1)"] and binding["env"] == {"MODE": "x"}
    assert binding["time_limit_seconds"] == 60 and binding["grace_seconds"] == 30
    assert binding["log_offset"] == 0 and binding["share"] == 1.0
    assert binding["resizable"] is False  # one replica of fixed size: no world file on the node

    assert h.report(node, job.pk, "started", attempt=0, replica=0, pid=42).status_code == 200
    running = [{"job_id": job.pk, "attempt": 0, "replica": 0, "pid": 42}]
    assert h.heartbeat(node, running)["start"] == []  # started: not sent again
    assert h.report(node, job.pk, "logs", attempt=0, replica=0, offset=0, data=b"2,3\n").status_code == 200
    done = h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=0)
    assert done.status_code == 200 and done.data["state"] == "succeeded"
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0
    assert _types(job) == ["submitted", "scheduled", "started", "succeeded"]
    assert bytes(LogChunk.objects.get(job=job).data) == b"2,3\n" and job.log_bytes == 4
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    again = h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=0)
    assert again.status_code == 200 and again.data["recorded"] is False


def test_an_exit_report_carrying_the_start_records_both_at_the_agents_start_time(world, join_token):
    # A process that ended at once is reported once: its exit report carries its start.
    node, _ = h.register(join_token, "gpu-01")
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0])
    spawned = timezone.now().timestamp()
    done = h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=0, started_at=spawned, pid=9)
    assert done.status_code == 200 and done.data["state"] == "succeeded"
    job.refresh_from_db()
    assert _types(job) == ["submitted", "scheduled", "started", "succeeded"]
    assert abs(job.started_at.timestamp() - spawned) < 0.001 and job.finished_at >= job.started_at


def test_a_skewed_agent_clock_cannot_put_a_start_before_the_binding_or_after_the_report(world, join_token):
    node, _ = h.register(join_token, "gpu-01")
    early = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0])
    late = h.bind(h.submit(world.alice, world.vision), "gpu-01", [1])
    hour_ago, in_an_hour = timezone.now().timestamp() - 3600, timezone.now().timestamp() + 3600
    h.report(node, early.pk, "started", attempt=0, replica=0, started_at=hour_ago, pid=3)
    before = timezone.now()
    h.report(node, late.pk, "exited", attempt=0, replica=0, exit_code=0, started_at=in_an_hour, pid=4)
    for job in (early, late):
        job.refresh_from_db()
        scheduled = job.events.get(type="scheduled").at
        started = job.events.get(type="started").at
        assert scheduled <= started == job.started_at
    assert early.started_at == max(a.created_at for a in early.allocations.all())  # the binding
    assert before <= late.started_at <= late.finished_at  # the report's time, not the agent's


def test_exits_reported_together_are_settled_and_answered_each_on_its_own(world, join_token):
    node, _ = h.register(join_token, "gpu-01")
    h.register(join_token, "gpu-02")
    done = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0])
    failed = h.bind(h.submit(world.alice, world.vision), "gpu-01", [1])
    elsewhere = h.bind(h.submit(world.alice, world.vision), "gpu-02", [0])
    now = timezone.now().timestamp()
    answer = node.post(
        AGENT + "exits",
        {
            "exits": [
                {"job_id": done.pk, "attempt": 0, "replica": 0, "exit_code": 0, "started_at": now, "pid": 5},
                {"job_id": failed.pk, "attempt": 3, "replica": 0, "exit_code": 1},  # an attempt never bound
                {"job_id": elsewhere.pk, "attempt": 0, "replica": 0, "exit_code": 0},  # another node's job
                {"job_id": failed.pk, "attempt": 0, "replica": 0, "exit_code": 1, "started_at": now},
            ]
        },
        format="json",
    )
    assert answer.status_code == 200, answer.content
    assert [r["status"] for r in answer.data["results"]] == [200, 409, 404, 200]
    assert [answer.data["results"][i]["state"] for i in (0, 3)] == ["succeeded", "failed"]
    for job, state in ((done, "succeeded"), (failed, "failed"), (elsewhere, "scheduled")):
        job.refresh_from_db()
        assert job.state == state
    assert _types(done) == ["submitted", "scheduled", "started", "succeeded"]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"exits": []},
        {"exits": [{"job_id": 1, "attempt": 0}]},
        {"exits": [{"job_id": 0, "attempt": 0, "exit_code": 0}]},
    ],
)
def test_a_bad_exits_body_is_refused_naming_the_field(join_token, body):
    node, _ = h.register(join_token, "gpu-01")
    answer = node.post(AGENT + "exits", body, format="json")
    assert answer.status_code == 400 and "exits" in answer.json(), answer.content


def test_a_heartbeat_says_which_checkpoints_jobs_can_resume_and_only_of_the_nodes_own_jobs(world):
    node, _ = h.register(h.new_join_token(), "gpu-01")
    other, _ = h.register(h.new_join_token(), "gpu-02")
    bound, ended, elsewhere = (h.submit(world.alice, world.vision, gpus=1) for _ in range(3))
    for job in (bound, ended):
        h.bind(job, "gpu-01", [0 if job is bound else 1])
    h.bind(elsewhere, "gpu-02", [0])
    do_cancel_job(ended.pk)  # bound, never started: settled by the next heartbeat, terminal
    h.heartbeat(node)
    ended.refresh_from_db()
    assert ended.state == JobState.CANCELLED
    asked = [bound.pk, ended.pk, elsewhere.pk, 999999]
    answer = node.post(AGENT + "heartbeat", {"running": [], "checkpoints": asked}, format="json")
    assert answer.status_code == 200, answer.content
    # another node's job, and one that does not exist: not answered for (the node learns nothing)
    assert answer.data["checkpoints"] == [
        {"job_id": bound.pk, "ended_at": None},  # it can still run: its checkpoint is kept
        {"job_id": ended.pk, "ended_at": ended.finished_at.timestamp()},
    ]
    assert "checkpoints" not in h.heartbeat(other)  # not asked: not answered
    bad = node.post(AGENT + "heartbeat", {"running": [], "checkpoints": ["x"]}, format="json")
    assert bad.status_code == 400 and "checkpoints" in bad.data


def test_a_heartbeat_reporting_the_process_catches_up_a_lost_started_report(world, join_token):
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    h.heartbeat(node, [{"job_id": job.pk, "attempt": 0, "replica": 0, "pid": 7}])
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and _types(job)[-1] == "started"


def test_log_chunks_are_idempotent_on_their_offset_and_capped_per_job(world, join_token, settings):
    settings.TESSERA = {**settings.TESSERA, "LOG_CAP_BYTES": 10}
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    h.report(node, job.pk, "started", attempt=0, replica=0)
    assert h.report(node, job.pk, "logs", attempt=0, replica=0, offset=0, data=b"abcd").data["stored"] == 4
    retry = h.report(node, job.pk, "logs", attempt=0, replica=0, offset=0, data=b"abcd")
    assert retry.data == {"stored": 0, "next_offset": 4, "truncated": False}
    overlap = h.report(node, job.pk, "logs", attempt=0, replica=0, offset=2, data=b"cdefgh")
    assert overlap.data["stored"] == 4 and overlap.data["next_offset"] == 8
    over = h.report(node, job.pk, "logs", attempt=0, replica=0, offset=8, data=b"ijklmnop")
    assert over.data == {"stored": 2, "next_offset": 10, "truncated": True}
    job.refresh_from_db()
    stored = b"".join(bytes(c.data) for c in LogChunk.objects.filter(job=job).order_by("offset"))
    # the cut is marked in the log itself, once, on a line of its own
    cut = b"\n[tessera] output past the job's log cap of 10 bytes dropped\n"
    assert stored == b"abcdefghij" + cut and job.log_truncated and job.log_bytes == 10
    again = h.report(node, job.pk, "logs", attempt=0, replica=0, offset=16, data=b"qrst")
    assert again.data["stored"] == 0 and again.data["truncated"]
    stored = b"".join(bytes(c.data) for c in LogChunk.objects.filter(job=job).order_by("offset"))
    assert stored == b"abcdefghij" + cut


def test_a_bad_log_chunk_is_refused_naming_the_field(world, join_token):
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    url = f"{AGENT}jobs/{job.pk}/logs"
    answer = node.post(url, {"attempt": 0, "offset": 0, "data": "%%%"}, format="json")
    assert answer.status_code == 400 and list(answer.json()) == ["data"]
    answer = node.post(url, {"attempt": 0, "offset": -1, "data": ""}, format="json")
    assert answer.status_code == 400 and list(answer.json()) == ["offset"]


def test_a_failed_replica_stops_the_others_and_the_job_fails(world, join_token):
    node_a, _ = h.register(join_token, "gpu-01")
    node_b, _ = h.register(join_token, "gpu-02")
    job = h.submit(world.alice, world.vision, gpus=16, replicas=2, min_available=2, grace_seconds=20)
    h.bind(job, "gpu-01", list(range(8)), replica=0)
    from scheduling.models import Allocation as A

    for i in range(8):
        A.objects.create(job=job, device=Device.objects.get(node__name="gpu-02", index=i), replica=1)
    (b0,) = h.heartbeat(node_a)["start"]
    (b1,) = h.heartbeat(node_b)["start"]
    assert (b0["replica"], b1["replica"], b1["replicas"]) == (0, 1, 2)
    h.report(node_a, job.pk, "started", attempt=0, replica=0)
    h.report(node_b, job.pk, "started", attempt=0, replica=1)

    h.report(node_a, job.pk, "exited", attempt=0, replica=0, exit_code=3)
    job.refresh_from_db()
    assert job.state == JobState.TERMINATING and job.stop_reason == "exit 3"
    (order,) = h.heartbeat(node_b, [{"job_id": job.pk, "attempt": 0, "replica": 1, "pid": 9}])["stop"]
    assert order["replica"] == 1 and 19 <= order["grace_left_seconds"] <= 20
    # Replica 0's process is gone but its GPUs stay held until the job settles (freed together).
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 16
    assert Allocation.objects.filter(job=job, exited_at__isnull=False).count() == 8

    h.report(node_b, job.pk, "exited", attempt=0, replica=1, exit_code=-15, reason="stopped")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.exit_code == 3
    assert job.events.order_by("-at", "-id").first().reason == "exit 3"
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_job_stopped_at_its_time_limit_fails_with_reason_time_limit(world, join_token):
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision, time_limit_seconds=1), "gpu-01", [0, 1])
    h.report(node, job.pk, "started", attempt=0, replica=0)
    h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=-15, reason="time-limit")
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert [(e.type, e.reason) for e in job.events.order_by("at", "id")][-2:] == [
        ("terminating", "time-limit"),
        ("failed", "time-limit"),
    ]


def test_a_job_its_agent_stopped_for_filling_its_disk_fails_with_disk_limit_not_retried(world, join_token):
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision, max_retries=2), "gpu-01", [0, 1])
    h.report(node, job.pk, "started", attempt=0, replica=0)
    h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=-9, reason="disk-limit")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.attempts == 0
    assert [(e.type, e.reason) for e in job.events.order_by("at", "id")][-2:] == [
        ("terminating", "disk-limit"),
        ("failed", "disk-limit"),
    ]


def test_the_server_stops_a_job_its_agent_let_run_past_its_time_limit(world, join_token):
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision, time_limit_seconds=5), "gpu-01", [0, 1])
    h.report(node, job.pk, "started", attempt=0, replica=0)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=60))
    (order,) = h.heartbeat(node, [{"job_id": job.pk, "attempt": 0, "replica": 0, "pid": 1}])["stop"]
    assert order["reason"] == "time-limit"


def test_a_cancelled_running_job_gets_a_stop_order_with_its_grace(world, join_token):
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision, grace_seconds=7), "gpu-01", [0, 1])
    h.report(node, job.pk, "started", attempt=0, replica=0)
    do_cancel_job(job.pk)
    running = [{"job_id": job.pk, "attempt": 0, "replica": 0, "pid": 1}]
    (order,) = h.heartbeat(node, running)["stop"]
    assert order["reason"] == "cancelled" and 6 <= order["grace_left_seconds"] <= 7
    h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=-15, reason="stopped")
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_a_process_not_bound_to_the_node_gets_an_immediate_stop_order(world, join_token):
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    h.report(node, job.pk, "started", attempt=0, replica=0)
    stale = [{"job_id": job.pk, "attempt": 5, "replica": 0, "pid": 1}]
    stops = h.heartbeat(node, stale)["stop"]
    assert [(s["attempt"], s["grace_left_seconds"]) for s in stops] == [(5, 0.0)]


def test_reports_about_an_old_attempt_are_refused_as_stale(world, join_token, settings):
    settings.TESSERA = {**settings.TESSERA, "RETRY_BACKOFF_S": 0.0}
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision, max_retries=1), "gpu-01", [0, 1])
    h.report(node, job.pk, "started", attempt=0, replica=0)
    h.report(node, job.pk, "logs", attempt=0, replica=0, offset=0, data=b"try 1\n")
    h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=1)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.attempts == 1
    h.bind(job, "gpu-01", [4, 5])
    (binding,) = h.heartbeat(node)["start"]
    assert binding["attempt"] == 1 and binding["log_offset"] == 6  # the retry's output follows
    assert h.report(node, job.pk, "started", attempt=0, replica=0).status_code == 409
    assert h.report(node, job.pk, "logs", attempt=0, replica=0, offset=6, data=b"x").status_code == 409
    assert h.report(node, job.pk, "started", attempt=1, replica=0).status_code == 200


def test_a_restarted_agent_settles_its_lost_running_replicas(world, join_token):
    node, _ = h.register(join_token)
    running = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    waiting = h.bind(h.submit(world.alice, world.vision), "gpu-01", [2, 3])
    h.report(node, running.pk, "started", attempt=0, replica=0)
    assert node.post(AGENT + "register", h.node_body("gpu-01"), format="json").status_code == 200
    running.refresh_from_db()
    waiting.refresh_from_db()
    # Its node lost it, not its own fault: back to the queue without a retry (it had none)
    assert running.state == JobState.PENDING and running.node_losses == 1
    assert running.events.order_by("-id").first().type == "requeued"
    assert running.events.order_by("-id").first().reason == "node-lost"
    assert waiting.state == JobState.SCHEDULED  # the new agent will start it


def test_a_job_id_out_of_range_answers_404_not_500(join_token):
    node, _ = h.register(join_token)
    for job_id in ("0", "999999999999999999", "99999999999999999999999"):
        answer = h.report(node, job_id, "started", attempt=0, replica=0)
        assert answer.status_code == 404, (job_id, answer.content)


def test_a_gang_succeeds_only_when_its_last_replica_exits_zero(world, join_token):
    node, _ = h.register(join_token, "gpu-01")
    job = h.submit(world.alice, world.vision, gpus=4, replicas=2, min_available=2)
    h.bind(job, "gpu-01", [0, 1], replica=0)
    for i in (2, 3):
        Allocation.objects.create(job=job, device=Device.objects.get(node__name="gpu-01", index=i), replica=1)
    assert sorted((b["replica"], tuple(b["gpus"])) for b in h.heartbeat(node)["start"]) == [
        (0, (0, 1)),
        (1, (2, 3)),
    ]
    for replica in (0, 1):
        h.report(node, job.pk, "started", attempt=0, replica=replica)
    h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=0)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    # Replica 0's GPUs stay held until the whole gang ends; it is not started again meanwhile.
    assert list(
        Allocation.objects.filter(job=job, released_at__isnull=True, exited_at__isnull=True)
        .values_list("device__index", flat=True)
        .order_by("device__index")
    ) == [2, 3]
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 4
    running = [{"job_id": job.pk, "attempt": 0, "replica": 1, "pid": 7}]
    assert h.heartbeat(node, running)["start"] == []
    h.report(node, job.pk, "exited", attempt=0, replica=1, exit_code=0)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert _types(job) == ["submitted", "scheduled", "started", "succeeded"]
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_replica_killed_by_its_agents_fencing_counts_as_a_node_loss_not_as_its_signal(world, join_token):
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    h.report(node, job.pk, "started", attempt=0, replica=0)
    h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=-9, reason="lost")
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.exit_code is None and job.node_losses == 1
    assert [(e.type, e.reason) for e in job.events.order_by("id")][-1] == ("requeued", "node-lost")


def test_an_old_attempts_process_is_stopped_while_the_new_one_keeps_running(world, join_token):
    node, _ = h.register(join_token)
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    Job.objects.filter(pk=job.pk).update(attempts=1)
    Allocation.objects.filter(job=job).update(attempt=1)
    h.report(node, job.pk, "started", attempt=1, replica=0)
    both = [{"job_id": job.pk, "attempt": a, "replica": 0, "pid": 10 + a} for a in (0, 1)]
    answer = h.heartbeat(node, both)
    assert [(s["attempt"], s["grace_left_seconds"]) for s in answer["stop"]] == [(0, 0.0)]
    assert answer["start"] == []


def test_a_checkpoint_report_over_http_names_its_field_or_answers_404_for_another_nodes_job(
    world, join_token
):
    node, _ = h.register(join_token, "gpu-01")
    other, _ = h.register(h.new_join_token("other"), "gpu-02")
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    h.report(node, job.pk, "started", attempt=0, replica=0)
    at = timezone.now().timestamp()
    answer = h.report(node, job.pk, "checkpointed", attempt=0, replica=0, at=at, line="step 7")
    assert answer.status_code == 200, answer.content
    assert h.report(other, job.pk, "checkpointed", attempt=0, replica=0, at=at).status_code == 404
    assert h.report(node, job.pk, "checkpointed", attempt=1, replica=0, at=at).status_code == 409
    assert h.report(node, job.pk, "checkpointed", attempt=0, replica=3, at=at).status_code == 409
    bad = h.report(node, job.pk, "checkpointed", attempt=0, replica=0, at="soon")
    assert bad.status_code == 400 and "at" in bad.json()
    (event,) = job.events.filter(type="checkpointed")
    assert event.reason == "step 7"


def test_a_gangs_replicas_are_told_where_to_meet_at_the_address_its_first_nodes_agent_registered(
    world, join_token
):
    first, _ = h.register(join_token, "gpu-01", address="10.1.0.1")
    second, _ = h.register(h.new_join_token("second"), "gpu-02", address="10.1.0.2")
    job = h.submit(world.alice, world.vision, gpus=4, replicas=2, min_available=2)
    h.bind(job, "gpu-01", [2, 3], replica=0)
    for i in (0, 1):
        Allocation.objects.create(job=job, device=Device.objects.get(node__name="gpu-02", index=i), replica=1)
    (theirs,) = h.heartbeat(second)["start"]
    (mine,) = h.heartbeat(first)["start"]
    assert mine["rendezvous"] == {
        "master_addr": "10.1.0.1",
        "master_port": 29502,  # 29500 + the master replica's first GPU: no other job has it there
        "world_size": 2,
        "rank": 0,
        "local_rank": 0,
    }
    assert theirs["rendezvous"] == {**mine["rendezvous"], "rank": 1}


def test_a_node_address_that_is_not_a_host_name_or_ip_is_refused_naming_the_field(join_token):
    answer = h.client_with(f"Join {join_token}").post(
        AGENT + "register", h.node_body("gpu-01", address="evil host; rm -rf /"), format="json"
    )
    assert answer.status_code == 400 and "address" in answer.json()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("register", h.node_body(name=0), "name"),  # not "0"
        ("register", h.node_body(cpus="64"), "cpus"),
        ("register", h.node_body(name="gpu-01\n"), "name"),
        ("register", h.node_body(metrics_url="ftp://x"), "metrics_url"),
        ("heartbeat", {"utilisation": [{"gpu": 0, "util": 1.0, "sm_active": False}]}, "utilisation"),
        ("heartbeat", {"running": [{"job_id": "1", "attempt": 0, "replica": 0}]}, "running"),
        ("exits", {"exits": [{"job_id": 1, "attempt": 0, "exit_code": 0, "started_at": False}]}, "exits"),
    ],
)
def test_agent_bodies_of_the_wrong_json_types_are_400s_naming_the_field(db, path, body, field):
    """An agent's body is JSON typed as the schema says: a number is not a string, nor a boolean
    a number (DRF's stock fields would turn false into 0.0 and 0 into "0")."""
    node, _ = h.register(h.new_join_token(), "gpu-01")
    client = h.client_with(f"Join {h.new_join_token()}") if path == "register" else node
    answer = client.post(AGENT + path, body, format="json")
    assert answer.status_code == 400 and field in answer.json(), answer.content

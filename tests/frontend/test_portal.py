"""The portal's job pages: the submit form, the jobs list, a job's page, cancel, the team page.

Who may see what: alice and carol (vision) see and act on each other's jobs; bob (nlp) gets 404 for
them, on every page and action; admin (operator) sees every team. The form's messages are the
API's own (its serializer validates what the form sends).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client

from scheduling.models import Job, JobEvent
from tests.api.bad_bodies import CASES
from tests.frontend.helpers import make_node

API_BODY = {"name": "t", "kind": "batch", "command": ["true"], "gpus": 1}
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def signed_in(user: Any, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def form(**fields: str) -> dict[str, str]:
    return {
        "name": "resnet",
        "kind": "training",
        "command": "python train.py --lr 0.1",
        "gpus": "2",
        **fields,
    }


def submit(world: Any, who: str, **body: Any) -> int:
    body = {"name": f"{who}-job", "kind": "training", "command": ["true"], **body}
    response = world.client(who).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_every_portal_page_sends_an_anonymous_visitor_to_sign_in(db: Any) -> None:
    for url in ("/jobs/", "/jobs/new/", "/jobs/1/", "/team/", "/jobs/1/log.txt", "/tokens/"):
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), url


def test_alice_submits_from_the_form_and_lands_on_her_jobs_page(world: Any, cluster: Any) -> None:
    client = signed_in(world.alice)
    response = client.post(
        "/jobs/new/",
        form(accelerators="H100, A100", env="WANDB_MODE=offline\nSEED=3", priority="5", preemptible="false"),
    )
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.owner == world.alice and job.tenant == world.vision
    assert job.command == ["python", "train.py", "--lr", "0.1"]
    assert job.accelerators == ["H100", "A100"] and job.env == {"WANDB_MODE": "offline", "SEED": "3"}
    assert job.priority == 5 and job.preemptible is False and job.gpus == 2
    page = client.get(response["Location"]).content.decode()
    assert "resnet" in page and "pending" in page and "Why it waits" in page
    assert "alice" in page  # the owner


def test_a_waiting_jobs_page_and_the_list_show_its_estimate_band_basis_and_place(
    world: Any, cluster: Any
) -> None:
    from datetime import UTC, datetime

    client = signed_in(world.alice)
    client.post("/jobs/new/", form())
    job = Job.objects.get()
    at = [datetime(2026, 1, 1, h, tzinfo=UTC) for h in (9, 10, 12)]
    Job.objects.filter(pk=job.pk).update(  # as a pass stores them (scheduling/services/passes.py)
        estimated_start=at[1], estimated_start_earliest=at[0], estimated_start_latest=at[2],
        estimate_basis="2 job(s) ahead of it; its runtime from 4 earlier runs of 'resnet' by the same user",
        queue_position=3, jobs_ahead=2,
    )  # fmt: skip
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "likely between" in page and "2026-01-01 09:00" in page and "2026-01-01 12:00" in page
    assert "Place in the queue: 3 (2 jobs ahead of it)" in page
    assert "4 earlier runs of &#x27;resnet&#x27; by the same user" in page
    listed = client.get("/jobs/").content.decode()
    assert "#3 in the queue" in listed


def test_the_forms_messages_are_the_apis_and_what_was_typed_stays(world: Any, cluster: Any) -> None:
    typed = form(name="", gpus="3", replicas="2", priority="high", time_limit_seconds="-5")
    response = signed_in(world.alice).post("/jobs/new/", typed)
    assert response.status_code == 400
    page = response.content.decode()
    api = world.client("alice").post(
        "/api/v1/jobs/",
        {"kind": "training", "command": ["x"], "gpus": 3, "replicas": 2, "priority": "high"},  # no name
        format="json",
    )
    for field in ("name", "priority"):
        for message in api.json()[field]:
            assert message in page, (field, message)
    assert 'value="high"' in page and 'value="-5"' in page and 'value="python train.py --lr 0.1"' in page
    assert Job.objects.count() == 0


def test_a_field_the_form_cannot_read_comes_with_the_apis_messages_on_the_others(
    world: Any, cluster: Any
) -> None:
    """An env line without "=" and an unclosed quote used to hide every other field's message:
    the person fixed one, pressed Submit, and only then learnt of the next."""
    typed = form(command="python 'train.py", env="novalue", gpus="abc", priority="9999999")
    response = signed_in(world.alice).post("/jobs/new/", typed)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert errors["env"] == ["line 1: write KEY=VALUE"]
    assert errors["command"][0].startswith("cannot be split into arguments")  # not "required"
    assert errors["gpus"] == ["must be a number"]
    assert errors["priority"] == ["must be at most 1000000"]
    assert 'aria-describedby="id_gpus_error"' in response.content.decode()
    assert Job.objects.count() == 0


def test_a_field_that_only_the_cross_field_rules_refuse_shows_its_message(world: Any) -> None:
    page = signed_in(world.alice).post("/jobs/new/", form(gpus="3", replicas="2")).content.decode()
    assert "must divide gpus" in page
    assert Job.objects.count() == 0


def test_a_yaml_job_file_is_submitted_as_the_apis_body(world: Any) -> None:
    job_file = "name: from-yaml\nkind: batch\ncommand: [python, -c, 'print(1)']\ngpus: 1\nenv: {A: b}\n"
    response = signed_in(world.alice).post("/jobs/new/", {"job_file": job_file})
    assert response.status_code == 302
    job = Job.objects.get()
    assert (job.name, job.kind, job.command, job.env) == (
        "from-yaml",
        "batch",
        ["python", "-c", "print(1)"],
        {"A": "b"},
    )


def test_an_uploaded_json_job_file_is_submitted(world: Any) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    body = {"name": "uploaded", "kind": "inference", "command": ["serve"], "gpus": 0.5}
    upload = SimpleUploadedFile("job.json", json.dumps(body).encode(), content_type="application/json")
    response = signed_in(world.alice).post("/jobs/new/", {"upload": upload})
    assert response.status_code == 302
    assert Job.objects.get().gpus == 0.5


@pytest.mark.parametrize(
    "text, words",
    [
        ("name: [unclosed", "not valid YAML or JSON"),
        ("- a list\n- of things", "must hold one job"),
        ("name: x\nkind: batch\ncommand: [x]\ncolour: blue", "colour: unknown field"),
    ],
)
def test_a_bad_job_file_is_refused_with_a_sentence(world: Any, text: str, words: str) -> None:
    response = signed_in(world.alice).post("/jobs/new/", {"job_file": text})
    assert response.status_code == 400
    assert words in response.content.decode()
    assert Job.objects.count() == 0


def is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_the_hostile_body_corpus_through_the_form_is_refused_never_a_500(world: Any) -> None:
    client = signed_in(world.alice)
    for case, body, _status, key in CASES:
        if isinstance(body, bytes) and not is_utf8(body):
            continue  # a browser's text box holds characters, not bytes
        text = body.decode() if isinstance(body, bytes) else json.dumps(body)
        response = client.post("/jobs/new/", {"job_file": text})
        assert response.status_code in (400, 413), (case, response.status_code)
        if response.status_code == 400 and key != "detail":
            assert key in response.content.decode(), case
    assert Job.objects.count() == 0


def test_a_dry_run_from_the_form_says_where_it_would_start_and_stores_nothing(
    world: Any, cluster: Any
) -> None:
    response = signed_in(world.alice).post("/jobs/new/", {**form(accelerators="H100"), "dry_run": "1"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "It would start now on n01 [0, 1]" in page
    assert Job.objects.count() == 0 and JobEvent.objects.count() == 0


def test_presets_fill_the_form_for_each_kind(world: Any) -> None:
    page = signed_in(world.alice).get("/jobs/new/?preset=training").content.decode()
    assert re.search(r'<option value="training" selected', page)
    assert 'value="600"' in page  # checkpoint every 10 minutes


def test_each_refused_field_points_a_screen_reader_at_its_own_message(world: Any) -> None:
    """Django marks a refused field ``aria-invalid`` and ``aria-describedby="<id>_error"``: the
    message beside it must carry that id, or assistive technology reads the field with no reason
    (the operator's Team select and the tokens form, written by hand, as well)."""
    pages = {
        "job form": signed_in(world.alice).post("/jobs/new/", form(gpus="many", kind="nope", name="")),
        "operator's team": signed_in(world.admin).post("/jobs/new/", form()),
        "tokens": signed_in(world.alice).post("/tokens/", {"name": "\x00"}),
    }
    for what, response in pages.items():
        assert response.status_code in (400, 403), what
        page = response.content.decode()
        invalid = re.findall(r'<(?:input|select|textarea)\b[^>]*aria-invalid="true"[^>]*>', page)
        assert invalid, what
        for tag in invalid:
            described = re.search(r'aria-describedby="([^"]+)"', tag)
            assert described, (what, tag)
            for ref in described.group(1).split():
                message = re.search(rf'<[^>]*\bid="{ref}"[^>]*>(.*?)</', page, re.S)
                assert message and message.group(1).strip(), (what, tag, ref)


def test_why_a_job_waits_names_its_code_once(world: Any) -> None:
    """The scheduler's sentence mostly begins with its code ("quota: vision uses …"): the page
    shows the code as a chip and must not repeat it before the sentence."""
    job_id = submit(world, "alice", name="over-quota")
    reason = "quota: vision uses 64 of 64 H100 (limit)"
    Job.objects.filter(pk=job_id).update(pending_code="quota", pending_reason=reason)
    page = signed_in(world.alice).get(f"/jobs/{job_id}/").content.decode()
    why = re.search(r'id="why-pending">.*?<p><span class="code">(.*?)</span>(.*?)</p>', page, re.S)
    assert why, page
    assert (why.group(1), why.group(2).strip()) == ("quota", "vision uses 64 of 64 H100 (limit)")
    assert "over-quota" in page


def test_resubmit_copies_a_teammates_job_but_bob_gets_404(world: Any) -> None:
    job_id = submit(world, "alice", name="copy-me", gpus=4, env={"K": "v"}, command=["python", "a b.py"])
    page = signed_in(world.carol).get(f"/jobs/new/?from={job_id}").content.decode()
    assert 'value="copy-me"' in page and "python &#x27;a b.py&#x27;" in page and "K=v" in page
    assert signed_in(world.bob).get(f"/jobs/new/?from={job_id}").status_code == 404


def resubmit_unchanged(client: Client, job_id: int) -> Job:
    """Open "Resubmit as a copy" and press Submit with the form as shown; the new job."""
    shown = client.get(f"/jobs/new/?from={job_id}")
    assert shown.status_code == 200
    form = shown.context["form"]
    data = {name: form[name].value() or "" for name in form.fields if name != "upload"}
    data["submit_key"] = shown.context["submit_key"]
    response = client.post("/jobs/new/", data)
    assert response.status_code == 302, response.content.decode()[-3000:]
    return Job.objects.get(pk=int(response["Location"].strip("/").split("/")[-1]))


COPIED = [
    "name",
    "kind",
    "command",
    "gpus",
    "replicas",
    "min_available",
    "accelerators",
    "topology",
    "priority",
    "preemptible",
    "grace_seconds",
    "checkpoint_seconds",
    "time_limit_seconds",
    "cpus",
    "memory_gib",
    "env",
    "node_selector",
    "prefer_labels",
    "max_retries",
    "elastic_min_gpus",
    "elastic_max_gpus",
    "idle_mode",
]


@pytest.mark.parametrize(
    "body",
    [
        {"interactive": True},
        {"preemptible": False, "idle_reclaim": "allow"},
        {"gpus": 0, "cpus": 1.2345678, "memory_gib": 3.14159265},
        {"env": {"CONFIG": "a=1\nb=2", "PAD": "  x  ", "K": "v"}},
        {"node_selector": {"zone": "eu west "}, "gpus": 0.25},
    ],
    ids=["interactive", "idle-reclaim-allow", "precise-numbers", "multi-line-env", "label-spaces"],
)
def test_a_copy_resubmitted_unchanged_is_the_same_job(world: Any, cluster: Any, body: Any) -> None:
    """What "Resubmit as a copy" shows, sent back as it is, stores the job the source was: not one
    that lost its interactive flag, six digits of a number, or an env value's second line."""
    job_id = submit(world, "alice", name="source", kind="batch", **body)
    source = Job.objects.get(pk=job_id)
    copy = resubmit_unchanged(signed_in(world.carol), job_id)
    assert copy.pk != source.pk
    assert {f: getattr(copy, f) for f in COPIED} == {f: getattr(source, f) for f in COPIED}


def test_the_form_sets_interactive_and_idle_reclaim(world: Any, cluster: Any) -> None:
    client = signed_in(world.alice)
    client.post("/jobs/new/", form(name="notebook", interactive="true"))
    client.post("/jobs/new/", form(name="reclaimable", preemptible="false", idle_reclaim="allow"))
    modes = dict(Job.objects.values_list("name", "idle_mode"))
    assert modes == {"notebook": "interactive", "reclaimable": "allow"}
    for name, said in (("notebook", "interactive: never judged idle"), ("reclaimable", "requeued when idle")):
        page = client.get(f"/jobs/{Job.objects.get(name=name).pk}/").content.decode()
        assert said in page, name


def test_an_operators_copy_of_a_job_keeps_its_team(world: Any, cluster: Any) -> None:
    """An operator submits for a team (the form's Team): a copy of a team's job must have that
    team chosen, or submitting the copy unchanged is refused ("operators belong to no tenant")."""
    job_id = submit(world, "bob", name="nlp-run", gpus=1)
    page = signed_in(world.admin).get(f"/jobs/new/?from={job_id}").content.decode()
    assert '<option value="nlp" selected>' in page
    assert '<option value="vision" selected>' not in page


def test_a_job_no_quota_admits_is_refused_beside_the_field_that_was_typed(world: Any, cluster: Any) -> None:
    """Refused for its size with no accelerator named, the API's sentence stood beside the empty
    Accelerators box; it now stands beside the GPUs typed (and beside the models when named)."""
    client = signed_in(world.alice)
    plain = client.post("/jobs/new/", form(gpus="128", replicas="16")).context["form"].errors
    assert "largest applicable quota limit" in plain["gpus"][0] and "accelerators" not in plain
    named = client.post("/jobs/new/", form(gpus="128", replicas="16", accelerators="H100"))
    assert "largest applicable quota limit" in named.context["form"].errors["accelerators"][0]
    assert Job.objects.count() == 0


def test_signing_in_again_after_an_action_lands_on_its_page_and_changes_nothing(world: Any) -> None:
    """A session that ended before Cancel (or Hold, Release, bulk cancel, Revoke) was pressed sends
    the person to sign in with the action's URL as next; signing in then brought them there with a
    GET, and require_POST answered a blank 405. Now the GET lands on the action's page."""
    from scheduling.services.tokens import do_create_api_token

    job_id = submit(world, "alice", name="still-wanted")
    token, _ = do_create_api_token(world.alice, "laptop")
    pages = {
        f"/jobs/{job_id}/cancel/": f"/jobs/{job_id}/",
        f"/jobs/{job_id}/hold/": f"/jobs/{job_id}/",
        f"/jobs/{job_id}/release/": f"/jobs/{job_id}/",
        "/jobs/cancel/": "/jobs/",
        f"/tokens/{token.pk}/revoke/": "/tokens/",
    }
    alice = signed_in(world.alice)
    for action, page in pages.items():
        expired = Client().post(action, {"job": [str(job_id)]})
        assert expired.status_code == 302 and expired["Location"] == f"/login/?next={action}"
        back = alice.get(action)
        assert back.status_code == 302 and back["Location"] == page, action
        assert alice.get(page).status_code == 200
        assert alice.put(action).status_code == 405
    job = Job.objects.get(pk=job_id)
    assert job.state == "pending" and not job.held  # a GET acted on nothing
    assert world.alice.api_tokens.filter(pk=token.pk).exists()


def test_bob_cannot_open_or_act_on_alices_job(world: Any) -> None:
    job_id = submit(world, "alice", name="alice-secret")
    bob = signed_in(world.bob)
    assert bob.get(f"/jobs/{job_id}/").status_code == 404
    assert bob.get(f"/jobs/{job_id}/?fragment=status").status_code == 404
    assert bob.get(f"/jobs/{job_id}/log.txt").status_code == 404
    assert bob.post(f"/jobs/{job_id}/cancel/").status_code == 404
    bob.post("/jobs/cancel/", {"job": [str(job_id)]})
    assert "alice-secret" not in bob.get("/jobs/").content.decode()
    assert Job.objects.get(pk=job_id).state == "pending"


def test_a_hostile_name_and_command_are_shown_as_text_never_markup(world: Any) -> None:
    job_id = submit(world, "alice", name=HOSTILE[:128], command=["sh", "-c", HOSTILE])
    client = signed_in(world.alice)
    for url in (f"/jobs/{job_id}/", "/jobs/", f"/jobs/new/?from={job_id}"):
        page = client.get(url).content.decode()
        assert "<script>alert" not in page and "<img src=x" not in page, url
        assert "&lt;script&gt;alert" in page, url


def test_every_form_needs_its_csrf_token(world: Any) -> None:
    job_id = submit(world, "alice")
    client = signed_in(world.alice, csrf=True)
    for url, data in (
        ("/jobs/new/", form()),
        (f"/jobs/{job_id}/cancel/", {}),
        ("/jobs/cancel/", {"job": [str(job_id)]}),
        (f"/jobs/{job_id}/hold/", {}),
        (f"/jobs/{job_id}/release/", {}),
        ("/tokens/", {"name": "ci"}),
        ("/tokens/1/revoke/", {}),
        ("/logout/", {}),
    ):
        assert client.post(url, data).status_code == 403, url
    assert Job.objects.get(pk=job_id).state == "pending" and Job.objects.count() == 1
    page = client.get("/jobs/new/").content.decode()
    assert 'name="csrfmiddlewaretoken"' in page


def test_cancel_from_the_job_page_goes_through_the_service_and_says_so(world: Any) -> None:
    job_id = submit(world, "alice")
    client = signed_in(world.carol)
    response = client.post(f"/jobs/{job_id}/cancel/", {"seen_state": "pending"}, follow=True)
    assert Job.objects.get(pk=job_id).state == "cancelled"
    assert "cancelled" in response.content.decode()
    assert JobEvent.objects.filter(job_id=job_id, type="cancelled").count() == 1


def test_cancelling_a_running_job_as_seen_does_not_say_it_changed_meanwhile(world: Any, cluster: Any) -> None:
    """The cancel itself moves a running job to terminating: "it changed meanwhile" is for a job
    that was in another state than the one its page showed, before the cancel."""
    from tests.api.helpers import bind, run

    job = Job.objects.get(pk=submit(world, "alice"))
    bind(job, cluster[0], [0])
    run(job)
    client = signed_in(world.carol)
    page = client.post(f"/jobs/{job.pk}/cancel/", {"seen_state": "running"}, follow=True).content.decode()
    assert Job.objects.get(pk=job.pk).state == "terminating"
    assert "stopping" in page and "meanwhile" not in page

    other = Job.objects.get(pk=submit(world, "alice", name="seen-pending"))
    bind(other, cluster[0], [1])
    run(other)  # it started after the page was drawn
    page = client.post(f"/jobs/{other.pk}/cancel/", {"seen_state": "pending"}, follow=True).content.decode()
    assert "it changed meanwhile: it was pending when you looked" in page


def test_a_form_whose_csrf_token_went_stale_says_so_in_the_portal_and_does_nothing(world: Any) -> None:
    """Signing in again in another tab rotates the CSRF token: a page left open then posts a stale
    one. The answer is a 403 in the portal's own layout that says what happened and leads back to
    the page, not Django's bare "CSRF verification failed. Request aborted." dead end."""
    job_id = submit(world, "alice")
    client = signed_in(world.alice, csrf=True)
    client.get(f"/jobs/{job_id}/")  # the page, with its form and a CSRF cookie
    response = client.post(
        f"/jobs/{job_id}/cancel/",
        {"seen_state": "pending", "csrfmiddlewaretoken": "stale" * 8},
        HTTP_REFERER=f"http://testserver/jobs/{job_id}/",
    )
    page = response.content.decode()
    assert response.status_code == 403
    assert 'class="topbar"' in page and "Request aborted" not in page
    assert "nothing was done" in page.lower()
    assert f'href="/jobs/{job_id}/"' in page  # back to the page it came from
    assert Job.objects.get(pk=job_id).state == "pending"
    elsewhere = client.post("/jobs/cancel/", {"job": [str(job_id)]}, HTTP_REFERER="https://evil.example/x")
    assert elsewhere.status_code == 403 and "evil.example" not in elsewhere.content.decode()


def test_cancelling_a_job_that_ended_meanwhile_says_so(world: Any, cluster: Any) -> None:
    from tests.api.helpers import bind, finish, run

    job = Job.objects.get(pk=submit(world, "alice"))
    bind(job, cluster[0], [0])
    run(job)
    finish(job, 0)
    response = signed_in(world.alice).post(f"/jobs/{job.pk}/cancel/", {"seen_state": "running"}, follow=True)
    assert "ended meanwhile" in response.content.decode()
    assert Job.objects.get(pk=job.pk).state == "succeeded"


def test_bulk_cancel_stops_the_selected_jobs_only(world: Any) -> None:
    a, b, c = (submit(world, "alice", name=n) for n in ("a", "b", "c"))
    response = signed_in(world.alice).post("/jobs/cancel/", {"job": [str(a), str(c), "junk"]})
    assert response.status_code == 302
    assert {j.pk: j.state for j in Job.objects.all()} == {a: "cancelled", b: "pending", c: "cancelled"}


def test_the_list_filters_by_owner_state_kind_and_name_and_pages(world: Any) -> None:
    submit(world, "alice", name="alpha-run")
    submit(world, "carol", name="carol-batch", kind="batch")
    submit(world, "bob", name="bob-run")
    alice = signed_in(world.alice)
    team = alice.get("/jobs/").content.decode()
    assert "alpha-run" in team and "carol-batch" in team and "bob-run" not in team
    mine = alice.get("/jobs/?scope=mine").content.decode()
    assert "alpha-run" in mine and "carol-batch" not in mine
    assert "alpha-run" not in alice.get("/jobs/?kind=batch").content.decode()
    assert "carol-batch" in alice.get("/jobs/?owner=carol").content.decode()
    assert "carol-batch" not in alice.get("/jobs/?name=alpha").content.decode()
    assert alice.get("/jobs/?state=nonsense&kind=%00&page=zz&sort=evil&name=%00").status_code == 200


def test_the_lists_page_links_say_where_they_go_in_its_sort(world: Any, monkeypatch: Any) -> None:
    """Sorted oldest first, the next page holds newer jobs: its link must not say "older"."""
    monkeypatch.setattr("frontend.jobs.PAGE_SIZE", 2)
    for i in range(5):
        submit(world, "alice", name=f"paged-{i}")
    alice = signed_in(world.alice)

    def pager(query: str) -> str:
        page = alice.get(f"/jobs/?{query}").content.decode()
        return re.sub(r"\s+", " ", page[page.index('class="pager"') :].split("</nav>")[0])

    assert ">older →<" in pager("sort=newest&page=2") and ">← newer<" in pager("sort=newest&page=2")
    assert ">newer →<" in pager("sort=oldest&page=2") and ">← older<" in pager("sort=oldest&page=2")
    by_name = pager("sort=name&page=2")
    assert ">next →<" in by_name and ">← previous<" in by_name


def test_the_list_keeps_failed_and_finished_jobs_with_their_outcome(world: Any, cluster: Any) -> None:
    from tests.api.helpers import bind, finish, run

    job = Job.objects.get(pk=submit(world, "alice", name="will-fail"))
    bind(job, cluster[0], [0])
    run(job)
    finish(job, 7)
    page = signed_in(world.alice).get("/jobs/").content.decode()
    assert "will-fail" in page and "exit 7" in page
    detail = signed_in(world.alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "n01 [0]" in detail and "exit 7" in detail  # where it ran, kept after it ended


def test_the_list_takes_the_same_few_queries_however_many_jobs(
    world: Any, django_assert_max_num_queries: Any
) -> None:
    for i in range(60):
        submit(world, "alice", name=f"j{i}")
    client = signed_in(world.alice)
    with django_assert_max_num_queries(8):
        page = client.get("/jobs/").content.decode()
    assert page.count('data-job-id="') == 50


def test_the_team_page_shows_quotas_and_use_for_the_viewers_team_only(world: Any) -> None:
    page = signed_in(world.bob).get("/team/").content.decode()
    assert "Team nlp" in page and "vision" not in page
    admin = signed_in(world.admin).get("/team/").content.decode()
    assert "Team nlp" in admin and "Team vision" in admin


def test_a_share_of_a_gpu_is_shown_to_the_thousandth_the_api_answers(world: Any, cluster: Any) -> None:
    """gpus is kept to thousandths (the allocation's unit): 0.001 was shown as "0.00" GPUs on the
    list, the job's page and the team's use, and 0.125 as "0.13", where the API says 0.001."""
    from scheduling.services.passes import run_pass

    tiny = submit(world, "alice", name="tiny", gpus=0.001, kind="inference", accelerators=["T4"])
    eighth = submit(world, "alice", name="eighth", gpus=0.125, kind="inference", accelerators=["T4"])
    run_pass()
    client = signed_in(world.alice)
    assert world.client("alice").get(f"/api/v1/jobs/{tiny}/").json()["gpus"] == 0.001
    cells = re.findall(r'<td class="num">([^<]*)</td>', client.get("/jobs/").content.decode())
    assert cells == ["0.125", "0.001"]  # newest first
    for job_id, shown in ((tiny, "0.001"), (eighth, "0.125")):
        page = client.get(f"/jobs/{job_id}/").content.decode()
        assert f"<dt>GPUs</dt><dd>{shown} · T4</dd>" in page
    team = client.get("/team/").content.decode()
    quota = re.search(r"<tr><td>any other model</td>(.*?)</tr>", team, re.S)  # the world's "*" row
    assert quota and re.findall(r'<td class="num">([^<]*)</td>', quota.group(1))[2] == "0.126"


def test_the_dashboards_queue_places_are_the_ones_the_job_page_and_api_show(world: Any) -> None:
    """The dashboard's "place N of M" came from its own ordering of every pending job (held and
    CPU-only ones too), the job's page and the API from the pass's plan: in the demo, a job its
    page called first ("0 jobs ahead") was "place 4 of 7" on the dashboard. Both now read the
    place the pass stored; bob's job counts but is never named to alice."""
    from datetime import UTC, datetime

    make_node("n9", "r9", 1, "T4")
    low = submit(world, "alice", name="low", gpus=64)
    bobs = submit(world, "bob", name="bobs", gpus=16, kind="inference")
    high = submit(world, "alice", name="high", gpus=64, priority=10)
    held = submit(world, "alice", name="held", gpus=1)  # held: the pass gives it no place
    for job_id, place in ((bobs, 1), (high, 2), (low, 3)):  # as a pass stores them
        Job.objects.filter(pk=job_id).update(
            queue_position=place, jobs_ahead=place - 1, estimated_start=datetime(2026, 1, 1, tzinfo=UTC)
        )
    Job.objects.filter(pk=held).update(held=True)
    order = signed_in(world.alice).get("/dashboard/queue.json").json()
    assert order == {"order": [{"id": high, "position": 2}, {"id": low, "position": 3}], "total": 3}
    for row in order["order"]:
        api = world.client("alice").get(f"/api/v1/jobs/{row['id']}/").json()
        assert api["queue_position"] == row["position"]
        page = signed_in(world.alice).get(f"/jobs/{row['id']}/").content.decode()
        assert f"Place in the queue: {row['position']} " in page
    assert signed_in(world.bob).get("/dashboard/queue.json").json()["order"] == [{"id": bobs, "position": 1}]


def test_admin_and_api_docs_are_linked_the_admin_only_for_operators(world: Any) -> None:
    alice = signed_in(world.alice).get("/jobs/").content.decode()
    assert 'href="/api/docs/"' in alice and 'href="/admin/"' not in alice
    admin = signed_in(world.admin).get("/jobs/").content.decode()
    assert 'href="/admin/"' in admin


def test_alice_makes_a_token_sees_its_key_once_and_revokes_it(world: Any) -> None:
    from rest_framework.test import APIClient

    from scheduling.models import ApiToken

    client = signed_in(world.alice)
    made = client.post("/tokens/", {"name": "laptop"})
    assert made.status_code == 200
    key = re.search(r'id="new-key"[^>]*value="([^"]+)"', made.content.decode()).group(1)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/v1/jobs/").status_code == 200
    listed = client.get("/tokens/").content.decode()
    assert "laptop" in listed and key not in listed  # shown once, never again
    again = client.post("/tokens/", {"name": "laptop"})
    assert again.status_code == 400 and "already have a token named" in again.content.decode()
    token = ApiToken.objects.get(user=world.alice, name="laptop")
    assert signed_in(world.bob).post(f"/tokens/{token.pk}/revoke/").status_code == 404
    assert client.post(f"/tokens/{token.pk}/revoke/").status_code == 302
    assert not ApiToken.objects.filter(pk=token.pk).exists()
    assert api.get("/api/v1/jobs/").status_code == 401


@pytest.mark.parametrize("name", ["", "x" * 65, "tab\there", "\x00"])
def test_a_bad_token_name_is_refused_with_a_sentence(world: Any, name: str) -> None:
    from scheduling.models import ApiToken

    before = ApiToken.objects.count()
    response = signed_in(world.alice).post("/tokens/", {"name": name})
    assert response.status_code == 400 and 'class="field-error"' in response.content.decode()
    assert ApiToken.objects.count() == before


def test_a_long_list_counts_up_to_its_cap_and_says_more(world: Any, settings: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr("frontend.jobs.LIST_CAP", 60)
    for i in range(70):
        submit(world, "alice", name=f"many-{i}")
    page = signed_in(world.alice).get("/jobs/?page=2").content.decode()
    assert "more than 60 jobs" in page
    assert page.count('data-job-id="') == 11  # the capped count's second page: 61 - 50


def test_the_team_page_shows_the_last_days_use_hour_by_hour(world: Any, cluster: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from frontend.state import usage_last_day
    from scheduling.models import Allocation
    from tests.api.helpers import bind, finish, run

    job = Job.objects.get(pk=submit(world, "alice", gpus=2, accelerators=["H100"]))
    bind(job, cluster[0], [0, 1])
    run(job)
    finish(job, 0)
    now = timezone.now()
    # It ran from 3.5 hours ago to 1.5 hours ago on 2 H100.
    Allocation.objects.filter(job=job).update(
        created_at=now - timedelta(hours=3.5), released_at=now - timedelta(hours=1.5)
    )
    hours = usage_last_day([world.vision.pk], now=now)[(world.vision.pk, "H100")]
    assert [round(h, 2) for h in hours[-4:]] == [1.0, 2.0, 1.0, 0.0]
    assert round(sum(hours), 2) == 4.0  # 2 GPUs for 2 hours
    page = signed_in(world.carol).get("/team/").content.decode()
    assert "The last 24 hours" in page and "H100" in page
    assert "H100" not in signed_in(world.bob).get("/team/").content.decode()


def test_a_teammate_holds_and_releases_a_waiting_job_from_its_page_and_bob_cannot(world: Any) -> None:
    job_id = submit(world, "alice", name="to-hold")
    carol = signed_in(world.carol)
    page = carol.post(f"/jobs/{job_id}/hold/", follow=True).content.decode()
    job = Job.objects.get(pk=job_id)
    assert job.held and job.pending_code == "held"
    assert "held" in page and 'id="release-job"' in page and 'id="hold-job"' not in page
    assert signed_in(world.bob).post(f"/jobs/{job_id}/release/").status_code == 404
    assert Job.objects.get(pk=job_id).held
    page = carol.post(f"/jobs/{job_id}/release/", follow=True).content.decode()
    assert not Job.objects.get(pk=job_id).held and 'id="hold-job"' in page
    assert list(JobEvent.objects.filter(job_id=job_id).values_list("type", flat=True))[-2:] == [
        "held",
        "released",
    ]


def test_holding_a_job_that_started_meanwhile_says_so(world: Any, cluster: Any) -> None:
    from tests.api.helpers import bind

    job = Job.objects.get(pk=submit(world, "alice"))
    bind(job, cluster[0], [0])
    response = signed_in(world.alice).post(f"/jobs/{job.pk}/hold/", follow=True)
    assert "only a waiting job can be held" in response.content.decode()
    assert not Job.objects.get(pk=job.pk).held


def test_the_submit_form_counts_against_the_apis_submit_limit(world: Any, settings: Any) -> None:
    settings.TESSERA_RATE_LIMITS = {"submit": (2, 60), "api": None}
    client = signed_in(world.alice)
    assert [client.post("/jobs/new/", form()).status_code for _ in range(2)] == [302, 302]
    refused = client.post("/jobs/new/", form())
    assert refused.status_code == 429 and 1 <= int(refused["Retry-After"]) <= 60
    assert "Too many submissions" in refused.content.decode()
    assert world.client("alice").post("/api/v1/jobs/", API_BODY, format="json").status_code == 429
    assert Job.objects.count() == 2  # the refused ones were not kept
    assert signed_in(world.bob).post("/jobs/new/", form()).status_code == 302  # per user


def test_a_form_sent_twice_submits_one_job_and_a_changed_one_asks_first(world: Any) -> None:
    alice = signed_in(world.alice)
    page = alice.get("/jobs/new/").content.decode()
    key = re.search(r'name="submit_key" value="(portal-[0-9a-f]{32})"', page).group(1)
    form = {"submit_key": key, "name": "twice", "kind": "training", "command": "sleep 1", "gpus": "1"}
    first, again = alice.post("/jobs/new/", form), alice.post("/jobs/new/", form)
    (job,) = Job.objects.filter(name="twice")
    assert first["Location"] == again["Location"] == f"/jobs/{job.pk}/"
    assert "not submitted twice" in alice.get(again["Location"]).content.decode()
    changed = alice.post("/jobs/new/", {**form, "gpus": "2"})  # Back, edit, Submit
    assert changed.status_code == 409 and "already submitted a job" in changed.content.decode()
    fresh = re.search(r'name="submit_key" value="(portal-[0-9a-f]{32})"', changed.content.decode()).group(1)
    assert fresh != key and changed.context["form"]["gpus"].value() == "2"  # kept as typed
    assert alice.post("/jobs/new/", {**form, "gpus": "2", "submit_key": fresh}).status_code == 302
    assert alice.post("/jobs/new/", {**form, "submit_key": "x" * 300}).status_code == 302  # not a key
    assert Job.objects.filter(name="twice").count() == 3


def test_a_job_with_thousands_of_events_shows_its_latest_and_says_how_many_more(world: Any) -> None:
    from django.utils import timezone

    job_id = submit(world, "alice")
    at = timezone.now()
    JobEvent.objects.bulk_create(
        JobEvent(job_id=job_id, type="requeued", at=at, reason=f"round {n}") for n in range(1, 2001)
    )
    for url in (f"/jobs/{job_id}/", f"/jobs/{job_id}/?fragment=status"):
        page = signed_in(world.alice).get(url).content.decode()
        assert page.count('<li class="event ') == 200
        shown = [int(n) for n in re.findall(r"round (\d+)", page)]
        assert shown == list(range(1801, 2001))  # the latest, oldest first
        assert "1801 earlier ones not shown" in page and f"/api/v1/jobs/{job_id}/events/" in page

"""The job list and a job's events in keyset pages: a client that follows ``next`` sees every row
that stays in its filtered set exactly once, however many rows leave or arrive between pages; the
offset pages older clients ask for keep working.

alice and carol share tenant vision; bob (nlp) is the outsider whose jobs never show up.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.choices import EventType
from scheduling.models import Job, JobEvent
from scheduling.services.jobs import do_cancel_job
from tests.api.helpers import submit

JOBS = "/api/v1/jobs/"


def read_all(client, url: str, params: dict | None = None, between=lambda page: None) -> list[dict]:
    """Every row of a list, following ``next``; ``between(n)`` runs after page n."""
    rows, answer, n = [], client.get(url, params or {}), 0
    while True:
        assert answer.status_code == 200, answer.content
        body = answer.json()
        rows += body["results"]
        if not body["next"]:
            return rows
        n += 1
        between(n)
        answer = client.get(body["next"])


def test_a_filtered_list_read_while_jobs_start_and_arrive_gives_each_staying_job_once(world):
    jobs = [submit(world.alice, world.vision, name=f"j{i}") for i in range(30)]
    submit(world.bob, world.nlp, name="bob's")
    newest_first = sorted(jobs, key=lambda j: -j.pk)
    left: set[int] = set()

    def meanwhile(page: int) -> None:
        # Two jobs leave `pending` (one already read, one not yet), and two new ones arrive.
        for job in (newest_first[page * 5 - 1], newest_first[page * 5 + 3]):
            if job.pk not in left and page * 5 + 3 < len(newest_first):
                do_cancel_job(job.pk, by=world.alice)
                left.add(job.pk)
        for i in range(2):
            submit(world.carol, world.vision, name=f"new{page}.{i}")

    rows = read_all(world.client("alice"), JOBS, {"state": "pending", "limit": 5}, meanwhile)
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)), "a job was given twice"
    stayed = {j.pk for j in jobs} - left
    assert stayed <= set(ids), f"jobs skipped: {sorted(stayed - set(ids))}"
    assert ids == sorted(ids, reverse=True)  # newest first, as before
    assert all(row["tenant"] == "vision" for row in rows)


def test_the_list_keeps_count_next_previous_and_results(world):
    for i in range(3):
        submit(world.alice, world.vision, name=f"j{i}")
    client = world.client("alice")
    first = client.get(JOBS, {"limit": 2}).json()
    assert set(first) == {"count", "next", "previous", "results"}
    assert first["count"] == 3 and len(first["results"]) == 2 and first["previous"] is None
    assert "cursor=" in first["next"] and "offset=" not in first["next"]
    second = client.get(first["next"]).json()
    assert second["count"] == 3 and len(second["results"]) == 1 and second["next"] is None
    back = client.get(second["previous"]).json()
    assert [j["id"] for j in back["results"]] == [j["id"] for j in first["results"]]


def test_an_offset_still_pages_by_offset_for_older_clients(world):
    for i in range(3):
        submit(world.alice, world.vision, name=f"j{i}")
    page = world.client("alice").get(JOBS, {"limit": 2, "offset": 2}).json()
    assert page["count"] == 3 and len(page["results"]) == 1 and page["next"] is None


@pytest.mark.parametrize(
    "cursor",
    ["x", "!!!", "\x00" * 4, "cD1hYmM=", "cD05OTk5OTk5OTk5OTk5OTk5OTk5OTk5OQ==", "bz0tMQ==", "ü"],
    # not base64 (3); p=abc; p=a 23-digit id; o=-1; not ASCII
)
def test_a_forged_cursor_is_a_400_naming_it(world, cursor):
    submit(world.alice, world.vision)
    response = world.client("alice").get(JOBS, {"cursor": cursor})
    assert response.status_code == 400, response.content
    assert set(response.json()) == {"cursor"}


def test_an_empty_cursor_is_the_first_page(world):
    submit(world.alice, world.vision)
    for query in ({"cursor": ""}, {"cursor": "", "offset": 0}):
        assert world.client("alice").get(JOBS, query).json()["count"] == 1


def test_a_cursor_with_an_offset_is_a_400(world):
    response = world.client("alice").get(JOBS, {"cursor": "cD0x", "offset": 0})
    assert response.status_code == 400 and set(response.json()) == {"cursor"}


def test_a_jobs_events_come_in_pages_oldest_first(world):
    job = submit(world.alice, world.vision)
    start = timezone.now()
    JobEvent.objects.bulk_create(
        JobEvent(job=job, type=EventType.CHECKPOINTED, at=start + timedelta(seconds=i), reason=f"step {i}")
        for i in range(2500)
    )
    client = world.client("alice")
    whole = client.get(f"{JOBS}{job.pk}/events/").json()  # no paging asked: the contract's one list
    assert isinstance(whole, list) and len(whole) == 2501 and whole[0]["type"] == "submitted"
    first = client.get(f"{JOBS}{job.pk}/events/", {"cursor": ""}).json()
    assert first["count"] == 2501 and len(first["results"]) == 1000 and first["next"]
    assert client.get(f"{JOBS}{job.pk}/events/", {"limit": 10**6}).json()["results"].__len__() == 1000
    seen: list[str] = []

    def more_events(page: int) -> None:  # the job goes on while its history is read
        JobEvent.objects.create(
            job=job, type=EventType.CHECKPOINTED, at=timezone.now() + timedelta(days=1), reason=f"late {page}"
        )

    rows = read_all(client, f"{JOBS}{job.pk}/events/", {"limit": 700}, more_events)
    seen = [row["reason"] or row["type"] for row in rows]
    assert seen[:2] == ["submitted", "step 0"]
    assert seen[1:2501] == [f"step {i}" for i in range(2500)]
    assert len(seen) == len(set(seen)) == 2501 + 3  # three pages after the first: three late ones
    assert Job.objects.get(pk=job.pk).events.count() == 2504


def test_an_older_clients_events_by_offset_still_work(world):
    job = submit(world.alice, world.vision)
    page = world.client("alice").get(f"{JOBS}{job.pk}/events/", {"limit": 200, "offset": 0}).json()
    assert [e["type"] for e in page["results"]] == ["submitted"] and page["next"] is None


@pytest.mark.parametrize("cursor", ["cD0xMjM=", "cD0yMDI2LTEyLTA3"])  # p=123; p=2026-12-07 (no zone)
def test_a_forged_events_cursor_is_a_400_naming_it(world, cursor):
    job = submit(world.alice, world.vision)
    response = world.client("alice").get(f"{JOBS}{job.pk}/events/", {"cursor": cursor})
    assert response.status_code == 400, response.content
    assert set(response.json()) == {"cursor"}


@pytest.mark.parametrize("limit", [None, 700, 1000])
def test_events_sharing_one_timestamp_come_once_each_across_pages(world, limit):
    """A burst of more events than a page at one ``at`` (a bulk write, a coarse clock): the cursor
    names the last event given, not the timestamp and a count of rows after it, so paging neither
    stops short, loops nor skips (DRF's cursor capped that count at 1,000)."""
    job = submit(world.alice, world.vision)
    at = timezone.now()
    JobEvent.objects.bulk_create(
        JobEvent(job=job, type=EventType.CHECKPOINTED, at=at, reason=f"step {i}") for i in range(2600)
    )
    client = world.client("alice")
    params = {"cursor": ""} if limit is None else {"limit": limit}
    rows, answer = [], client.get(f"{JOBS}{job.pk}/events/", params)
    for _ in range(10):  # 2,601 events: at most 4 pages; a cursor that loops must not hang the test
        rows += answer.json()["results"]
        if not answer.json()["next"]:
            break
        answer = client.get(answer.json()["next"])
    assert [row["reason"] or row["type"] for row in rows] == ["submitted"] + [
        f"step {i}" for i in range(2600)
    ]


def test_an_events_previous_link_goes_back_one_page_within_one_timestamp(world):
    job = submit(world.alice, world.vision)
    at = timezone.now()
    JobEvent.objects.bulk_create(
        JobEvent(job=job, type=EventType.CHECKPOINTED, at=at, reason=f"step {i}") for i in range(2500)
    )
    client = world.client("alice")
    first = client.get(f"{JOBS}{job.pk}/events/", {"limit": 1000}).json()
    second = client.get(first["next"]).json()
    assert [e["reason"] for e in second["results"]] == [f"step {i}" for i in range(999, 1999)]
    back = client.get(second["previous"]).json()
    assert back["results"] == first["results"]

"""Listing through pages: every item once, however the list moves between two pages."""

from __future__ import annotations

from typing import Any

from tessera_cli.client import Client


class ShiftingJobs(Client):
    """A server's newest-first job list, offset-paginated, where a new job arrives after each page."""

    def __init__(self) -> None:
        super().__init__("http://tessera.invalid", "tsr_x", retries=0)
        self.ids = list(range(10, 0, -1))  # newest first

    def get(self, path: str, **kwargs: Any) -> Any:
        params = kwargs["params"]
        offset, limit = int(params.get("offset", 0)), int(params["limit"])
        page = self.ids[offset : offset + limit]
        self.ids.insert(0, self.ids[0] + 1)  # someone submits a job meanwhile
        more = offset + limit < len(self.ids)
        return {
            "count": len(self.ids),
            "next": f"http://proxy.invalid/api/v1/jobs/?limit={limit}&offset={offset + limit}"
            if more
            else None,
            "results": [{"id": i} for i in page],
        }


def test_a_job_submitted_between_two_pages_does_not_list_a_job_twice():
    ids = [item["id"] for item in ShiftingJobs().pages("jobs/", {"limit": 3})]
    assert len(ids) == len(set(ids)) and set(range(1, 11)) <= set(ids)


class CursorJobs(Client):
    """A server's newest-first pending jobs in keyset pages: after each page, the oldest job not
    yet read starts (leaves the filtered set) and a new one arrives."""

    def __init__(self) -> None:
        super().__init__("http://tessera.invalid", "tsr_x", retries=0)
        self.pending = list(range(20, 0, -1))  # newest first
        self.asked: list[dict[str, Any]] = []

    def get(self, path: str, **kwargs: Any) -> Any:
        params = kwargs["params"]
        self.asked.append(dict(params))
        assert "offset" not in params, "a cursor list was paged by offset"
        after = int(params.get("cursor", 10**9))
        rows = [i for i in self.pending if i < after][: int(params["limit"])]
        self.pending.remove(min(self.pending))  # the oldest pending job starts
        self.pending.insert(0, max(self.pending) + 1)  # and a new one is submitted
        more = any(i < rows[-1] for i in self.pending) if rows else False
        link = f"http://proxy.invalid/api/v1/jobs/?cursor={rows[-1]}&limit={params['limit']}&state=pending"
        return {
            "count": len(self.pending),
            "next": link if more else None,
            "results": [{"id": i} for i in rows],
        }


def test_a_cursor_list_is_read_by_following_next_on_this_clients_own_server():
    client = CursorJobs()
    ids = [item["id"] for item in client.pages("jobs/", {"state": "pending", "limit": 4})]
    assert ids == sorted(set(ids), reverse=True)  # each once, newest first
    assert set(range(13, 21)) <= set(ids)  # the jobs still pending when read: none skipped
    assert all(asked.get("state") == "pending" for asked in client.asked)
    assert [asked.get("cursor") for asked in client.asked[1:3]] == ["17", "13"]

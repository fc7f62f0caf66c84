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
        offset, limit = int(params["offset"]), int(params["limit"])
        page = self.ids[offset : offset + limit]
        self.ids.insert(0, self.ids[0] + 1)  # someone submits a job meanwhile
        more = offset + limit < len(self.ids)
        return {
            "count": len(self.ids),
            "next": "more" if more else None,
            "results": [{"id": i} for i in page],
        }


def test_a_job_submitted_between_two_pages_does_not_list_a_job_twice():
    ids = [item["id"] for item in ShiftingJobs().pages("jobs/", {"limit": 3})]
    assert len(ids) == len(set(ids)) and set(range(1, 11)) <= set(ids)

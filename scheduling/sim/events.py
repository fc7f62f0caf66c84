"""The events file (``events.jsonl``): read it strictly, write it compactly.

One JSON object a line: ``{"t": 12.5, "event": "start", "job": "j42", "allocations": [...]}``
(docs/formats.md). Reading checks the shape of every line and raises :class:`EventsError`
naming the file, the line and, for bad JSON, the column.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

EVENT_TYPES = (
    "submit", "start", "finish", "preempt", "resize", "fail", "cancel", "reject", "checkpoint",
    "idle-warning",
)  # fmt: skip
RELEASES = ("finish", "preempt", "fail", "cancel")


class EventsError(ValueError):
    """An events file that cannot be read; the message says where."""


def _bad(path: Path, lineno: int, why: str) -> EventsError:
    return EventsError(f"{path}:{lineno}: {why}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_allocations(path: Path, lineno: int, allocs: Any) -> None:
    if not isinstance(allocs, list):
        raise _bad(path, lineno, "'allocations' must be a list")
    for a in allocs:
        if not isinstance(a, dict):
            raise _bad(path, lineno, "each allocation must be an object")
        if not isinstance(a.get("node"), str):
            raise _bad(path, lineno, "an allocation needs a 'node' string")
        gpus = a.get("gpus", [])
        if not isinstance(gpus, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) for g in gpus
        ):
            raise _bad(path, lineno, "an allocation's 'gpus' must be a list of integers")
        if not _number(a.get("share", 1.0)):
            raise _bad(path, lineno, "an allocation's 'share' must be a number")
        replica = a.get("replica", 0)
        if not isinstance(replica, int) or isinstance(replica, bool):
            raise _bad(path, lineno, "an allocation's 'replica' must be an integer")


def read_events(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, event)`` for every non-blank line, checking each one's shape."""
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EventsError(f"{path}:{lineno}:{exc.colno}: not JSON: {exc.msg}") from None
            if not isinstance(event, dict):
                raise _bad(path, lineno, "each line must be a JSON object")
            if not _number(event.get("t")):
                raise _bad(path, lineno, "'t' must be a number (seconds from the trace's start)")
            if event.get("event") not in EVENT_TYPES:
                raise _bad(path, lineno, f"'event' must be one of {', '.join(EVENT_TYPES)}")
            if not isinstance(event.get("job"), str):
                raise _bad(path, lineno, "'job' must be a string")
            if "allocations" in event:
                _check_allocations(path, lineno, event["allocations"])
            elif event["event"] in ("start", "resize"):
                raise _bad(path, lineno, f"a '{event['event']}' event needs 'allocations'")
            yield lineno, event


def write_events(path: str | Path, events: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for event in events:
            fh.write(json.dumps(event, separators=(",", ":")))
            fh.write("\n")

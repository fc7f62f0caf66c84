"""Reading a job's output from its stored ``LogChunk`` rows, a page at a time.

A page starts at a byte offset of one replica's log and ends at a UTF-8 character boundary (so a
character split across pages is never mangled), at most ``MAX_PAGE_BYTES`` long. Bytes that are
not UTF-8 come back as U+FFFD.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from scheduling.choices import TERMINAL_STATES
from scheduling.models import Job, LogChunk

MAX_PAGE_BYTES = 1024 * 1024
MAX_OFFSET = 2**62


@dataclass(frozen=True)
class LogPage:
    offset: int
    next_offset: int
    data: str
    eof: bool
    truncated: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "offset": self.offset,
            "next_offset": self.next_offset,
            "data": self.data,
            "eof": self.eof,
            "truncated": self.truncated,
        }


def read_log(job: Job, replica: int, offset: int, limit: int = MAX_PAGE_BYTES) -> LogPage:
    """Up to ``limit`` bytes of ``replica``'s output from ``offset``.

    1. Start from the chunk that holds ``offset`` (the last one starting at or before it).
    2. Take bytes chunk by chunk until ``limit``; a gap between chunks (output dropped) is skipped.
    3. Decode incrementally: bytes of a character cut by the limit stay for the next page, unless
       the log is complete (then they decode as U+FFFD).
    """
    chunks = LogChunk.objects.filter(job=job, replica=replica)
    first = chunks.filter(offset__lte=offset).order_by("-offset").only("offset").first()
    pieces: list[bytes] = []
    taken = 0
    pos = page_start = offset
    more = False
    for chunk in (
        chunks.filter(offset__gte=first.offset if first else offset)
        .order_by("offset")
        .iterator(chunk_size=64)
    ):
        data = bytes(chunk.data)
        end = chunk.offset + len(data)
        if end <= pos:
            continue
        if chunk.offset > pos:
            if taken:  # a gap after data already taken: end this page at the gap
                more = True
                break
            pos = page_start = chunk.offset  # a gap at the start: skip to what is there
        piece = data[pos - chunk.offset :][: limit - taken]
        pieces.append(piece)
        taken += len(piece)
        pos += len(piece)
        if taken >= limit:
            more = pos < end or chunks.filter(offset__gte=pos).exists()
            break
    complete = job.state in TERMINAL_STATES and not more
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(b"".join(pieces), final=complete)
    held = len(decoder.getstate()[0])  # the bytes of an unfinished character, kept for next time
    return LogPage(
        offset=offset,
        next_offset=page_start + taken - held,
        data=text,
        eof=complete,
        truncated=job.log_truncated,
    )

"""A job's checkpoint marker: the file it writes a line to once a checkpoint is durable.

Each replica gets ``TESSERA_CHECKPOINT_MARKER``, a path in its own working directory (0700, its
uid's, a random part in its name). The agent, root, reads a file a tenant controls, so it reads
it the safe way (:func:`read_marker`): without following a link, without blocking (a FIFO), a
regular file only, owned by the job's uid and with one link (a hard link to a file the job could
not read itself is refused), at most :data:`TAIL_BYTES` from its end, its last line UTF-8 text.
Anything else is ignored, with the reason logged; nothing of it reaches another job.

:class:`MarkerWatch` looks at the file's ``lstat`` at every tick of the job's supervisor (one
system call), reads it only when it changed, and says when a new checkpoint is to be reported:
the first at once, later ones at most once per :data:`REPORT_EVERY_S` (the latest line wins).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass

log = logging.getLogger("tessera.agent")

MARKER_NAME = "checkpoint-marker"
TAIL_BYTES = 4096  # what is read of a marker: its last line must lie within it
LINE_CHARS = 128  # what is kept of that line (the checkpointed event's reason)
REPORT_EVERY_S = 60.0  # at most one report per job per minute


class Ignored(Exception):
    """The marker cannot be taken (the reason is the message)."""


def read_marker(path: str, uid: int | None) -> str:
    """The marker's last non-empty line, or :class:`Ignored`. ``uid``: the job's (None: any)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise Ignored("a symbolic link" if exc.errno == 40 else f"unreadable ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Ignored("not a regular file")
        if uid is not None and info.st_uid != uid:
            raise Ignored(f"owned by uid {info.st_uid}, not the job's")
        if info.st_nlink != 1:
            raise Ignored(f"{info.st_nlink} links to it")
        start = max(0, info.st_size - TAIL_BYTES)
        data = os.pread(fd, TAIL_BYTES, start)
    finally:
        os.close(fd)
    lines = [line for line in data.split(b"\n") if line.strip()]
    if not lines:
        raise Ignored("no line in it")
    try:
        line = lines[-1].decode("utf-8").strip()
    except UnicodeDecodeError:
        raise Ignored("its last line is not UTF-8 text") from None
    if not line.isprintable():
        raise Ignored("its last line has control characters")
    return line[:LINE_CHARS]


@dataclass
class Checkpoint:
    line: str
    at: float  # epoch seconds the agent saw it


class MarkerWatch:
    """One replica's marker: what changed in it, and when to report it."""

    def __init__(self, path: str, job_id: int, uid: int | None):
        self.path, self.job_id, self.uid = path, job_id, uid
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime) last read
        self.latest: Checkpoint | None = None  # the newest checkpoint seen
        self.unreported: Checkpoint | None = None  # seen and not yet reported
        self.reported_at = -REPORT_EVERY_S  # monotonic
        self.count = 0  # checkpoints seen in this attempt

    def look(self) -> bool:
        """Look at the marker; whether a new checkpoint line appeared since the last look."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("job %s: checkpoint marker ignored: %s", self.job_id, exc.strerror)
            return False
        seen = (info.st_ino, info.st_size, info.st_mtime_ns)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            line = read_marker(self.path, self.uid)
        except Ignored as exc:
            log.warning("job %s: checkpoint marker ignored: %s", self.job_id, exc)
            return False
        self.latest = self.unreported = Checkpoint(line, time.time())
        self.count += 1
        return True

    def due(self, now: float) -> Checkpoint | None:
        """The checkpoint to report now (``now``: monotonic), if any: at most one a minute."""
        if self.unreported is None or now - self.reported_at < REPORT_EVERY_S:
            return None
        return self.unreported

    def reported(self, checkpoint: Checkpoint, now: float) -> None:
        self.reported_at = now
        if self.unreported is checkpoint:
            self.unreported = None

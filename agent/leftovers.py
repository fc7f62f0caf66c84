"""What a job leaves behind: its session's processes, recorded so that no agent life loses them.

Every replica runs in a session of its own (:mod:`agent.process`). The parent-death signal kills
only the session's leader when the agent dies; whatever it forked (``sh -c "sleep 300; ..."``)
runs on. A restarted agent registers again and the server settles the old replicas as lost and
frees their GPUs, so such a leftover would share its GPUs with the next job, or run a job twice.

So each running replica's session is recorded as ``<job>-<attempt>-<replica>`` (written
atomically, removed once the session is empty), and an agent that starts kills every process of a
recorded session before it registers (:func:`kill_leftovers`). A record means something only
until the next boot, so it lives in ``/run`` (a tmpfs: making and removing a file there costs a
few microseconds, where a file system's inodes, made and deleted at the rate of short jobs, cost
more): ``/run/tessera-agent/sessions/<state directory's name>-<digest of its path>/``, one
directory per agent on the node. An agent that may not write there (not root) records in
``STATE/sessions``; both places are read at the start. A session is named by
its id and its leader's start time (``/proc/<pid>/stat`` field 22, clock ticks since boot) and
the boot it belongs to: a process counts as the session's only when its session id matches and
it started at or after the leader (a session id reused by a later session, after every process
of ours was gone, then mostly differs by its leader; see :func:`_members`). Signals go through a
pidfd after a second look at the process, so a pid reused in between is never hit.

What escapes the session: a process that starts a session of its own (``setsid``), and one forked
in the instant between the spawn and its record. A job with a uid of its own (agent/identity.py)
has its uid recorded too, and every process of that uid is killed as well. Stdlib only, as the
rest of the agent.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent import identity

log = logging.getLogger("tessera.agent")

SESSIONS_DIR = "sessions"  # STATE/sessions: where an agent records when it may not write RUN_SESSIONS
RUN_SESSIONS = Path("/run/tessera-agent/sessions")  # one directory per agent (its state directory)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
LAST_PID = "/proc/sys/kernel/ns_last_pid"
MAX_LOOK_GAP_S = 2.0  # a PidClock's looks farther apart than this may have missed a wrap
STARTUP_TIMEOUT_S = 60.0  # how long a starting agent waits for leftovers to die before it gives up
PROGRESS_EVERY_S = 2.0
ROUND_S = 0.05  # between two scans while processes die
# A session's end reads its candidate pids one by one while there are at most this many (from
# its leader's to the kernel's last); more, and it lists /proc instead.
SPAN_MAX = 512


@dataclass(frozen=True)
class Session:
    """A job's session: its id (the leader's pid), the leader's start time, the boot."""

    sid: int
    start: int  # clock ticks after boot, /proc/<pid>/stat field 22
    boot_id: str
    uid: int | None = None  # the job's own uid (agent/identity.py), when it has one


@dataclass(frozen=True)
class Proc:
    pid: int
    name: str
    state: str
    ppid: int
    sid: int
    start: int
    threads: int = 1  # field 20: a "zombie" whose other threads still run is alive

    @property
    def dead(self) -> bool:
        """Exited, waiting for whoever inherited it to reap it: a zombie (or dying) with no
        thread left. Not a process whose first thread exited (``pthread_exit``) while its others
        run on: its pid reads as a zombie all the same, and it could outlive its job that way."""
        return self.state in ("Z", "X") and self.threads <= 1


class LeftoversRemain(Exception):
    """Processes of a previous run would not die in time: the node must not take work."""


@functools.cache  # the same while the agent runs
def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def read_proc(pid: int) -> Proc | None:
    """``/proc/<pid>/stat``, the fields we need; None when the process is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The name (field 2) is in parentheses and may hold anything, ')' too: split at the last one.
    head, _, tail = raw.rpartition(b")")
    fields = tail.split(maxsplit=20)  # fields 3.. of the man page: fields[n - 3] is field n
    if len(fields) < 20:
        return None
    name = head.partition(b"(")[2].decode("utf-8", "replace")
    return Proc(
        pid, name, fields[0].decode(), int(fields[1]), int(fields[3]), int(fields[19]), int(fields[17])
    )


def session_of(pid: int) -> Session | None:
    """The session ``pid`` leads (a job's process, spawned with ``start_new_session``)."""
    proc = read_proc(pid)
    if proc is None or proc.sid != pid:
        return None
    return Session(pid, proc.start, boot_id())


# --- the records --------------------------------------------------------------------------------


def record(state_dir: Path, name: str, session: Session) -> None:
    """Record ``session`` as replica ``name``'s (temp file and rename: never half written)."""
    directory = records_dir(state_dir)
    tmp = f"{directory}/.{name}.tmp"
    fields: dict[str, object] = {"sid": session.sid, "start": session.start, "boot_id": session.boot_id}
    if session.uid is not None:
        fields["uid"] = session.uid
    body = json.dumps(fields)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except FileNotFoundError:  # the directory was removed meanwhile: make it again
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, body.encode())
    finally:
        os.close(fd)
    os.replace(tmp, f"{directory}/{name}")


def records_dir(state_dir: Path) -> str:
    """Where this agent records its sessions: its directory under :data:`RUN_SESSIONS`, made on
    first use (0700, the agent's alone: a job must not edit what gets killed), else
    ``STATE/sessions``."""
    return _records_dir(str(state_dir), str(RUN_SESSIONS))


@functools.cache  # once per agent (and per place, for tests that move RUN_SESSIONS)
def _records_dir(state_dir: str, run_sessions: str) -> str:
    directory = _run_dir(state_dir, run_sessions)
    try:
        os.makedirs(run_sessions, mode=0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        os.chmod(directory, 0o700)
        if os.stat(directory).st_uid != os.geteuid():
            raise PermissionError(f"{directory} is not this agent's")
        return directory
    except OSError as exc:
        legacy = _legacy_dir(state_dir)
        log.info("recording job sessions in %s (%s: %s)", legacy, directory, exc.strerror or exc)
        os.makedirs(legacy, mode=0o700, exist_ok=True)
        return legacy


def _run_dir(state_dir: str, run_sessions: str) -> str:
    """The state directory's own under ``run_sessions``: its name (for the reader) and a digest
    of its whole path (two agents' state directories may share a name)."""
    path = os.path.realpath(state_dir)
    digest = hashlib.sha256(path.encode()).hexdigest()[:16]
    return os.path.join(run_sessions, f"{os.path.basename(path) or 'root'}-{digest}")


def _legacy_dir(state_dir: str | Path) -> str:
    """``STATE/sessions``: an earlier version's place, and a run's that could not write ``/run``."""
    return os.path.join(str(state_dir), SESSIONS_DIR)


def _record_dirs(state_dir: Path) -> list[str]:
    """Every place a record of this agent may be: its :func:`records_dir`, then
    :func:`_legacy_dir` (when that is another)."""
    here, legacy = records_dir(state_dir), _legacy_dir(state_dir)
    return [here] if here == legacy else [here, legacy]


def forget(state_dir: Path, name: str) -> None:
    """Remove replica ``name``'s record, wherever it is (this agent's own place first)."""
    for directory in _record_dirs(state_dir):
        try:
            os.unlink(f"{directory}/{name}")
            return
        except FileNotFoundError:
            continue


def tidy(state_dir: Path) -> None:
    """At the agent's end: its directory under ``/run`` goes if no record is left in it."""
    here, *legacy = _record_dirs(state_dir)
    if legacy:
        with contextlib.suppress(OSError):  # not empty: a record the next start needs
            os.rmdir(here)


def recorded(state_dir: Path) -> dict[str, Session]:
    """The recorded sessions by replica name; an unreadable record is dropped (and said so)."""
    found: dict[str, Session] = {}
    for directory in reversed(_record_dirs(state_dir)):  # this agent's own place wins
        try:
            names = sorted(n for n in os.listdir(directory) if not n.startswith("."))
        except FileNotFoundError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            try:
                with open(path) as f:
                    body = json.load(f)
                uid = None if body.get("uid") is None else int(body["uid"])
                found[name] = Session(int(body["sid"]), int(body["start"]), str(body["boot_id"]), uid)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring the unreadable session record %s: %s", path, exc)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
    return found


# --- finding and killing ------------------------------------------------------------------------


class PidClock:
    """Whether the kernel's pid numbers may have wrapped around since a session began.

    Pids are handed out in increasing order up to ``pid_max`` (32,768 on many machines), then from
    the bottom again. Every process of a session is newer than its leader, so until a wrap its pid
    is above the leader's: the end of a job then reads ``/proc/<pid>/stat`` for the processes newer
    than its leader only (a handful), not for all of the node's (several times the cost:
    docs/benchmarks/e2e.md). The kernel's last pid (``ns_last_pid``) is looked at when the session
    begins and at every tick of its supervisor (4 a second): a wrap means it went down between two
    looks (a whole cycle between two looks would take ``pid_max`` forks in 0.25 s). When it cannot
    be read, every process is read, as after a wrap. Until a wrap, no process of the session has a
    pid above the last one handed out either: a short job's end reads the pids between the two,
    without listing ``/proc`` (every process of the node, kernel threads included).
    """

    def __init__(self, leader: int):
        self.floor = leader
        self.seen = _last_pid()
        self.looked = time.monotonic()
        self.wrapped = self.seen is None or self.seen < leader

    def observe(self) -> None:
        now, at = _last_pid(), time.monotonic()
        # Looks far apart (a supervisor tick held up by a slow request) could hide a whole
        # cycle: then assume one.
        if now is None or self.seen is None or now < self.seen or at - self.looked > MAX_LOOK_GAP_S:
            self.wrapped = True
        else:
            self.seen = now
        self.looked = at

    def newer_than_leader(self) -> int | None:
        """The smallest pid a process of the session can have; None: any."""
        self.observe()
        return None if self.wrapped else self.floor

    def span(self) -> tuple[int, int] | None:
        """The smallest pid a process of the session can have and the largest handed out so far
        (looked at now); None: any pid (a wrap, or no look)."""
        floor = self.newer_than_leader()
        return None if floor is None or self.seen is None else (floor, self.seen)


def _last_pid() -> int | None:
    try:
        fd = os.open(LAST_PID, os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 32))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _listed(floor: int | None = None) -> Iterator[int]:
    """The pids ``/proc`` lists (``floor``: only those from it on)."""
    pids = (int(e) for e in os.listdir("/proc") if e.isdigit())
    return pids if floor is None else (pid for pid in pids if pid >= floor)


def _spanned(floor: int, last: int) -> Iterator[int]:
    """Every pid from ``floor`` to the kernel's last, which is looked at again once they are
    read: the pids handed out meanwhile (a member's fork) are read too, until it stays put. So
    nothing ``/proc`` would have listed is left out. Past :data:`SPAN_MAX` pids, or at a wrap,
    the rest comes from ``/proc``'s listing."""
    low = floor
    while last - floor < SPAN_MAX:
        yield from range(low, last + 1)
        now = _last_pid()
        if now == last:
            return
        if now is None or now < last:  # wrapped meanwhile (or unreadable): any pid at all
            yield from _listed()
            return
        low, last = last + 1, now
    yield from _listed(low)


def _leads_its_group(pid: int) -> bool:
    """Whether ``pid`` is a process (its thread group's first thread: ``Tgid`` in its status), not
    one of its other threads. A pid whose status cannot be read has ended since its ``stat`` was
    read (a thread of a process being killed): it is not counted, as ``/proc``'s listing would not
    list it either."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1]) == pid
    except (OSError, ValueError, IndexError):
        pass
    return False


def _members(
    sessions: Iterable[Session], floor: int | None = None, last: int | None = None
) -> list[tuple[Proc, Session]]:
    """The live (not zombie) processes of ``sessions``, with the session each belongs to
    (``floor``: no process of theirs has a smaller pid, ``last``: the largest pid handed out,
    looked at just before; see :class:`PidClock`)."""
    by_sid = {s.sid: s for s in sessions}
    if not by_sid:
        return []
    spanned = floor is not None and last is not None
    pids = _spanned(floor, last) if floor is not None and last is not None else _listed(floor)
    procs = [p for pid in pids if (p := read_proc(pid)) is not None]
    if spanned:
        # A pid read directly may be a thread's (/proc lists processes only): as in the listing,
        # a process is its thread group's leader.
        procs = [p for p in procs if p.sid not in by_sid or _leads_its_group(p.pid)]
    # A live process whose pid is a recorded session's id, leading a session but started at
    # another time, is a later session with that id: ours ended (its id was free to reuse).
    reused = {p.sid for p in procs if p.pid == p.sid and p.sid in by_sid and p.start != by_sid[p.sid].start}
    me = os.getpid()
    return [
        (p, by_sid[p.sid])
        for p in procs
        if p.sid in by_sid
        and p.sid not in reused
        and p.start >= by_sid[p.sid].start
        and not p.dead
        and p.pid not in (1, me)
    ]


def _kill(proc: Proc, session: Session) -> None:
    """SIGKILL ``proc`` if it is still the one we saw (looked at again through a pidfd)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (OSError, AttributeError):
        pidfd = None  # gone, or a kernel before 5.3: the plain kill below
    try:
        again = read_proc(proc.pid)
        if again is None or again.sid != session.sid or again.start != proc.start:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGKILL)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def end_sessions(
    sessions: Iterable[Session],
    timeout: float,
    names: dict[int, str] | None = None,
    pids: PidClock | None = None,
) -> tuple[list[Proc], list[Proc]]:
    """SIGKILL every process of ``sessions`` until none is left or ``timeout`` has passed.

    Rounds of scan and kill: a process may fork while its session is being killed, and its child
    shows up in the next scan. Returns (the processes killed, those still alive at the timeout).
    ``names``: session id → what to call it in the progress lines (none are logged without it).
    ``pids``: the one session's :class:`PidClock` (then only its leader's and newer pids are read).
    """
    sessions = list(sessions)
    killed: dict[tuple[int, int], Proc] = {}
    began = time.monotonic()
    next_progress = began + PROGRESS_EVERY_S
    while True:
        span = pids.span() if pids is not None else None
        members = _members(sessions, *span) if span is not None else _members(sessions)
        if not members:
            return list(killed.values()), []
        now = time.monotonic()
        if now - began >= timeout:
            return list(killed.values()), [p for p, _ in members]
        if names is not None and now >= next_progress:
            next_progress = now + PROGRESS_EVERY_S
            waiting = (f"{p.pid} ({p.name}, {names.get(s.sid, '?')}, state {p.state})" for p, s in members)
            log.warning(
                "still waiting for %d leftover process(es) to exit after %.0fs: %s",
                len(members),
                now - began,
                ", ".join(waiting),
            )
        for proc, session in members:
            killed[(proc.pid, proc.start)] = proc  # the latest look: its name after an exec
            _kill(proc, session)  # again each round: cheap, and a stopped process needs no more
        time.sleep(ROUND_S)


def kill_leftovers(state_dir: Path, timeout: float = STARTUP_TIMEOUT_S) -> list[Proc]:
    """At the agent's start, before it registers: kill what runs of the recorded sessions, wait
    until it is gone, forget the records. Raises LeftoversRemain when some outlive ``timeout``
    (the records stay, for the next try). Returns the processes killed."""
    records = recorded(state_dir)
    if not records:
        return []
    this_boot = boot_id()
    for name, session in list(records.items()):
        if session.boot_id != this_boot:  # nothing survives a reboot; its ids mean nothing now
            forget(state_dir, name)
            del records[name]
    names = {s.sid: f"replica {name}" for name, s in records.items()}
    if records:
        log.info(
            "%d job session(s) recorded by a previous agent run: killing what is left of them "
            "before registering (waiting up to %gs)",
            len(records),
            timeout,
        )
    began = time.monotonic()
    killed, alive = end_sessions(records.values(), timeout, names)
    if alive:
        raise LeftoversRemain(
            f"{len(alive)} leftover process(es) of a previous run still alive after "
            f"{time.monotonic() - began:.1f}s of SIGKILL: "
            + ", ".join(f"{p.pid} ({p.name}, {names.get(p.sid, '?')}, state {p.state})" for p in alive)
            + "; not registering while they may hold GPUs"
        )
    for uid in sorted({s.uid for s in records.values() if s.uid is not None}):
        try:
            by_uid = identity.end_leftover_uid(uid)
        except identity.UidsLeft as exc:
            raise LeftoversRemain(f"{exc}; not registering while they may hold GPUs") from None
        if by_uid:
            log.warning("killed %d leftover process(es) of uid %d (outside their job's session)", by_uid, uid)
    if killed:
        log.warning(
            "killed %d leftover process(es) of the previous agent run before registering: %s",
            len(killed),
            ", ".join(f"{p.pid} ({p.name}, {names.get(p.sid, '?')})" for p in killed),
        )
    for name in records:
        forget(state_dir, name)
    if killed:
        log.info("leftovers gone after %.1fs", time.monotonic() - began)
    return killed

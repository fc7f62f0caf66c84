"""Who a job runs as: a uid (and a private gid of the same number) of its own, from a range.

Every job attempt on this node gets a uid nobody else has while it runs (systemd's DynamicUser
does the same for services; Slurm runs jobs as their submitter). Its replicas here share it (they
share the job's checkpoint directory); its files are 0700 to it; another job, of the same tenant
or not, cannot read them, read its ``/proc/<pid>/environ`` or signal it. The uid is free again only
once no process of it is left: when the attempt's last replica here ends, every process of the uid
is killed (``kill(-1, SIGKILL)`` sent *as* that uid, which the kernel applies to all its
processes at once, so a fork bomb cannot outrun it) and the agent waits until ``/proc`` shows none.

A uid is held through a lock file, ``/run/tessera-agent/uids/<uid>``, under ``flock``: several
agents on one machine (the demo runs 12) share the range and never hand one uid to two jobs, and a
dead agent's locks go with it. The file holds its holder's pid while the uid is in use and is
emptied once every process of the uid is dead; a uid found non-empty (its holder died) has its
processes killed before it is handed out again (found in ``/proc/<pid>/status``, all four of its
uids: a job cannot hide by making itself undumpable). So no uid is handed out while a process of
it runs, an agent restarted mid-job included.

:class:`SharedUser` is the other way, for an agent that is not root: every job runs as one user
(``--single-tenant``), which protects jobs from nothing but each other's mistakes.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import grp
import logging
import os
import pwd
import random
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.state import remove_tree

log = logging.getLogger("tessera.agent")

DEFAULT_RANGE = "200000-265535"  # past the 16-bit ids of /etc/passwd; systemd's DynamicUser
# range is 61184-65519, within them: ours stays clear of both
DEFAULT_LOCK_DIR = Path("/run/tessera-agent/uids")
KILL_TIMEOUT_S = 10.0
ROUND_S = 0.02
MIN_FREE_UID = 1000  # below: system users, never a job's
MAX_RANGE = 1 << 18  # uids in a range at most: the loopback rules load two elements per uid


@dataclass(frozen=True)
class RunAs:
    """The user a job runs as (None ids: the agent's own user, when it is not root)."""

    name: str
    uid: int | None = None
    gid: int | None = None


class UidsExhausted(Exception):
    """Every uid of the range is held or still has processes."""


class UidsLeft(Exception):
    """Processes of a job's uid outlived their SIGKILL (a process stuck in the kernel)."""


@dataclass(frozen=True)
class UidRange:
    first: int
    last: int

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def __len__(self) -> int:
        return self.last - self.first + 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


def parse_range(text: str) -> UidRange:
    """``FIRST-LAST``; raises ValueError naming what is wrong."""
    first, sep, last = text.strip().partition("-")
    try:
        low, high = int(first), int(last)
    except ValueError:
        raise ValueError(f"job uids {text!r}: expected FIRST-LAST, e.g. {DEFAULT_RANGE}") from None
    if not sep or low > high:
        raise ValueError(f"job uids {text!r}: expected FIRST-LAST with FIRST <= LAST")
    if low < MIN_FREE_UID or high >= 2**32 - 1:
        raise ValueError(f"job uids {text!r}: must lie within {MIN_FREE_UID}-{2**32 - 2}")
    if high - low + 1 > MAX_RANGE:
        raise ValueError(f"job uids {text!r}: at most {MAX_RANGE} uids (one per job running at once)")
    return UidRange(low, high)


def check_range(ids: UidRange) -> None:
    """Refuse a range that holds a user or a group of this machine: a job would get its files."""
    users = sorted(f"{u.pw_name} ({u.pw_uid})" for u in pwd.getpwall() if u.pw_uid in ids)
    groups = sorted(f"{g.gr_name} ({g.gr_gid})" for g in grp.getgrall() if g.gr_gid in ids)
    if users or groups:
        taken = ", ".join(users + [f"group {g}" for g in groups])
        raise ValueError(f"job uids {ids}: the range holds existing ids ({taken}); choose another range")


def processes_of(uids: UidRange | set[int]) -> dict[int, list[int]]:
    """uid → the pids of live processes that have it as any of their four uids (real, effective,
    saved, filesystem). Zombies hold nothing and are not counted (a process whose first thread
    exited while others run reads as one, and is counted: :func:`_uids_of`)."""
    found: dict[int, list[int]] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        ids = _uids_of(int(entry))
        if ids is None:
            continue
        for uid in set(ids):
            if uid in uids:
                found.setdefault(uid, []).append(int(entry))
    return found


def _uids_of(pid: int) -> tuple[int, ...] | None:
    """The four uids of ``pid`` from ``/proc/<pid>/status``; None when gone or a zombie.

    A zombie is a process with no thread left. One whose first thread called ``pthread_exit``
    reads as a zombie too (its state is its first thread's) while its other threads run on, as
    its uid: counted, and killed, or a job could outlive its end that way and keep its uid,
    files and GPU after its exit was reported.

    Read with ``os.open``/``os.read`` and two searches, not a file object and a split into lines:
    a scan reads every process of the node at each job's end, and this way costs a fifth
    (docs/benchmarks/e2e.md, "The agent's share")."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    state = text.find(b"\nState:\t")
    if state >= 0 and text[state + 8 : state + 9] in (b"Z", b"X"):
        threads = text.find(b"\nThreads:\t")
        end = text.find(b"\n", threads + 1)
        if threads < 0 or int(text[threads + 10 : end if end >= 0 else len(text)] or b"0") <= 1:
            return None
    at = text.find(b"\nUid:\t")
    if at < 0:
        return None
    end = text.find(b"\n", at + 1)
    return tuple(int(v) for v in text[at + 6 : end if end >= 0 else len(text)].split())


def kill_uid(uid: int, timeout: float = KILL_TIMEOUT_S) -> int:
    """SIGKILL every process of ``uid`` and wait until none is left; how many were seen.

    The kill is sent by a process running as ``uid`` itself (``kill(-1)``: every process it may
    signal, i.e. of its uid, but itself): the kernel walks its process list once under a lock that
    fork also takes, so no child forked meanwhile escapes. Repeated until ``/proc`` shows none
    (a dying process lingers while it releases its memory). Raises :class:`UidsLeft` past
    ``timeout``."""
    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    while True:
        pids = processes_of({uid}).get(uid, [])
        if not pids:
            return len(seen)
        seen.update(pids)
        if time.monotonic() > deadline:
            raise UidsLeft(f"{len(pids)} process(es) of uid {uid} outlived {timeout:g}s of SIGKILL: {pids}")
        _kill_all_as(uid)
        time.sleep(ROUND_S)


SYSVIPC = Path("/proc/sysvipc")
TOOLS_PATH = "/usr/bin:/bin"  # util-linux's ipcrm
# /proc/sysvipc's file, its id column, and ipcrm's option for each kind of System V IPC object.
IPC_KINDS = (("shm", "shmid", "-m"), ("sem", "semid", "-s"), ("msg", "msqid", "-q"))


def ipc_of(uid: int, sysvipc: Path = SYSVIPC) -> list[tuple[str, int]]:
    """The System V IPC objects (shared memory segments, semaphore sets, message queues) of the
    agent's IPC namespace that ``uid`` created or owns, as (ipcrm's option, id)."""
    found = []
    for name, id_column, option in IPC_KINDS:
        try:
            rows = (sysvipc / name).read_text().splitlines()
        except OSError:
            continue
        if not rows:
            continue
        header = rows[0].split()
        try:
            at_id, at_uid, at_cuid = header.index(id_column), header.index("uid"), header.index("cuid")
        except ValueError:
            continue
        for row in rows[1:]:
            cells = row.split()
            with contextlib.suppress(IndexError, ValueError):
                if uid in (int(cells[at_uid]), int(cells[at_cuid])):
                    found.append((option, int(cells[at_id])))
    return found


def remove_ipc(uid: int, sysvipc: Path = SYSVIPC) -> int:
    """Remove the System V IPC objects ``uid`` created or owns (:func:`ipc_of`), once no process
    of it is left: unlike its files, they hold the node's memory (a segment lives on after its
    last process, until removed) and outlive the job, for the next job given the uid to attach
    to and read. Where jobs have an IPC namespace each there are none here (theirs went with
    their last process). How many were removed; a failure is logged."""
    found = ipc_of(uid, sysvipc)
    ipcrm = shutil.which("ipcrm", path=TOOLS_PATH)
    if not found or ipcrm is None:
        return 0
    argv = [ipcrm, *(arg for option, ident in found for arg in (option, str(ident)))]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env={"PATH": TOOLS_PATH},
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("uid %d: its System V IPC objects not removed: %s", uid, exc)
        return 0
    if done.returncode != 0:
        log.warning("uid %d: its System V IPC objects not all removed: %s", uid, done.stderr.strip())
    return len(found)


KEY_USERS = Path("/proc/key-users")
# keyctl(2): its number (glibc has no wrapper; x86_64's and aarch64's), and what is used of it.
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
KEYCTL_GET_PERSISTENT, KEYCTL_CLEAR = 22, 7
KEY_SPEC_PROCESS_KEYRING, KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -2, -4, -5


def has_keys(uid: int, key_users: Path = KEY_USERS) -> bool:
    """Whether the kernel holds keys of ``uid`` (``/proc/key-users``: a line per uid that has)."""
    try:
        lines = key_users.read_text().splitlines()
    except OSError:
        return False
    return any(line.split(":", 1)[0].strip() == str(uid) for line in lines)


def clear_keys(uid: int, key_users: Path = KEY_USERS) -> bool:
    """Empty ``uid``'s keyrings in the kernel (its user, user-session and persistent keyrings)
    once no process of it is left: unlike its processes they outlive it (the user keyring as long
    as the machine runs, the persistent one for days), so a secret a job kept there (a Kerberos
    ticket in ``KEYRING:persistent``, an API key with ``keyctl add``) was the next job's given
    the uid. Done as ``uid`` (a forked child, as :func:`_kill_all_as`): the keyrings are its
    own; only when ``/proc/key-users`` says it has keys, so a job that made none costs no fork.
    Whether they were cleared."""
    if SYS_KEYCTL is None or not has_keys(uid, key_users):
        return False
    keyctl = ctypes.CDLL(None, use_errno=True).syscall  # loaded before the fork: the child calls it

    def clear() -> None:
        keyctl(SYS_KEYCTL, KEYCTL_CLEAR, KEY_SPEC_USER_KEYRING)
        keyctl(SYS_KEYCTL, KEYCTL_CLEAR, KEY_SPEC_USER_SESSION_KEYRING)
        persistent = keyctl(SYS_KEYCTL, KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_PROCESS_KEYRING)
        if persistent > 0:
            keyctl(SYS_KEYCTL, KEYCTL_CLEAR, persistent)

    status = _as_uid(uid, clear)
    if status != 0:
        log.warning("uid %d: its keyrings could not be cleared", uid)
    return status == 0


MQUEUE = Path("/dev/mqueue")
SHM = Path("/dev/shm")


def remove_mqueues(uid: int, mqueue: Path = MQUEUE) -> int:
    """Remove the POSIX message queues of the agent's IPC namespace that ``uid`` owns, found
    where the node mounts their file system (``/dev/mqueue``): like System V's, a queue outlives
    its last process, holding the node's memory (the messages in it) for the next job given the
    uid to read. Where jobs have an IPC namespace each (and ``/dev/mqueue`` of their own) there
    are none here. How many were removed; a failure is logged."""
    return remove_owned(uid, mqueue)


def remove_shm(uid: int, shm: Path = SHM) -> int:
    """Remove what ``uid`` owns in the node's ``/dev/shm`` (POSIX shared memory, ``shm_open``'s
    objects, and any file or directory it made there): a tmpfs, the node's memory, which a job
    without a private one (no mount namespaces) left holding it, for the next job given the uid
    to own and read. With namespaces a job's ``/dev/shm`` is its own, gone with it. How many
    entries were removed."""
    return remove_owned(uid, shm)


def remove_owned(uid: int, directory: Path) -> int:
    """Remove the entries directly in ``directory`` that ``uid`` owns (a directory with all in it,
    following no link: :func:`agent.state.remove_tree`). How many; a failure is logged."""
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if st.st_uid != uid:
                continue
            if stat.S_ISDIR(st.st_mode):
                remove_tree(Path(entry.path))
            else:
                os.unlink(entry.path)
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("uid %d: %s not removed: %s", uid, entry.path, exc)
    return removed


def clean_uid(uid: int) -> None:
    """What a uid keeps in the kernel once its processes are gone, removed before it goes to
    another job: its System V IPC objects, its POSIX message queues and shared memory, and its
    keys."""
    remove_ipc(uid)
    remove_mqueues(uid)
    remove_shm(uid)
    clear_keys(uid)


def _as_uid(uid: int, action: Callable[[], None]) -> int:
    """Run ``action`` in a child that became ``uid`` (no group but its own): Python's own fork, so
    nothing but this module is needed on the node (no setpriv, no kill binary). Its wait status:
    0 when ``action`` returned."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child exits at once
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            action()
        except BaseException:
            os._exit(1)
        os._exit(0)
    return os.waitpid(pid, 0)[1]


def _kill_all_as(uid: int) -> None:
    # kill(-1, SIGKILL) as ``uid``: every process of it at once, none of anyone else's
    _as_uid(uid, lambda: os.kill(-1, signal.SIGKILL))


class JobUsers(Protocol):
    """Hands out the user a job attempt runs as, and takes it back after the attempt here."""

    isolated: bool

    def take(self, job_id: int, attempt: int) -> RunAs: ...

    def give_back(self, job_id: int, attempt: int, ended: Callable[[int], None] | None = None) -> int: ...

    def probe(self) -> RunAs: ...


class SharedUser:
    """Every job as one user (``--single-tenant``, or an agent that is not root): nothing between
    jobs; a job's escaped processes are found by session only (agent/leftovers.py)."""

    isolated = False

    def __init__(self, run_as: RunAs):
        self.run_as = run_as

    def take(self, job_id: int, attempt: int) -> RunAs:
        return self.run_as

    def give_back(self, job_id: int, attempt: int, ended: Callable[[int], None] | None = None) -> int:
        return 0

    def probe(self) -> RunAs:
        return self.run_as


class UidWatcher(Protocol):
    """Told of each uid an agent claims (before its job is spawned) and gives back (once no process
    of it is left, while its lock is still held): the loopback rules (agent/firewall.py)."""

    def claimed(self, uid: int, stale: bool) -> None: ...

    def released(self, uid: int) -> bool: ...


class UidPool:
    """The uids of ``ids``, one per job attempt on this node (its replicas here share it)."""

    isolated = True

    def __init__(self, ids: UidRange, lock_dir: Path = DEFAULT_LOCK_DIR):
        self.ids = ids
        self.lock_dir = lock_dir
        self.watcher: UidWatcher | None = None
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._held: dict[tuple[int, int], tuple[int, int, int]] = {}  # key → (uid, lock fd, users)
        self._next = random.randrange(len(ids))  # agents sharing the range start apart

    def take(self, job_id: int, attempt: int) -> RunAs:
        key = (job_id, attempt)
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                uid, fd, users = held
                self._held[key] = (uid, fd, users + 1)
                return _job_user(uid)
            uid, fd, stale = self._claim()
            self._held[key] = (uid, fd, 1)
            if self.watcher is not None:
                self.watcher.claimed(uid, stale)
        return _job_user(uid)

    def give_back(self, job_id: int, attempt: int, ended: Callable[[int], None] | None = None) -> int:
        """One replica of the attempt ended; after the last, kill what is left of its uid, wait
        until it is gone and free the uid. ``ended`` is called with the uid in between: no
        process of it is left, and no other job can have it yet (what the attempt kept, its
        checkpoint, is taken back from the uid there). Returns the processes killed; raises
        :class:`UidsLeft` (the uid then stays held by this agent, never handed out again in its
        life)."""
        key = (job_id, attempt)
        with self._lock:
            held = self._held.get(key)
            if held is None:
                return 0
            uid, fd, users = held
            if users > 1:
                self._held[key] = (uid, fd, users - 1)
                return 0
            del self._held[key]
        killed = kill_uid(uid)  # raises UidsLeft: the fd stays open, the uid held for good
        clean_uid(uid)
        if ended is not None:
            ended(uid)
        if self.watcher is not None and not self.watcher.released(uid):
            os.close(fd)  # not clean: its next claim treats it as a dead holder's
            return killed
        _clean(fd)  # the flock goes with it
        return killed

    def uid_of(self, job_id: int, attempt: int) -> int | None:
        with self._lock:
            held = self._held.get((job_id, attempt))
        return held[0] if held else None

    def probe(self) -> RunAs:
        """A uid of the range, for checks made as a job user would run (reaching a directory)."""
        return _job_user(self.ids.first)

    def _claim(self) -> tuple[int, int, bool]:
        """A uid no one holds and no process has; its lock file's fd, flocked and marked in use;
        whether its last holder died holding it (or could not give it back clean).

        The lock file says whether its last holder gave the uid back cleanly (empty: every
        process of it was dead) or died holding it (the holder's pid in it): only then can a
        process of the uid still run, and it is killed first — it is a job of a dead agent, whose
        lease has run out or soon will. So the common claim reads no ``/proc``."""
        for _ in range(len(self.ids)):
            uid = self.ids.first + self._next
            self._next = (self._next + 1) % len(self.ids)
            fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            try:
                stale = bool(os.read(fd, 64))
                if stale:
                    kill_uid(uid)  # its holder died: what it left of the uid goes first
                    clean_uid(uid)
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            except (OSError, UidsLeft) as exc:
                log.warning("uid %d left out: %s", uid, exc)
                os.close(fd)
                continue
            return uid, fd, stale
        raise UidsExhausted(f"every uid of {self.ids} is held by a job or still has processes")


def _clean(fd: int) -> None:
    """Mark a held uid as given back cleanly (no process of it left), then let it go."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    os.close(fd)


def end_leftover_uid(uid: int, lock_dir: Path = DEFAULT_LOCK_DIR, timeout: float = 5.0) -> int | None:
    """At an agent's start: kill what a job of its previous run left under ``uid`` (a process
    that left its session), holding the uid's lock meanwhile. None when another agent holds the
    uid past ``timeout``: it took it after our predecessor died, once no process of it was left,
    so what runs under it now is that agent's job. Raises :class:`UidsLeft`."""
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        killed = kill_uid(uid)
        os.ftruncate(fd, 0)  # clean: no process of it left
        return killed
    finally:
        os.close(fd)


def _job_user(uid: int) -> RunAs:
    return RunAs(f"job-{uid}", uid, uid)


def resolve_run_as(user: str) -> RunAs:
    """As root: the named unprivileged user (never root). Otherwise: the agent's own user."""
    if os.geteuid() != 0:
        return RunAs(pwd.getpwuid(os.geteuid()).pw_name)
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"--run-as {user!r}: no such user") from None
    if entry.pw_uid == 0:
        raise ValueError(f"--run-as {user!r} is root; jobs must run as an unprivileged user")
    return RunAs(user, entry.pw_uid, entry.pw_gid)


def users_for(
    single_tenant: bool, run_as: str, uid_range: str, lock_dir: Path = DEFAULT_LOCK_DIR
) -> JobUsers:
    """The agent's job users, per its flags; raises ValueError saying why it cannot run."""
    if single_tenant:
        return SharedUser(resolve_run_as(run_as))
    if os.geteuid() != 0:
        raise ValueError(
            "jobs of several tenants need a uid each, which only a root agent can give "
            "(it needs CAP_SETUID, CAP_SETGID, CAP_KILL, CAP_CHOWN, CAP_SYS_ADMIN): run it as root, "
            "or pass --single-tenant to run every job as this user (unsafe for sharing the node: "
            "any job can read, signal and overwrite any other)"
        )
    ids = parse_range(uid_range)
    check_range(ids)
    return UidPool(ids, lock_dir)

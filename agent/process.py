"""One job replica's process on this node: start it, stream its output, stop it, report its end.

The process runs in a clean environment (not the agent's: the credential and the join token never
reach it), as its job attempt's own uid when the agent is root (agent/identity.py), behind the
spawn chain of agent/sandbox.py, in its own session (so a stop signals its whole process group),
with umask 077, in a working directory of its own (0700, a random part in its name) with a private
``TMPDIR`` in it. A supervisor thread ships its output in chunks with byte offsets, enforces its
time limit and its kill deadline, and reports its exit once every process of it is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import hmac
import itertools
import json
import logging
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from agent import leftovers, sandbox, state
from agent.cgroups import AnyCgroups
from agent.checkpoints import MARKER_NAME, Checkpoint, MarkerWatch
from agent.client import AgentClient, Rejected, ServerError
from agent.identity import JobUsers, RunAs, SharedUser, UidsExhausted, UidsLeft
from agent.reports import ExitReporter
from agent.sandbox import SAFE_PATH, Sandbox

WORLD_NAME = "world.json"  # TESSERA_WORLD_FILE, in the job's working directory
log = logging.getLogger("tessera.agent")

CHUNK_BYTES = 256 * 1024
# A replica's output not yet sent that the agent holds at most (``--job-log-buffer-mb``); past it
# output is dropped, until sending has brought it under half again, where a line says how much was.
MAX_BUFFER_BYTES = 32 * 1024 * 1024
LOG_RETRY_S = 1.0  # after a failed send of output, the next try (the process's exit: sooner)
TICK_S = 0.25
DISK_CHECK_S = 5.0  # between sums of a job's directories (a fifth of it past half the bound)
SUM_SHARE = 5  # a sum that took T seconds puts the next off by at least SUM_SHARE × T
# A process that ends this soon after its start is reported once: its exit report carries its
# start (one request instead of two; the start time is the spawn's either way).
QUICK_EXIT_S = 0.05
# After the job's main process exits, how long the rest of its session gets to die of SIGKILL
# before the exit is reported anyway (its record stays: the next agent start tries again).
SESSION_END_S = 10.0
PR_SET_PDEATHSIG = 1
JOB_UMASK = 0o077
# The kernel's OOM killer, when the node runs out of memory, kills the process with the highest
# score (its memory, plus its oom_score_adj in thousandths of the machine's): the agent last (its
# death ends every job on the node), a job whose memory no cgroup bounds (no ``memory_gib``:
# nothing else stops it) first, then one that asked for memory. Set by the agent (root) on each
# job's spawned process before anything of the job runs, which also keeps the job from lowering
# it (agent/cli.py lowers the agent's own).
AGENT_OOM_SCORE_ADJ = -999
UNBOUNDED_JOB_OOM_SCORE_ADJ = 1000
BOUNDED_JOB_OOM_SCORE_ADJ = 500


def run_as_kwargs(run_as: RunAs) -> dict[str, Any]:
    if run_as.uid is None:
        return {}
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}


def runs_as(argv: list[str], run_as: RunAs, cwd: str = "/") -> bool:
    """Whether ``argv`` runs successfully as the job user (e.g. can it reach this Python?)."""
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env={"PATH": SAFE_PATH},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=20,
            **run_as_kwargs(run_as),
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def job_path(state_dir: Path, run_as: RunAs) -> str:
    """PATH for jobs: the agent's Python first, so ``python`` works as the job asked.

    When the job user cannot run the agent's interpreter (a venv under a private home), a
    ``python`` link to one it can run is made in ``STATE/bin``.
    """
    exe_dir = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(exe_dir, "python")) and runs_as(
        [os.path.join(exe_dir, "python"), "-c", "pass"], run_as
    ):
        return f"{exe_dir}:{SAFE_PATH}"
    bin_dir = state_dir / "bin"
    bin_dir.mkdir(mode=0o755, exist_ok=True)
    for candidate in (os.path.realpath(sys.executable), shutil.which("python3", path=SAFE_PATH)):
        if candidate and runs_as([candidate, "-c", "pass"], run_as):
            for name in ("python", "python3"):
                link = bin_dir / name
                if link.is_symlink() or link.exists():
                    link.unlink()
                link.symlink_to(candidate)
            return f"{bin_dir}:{SAFE_PATH}"
    log.warning("no Python the job user %s can run; jobs get PATH=%s", run_as.name, SAFE_PATH)
    return SAFE_PATH


def job_environment(
    binding: dict[str, Any], run_as: RunAs, path: str, workdir: Path, checkpoint_dir: Path
) -> dict[str, str]:
    """The job's whole environment: its own ``env``, then what Tessera sets (which wins)."""
    home = str(workdir)  # joined as text: pathlib's joins cost more than the rest of this
    env: dict[str, str] = {
        "PATH": path,
        "HOME": home,
        "USER": run_as.name,
        "LOGNAME": run_as.name,
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",  # so output streams while the job runs, not at its exit
    }
    env.update({str(k): str(v) for k, v in (binding.get("env") or {}).items()})
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, binding.get("gpus", []))),
            "TESSERA_JOB_ID": str(binding["job_id"]),
            "TESSERA_ATTEMPT": str(binding["attempt"]),
            "TESSERA_REPLICA": str(binding.get("replica", 0)),
            "TESSERA_REPLICAS": str(binding.get("replicas", 1)),
            "TESSERA_CHECKPOINT_DIR": str(checkpoint_dir),
            "TESSERA_CHECKPOINT_MARKER": f"{home}/{MARKER_NAME}",
            "TMPDIR": f"{home}/tmp",
        }
    )
    if binding.get("resizable", True):  # (a server before the field: every job had a world file)
        env["TESSERA_WORLD_FILE"] = f"{home}/{WORLD_NAME}"
    share = float(binding.get("share", 1.0))
    if share < 1.0:
        env["TESSERA_GPU_SHARE"] = f"{share:g}"
    meet = binding.get("rendezvous") or {}
    if meet.get("master_port"):  # (the agent gives a port to a job on one node that had none)
        env.update(
            {
                "MASTER_ADDR": str(meet["master_addr"]),
                "MASTER_PORT": str(meet["master_port"]),
                "WORLD_SIZE": str(meet["world_size"]),
                "RANK": str(meet["rank"]),
                "LOCAL_RANK": str(meet["local_rank"]),
            }
        )
    return env


def protect_from_oom() -> str | None:
    """Put the agent last in the OOM killer's order (:data:`AGENT_OOM_SCORE_ADJ`): a job that
    fills the node's memory must not get the agent killed, and every job with it. None when
    done, else why not (not root, a container without ``CAP_SYS_RESOURCE``)."""
    try:
        Path("/proc/self/oom_score_adj").write_text(f"{AGENT_OOM_SCORE_ADJ}\n")
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _die_with_agent() -> None:
    """In the child, after it dropped privileges: SIGKILL it if the agent dies (no orphans).

    Set after setuid on purpose: the kernel clears it when the credentials change.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _check_executable(program: str, path: str, cwd: Path, run_as: RunAs) -> None:
    """Raise what executing ``program`` would, as far as the agent can tell: behind ``setpriv``,
    a command that cannot start is then still reported as ``spawn-failed`` before any spawn.
    (One only the job user cannot run gets ``setpriv``'s own exit, 126 or 127, and message.)

    The agent looks as root, so it looks only where the job's user could look too (every
    directory on the way searchable by it: :func:`_public`): else a command such as
    ``/proc/<pid>/root/tmp/<name>`` or ``/root/.ssh/id_rsa`` said, by ``spawn-failed`` "No such
    file" against a permission error, whether a path the job may not see exists — another job's
    private files by their names. Where any place the command may be is not the job's to see,
    the agent says nothing and the job's own ``exec`` reports, as its user."""
    target = os.path.join(cwd, program) if "/" in program else program
    places = [target] if "/" in program else [os.path.join(d, program) for d in path.split(os.pathsep) if d]
    if not all(_public(place, run_as) for place in places):
        return
    if shutil.which(target, path=path) is not None:
        return
    found = any(os.path.isfile(place) for place in places)
    code = errno.EACCES if found else errno.ENOENT
    raise OSError(code, os.strerror(code), program)


def _public(place: str, run_as: RunAs) -> bool:
    """Whether the job's user may search every directory on the way to ``place`` (links
    resolved, as root resolves them), from the root down: each one searchable by others, or by
    the user as its owner or group; one that does not exist ends the way (the user sees that as
    well). Unsure (a directory root cannot read): no."""
    if run_as.uid is None:  # the agent is not root: it sees what the job's user sees
        return True
    real = Path(os.path.realpath(place))
    for directory in reversed(real.parents):
        try:
            st = os.stat(directory)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if st.st_mode & 0o001:
            continue
        if st.st_uid == run_as.uid and st.st_mode & 0o100:
            continue
        if run_as.gid is not None and st.st_gid == run_as.gid and st.st_mode & 0o010:
            continue
        return False
    return True


def _empty(procs: list[Path]) -> bool:
    """Whether every one of the cgroup.procs files ``procs`` lists no process (False when one
    cannot be read: the caller then looks for the processes another way)."""
    try:
        return not any(path.read_bytes().strip() for path in procs)
    except OSError:
        return False


def write_world(workdir: Path, world: dict[str, Any], run_as: RunAs) -> None:
    """Replace ``workdir/world.json`` with ``world`` (JSON, one line), the job user's, 0600.

    The agent (root) writes into a directory the job owns, so it never follows a path the job
    could have changed: the directory is opened without following a link, the new file is
    created there exclusively under a random name and renamed over the old one (a rename
    replaces a link, it does not follow it)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    dfd = os.open(workdir, flags)
    try:
        tmp = f".world-{secrets.token_hex(8)}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
        )
        try:
            if run_as.uid is not None:
                os.fchown(fd, run_as.uid, run_as.gid if run_as.gid is not None else run_as.uid)
            os.write(fd, (json.dumps(world, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)
        os.replace(tmp, WORLD_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


def _owned_dir(path: Path, run_as: RunAs, isolated: bool = False) -> bool:
    """Make ``path`` 0700 and owned by the job user, and so everything in it (a checkpoint
    directory an earlier attempt, another uid, wrote): chowned without following a link; where
    jobs have uids of their own (``isolated``), a file of a system user's in it (a hard link an
    attempt made to a file of the node's) is unlinked instead (:func:`state.drop_foreign`).
    Whether it was there already, a directory: a checkpoint to resume from.

    Only what differs is changed: a directory made here (empty: nothing in it to chown) or found
    as it should be costs three or two system calls, where setting it whole took ten or six
    (docs/benchmarks/e2e.md, Session 21)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        made = False
    except FileNotFoundError:  # its parent is missing
        return _owned_dir_made(path, run_as, isolated)
    else:
        made = True
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):  # a link, or not a directory at all: as it always was
        return _owned_dir_made(path, run_as, isolated)
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    if run_as.uid is None:
        return not made
    uid, gid = run_as.uid, run_as.gid if run_as.gid is not None else run_as.uid
    if not made and st.st_uid != uid:
        state.chown_tree(path, uid, gid, isolated)
    if st.st_uid != uid or st.st_gid != gid:
        os.chown(path, uid, gid, follow_symlinks=False)
    return not made


def _owned_dir_made(path: Path, run_as: RunAs, isolated: bool = False) -> bool:
    """:func:`_owned_dir` by the long way, for a path that is not a plain directory, or whose
    parent is missing: made with its parents, set whatever it was."""
    existed = path.is_dir()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    if run_as.uid is None:
        return existed
    uid, gid = run_as.uid, run_as.gid if run_as.gid is not None else run_as.uid
    if os.lstat(path).st_uid != uid:
        state.chown_tree(path, uid, gid, isolated)
    os.chown(path, uid, gid, follow_symlinks=False)
    return existed


def _new_workdir(path: Path, run_as: RunAs) -> None:
    """The replica's working directory and its ``tmp`` (``TMPDIR``), made afresh: 0700, the job
    user's. Both are made, with nothing to follow or walk (``mkdir`` refuses a path that is
    there), before either is handed to the job user."""
    tmp = path / "tmp"
    for directory in (path, tmp):
        os.mkdir(directory, 0o700)
        os.chmod(directory, 0o700)  # whatever the agent's umask
    if run_as.uid is not None:
        gid = run_as.gid if run_as.gid is not None else run_as.uid
        for directory in (tmp, path):
            os.chown(directory, run_as.uid, gid, follow_symlinks=False)


def _remove_workdir(path: Path) -> None:
    """Remove the replica's working directory: as it was made (its ``tmp`` empty, at most the
    world file beside it) by a few calls that follow no link (``rmdir`` and ``unlink`` do not
    follow a path's last part, and ``path`` itself lies in the agent's own ``jobs``); anything
    else the job left there by a walk that follows none either."""
    try:
        os.rmdir(path / "tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path / WORLD_NAME)
        os.rmdir(path)
    except OSError:
        state.remove_tree(path)


class DiskUsage(NamedTuple):
    """What a job's files take: bytes on disk (allocated blocks), and files (inodes: each file,
    directory and link, empty or not)."""

    bytes: int
    files: int


def disk_usage(top: Path, most_files: int | None = None) -> DiskUsage:
    """Bytes the files under ``top`` take on disk (allocated blocks: a sparse file counts what
    it holds, not its length), and how many there are (each entry, directories and links too:
    an empty file holds no block but one of the file system's inodes), links not followed;
    nothing if it is not there. ``most_files``: the walk stops once it has seen more than that
    (the job is over its bound then), so neither its time nor the agent's memory grows with
    what a job makes past it (a directory of millions of entries is listed only that far).

    Walked through directory descriptors, each subdirectory opened by its name in its parent
    without following a link: no path is ever built, so no depth hides anything (a path past the
    kernel's 4,096 bytes cannot be opened: what a job put a few thousand levels deep went
    uncounted), and a directory the job swaps for a link meanwhile leads nowhere else. One
    descriptor per level, at most :data:`MAX_HELD_LEVELS` (a deep tree must not leave the agent's
    other threads, other jobs' spawns and its connections, without descriptors): a deeper tree is
    summed by ``du`` instead."""
    try:
        fd = os.open(top, _DIRECTORY_FLAGS)
    except OSError:
        return DiskUsage(0, 0)
    total = files = 0
    try:
        levels = [(fd, _entries(fd, most_files))]  # each directory being read, with what is left of it
    except OSError:
        os.close(fd)
        return DiskUsage(state.tree_size(top), state.tree_files(top))
    too_deep = False
    try:
        while levels and not too_deep:
            parent, left = levels[-1]
            if not left:
                os.close(parent)
                levels.pop()
                continue
            entry = left.pop()
            files += 1
            if most_files is not None and files > most_files:
                break
            try:
                if entry.is_dir(follow_symlinks=False):
                    if len(levels) >= MAX_HELD_LEVELS:
                        too_deep = True
                        break
                    child = os.open(entry.name, _DIRECTORY_FLAGS, dir_fd=parent)
                    try:
                        listing = _entries(child, None if most_files is None else most_files - files)
                    except OSError:
                        os.close(child)
                        raise
                    levels.append((child, listing))
                else:  # a file, or a link (its own blocks, as a long target has)
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError as exc:  # gone meanwhile, or a link now: nothing of it to count
                too_deep = exc.errno in (errno.EMFILE, errno.ENFILE)
    finally:
        for fd, _ in levels:
            os.close(fd)
    return DiskUsage(state.tree_size(top), state.tree_files(top)) if too_deep else DiskUsage(total, files)


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_HELD_LEVELS = 64  # directories open at once in disk_usage's walk; deeper: du


def _entries(fd: int, most: int | None = None) -> list[os.DirEntry[str]]:
    """What the directory ``fd`` holds (its listing closed at once: a descriptor per level only),
    at most ``most`` + 1 entries; nothing when it cannot be read, but OSError when the agent is
    out of descriptors."""
    try:
        with os.scandir(fd) as entries:
            return list(entries) if most is None else list(itertools.islice(entries, max(0, most) + 1))
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise
        return []


def checkpoint_dir(state_dir: Path, job_id: int, root: Path | None = None) -> Path:
    """``STATE/checkpoints/<job>-<key>``: the same for every attempt of the job on this node, not
    guessable by a job (an HMAC of the job id under the node's key, ``STATE/checkpoint-key``).
    With a shared ``root`` (``--checkpoint-root``): ``ROOT/<job>-<key>`` under the root's own key
    (``ROOT/.checkpoint-key``), the same on every node that mounts it, so a job requeued onto
    another node finds its checkpoint."""
    if root is not None:
        key, parent = state.checkpoint_key(root, name=".checkpoint-key"), str(root)
    else:
        key, parent = state.checkpoint_key(state_dir), f"{state_dir}/checkpoints"
    tag = hmac.digest(key, str(job_id).encode(), "sha256").hex()[:32]
    return Path(f"{parent}/{job_id}-{tag}")


class JobProcess:
    """A replica's process and the thread that watches it."""

    def __init__(
        self,
        binding: dict[str, Any],
        client: AgentClient | ExitReporter,  # what starts, logs and exits are reported to
        state_dir: Path,
        users: JobUsers | RunAs,
        path: str,
        cgroups: AnyCgroups | None = None,
        sandbox: Sandbox | None = None,
        checkpoint_root: Path | None = None,
        checkpoint_signal: int = signal.SIGUSR1,
        log_buffer_bytes: int = MAX_BUFFER_BYTES,
    ):
        self.binding = binding
        self.cgroups = cgroups
        self.cgroup: Path | None = None
        # The cgroup.procs files the spawn chain joined, before anything of the job ran: every
        # process of the job is in them (none can leave: the cgroups are root's).
        self.joined: list[Path] = []
        self.job_id = int(binding["job_id"])
        self.attempt = int(binding["attempt"])
        self.replica = int(binding.get("replica", 0))
        self.gpus = [int(g) for g in binding.get("gpus", [])]
        self.share = float(binding.get("share", 1.0))
        self.client, self.state_dir, self.path = client, state_dir, path
        self.users: JobUsers = SharedUser(users) if isinstance(users, RunAs) else users
        self.sandbox = sandbox if sandbox is not None else Sandbox(namespaces=False)
        self.run_as: RunAs | None = None  # taken from ``users`` at the start
        self.proc: subprocess.Popen[bytes] | None = None
        self.session: leftovers.Session | None = None  # recorded in STATE/sessions while it runs
        self.pids: leftovers.PidClock | None = None  # which pids its session's processes can have
        self.started_at = time.monotonic()
        self.started_wall: float | None = None  # the epoch time the process was spawned
        self.exit_code: int | None = None
        self.exit_reason = ""
        self.stop_reason: str | None = None
        self.kill_at: float | None = None
        self.killed = False
        self.silent = False  # the agent is shutting down: no more reports
        self.done = threading.Event()  # the exit was reported (or abandoned)
        self._lock = threading.Lock()
        # Wakes the supervisor from other threads (a stop, a note); polled with the output pipe.
        self._wake_fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._buffer = bytearray()
        self._buffer_cap = log_buffer_bytes
        self._dropped: int | None = None  # while output is dropped (the buffer full): how much
        self._line_open = False  # the last output kept does not end with a newline
        self._ship_at = 0.0  # no send of output before then (monotonic): the last one failed
        self._output_open = False
        self._offset = int(binding.get("log_offset", 0))
        self._drop_logs = False
        self._started_pending = True
        self._session_over = False  # its session has no process left (its record may go)
        # Random: a job cannot guess another's directory (nor could it enter it: 0700, another uid).
        self.workdir = Path(f"{state_dir}/jobs/{self.name}-{secrets.token_hex(8)}")
        self.checkpoint_dir = checkpoint_dir(state_dir, self.job_id, checkpoint_root)
        self.checkpoint_signal = checkpoint_signal
        self.marker: MarkerWatch | None = None  # watched once the process runs
        self._term_at: float | None = None  # SIGTERM deferred while a checkpoint is awaited
        self.world: dict[str, Any] = {}  # what its world file says
        # Only a job that can change size has a world file; any other's world is its environment.
        self.resizable = bool(binding.get("resizable", True))
        self._checkpoints_before_stop = 0
        # A checkpoint a stop asked for is seen and not yet taken by the server: sent at every
        # tick until it is (not held back by the once-a-minute bound), and before the exit report.
        self._owed_checkpoint = False
        self._disk_check_at = 0.0  # when its directories are summed next (``--job-disk-mb``)
        # Its share of the node's disk and files where the operator set no bound, else the bound.
        self.disk_mb, self.max_files = self.sandbox.bounds(
            len(self.gpus), self.share, float(binding.get("cpus") or 0)
        )

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.job_id, self.attempt, self.replica)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    @property
    def holds_gpus(self) -> bool:
        """Spawned, and its exit not yet recorded (which follows the end of its whole session)."""
        return self.proc is not None and self.exit_code is None

    @property
    def reported_running(self) -> bool:
        """What the heartbeat lists: a process still running, or one whose start the server was
        told of. Not one that ended before any report (or never started): its exit report, which
        carries its start, says it all; listed, it was recorded started at that heartbeat's time,
        seconds late when the server was slow to answer the exit report."""
        if self.proc is None:
            return False
        return self.proc.returncode is None or not self._started_pending

    # --- starting ------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the process (from the agent's main thread: the parent-death signal follows the
        thread that spawns) and its supervisor thread, which reads its output, ships it, enforces
        its limits and reports its exit."""
        try:
            self.run_as = run_as = self.users.take(self.job_id, self.attempt)
            _new_workdir(self.workdir, run_as)
            resumable = _owned_dir(self.checkpoint_dir, run_as, self.users.isolated)
            if self.binding.get("last_checkpoint_at") and not resumable:
                self._note(
                    "an earlier attempt checkpointed, but its checkpoint is not on this node "
                    "(checkpoints are node-local without --checkpoint-root), so this attempt starts "
                    "from the beginning"
                )
            env = job_environment(self.binding, run_as, self.path, self.workdir, self.checkpoint_dir)
            self.tell_world(self.binding.get("rendezvous") or {})
            command = [str(c) for c in self.binding["command"]]
            if not command:
                raise ValueError("the job's command is empty")
            self._make_cgroup()
            self.proc = self._spawn(run_as, command, env)
        except (OSError, ValueError, subprocess.SubprocessError, UidsExhausted) as exc:
            self._note(f"could not start {self.binding.get('command')!r}: {exc}")
            self.exit_code, self.exit_reason = 127, "spawn-failed"
            self._started_pending = False
        else:
            self.started_wall = time.time()
            self._output_open = True
            self.marker = MarkerWatch(env["TESSERA_CHECKPOINT_MARKER"], self.job_id, run_as.uid)
            # Nothing has waited for it yet: the pid is still the job's (a zombie at worst). Its
            # record is written by its supervisor, off the path of the next binding's start.
            self.session = leftovers.session_of(self.proc.pid)
        self.started_at = time.monotonic()
        threading.Thread(target=self._supervise, name=f"job-{self.job_id}", daemon=True).start()

    def _spawn(self, run_as: RunAs, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Behind the sandbox's chain (its environment through a pipe, written once the chain is in
        the replica's cgroup), or, without ``setpriv``, by a fork that switches the user itself."""
        cpus = float(self.binding.get("cpus") or 0)
        tmpfs_mb = self.sandbox.tmpfs_mb(
            len(self.gpus), self.share, cpus, float(self.binding.get("memory_gib") or 0), self.disk_mb
        )
        tasks = self.sandbox.tasks(len(self.gpus), self.share, cpus)
        prefix = self.sandbox.prefix(run_as, self.gpus, tmpfs_mb, tasks, self.disk_mb, self.max_files)
        if not prefix:
            proc = subprocess.Popen(
                command,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                umask=JOB_UMASK,
                preexec_fn=_die_with_agent,
                **run_as_kwargs(run_as),
            )
            self._move_into_cgroup(proc.pid)
            self._rank_for_oom(proc.pid)
            return proc
        _check_executable(command[0], env["PATH"], self.workdir, run_as)
        script = sandbox.env_script(env)
        env_in, env_out = sandbox.env_pipe(len(script))
        try:
            proc = subprocess.Popen(
                [*prefix, *command],
                cwd=self.workdir,
                env=self.sandbox.env,
                stdin=env_in,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                umask=JOB_UMASK,
            )
            try:
                self._join_cgroup(proc.pid)
                self._rank_for_oom(proc.pid)
                sandbox.send_env(env_in, env_out, script, run_as)
            except OSError:
                # Nothing of the job has run: the chain waits for its environment.
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its group: a mount it forked too
                proc.wait()
                if proc.stdout is not None:
                    proc.stdout.close()
                raise
        finally:
            os.close(env_in)
            os.close(env_out)
        return proc

    def _rank_for_oom(self, pid: int) -> None:
        """The spawned process's ``oom_score_adj`` (:data:`UNBOUNDED_JOB_OOM_SCORE_ADJ`, or
        :data:`BOUNDED_JOB_OOM_SCORE_ADJ` in a memory-bounded cgroup), written by the agent while
        the chain waits for the job's environment: everything the job forks inherits it, and as
        root wrote it, no process of the job may set it lower (the kernel's floor for the process
        is what a privileged writer last set). Otherwise the job inherited the agent's
        :data:`AGENT_OOM_SCORE_ADJ`, and could set itself as low. Where it cannot be written (not
        root), the job keeps the agent's."""
        bounded = self.cgroup is not None and float(self.binding.get("memory_gib") or 0) > 0
        score = BOUNDED_JOB_OOM_SCORE_ADJ if bounded else UNBOUNDED_JOB_OOM_SCORE_ADJ
        try:
            Path(f"/proc/{pid}/oom_score_adj").write_text(f"{score}\n")
        except OSError as exc:
            log.debug("job %s: its oom_score_adj stays the agent's: %s", self.job_id, exc)

    def _join_cgroup(self, pid: int) -> None:
        """Move the spawned chain into the replica's cgroup while it waits for the job's
        environment, before anything of the job runs: every process of the job is inside."""
        if self.cgroups is None or self.cgroup is None:
            return
        try:
            self.cgroups.add(self.cgroup, pid)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot join the job's cgroup ({exc.strerror})", exc.filename) from exc
        self.joined = self.cgroups.procs(self.cgroup)

    @property
    def name(self) -> str:
        return f"{self.job_id}-{self.attempt}-{self.replica}"

    def _record_session(self) -> None:
        """Record the job's session (agent/leftovers.py): a restarted agent kills what is left."""
        if self.session is None:
            return
        self.pids = leftovers.PidClock(self.session.sid)
        try:
            if self.run_as is not None and self.users.isolated:
                # The uid too: a restarted agent kills what escaped the session by it.
                self.session = dataclasses.replace(self.session, uid=self.run_as.uid)
            leftovers.record(self.state_dir, self.name, self.session)
        except OSError as exc:
            log.warning(
                "job %s: its session could not be recorded (%s): a restarted agent "
                "will not find what it leaves",
                self.job_id,
                exc,
            )

    def _end_session(self) -> None:
        """The main process has exited (and is reaped): kill the rest of its session, whatever
        process group it moved to, and wait until it is gone, so the job's GPUs are free when its
        exit is reported. Its record is kept if something would not die."""
        if self.session is None:
            return
        if self.joined and _empty(self.joined):
            # Nothing of the job is left in its cgroup, so nothing of its session is left either:
            # no scan of every process on the node (the common end, a job that leaves nothing).
            self._session_over = True
            return
        killed, alive = leftovers.end_sessions([self.session], SESSION_END_S, pids=self.pids)
        if killed:
            self._note(f"killed {len(killed)} leftover process(es) of the job")
        if alive:
            log.error(
                "job %s: %d process(es) of its session outlived %gs of SIGKILL: %s",
                self.job_id,
                len(alive),
                SESSION_END_S,
                ", ".join(f"{p.pid} ({p.name}, state {p.state})" for p in alive),
            )
            return
        self._session_over = True

    def _end_uid(self) -> None:
        """Give the uid back: after the attempt's last replica here, every process of it is killed
        and gone first (a process that left the session, ``setsid``, is found by its uid). The
        session's record is forgotten once nothing of it can be left."""
        if self.run_as is None:
            return
        try:
            killed = self.users.give_back(self.job_id, self.attempt, ended=self._disown_checkpoint)
        except UidsLeft as exc:
            log.error("job %s: %s; the uid stays held", self.job_id, exc)
            return
        if killed:
            self._note(f"killed {killed} process(es) the job left running under its uid")
        if self._session_over:
            with contextlib.suppress(OSError):
                leftovers.forget(self.state_dir, self.name)

    def _disown_checkpoint(self, uid: int) -> None:
        """The attempt's uid has no process left and is about to be handed out again: its
        checkpoint directory becomes the agent's (0700), so the next job given the uid — another
        tenant's, once the range has come round — owns nothing of it. The job's next attempt
        takes it over as ever (:func:`_owned_dir`)."""
        try:
            state.disown(self.checkpoint_dir, uid)
        except OSError as exc:
            log.warning(
                "job %s: its checkpoint directory stays uid %d's, who may be another job's next: %s",
                self.job_id,
                uid,
                exc,
            )

    def _make_cgroup(self) -> None:
        """The replica's own cgroup with its CPU and memory limits, before its spawn: the spawn
        chain joins it before anything of the job runs (:meth:`_join_cgroup`). Named after its
        working directory, whose random part keeps two agents of one machine out of each other's
        cgroups. A replica that asks for no limit gets one too: its processes share the CPU as one
        group, not each as the agent's equal (agent/cgroups.py)."""
        if self.cgroups is None:
            return
        cpus = float(self.binding.get("cpus") or 0)
        memory = float(self.binding.get("memory_gib") or 0)
        try:
            self.cgroup = self.cgroups.create(self.workdir.name, cpus, memory)
        except OSError as exc:
            asked = "CPU and memory limits not applied" if cpus > 0 or memory > 0 else "no cgroup of its own"
            self._note(f"{asked}: {exc}")

    def _move_into_cgroup(self, pid: int) -> None:
        """Without the spawn chain (no setpriv): move the process from outside, after its spawn
        (what it forks in that first instant stays outside)."""
        if self.cgroups is None or self.cgroup is None:
            return
        try:
            self.cgroups.add(self.cgroup, pid)
        except OSError as exc:
            self._note(f"CPU and memory limits not applied: {exc}")

    # --- stopping ------------------------------------------------------------------------------

    def stop(self, reason: str, grace_s: float) -> None:
        """SIGTERM the process group now; SIGKILL it when ``grace_s`` has passed. No grace: SIGKILL
        now, from the caller's thread (the lease's fencing does not wait for the supervisor)."""
        with self._lock:
            deadline = time.monotonic() + max(0.0, grace_s)
            if self.kill_at is None or deadline < self.kill_at:
                self.kill_at = deadline
            first = self.stop_reason is None
            if first:
                self.stop_reason = reason
        running = self.proc is not None and self.proc.poll() is None
        if running and grace_s <= 0:
            self._note(f"stopping ({reason}): SIGKILL")
            self._signal(signal.SIGKILL)
        elif running and first and self._checkpoint_first(reason):
            wait = grace_s / 2
            self._note(
                f"stopping ({reason}): {signal.Signals(self.checkpoint_signal).name} to checkpoint now; "
                f"SIGTERM once it has (at most {wait:g}s), SIGKILL in {grace_s:g}s"
            )
            with self._lock:
                self._term_at = time.monotonic() + wait
                self._checkpoints_before_stop = self.marker.count if self.marker else 0
            self._signal(self.checkpoint_signal)
        elif running and first:
            self._note(f"stopping ({reason}): SIGTERM, SIGKILL in {grace_s:g}s")
            self._signal(signal.SIGTERM)
        self._wake()

    def tell_world(self, meet: dict[str, Any]) -> None:
        """Write the replica's current world (its job's replicas after a resize, its rank among
        them) to ``TESSERA_WORLD_FILE`` if it changed: how running replicas learn of a resize in
        place (docs/agent.md, "Resizes")."""
        keys: tuple[str, ...] = ("world_size", "rank", "local_rank", "master_addr", "master_port")
        world: dict[str, Any] = {k: meet[k] for k in keys if k in meet}
        if "master_port" in world and world["master_port"] is None:
            # The server left the port to this agent (a job on this node alone without a whole
            # GPU): the one the replica started with, which the agent chose.
            world["master_port"] = (self.binding.get("rendezvous") or {}).get("master_port")
        if not self.resizable or not world or world == self.world or self.run_as is None:
            return
        try:
            write_world(self.workdir, world, self.run_as)
        except OSError as exc:
            log.warning(
                "job %s replica %s: could not write its world file: %s", self.job_id, self.replica, exc
            )
            return
        self.world = world

    def _checkpoint_first(self, reason: str) -> bool:
        """Whether a stop for ``reason`` asks the job to checkpoint first: a preemption (a reclaim
        is one) of a job that has written its marker in this attempt. Only such a job is known to
        handle the signal: SIGUSR1's default action ends a process that does not."""
        return reason.startswith("preempt") and self.marker is not None and self.marker.count > 0

    def silence(self) -> None:
        """The agent is leaving: report nothing more; the lease decides the job's fate."""
        self.silent = True
        self._wake()

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def _enforce(self, now: float) -> None:
        if self._term_at is not None:
            checkpointed = self.marker is not None and self.marker.count > self._checkpoints_before_stop
            if checkpointed or now >= self._term_at:
                self._term_at = None
                self._note("checkpoint written: SIGTERM" if checkpointed else "no checkpoint came: SIGTERM")
                self._signal(signal.SIGTERM)
        self._bound_disk(now)
        limit = self.binding.get("time_limit_seconds")
        if limit and self.stop_reason is None and now - self.started_at >= float(limit):
            self._note(f"time limit of {limit}s reached")
            self.stop("time-limit", float(self.binding.get("grace_seconds") or 0))
        if self.kill_at is not None and now >= self.kill_at and not self.killed:
            if self.proc is not None and self.proc.poll() is None:
                self._note("grace period over: SIGKILL")
                self._signal(signal.SIGKILL)
            self.killed = True

    def _bound_disk(self, now: float) -> None:
        """Every ``DISK_CHECK_S`` (more often past half the bound): the job's own directories and
        its private tmpfs mounts summed, in bytes and in files; over ``--job-disk-mb`` or
        ``--job-max-files``, it is stopped at once (reason ``disk-limit``, no retry). A sum that
        took long (many files) puts the next one off in proportion: at most a fifth of the time
        goes to summing, whatever a job makes."""
        bound, most = self.disk_mb, self.max_files
        if not (bound or most) or self.stop_reason is not None or now < self._disk_check_at:
            return
        began = time.monotonic()
        used, files = self._private_used()
        for directory in (self.workdir, self.checkpoint_dir):
            held = disk_usage(directory, None if most is None else max(0, most - files))
            used, files = used + held.bytes, files + held.files
        limit = (bound << 20) if bound else None
        past_half = (limit is not None and used >= limit // 2) or (most is not None and files >= most // 2)
        spent = time.monotonic() - began
        self._disk_check_at = now + max(DISK_CHECK_S / 5 if past_half else DISK_CHECK_S, spent * SUM_SHARE)
        if limit is not None and used > limit:
            self._note(
                f"disk limit of {bound} MB passed ({used >> 20} MB in its directories and private /tmp, "
                "/var/tmp and /dev/shm)"
            )
            self.stop("disk-limit", 0.0)
        elif most is not None and files > most:
            self._note(
                f"file limit of {most} files passed (more in its directories and private /tmp, "
                "/var/tmp and /dev/shm)"
            )
            self.stop("disk-limit", 0.0)

    def _private_used(self) -> DiskUsage:
        """Bytes and files its private ``/tmp``, ``/var/tmp`` and ``/dev/shm`` hold (tmpfs: the
        node's memory), seen through its process's root in ``/proc``, i.e. in its mount
        namespace; nothing without one (they are the node's own then) or once the process has
        exited. A path still on the node's own file system (the spawn chain has not mounted it
        yet) is not counted."""
        if not self.sandbox.namespaces or self.proc is None or self.proc.poll() is not None:
            return DiskUsage(0, 0)
        total = files = 0
        for mount in self.sandbox.private:
            seen = f"/proc/{self.proc.pid}/root{mount}"
            with contextlib.suppress(OSError):
                if os.stat(seen).st_dev == os.stat(mount).st_dev:
                    continue
                st = os.statvfs(seen)
                total += (st.f_blocks - st.f_bfree) * st.f_frsize
                files += max(0, st.f_files - st.f_ffree - 1)  # not its root directory
        return DiskUsage(total, files)

    # --- output --------------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        """A line from the agent in the job's log, so its owner sees why it stopped (kept even
        while output is dropped: they are few and short)."""
        with self._lock:
            self._mark_dropped(resume=False)
            self._buffer += f"[tessera-agent] {text}\n".encode()

    def _append(self, data: bytes) -> None:
        """The job's output, kept to be sent unless the buffer is full (``--job-log-buffer-mb``):
        then it is dropped until sending has made room (half the buffer), and counted."""
        with self._lock:
            if self._dropped is not None or len(self._buffer) + len(data) > self._buffer_cap:
                self._dropped = (self._dropped or 0) + len(data)
                return
            self._buffer += data
            self._line_open = not data.endswith(b"\n")

    def _mark_dropped(self, resume: bool) -> None:
        """With the lock held, while output is dropped: a line in the log saying how much was,
        where it was (never silently lost); ``resume``: take output again if there is room."""
        if self._dropped is None or (resume and len(self._buffer) > self._buffer_cap // 2):
            return
        if self._dropped:
            cut = "\n" if self._line_open else ""  # the note on a line of its own
            self._buffer += (
                f"{cut}[tessera-agent] {self._dropped} bytes of output dropped: the agent holds at "
                f"most {self._buffer_cap >> 20} MiB of a job's output not yet sent\n"
            ).encode()
            self._line_open = False
        self._dropped = None if resume else 0

    def _wake(self) -> None:
        with self._lock:
            if self._wake_fd is not None:
                os.eventfd_write(self._wake_fd, 1)

    def _read(self, poller: select.poll, timeout: float) -> None:
        """Wait up to ``timeout`` for output or a wake, and take the output that came."""
        assert self.proc is not None and self.proc.stdout is not None
        for fd, _event in poller.poll(max(0.0, timeout) * 1000):
            if fd != self.proc.stdout.fileno():
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(fd)
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if chunk:
                self._append(chunk)
            else:
                poller.unregister(fd)
                self._output_open = False
                self._await_exit(0.01)  # its output closed: its exit status follows

    def _ship_logs(self) -> bool:
        """Send what is buffered; False when the server could not be reached (retry later)."""
        while not self._drop_logs:
            with self._lock:
                self._mark_dropped(resume=True)
                data = bytes(self._buffer[:CHUNK_BYTES])
            if not data:
                return True
            try:
                answer = self.client.logs(self.job_id, self.attempt, self.replica, self._offset, data)
            except ServerError:
                self._ship_at = time.monotonic() + LOG_RETRY_S
                return False
            except Rejected as exc:
                log.info("job %s: logs refused (%s); dropping them", self.job_id, exc)
                self._drop_logs = True
                break
            with self._lock:
                del self._buffer[: len(data)]
            self._offset += len(data)
            if answer.get("truncated"):
                self._drop_logs = True  # the job's cap is reached: the rest would be dropped anyway
        with self._lock:
            self._buffer.clear()
        return True

    # --- the supervisor ------------------------------------------------------------------------

    def _report_started(self) -> None:
        try:
            self.client.started(self.job_id, self.attempt, self.replica, self.pid, self.started_wall)
        except ServerError:
            return  # next tick
        except Rejected as exc:
            log.warning("job %s attempt %s: start refused (%s); stopping it", self.job_id, self.attempt, exc)
            self.stop("not bound", 0)
        self._started_pending = False

    def _report_checkpoint(self) -> bool:
        """Report the marker's newest line, if one is due (at most one a minute; an owed one:
        now). False when the server could not be reached (the report is due again)."""
        if self.marker is None or self.silent:
            return True
        now = time.monotonic()
        owed = self._owed_checkpoint
        due: Checkpoint | None = self.marker.unreported if owed else self.marker.due(now)
        if due is None:
            self._owed_checkpoint = False
            return True
        try:
            self.client.checkpointed(self.job_id, self.attempt, self.replica, due.at, due.line)
        except ServerError:
            return False  # next tick
        except Rejected as exc:
            log.info("job %s: checkpoint report refused (%s)", self.job_id, exc)
        self.marker.reported(due, now)
        self._owed_checkpoint = False
        return True

    def _supervise(self) -> None:
        try:
            self._record_session()
            self._watch()
        except Exception:  # a bug here must not leave the job unwatched and never reported
            log.exception("job %s: supervisor failed; killing the job", self.job_id)
            self._signal(signal.SIGKILL)
        if self.proc is not None:
            self._signal(signal.SIGKILL)  # leftovers of the group; the job itself has exited
            self.proc.wait()
            try:
                self._end_session()  # and of its session: the processes that left the group
            except Exception:  # the exit is reported all the same; the record stays
                log.exception("job %s: could not end its session", self.job_id)
        self._end_uid()  # and of its uid, after the attempt's last replica here: setsid escapes
        if self.proc is not None:
            self._drain(2.0)
            self.exit_code = self.proc.returncode
            self.exit_reason = self._reason()
        try:
            self._finish()
        except Exception:
            log.exception("job %s: could not report its exit", self.job_id)
        finally:
            with self._lock:
                if self._wake_fd is not None:
                    os.close(self._wake_fd)
                    self._wake_fd = None
            _remove_workdir(self.workdir)
            with contextlib.suppress(OSError):
                os.utime(self.checkpoint_dir)  # its retention counts from the last use
            if self.cgroup is not None and self.cgroups is not None:
                self.cgroups.remove(self.cgroup)
            self.done.set()

    def _poller(self) -> select.poll:
        assert self.proc is not None and self.proc.stdout is not None and self._wake_fd is not None
        poller = select.poll()
        poller.register(self._wake_fd, select.POLLIN)
        if self._output_open:
            poller.register(self.proc.stdout.fileno(), select.POLLIN)
        return poller

    def _drain(self, timeout: float) -> None:
        """What the output pipe still holds, until it closes or ``timeout`` passes; then close it."""
        assert self.proc is not None and self.proc.stdout is not None
        poller = self._poller()
        deadline = time.monotonic() + timeout
        while self._output_open and (left := deadline - time.monotonic()) > 0:
            self._read(poller, left)
        self._output_open = False
        self.proc.stdout.close()

    def _watch(self) -> None:
        if self.proc is None:
            return  # it could not start: only its note to ship, with the exit report
        poller = self._poller()
        exited_at: float | None = None
        quick_until = time.monotonic() + QUICK_EXIT_S
        while self._output_open and (left := quick_until - time.monotonic()) > 0:
            self._read(poller, left)
        while True:
            now = time.monotonic()
            quick_exit = exited_at is None and self.proc.poll() is not None
            if self._started_pending and not self.silent and not quick_exit:
                self._report_started()
            self._enforce(now)
            if self.pids is not None:
                self.pids.observe()  # at every tick: a wrap of the pid numbers is seen
            if self.marker is not None and self.marker.look() and self._term_at is not None:
                self._owed_checkpoint = True  # the checkpoint a stop asked for: at once
            if not self.silent:
                self._report_checkpoint()
                if now >= self._ship_at:
                    self._ship_logs()
            if exited_at is None and self.proc.poll() is not None:
                exited_at = now
            # A background child may hold the output pipe open: give it a moment, then end it.
            if exited_at is not None and (not self._output_open or now - exited_at > 2.0):
                break
            self._read(poller, TICK_S)

    def _await_exit(self, timeout: float) -> None:
        """Wait for the process's exit status, which follows the end of its output closely but not
        always before the supervisor looks (it then waited a whole tick). A process that closed its
        output and runs on is then watched at the tick, as any other."""
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)

    def _reason(self) -> str:
        if self.stop_reason is None:
            return ""
        if self.stop_reason in ("time-limit", "disk-limit"):
            return self.stop_reason
        if self.stop_reason in ("lease expired", "shutdown"):
            return "lost"
        return "stopped"

    def _finish(self) -> None:
        if self.marker is not None:
            self.marker.look()  # a line written just before the exit counts too
            self._owed_checkpoint = True  # any line not yet reported goes before the exit
        delay = 0.5
        while not self.silent:
            # Before the exit report: the server takes a checkpoint only from a running attempt.
            if not self._report_checkpoint() or not self._ship_logs():
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            # Not reported started yet (it ended at once): the exit report records the start too.
            started = self._started_pending and self.exit_reason != "spawn-failed"
            try:
                self.client.exited(
                    self.job_id,
                    self.attempt,
                    self.replica,
                    self.exit_code,
                    self.exit_reason,
                    started_at=self.started_wall if started else None,
                    pid=self.pid if started else 0,
                )
                self._started_pending = False
                break
            except ServerError:
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Rejected as exc:
                log.info("job %s: exit report refused (%s)", self.job_id, exc)
                break
        log.info(
            "job %s attempt %s replica %s exited %s %s",
            self.job_id,
            self.attempt,
            self.replica,
            self.exit_code,
            self.exit_reason,
        )

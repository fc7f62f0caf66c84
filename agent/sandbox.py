"""How a job's process is spawned: the user switch, and a private view of the node where possible.

A job's command runs behind a chain of small programs that each ``exec`` the next, so its pid is
the one the agent spawned (the agent's child: the parent-death signal and the session hold). The
job's environment comes last, through a pipe the agent writes once the pid is in the replica's
cgroup (agent/cgroups.py), when it has one: the chain's last step, as the job's user, waits for
it before it runs anything of the job, so nothing of the job runs outside its CPU and memory
limits (a failed move ends the spawn: the job never runs unlimited by accident); only the
``mount`` programs of step 2, root's own and done before the job's, may run outside them.

0. ``prlimit --nproc=N --fsize=B`` (util-linux): at most N processes and threads of the job's
   uid (the replica's share of ``--job-max-tasks``: :meth:`Sandbox.tasks`), no file it writes
   larger than ``--job-disk-mb`` (without a uid of the job's own, as with ``--single-tenant``,
   there is no process bound, and step 5 sets the file size bound with ``ulimit -f``: one
   program fewer to start);
1. ``unshare --mount --ipc --propagation private`` (util-linux), where the agent may make
   namespaces (root, not in a locked-down container): the job gets mounts of its own, and SysV IPC
   and POSIX message queues of its own (gone with its last process, so a later job of the same
   uid finds nothing);
2. ``/bin/sh -c`` mounting, in that namespace only: a private tmpfs on ``/tmp``, ``/var/tmp``
   and ``/dev/shm`` (0700, owned by the job's uid, each at most :meth:`Sandbox.tmpfs_mb` and
   ``--job-max-files`` files) and
   on ``/run/lock`` (the same, 1 MB: ``/var/lock``) and each of :data:`SYSTEM_SHARED` that is
   world-writable at the agent's start (Ubuntu's ``/var/crash``), a fresh
   ``/proc`` with ``hidepid=invisible`` (the job sees only its own processes), its own IPC
   namespace's POSIX message queues on ``/dev/mqueue`` (:data:`MQUEUE`, where the node has it),
   an empty directory over each local service's socket directory (:data:`HIDDEN`; an unreadable
   file over a socket of its own: ``/dev/log``), and over each GPU
   device file that is not the job's an unreadable file (``open`` fails with EACCES; the job
   cannot unmount it: it has no privilege, and a mount namespace it might make of its own keeps
   the mounts it inherited locked);
3. ``python -I -S agent/landlock.py`` (the agent's interpreter, stdlib only), where the kernel has
   Landlock ABI 6 (Linux 6.12; tried at the agent's start): the rest of the chain in a Landlock
   domain of its own, one per replica process, scoped so that nothing in it can connect to an
   abstract unix socket (``"\\0name"``: no file, so nothing above hides it) made outside it —
   another job's, a node service's — nor signal a process outside it, even one of
   its own uid (another replica of its attempt); no file or network access is restricted;
4. ``setpriv --pdeathsig SIGKILL --reuid U --regid G --clear-groups --no-new-privs``: the job's own
   uid and gid, no supplementary group, no way back up through a setuid program (``sudo``,
   ``ping``), and SIGKILL when the agent dies (set after the user switch, which clears it);
5. ``/bin/sh``, already as the job's user, sourcing the job's environment from its standard input
   (until here the chain runs with a clean one: a job's ``LD_PRELOAD`` or ``LD_LIBRARY_PATH``
   must never reach a program running as root), whose last line ``exec``s (:func:`env_script`:
   a script cut short by the agent's death runs nothing of the job)
6. the job's command.

Without namespaces the chain skips 1-2, without Landlock scopes it skips 3 (the agent says so at
its start either way; ``--single-tenant`` skips both); without a ``setpriv`` that takes
``--pdeathsig``, the agent forks and switches the user itself (no ``--no-new-privs`` and no
Landlock domain then). Spawning this way (no ``preexec_fn``) lets Python use ``vfork``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import grp
import logging
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.identity import RunAs

log = logging.getLogger("tessera.agent")

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
SYSTEM_PATH = f"{SAFE_PATH}:/usr/sbin:/sbin"
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
# World-writable lock directories (``/var/lock`` links to ``/run/lock``): private to the job too,
# or a file one job leaves there (on the root disk where ``/run`` is no tmpfs) stays, its uid's,
# for another job to read or a later holder of the uid to own. Lock files are empty: 1 MB each.
PRIVATE_LOCKS = ("/run/lock",)
LOCKS_MB = 1
LOCKS_FILES = 1024  # files (inodes) in a job's private /run/lock: its size bounds no empty file
# World-writable directories of the system's own programs on the node's disk (apport's crash
# reports, 1777 on Ubuntu; PHP's sessions, 1733): outside every bound of a job (its directories
# and private tmpfs are summed, not these), and what a job leaves there stays, its uid's. Private
# to the job as /run/lock is (a tmpfs of LOCKS_MB), where they are world-writable. Not every such
# directory: one an operator made for jobs to share (a model cache) is theirs to share.
SYSTEM_SHARED = ("/var/crash", "/var/lib/php/sessions")
# The chain's whole environment, until setpriv. No locale: each util-linux program of it (setpriv,
# unshare, every mount of step 2) loads the one named only to word its errors, 0.25 ms of CPU
# each (docs/benchmarks/e2e.md, Session 19); the job's own ``LANG`` comes with its environment
# (agent/process.py). The Landlock step (Python) gets one (``SCOPED_LOCALE``: from step 2's
# script when there is one, else from the start): in the C locale Python would put ``LC_CTYPE``
# into the job's environment.
CHAIN_ENV = {"PATH": SYSTEM_PATH}
SCOPED_LOCALE = "C.UTF-8"
SCOPED_CHAIN_ENV = {**CHAIN_ENV, "LANG": SCOPED_LOCALE}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
BLOCKER = Path("/run/tessera-agent/no-access")
# Where local services keep their unix sockets (PostgreSQL's is open to all by default: with
# "trust" authentication for local connections, as on many small installs, that is the whole
# database), and the agent's own run directory: an empty directory, or an unreadable file, in the
# job's view. ``--hide-path`` adds more.
HIDDEN = (
    "/run/postgresql",
    "/var/run/postgresql",
    "/run/mysqld",
    "/var/run/mysqld",
    "/run/redis",
    "/var/run/redis",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/containerd",
    "/run/dbus",
    "/run/tessera-agent",
    # syslog's socket (a job could forge any program's lines there, as rsyslog takes the tag it
    # is sent) and journald's (its native protocol and stdout streams): a job logs to its output.
    "/dev/log",
    "/run/systemd/journal",
)
# POSIX message queues' file system: the node's IPC namespace's queues, which its path reaches
# whatever IPC namespace the process is in (``open`` on it gives a descriptor that ``mq_send``
# and ``mq_receive`` take): in a job's mount namespace, its own IPC namespace's queues instead.
MQUEUE = "/dev/mqueue"
# The chain's last step (step 5), as the job's user: waits for its cue on its standard input, then
# sources the rest of it, the job's environment and the line that runs its command
# (:func:`env_script`); what comes short of that line ends here.
JOB_SHELL = (
    "read -r _ && . /dev/stdin\n"
    'echo "tessera-agent: the job\'s environment did not arrive whole" >&2; exit 125'
)
PIPE_PAGE = 4096  # what any pipe holds
HOLD = Path("/run/tessera-agent/hold")  # where kept directories wait while /tmp is replaced
LANDLOCK_STEP = Path(__file__).with_name("landlock.py")


@dataclass(frozen=True)
class NodeSize:
    """What the node has, as it registered: its memory (MB), GPUs and CPUs."""

    memory_mb: int
    gpus: int
    cpus: float


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


@functools.cache
def setpriv() -> str | None:
    """util-linux's ``setpriv`` when it takes ``--pdeathsig`` (checked once, by running it)."""
    path = shutil.which("setpriv", path=SYSTEM_PATH)
    if path is None:
        return None
    return path if _runs([path, "--pdeathsig", "SIGKILL", "--", "true"]) else None


def setpriv_ids(uid: int, gid: int) -> tuple[str, str]:
    """What ``setpriv --reuid`` and ``--regid`` are given for ``uid`` and ``gid``: each one's name
    where the node's user (group) database names it and that name stands for exactly that id now
    (looked at again at each spawn: an entry changed since is never followed), else the number.

    setpriv looks its argument up as a name first and reads it as a number only when no entry
    bears that name: a number goes through every source ``nsswitch.conf`` lists (``files
    systemd`` on Debian and Ubuntu: setpriv then loads the ``systemd`` module and its libraries
    at every spawn, docs/benchmarks/e2e.md), a name held in ``/etc/passwd`` stops at the first.
    Either way setpriv switches to the same ids."""
    user, group = _name(pwd.getpwuid, "pw_name", uid), _name(grp.getgrgid, "gr_name", gid)
    if user is None or _lookup(pwd.getpwnam, user, "pw_uid") != uid:
        user = str(uid)
    if group is None or _lookup(grp.getgrnam, group, "gr_gid") != gid:
        group = str(gid)
    return user, group


def _lookup(by_name: Callable[[str], object], name: str, field: str) -> int | None:
    try:
        return int(getattr(by_name(name), field))
    except (KeyError, OSError):
        return None


@functools.lru_cache(maxsize=8192)
def _name(by_id: Callable[[int], object], field: str, ident: int) -> str | None:
    """The user's (group's) name of ``ident``, if one that setpriv reads as a name (checked
    against the id at each use)."""
    try:
        name = str(getattr(by_id(ident), field))
    except (KeyError, OSError):
        return None
    return name if _plain(name) else None


def _plain(name: str) -> bool:
    # Never what could read as an option, nor a name of digits (passed as the number instead).
    return bool(name) and not name.startswith("-") and not name.isdigit()


def _runs(argv: list[str]) -> bool:
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


class Sandbox:
    """Builds the spawn chain of a job; ``namespaces``: whether steps 1-2 are taken, ``scoped``:
    whether step 3 is (a Landlock domain per replica)."""

    def __init__(
        self,
        namespaces: bool,
        devices: Mapping[int, str] | None = None,
        keep: Sequence[str | Path] = (),
        max_tasks: int | None = None,
        hide: Sequence[str | Path] = HIDDEN,
        disk_mb: int | None = None,
        scoped: bool = False,
        node: NodeSize | None = None,
        max_files: int | None = None,
        mqueue: bool = True,
        disk_pool_mb: int | None = None,
        files_pool: int | None = None,
    ):
        self.namespaces = namespaces
        self.scoped = scoped
        self.node = node  # what the node has: a job's private tmpfs (memory) is sized by its share
        # What the chain starts with (step 2's script gives the Landlock step its locale).
        self.env = SCOPED_CHAIN_ENV if scoped and not namespaces else CHAIN_ENV
        # What a job attempt may fill (``--job-disk-mb``): each private tmpfs, any one file it
        # writes, and its own directories and private tmpfs together (summed by its supervisor,
        # agent/process.py).
        self.disk_mb = disk_mb
        # Files (inodes) a job attempt may make (``--job-max-files``): in each private tmpfs
        # (``nr_inodes``: an empty file holds no byte of its size, but kernel memory), and in its
        # own directories and private tmpfs together (summed with the bytes). The node's file
        # system has so many inodes, and empty files fill none of ``--job-disk-mb``.
        self.max_files = max_files
        # What the node's jobs may fill together where the operator set no bound (half the state
        # directory's free space and inodes at the start): each replica gets its share of it
        # (:meth:`bounds`), at most ``disk_mb`` and ``max_files``; else each the whole bound.
        self.disk_pool_mb = disk_pool_mb
        self.files_pool = files_pool
        # The node's services reached through the file system (unix sockets), out of sight.
        self.hide = sorted({os.path.realpath(p) for p in hide if os.path.lexists(p)})
        # RLIMIT_NPROC of a job uid's processes (threads count): a fork bomb stops there, and
        # harms only its own job, as the uid is the job's alone.
        self.max_tasks = max_tasks
        self.prlimit = shutil.which("prlimit", path=SYSTEM_PATH)
        self.devices = dict(devices or {})  # GPU index → its device file (/dev/nvidiaN)
        self.unshare = shutil.which("unshare", path=SYSTEM_PATH) or "unshare"
        self.mount = shutil.which("mount", path=SYSTEM_PATH) or "mount"
        self.mkdir = shutil.which("mkdir", path=SYSTEM_PATH) or "mkdir"
        self.private = [p for p in PRIVATE_TMP if os.path.isdir(p)]
        self.locks = [p for p in PRIVATE_LOCKS if os.path.isdir(p) and not os.path.islink(p)]
        self.locks += [p for p in SYSTEM_SHARED if _world_writable(p) and not _holds(p, keep)]
        # The node's message queues' file system, mounted again in the job's IPC namespace
        # (``mqueue``: where that was tried and works, :func:`mqueue_unavailable`).
        self.mqueue = MQUEUE if mqueue and os.path.isdir(MQUEUE) and not os.path.islink(MQUEUE) else None
        # Host directories jobs need (the state directory, the PATH's Python) that lie under a
        # private path (a state directory in /tmp): put back on top of the private tmpfs. The
        # Landlock step runs inside the namespace too: its interpreter and script (an agent
        # installed in /tmp: `make demo` from a checkout there) must stay in sight.
        if scoped:
            keep = [*keep, os.path.dirname(sys.executable), sys.base_prefix, LANDLOCK_STEP.parent]
        self.keep = sorted(
            {
                os.path.realpath(k)
                for k in keep
                if os.path.isdir(k) and any(_under(os.path.realpath(k), p) for p in self.private)
            }
        )
        if namespaces:
            HOLD.mkdir(mode=0o700, parents=True, exist_ok=True)
            _make_blocker()

    def part(self, gpus: int, share: float, cpus: float) -> float:
        """The replica's share of the node (0 to 1): of its GPUs (``gpus`` × ``share`` ÷ the
        node's), or of its CPUs for a CPU-only replica (one CPU when it says none, as the
        scheduler counts it: so many of them fit the node's CPUs, where a GPU's share each let
        a node's worth of them hold many times the node); one GPU's when the node's CPUs are
        unknown (1 when the node's size is not known at all)."""
        if self.node is None:
            return 1.0
        gpu_part = gpus * share / self.node.gpus if self.node.gpus else 0.0
        if gpus == 0:
            cpus = max(cpus, 1.0)
        cpu_part = cpus / self.node.cpus if self.node.cpus > 0 else 0.0
        return min(1.0, max(gpu_part, cpu_part) or (1.0 / max(1, self.node.gpus)))

    def bounds(self, gpus: int, share: float, cpus: float) -> tuple[int | None, int | None]:
        """The replica's ``--job-disk-mb`` and ``--job-max-files`` (None: no bound): each the
        whole bound where the operator set it, else the least of it and the replica's share
        (:meth:`part`) of the node's pool (half the state directory's free space and inodes),
        and at least :data:`MIN_DISK_MB` and :data:`MIN_FILES` (or the bound, if less). A bound of
        half the free space for each let two jobs together fill the file system that holds every
        job's working directory and checkpoint."""
        part = self.part(gpus, share, cpus)
        disk, files = self.disk_mb, self.max_files
        if disk and self.disk_pool_mb:
            disk = min(disk, max(MIN_DISK_MB, int(self.disk_pool_mb * part)))
        if files and self.files_pool:
            files = min(files, max(MIN_FILES, int(self.files_pool * part)))
        return disk, files

    def tmpfs_mb(
        self, gpus: int, share: float, cpus: float, memory_gib: float, disk_mb: int | None = None
    ) -> int | None:
        """The size of each of a replica's private tmpfs mounts, in MB (None: the kernel's default,
        half the machine's memory): they hold the node's memory, so at most what the scheduler
        handed the replica — its ``memory_gib`` when it has one (to which its memory cgroup
        charges them too), else its share of the node's memory in proportion to its share of the
        node's GPUs (``gpus`` × ``share``), or of its CPUs for a CPU-only replica — and never
        more than ``disk_mb``, the replica's disk bound (:meth:`bounds`; None: ``--job-disk-mb``)."""
        if memory_gib > 0:
            mb: int | None = int(memory_gib * 1024)
        elif self.node is not None and self.node.memory_mb > 0:
            mb = int(self.node.memory_mb * self.part(gpus, share, cpus))
        else:
            mb = None
        cap = disk_mb or self.disk_mb
        if cap and (mb is None or mb > cap):
            mb = cap
        return None if mb is None else max(1, mb)

    def tasks(self, gpus: int, share: float, cpus: float) -> int | None:
        """The replica's ``RLIMIT_NPROC`` (None: no bound): its share of ``--job-max-tasks``
        (:meth:`part`), which is what a replica holding the whole node may have, and at least
        :data:`MIN_TASKS` (or the whole bound, if smaller). Each job uid is bounded alone, so a
        bound of the whole node's for each let a few jobs together (one tenant's four one-GPU
        jobs on a node of four) take every pid of the node: no process of another job, nor the
        agent's next spawn, could fork."""
        if not self.max_tasks:
            return None
        return max(min(self.max_tasks, MIN_TASKS), int(self.max_tasks * self.part(gpus, share, cpus)))

    def prefix(
        self,
        run_as: RunAs,
        gpus: Sequence[int],
        tmpfs_mb: int | None = None,
        max_tasks: int | None = None,
        disk_mb: int | None = None,
        max_files: int | None = None,
    ) -> list[str]:
        """The argv before the job's command; [] when there is no setpriv (fork and switch).
        ``tmpfs_mb``: the size of each private tmpfs (:meth:`tmpfs_mb`; None: ``--job-disk-mb``);
        ``max_tasks``: the replica's bound on processes (:meth:`tasks`; None: ``--job-max-tasks``);
        ``disk_mb``, ``max_files``: its disk bounds (:meth:`bounds`; None: the node's).

        The chain runs as root until ``setpriv``: it gets a clean environment (:attr:`env`),
        never the job's, whose ``LD_PRELOAD`` or ``LD_LIBRARY_PATH`` would load a tenant's code
        into it. The job's environment reaches its command through its standard input (see
        :func:`env_script`), read by a shell already running as the job's user, which then gives
        the command ``/dev/null`` as its standard input."""
        tool = setpriv()
        if tool is None:
            return []
        chain = [tool, "--pdeathsig", "SIGKILL"]
        if run_as.uid is not None:
            gid = run_as.gid if run_as.gid is not None else run_as.uid
            user, group = setpriv_ids(run_as.uid, gid)
            chain += ["--reuid", user, "--regid", group, "--clear-groups", "--no-new-privs"]
        limits = []
        tasks = max_tasks or self.max_tasks
        if tasks and run_as.uid is not None:
            limits.append(f"--nproc={tasks}")
        job = JOB_SHELL
        disk = disk_mb or self.disk_mb
        if disk:
            if limits and self.prlimit:
                limits.append(f"--fsize={disk << 20}")
            else:
                # Nothing else for prlimit to set (--single-tenant): the job's shell sets the same
                # limit (POSIX ulimit -f, in 512-byte blocks), one exec fewer per spawn.
                job = f"ulimit -f {disk << 11} || exit 125\n{job}"
        chain += ["--", "/bin/sh", "-c", job, "tessera-job"]
        if self.scoped:
            chain = [*landlock_step(), *chain]
        if limits and self.prlimit:
            chain = [self.prlimit, *limits, "--", *chain]
        if self.namespaces:
            chain = self._namespaced(run_as, gpus, chain, tmpfs_mb or disk, max_files or self.max_files)
        return chain

    def _namespaced(
        self,
        run_as: RunAs,
        gpus: Sequence[int],
        chain: list[str],
        tmpfs_mb: int | None,
        max_files: int | None = None,
    ) -> list[str]:
        return [
            self.unshare,
            "--mount",
            "--ipc",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            self._script(run_as, gpus, tmpfs_mb, max_files),
            "tessera-sandbox",
            *chain,
        ]

    def _script(
        self, run_as: RunAs, gpus: Sequence[int], tmpfs_mb: int | None = None, max_files: int | None = None
    ) -> str:
        owner = f"uid={run_as.uid},gid={run_as.gid}," if run_as.uid is not None else ""
        mount, mkdir = shlex.quote(self.mount), shlex.quote(self.mkdir)
        size = f"size={tmpfs_mb}m," if tmpfs_mb else ""
        files = max_files or self.max_files
        inodes = f"nr_inodes={files}," if files else ""
        options = f"{owner}{size}{inodes}mode=0700,nosuid,nodev"
        hold = [f"{HOLD}/{i}" for i in range(len(self.keep))]
        steps = [f"{mount} -t tmpfs -o mode=0700 tessera-hold {HOLD}"] if self.keep else []
        for kept, held in zip(self.keep, hold, strict=True):
            steps += [f"{mkdir} {held}", f"{mount} --rbind {shlex.quote(kept)} {held}"]
        steps += [f"{mount} -t tmpfs -o {options} tessera-tmp {shlex.quote(p)}" for p in self.private]
        locks = f"{owner}size={LOCKS_MB}m,nr_inodes={LOCKS_FILES},mode=0700,nosuid,nodev,noexec"
        steps += [f"{mount} -t tmpfs -o {locks} tessera-lock {shlex.quote(p)}" for p in self.locks]
        for kept, held in zip(self.keep, hold, strict=True):
            steps += [f"{mkdir} -p {shlex.quote(kept)}", f"{mount} --move {held} {shlex.quote(kept)}"]
        steps.append(f"{mount} -t proc -o hidepid=invisible,nosuid,nodev,noexec proc /proc")
        if self.mqueue:  # mounted in the job's IPC namespace (unshare --ipc): its queues alone
            queues = shlex.quote(self.mqueue)
            steps.append(f"{mount} -t mqueue -o nosuid,nodev,noexec tessera-mqueue {queues}")
        blocker = shlex.quote(str(BLOCKER))
        # Files first: the blocker lives in a directory hidden next (/run/tessera-agent).
        blocked = [p for i, p in sorted(self.devices.items()) if i not in gpus and os.path.exists(p)]
        blocked += [p for p in self.hide if not os.path.isdir(p)]
        steps += [f"{mount} --bind {blocker} {shlex.quote(p)}" for p in blocked]
        empty = f"{mount} -t tmpfs -o mode=0755,size=4k,nosuid,nodev tessera-hidden"
        steps += [f"{empty} {shlex.quote(p)}" for p in self.hide if os.path.isdir(p)]
        # The job's files: 0700 (umask 077); the directories made here for kept paths: 0755.
        locale = f"export LANG={SCOPED_LOCALE}\n" if self.scoped else ""
        return "set -e\numask 022\n" + "\n".join(steps) + f'\numask 077\n{locale}exec "$@"'


def _world_writable(path: str) -> bool:
    """Whether ``path`` is a directory (not a link) that every user may write in."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & 0o002)


def _holds(path: str, paths: Sequence[str | Path]) -> bool:
    """Whether one of ``paths`` lies in ``path`` (hiding it would hide them)."""
    return any(_under(os.path.realpath(p), path) for p in paths)


def env_script(env: Mapping[str, str]) -> bytes:
    """What the chain's last step reads (:data:`JOB_SHELL`): an empty line, its cue to go on, then
    ``env`` as ``export`` lines a POSIX shell sources (every value quoted: any text is safe) and
    the line that ``exec``s the job's command (a script cut short by the agent's death runs
    nothing of the job)."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items() if NAME.fullmatch(k))
    return f'\n{exports}exec "$@" </dev/null\n'.encode()


def env_pipe(size: int) -> tuple[int, int]:
    """A pipe (read end, write end; close-on-exec) that holds ``size`` bytes, so that writing
    them never waits for the reader (a pipe holds 64 KiB by default, a page at least)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        if size > PIPE_PAGE and size > fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, size)
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        raise OSError(exc.errno, f"the job's environment ({size} bytes) does not fit a pipe") from exc
    return read_end, write_end


def send_env(read_end: int, write_end: int, script: bytes, run_as: RunAs) -> None:
    """Hand :func:`env_script`'s ``script`` over through the pipe of :func:`env_pipe`, the chain's
    standard input. Until now the pipe was root's: the chain's last step, already the job's user,
    waited on its cue reading the descriptor it inherited, which needs no permission, while no
    process of the job's uid could open the pipe (``/proc/PID/fd/0``) to write into it; now it
    becomes the job user's, as its shell opens it again to source it (``/dev/stdin``). A chain
    already gone takes nothing: its exit says what happened."""
    if run_as.uid is not None:
        os.fchown(read_end, run_as.uid, run_as.gid if run_as.gid is not None else run_as.uid)
    view = memoryview(script)
    with contextlib.suppress(BrokenPipeError):
        while view:
            view = view[os.write(write_end, view) :]


def _make_blocker() -> None:
    """A root-owned file nobody may open: what a job sees in place of another job's GPU."""
    BLOCKER.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not BLOCKER.exists():
        BLOCKER.touch(mode=0)
    os.chmod(BLOCKER, 0)


def namespaces_unavailable() -> str | None:
    """None when jobs can get private mounts (tried for real, once); otherwise why not."""
    if os.geteuid() != 0:
        return "the agent is not root"
    unshare = shutil.which("unshare", path=SYSTEM_PATH)
    if unshare is None:
        return "no unshare (util-linux) on PATH"
    probe = [
        unshare,
        "--mount",
        "--ipc",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        "mount -t tmpfs tessera-probe /tmp && mount -t proc -o hidepid=invisible proc /proc",
    ]
    return _probe(probe, "unshare and mount failed")


def mqueue_unavailable() -> str | None:
    """None when a job's IPC namespace can have ``/dev/mqueue`` of its own (tried for real, once;
    also None where the node has no ``/dev/mqueue``: nothing to replace); otherwise why not."""
    if not os.path.isdir(MQUEUE) or os.path.islink(MQUEUE):
        return None
    unshare = shutil.which("unshare", path=SYSTEM_PATH) or "unshare"
    mount = shutil.which("mount", path=SYSTEM_PATH) or "mount"
    probe = [unshare, "--mount", "--ipc", "--propagation", "private", "--"]
    probe += [mount, "-t", "mqueue", "tessera-probe", MQUEUE]
    return _probe(probe, "mount -t mqueue failed")


def _probe(argv: list[str], failed: str) -> str | None:
    """Run a namespace probe: None when it worked, else why not (``failed``: what to call it)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run unshare: {exc}"
    if done.returncode != 0:
        return f"{failed}: {done.stderr.strip() or done.returncode}"
    return None


def landlock_step() -> list[str]:
    """Step 3 of the chain, before the program it ``exec``s: run as root by the agent's own
    interpreter, isolated (``-I``: no ``PYTHON*`` variable, no script directory on the path) and
    without ``site`` (``-S``), which imports only the standard library."""
    return [sys.executable, "-I", "-S", str(LANDLOCK_STEP)]


@functools.cache
def scope_unavailable() -> str | None:
    """None when a job can be put in a scoped Landlock domain (tried for real, once: step 3 of
    the chain running ``true``); otherwise why not."""
    true = shutil.which("true", path=SYSTEM_PATH) or "/bin/true"
    try:
        done = subprocess.run(
            [*landlock_step(), true],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=SCOPED_CHAIN_ENV,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run {LANDLOCK_STEP.name}: {exc}"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        return (
            said[-1].removeprefix("tessera-agent: ")
            if said
            else f"{LANDLOCK_STEP.name} exited {done.returncode}"
        )
    return None


def default_max_tasks() -> int:
    """A quarter of the machine's pid numbers (between 1,024 and 65,536) per job uid."""
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    return max(1024, min(65536, pid_max // 4))


def default_disk_mb(state_dir: Path) -> int:
    """What a job may fill by default: 100 GiB, or half the state directory's free space."""
    return max(1, min(100 << 10, disk_pool_mb(state_dir)))


def disk_pool_mb(state_dir: Path) -> int:
    """What the node's jobs may fill together by default (each its share): half the state
    directory's free space (100 GiB when it cannot be read)."""
    try:
        st = os.statvfs(state_dir)
        return max(1, st.f_bavail * st.f_frsize // 2 >> 20)
    except OSError:
        return 100 << 10


MAX_FILES = 1_000_000
# The fewest processes and threads a replica's share of --job-max-tasks gives it (a small share:
# a fraction of one GPU of eight), unless --job-max-tasks is less.
MIN_TASKS = 256
# The least a replica's share of the node's disk pool gives it (where --job-disk-mb and
# --job-max-files are not set), unless the bound is less.
MIN_DISK_MB = 1024
MIN_FILES = 10_000


def default_max_files(state_dir: Path) -> int:
    """What a job may make by default: a million files (inodes), or half the state directory's
    file system's free ones, whichever is less (a file system that reports no fixed number of
    inodes, as btrfs: a million)."""
    return max(1, min(MAX_FILES, files_pool(state_dir)))


def files_pool(state_dir: Path) -> int:
    """What the node's jobs may make together by default (each its share): half the state
    directory's file system's free inodes (a million when there is no fixed number, as on btrfs,
    or it cannot be read)."""
    try:
        st = os.statvfs(state_dir)
    except OSError:
        return MAX_FILES
    if st.f_files <= 0:
        return MAX_FILES
    return max(1, st.f_favail // 2)


SYSCTL = Path("/proc/sys")


def user_namespaces_open(sysctl: Path | None = None) -> bool:
    """Whether a job's uid may make user namespaces of its own (``unshare -U``): a large part
    of the kernel opened to it, and a way to move out of its agent's view of its private mounts.
    Closed by ``user.max_user_namespaces = 0``, Debian's ``kernel.unprivileged_userns_clone = 0``
    or Ubuntu's ``kernel.apparmor_restrict_unprivileged_userns = 1``: the node's operator's call,
    since it closes them for every user of the node."""

    root = SYSCTL if sysctl is None else sysctl

    def read(name: str) -> int | None:
        try:
            return int((root / name).read_text().strip())
        except (OSError, ValueError):
            return None

    return not (
        read("user/max_user_namespaces") == 0
        or read("kernel/unprivileged_userns_clone") == 0
        or read("kernel/apparmor_restrict_unprivileged_userns") == 1
    )


def detect(
    devices: Mapping[int, str] | None = None,
    enabled: bool = True,
    keep: Sequence[str | Path] = (),
    max_tasks: int | None = None,
    hide: Sequence[str | Path] = HIDDEN,
    disk_mb: int | None = None,
    node: NodeSize | None = None,
    max_files: int | None = None,
    disk_pool_mb: int | None = None,
    files_pool: int | None = None,
) -> Sandbox:
    """The sandbox this machine allows (said at the start: what jobs get, and what not).
    ``keep``: host directories jobs need, e.g. the state directory."""
    unscoped = (
        (scope_unavailable() if setpriv() else "no setpriv with --pdeathsig")
        if enabled
        else "--single-tenant"
    )
    if unscoped is None:
        log.info(
            "jobs each get a Landlock domain: no abstract unix socket or signal of theirs reaches "
            "outside their replica's processes"
        )
    else:
        log.warning(
            "jobs can connect to every abstract unix socket on this node (another job's, a service's) "
            "and signal processes of their uid outside their replica: %s",
            unscoped,
        )
    if enabled and user_namespaces_open():
        log.warning(
            "jobs may make user namespaces of their own (unshare -U): on a node shared by tenants "
            "that do not trust each other, close them (sysctl user.max_user_namespaces=0; "
            "docs/agent.md, 'Not guaranteed')"
        )
    reason = namespaces_unavailable() if enabled else "--single-tenant"
    if reason is None:
        log.info(
            "jobs get private /tmp, /var/tmp, /dev/shm, /run/lock, /proc and IPC, "
            "and only their own GPUs' devices"
        )
        queues = mqueue_unavailable()
        if queues is not None:
            log.warning("jobs see and may open the node's POSIX message queues in %s: %s", MQUEUE, queues)
        return Sandbox(
            True,
            devices,
            keep,
            max_tasks,
            hide,
            disk_mb,
            scoped=unscoped is None,
            node=node,
            max_files=max_files,
            mqueue=queues is None,
            disk_pool_mb=disk_pool_mb,
            files_pool=files_pool,
        )
    log.warning(
        "jobs share /tmp, /dev/shm and IPC, see every process and can open every GPU's device file: %s",
        reason,
    )
    max_tasks = max_tasks if enabled else None
    return Sandbox(
        False,
        devices,
        max_tasks=max_tasks,
        disk_mb=disk_mb,
        scoped=unscoped is None,
        node=node,
        max_files=max_files,
        disk_pool_mb=disk_pool_mb,
        files_pool=files_pool,
    )

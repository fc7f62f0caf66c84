"""The agent's state directory and its secrets.

``STATE/credential`` (mode 0600, owned by the agent's user) holds the node's credential, so a
restarted agent re-registers without the join token. The directory itself is 0711: job users may
pass through to their own working directories (``STATE/jobs/...``, owned by them) but list nothing.
``STATE/sessions`` (0700) records the running replicas' sessions (:mod:`agent.leftovers`).
``STATE/checkpoint-key`` (0600) is the key that makes checkpoint directories' names unguessable
(:func:`agent.process.checkpoint_dir`).

Nothing of a job outlives its use: its working directory goes when it ends; what an agent killed
mid-job left in ``STATE/jobs`` goes at the next start (:func:`clean_jobs`, after the leftover
processes are dead); a checkpoint directory goes once the server says its job cannot resume
and the retention has passed since it ended (:func:`sweep_checkpoints`, applied by the running
agent: agent/node.py).

The join token is read from, in order: ``--join-token-file PATH``, ``--join-token -`` (stdin),
``$TESSERA_JOIN_TOKEN``, or a literal ``--join-token T`` — which ``ps`` would show, so the CLI
moves it into a pipe and re-executes itself without it (:func:`agent.cli.main`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

log = logging.getLogger("tessera.agent")

CREDENTIAL_FILE = "credential"
CHECKPOINT_KEY = "checkpoint-key"
TOOLS_PATH = "/usr/bin:/bin"  # coreutils' rm, chown and du, findutils' find
SYSTEM_UIDS = 1000  # below: root and the node's services, never a job's (identity.MIN_FREE_UID)


def default_state_dir(name: str) -> Path:
    env = os.environ.get("TESSERA_AGENT_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/tessera-agent") / name
    return Path.home() / ".local" / "state" / "tessera-agent" / name


def prepare_state_dir(path: Path) -> Path:
    """Make ``path`` the agent's state directory: 0711 (the job users reach their own directories
    under ``jobs`` and ``checkpoints`` through it, and list nothing; its files — the credential,
    the checkpoint key — are 0600), as is each directory above it that it makes (``var/agents``
    of the demo, ``/var/lib/tessera-agent``: at the agent's umask, 0755, they listed the node's
    agents to every job)."""
    for parent in [*reversed(path.parents), path]:
        if not parent.exists():
            with contextlib.suppress(FileExistsError):  # another agent's start made it meanwhile
                parent.mkdir(mode=0o711)
                parent.chmod(0o711)
    path.chmod(0o711)
    for sub in ("jobs", "checkpoints"):
        (path / sub).mkdir(exist_ok=True)
        (path / sub).chmod(0o711)
    (path / "sessions").mkdir(exist_ok=True)
    (path / "sessions").chmod(0o700)  # the agent's alone: a job must not edit what gets killed
    checkpoint_key(path)
    return path


# Cached: a key never changes once made, so each replica's start (which names its checkpoint
# directory) need not read it again (docs/benchmarks/e2e.md, Session 21).
@functools.cache
def checkpoint_key(state_dir: Path, name: str = CHECKPOINT_KEY) -> bytes:
    """The node's key for checkpoint directory names (made, 0600, on first use); ``name``: the
    file's name in ``state_dir`` (a shared checkpoint root keeps one for all its nodes). Read
    once per process: the key this process has used stays the one it uses."""
    key = state_dir / name
    try:
        return key.read_bytes()
    except FileNotFoundError:
        pass
    tmp = state_dir / f".{name}.{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(32))
    finally:
        os.close(fd)
    try:
        os.link(tmp, key)  # whole or not at all; a key made meanwhile by another start wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return key.read_bytes()


def clean_jobs(state_dir: Path) -> int:
    """Remove every working directory and take every checkpoint directory back (at the start,
    once no process of a job is left: what an agent that was killed left behind, its running
    attempts' checkpoints still their uids', which later jobs will get). Returns how many
    working directories were removed."""
    jobs = state_dir / "jobs"
    names = os.listdir(jobs)
    for name in names:
        remove_tree(jobs / name)
    if names:
        log.info("removed %d working director(ies) left by a previous run", len(names))
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(state_dir / "checkpoints"):
            with contextlib.suppress(OSError):
                owner = entry.stat(follow_symlinks=False).st_uid
                if entry.is_dir(follow_symlinks=False) and owner != os.geteuid():
                    disown(Path(entry.path), owner)
    return len(names)


def remove_tree(path: Path) -> None:
    """Remove ``path`` and all that is in it, however deep, following no link, errors ignored:
    coreutils' ``rm -rf`` (fts: the tree walked through directory descriptors, without
    recursion). ``shutil.rmtree`` recurses once per level: a job's tree a few thousand levels
    deep (a loop of mkdir and chdir) raised RecursionError where the agent removes it. Within
    ``path``'s own file system only (``--one-file-system``)."""
    rm = shutil.which("rm", path=TOOLS_PATH)
    if rm is None:  # pragma: no cover - coreutils is on every node
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [rm, "-rf", "--one-file-system", "--", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": TOOLS_PATH},
            timeout=600,
        )


def tree_size(path: Path) -> int:
    """Bytes ``path`` and all in it take on disk, however deep, following no link: coreutils'
    ``du`` (fts), for a tree deeper than the agent's own walk may open; 0 when it fails."""
    return max(0, _du(path, "-B1"))


def tree_files(path: Path) -> int:
    """How many files (inodes: directories and links too) ``path`` holds, however deep, following
    no link: ``du --inodes``, as :func:`tree_size`; 0 when it fails."""
    return max(0, _du(path, "--inodes") - 1)  # not ``path`` itself


def _du(path: Path, unit: str) -> int:
    """``du -s`` of ``path`` in ``unit`` (``-B1``: bytes; ``--inodes``), no link followed and no
    other file system entered; -1 when it fails."""
    du = shutil.which("du", path=TOOLS_PATH)
    if du is None:  # pragma: no cover - coreutils is on every node
        return -1
    try:
        done = subprocess.run(
            [du, "-s", unit, "-P", "--one-file-system", "--", str(path)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env={"PATH": TOOLS_PATH},
            timeout=600,
        )
        return int(done.stdout.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return -1


def chown_tree(path: Path, uid: int, gid: int, isolated: bool = False) -> None:
    """Give ``path`` and all that is in it, however deep, to ``uid``:``gid``, following no link,
    not even one that a process of the old owner swaps in for a directory while the walk goes on:
    coreutils' ``chown -R -P -h`` (fts: each directory entered through a descriptor opened
    without following a link, each entry changed by its name in it; no recursion, where
    ``os.walk`` and ``os.fwalk`` recurse once per level and raised RecursionError for a job's
    tree a few thousand levels deep). ``isolated``: the tree is of jobs that run as uids of their
    own; a file in it that a system user owns is unlinked from it first (:func:`drop_foreign`),
    never handed over. Raises OSError saying why when it fails."""
    if isolated:
        drop_foreign(path)
    _hand_over_with(path, "chown", "coreutils", ["-R", "-P", "-h", f"{uid}:{gid}", "--", str(path)])


def drop_foreign(path: Path) -> None:
    """Unlink from the tree ``path`` every name of a file (not a directory) that a system user
    (uid below :data:`SYSTEM_UIDS`: root, the node's services) owns: a job makes files of its own
    uid only, which is never one of those, so such a name is a hard link it made to a file of
    the node's (one it may write, as ``fs.protected_hardlinks`` allows no more; any file, the
    sysctl off), which handing the tree over would have given to the next uid. Unlinking the name
    leaves the file itself as it was. findutils' ``find -P ... -delete`` (each name removed
    through its directory's descriptor, no link followed; no user database read). Raises OSError
    saying why when it fails."""
    args = ["-P", str(path), "-mindepth", "1", "!", "-type", "d", "-uid", f"-{SYSTEM_UIDS}", "-delete"]
    _hand_over_with(path, "find", "findutils", args)


def _hand_over_with(path: Path, tool: str, package: str, args: list[str]) -> None:
    """Run the system's ``tool`` (of ``package``, from :data:`TOOLS_PATH` only) with ``args`` on
    ``path``, as a step of handing it over. Raises OSError saying why when it fails."""
    program = shutil.which(tool, path=TOOLS_PATH)
    if program is None:  # pragma: no cover - coreutils and findutils are on every node
        raise OSError(f"no {tool} ({package}) in {TOOLS_PATH}")
    done = subprocess.run(
        [program, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={"PATH": TOOLS_PATH},
        timeout=600,
    )
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise OSError(f"cannot hand {path} over: {said[-1] if said else f'{tool} exited {done.returncode}'}")


def disown(path: Path, uid: int) -> None:
    """Make the directory ``path`` the agent's (0700) if ``uid`` owns it, as when an attempt's
    uid is given back (its checkpoint): its files stay as they are, out of reach behind it, so
    the next job given the uid owns nothing of it. Opened without following a link; a directory
    another attempt has taken over meanwhile is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if os.fstat(fd).st_uid == uid:
            os.fchown(fd, os.geteuid(), os.getegid())
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def stale_checkpoints(
    state_dir: Path, retention_s: float, keep: set[int] | None = None
) -> dict[int, list[Path]]:
    """The checkpoint directories whose time is more than ``retention_s`` ago, by job, but not
    those of the jobs in ``keep`` (running here). A directory's time is set when an attempt here
    ends, and when the server says its job can still resume (:func:`sweep_checkpoints`)."""
    stale: dict[int, list[Path]] = {}
    now = time.time()
    try:
        entries = list(os.scandir(state_dir / "checkpoints"))
    except FileNotFoundError:
        return stale
    for entry in entries:
        job = entry.name.partition("-")[0]
        if not job.isdigit() or int(job) in (keep or set()):
            continue
        try:
            idle = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if idle > retention_s:
            stale.setdefault(int(job), []).append(Path(entry.path))
    return stale


def sweep_checkpoints(
    state_dir: Path,
    retention_s: float,
    keep: set[int] | None = None,
    ended: dict[int, float | None] | None = None,
) -> list[int]:
    """Remove the checkpoint directories past their retention (:func:`stale_checkpoints`) whose
    jobs cannot resume; the job ids removed. ``ended``: what the server said of the jobs asked
    about (only those are looked at): None for a job that can still resume (its directory is
    kept, its time set to now: a retention more), else when it ended, epoch seconds (kept until
    the retention has passed since then, its time set to that end). ``ended`` None (a server
    that does not say): by their time alone."""
    removed: list[int] = []
    now = time.time()
    for job, paths in stale_checkpoints(state_dir, retention_s, keep).items():
        if ended is not None and job not in ended:
            continue
        end = ended.get(job, 0.0) if ended is not None else 0.0
        for path in paths:
            if end is None or now - end <= retention_s:
                with contextlib.suppress(OSError):
                    os.utime(path, None if end is None else (end, end))
                continue
            remove_tree(path)
            removed.append(job)
    if removed:
        log.info(
            "removed the checkpoints of job(s) %s: past their retention of %gh",
            sorted(removed),
            retention_s / 3600,
        )
    return removed


def write_credential(state_dir: Path, credential: str) -> Path:
    """Write atomically with mode 0600 from the start (never briefly world-readable)."""
    target = state_dir / CREDENTIAL_FILE
    tmp = state_dir / f".{CREDENTIAL_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, credential.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, target)
    return target


def read_credential(state_dir: Path) -> str | None:
    try:
        return (state_dir / CREDENTIAL_FILE).read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def read_secret_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        value = f.read().strip()
    if not value:
        raise ValueError(f"{path} is empty")
    return value


def read_secret_fd(fd: int) -> str:
    with os.fdopen(fd, "r", encoding="utf-8") as f:
        return f.read().strip()

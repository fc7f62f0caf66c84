"""The agent's state directory and its secrets.

``STATE/credential`` (mode 0600, owned by the agent's user) holds the node's credential, so a
restarted agent re-registers without the join token. The directory itself is 0711: job users may
pass through to their own working directories (``STATE/jobs/...``, owned by them) but list nothing.
``STATE/sessions`` (0700) records the running replicas' sessions (:mod:`agent.leftovers`).

The join token is read from, in order: ``--join-token-file PATH``, ``--join-token -`` (stdin),
``$TESSERA_JOIN_TOKEN``, or a literal ``--join-token T`` — which ``ps`` would show, so the CLI
moves it into a pipe and re-executes itself without it (:func:`agent.cli.main`).
"""

from __future__ import annotations

import os
from pathlib import Path

CREDENTIAL_FILE = "credential"


def default_state_dir(name: str) -> Path:
    env = os.environ.get("TESSERA_AGENT_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/tessera-agent") / name
    return Path.home() / ".local" / "state" / "tessera-agent" / name


def prepare_state_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o711)
    for sub in ("jobs", "checkpoints"):
        (path / sub).mkdir(exist_ok=True)
        (path / sub).chmod(0o711)
    (path / "sessions").mkdir(exist_ok=True)
    (path / "sessions").chmod(0o700)  # the agent's alone: a job must not edit what gets killed
    return path


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

"""Where the server is and who is asking: ``TESSERA_URL`` and ``TESSERA_TOKEN``, else the file
``tessera login`` wrote (``$TESSERA_CONFIG``, or ``$XDG_CONFIG_HOME/tessera/config.json``, by
default ``~/.config/tessera/config.json``), readable by its owner only (mode 0600)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tessera_cli import outcome
from tessera_cli.errors import CliError


@dataclass(frozen=True)
class Settings:
    url: str
    token: str


def config_path() -> Path:
    explicit = os.environ.get("TESSERA_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tessera" / "config.json"


def read_file() -> dict[str, str]:
    path = config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", outcome.BAD_INPUT) from None
    try:
        data = json.loads(text)
    except ValueError:
        raise CliError(f"{path} is not JSON; run `tessera login` again", outcome.BAD_INPUT) from None
    if not isinstance(data, dict):
        raise CliError(f"{path} is not a JSON object; run `tessera login` again", outcome.BAD_INPUT)
    return {k: v for k, v in data.items() if isinstance(v, str)}


def write_file(url: str, token: str) -> Path:
    """Write the config with mode 0600 from the start (never readable by others, even briefly)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": url, "token": token}, out)
        out.write("\n")
    os.chmod(temp, 0o600)  # an older file of that name kept its mode through O_TRUNC
    os.replace(temp, path)
    return path


def normal_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise CliError(f"the server URL must start with http:// or https:// (got {url!r})", outcome.BAD_INPUT)
    try:  # a URL requests cannot even parse is the caller's mistake, not a server that is down
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not 0-65535)
        malformed = not parts.hostname or any(c.isspace() for c in url)
    except ValueError:
        malformed = True
    if malformed:
        raise CliError(f"the server URL is malformed (got {url!r})", outcome.BAD_INPUT)
    return url.removesuffix("/api/v1")


def load(url: str | None = None) -> Settings:
    """The settings in force: the environment first, then the config file."""
    stored = read_file()
    chosen_url = url or os.environ.get("TESSERA_URL") or stored.get("url")
    token = os.environ.get("TESSERA_TOKEN") or stored.get("token")
    if not chosen_url:
        raise CliError("no server: set TESSERA_URL or run `tessera login`", outcome.BAD_INPUT)
    token = (token or "").strip()  # a secret read from a file often ends with its newline
    if not token:
        raise CliError("no token: set TESSERA_TOKEN or run `tessera login`", outcome.AUTH)
    check_token(token, "TESSERA_TOKEN" if os.environ.get("TESSERA_TOKEN") else "the saved token")
    return Settings(url=normal_url(chosen_url), token=token)


def check_token(token: str, where: str) -> None:
    """A :class:`CliError` (exit 201) for a token with a space, a control or a non-ASCII character:
    requests would refuse such a header before sending, which read as a server that is down (202)."""
    if not all(" " < c < "\x7f" for c in token):
        raise CliError(
            f"{where} is not a token: it holds a space, a control or a non-ASCII character", outcome.AUTH
        )

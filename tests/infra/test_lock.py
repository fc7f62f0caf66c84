"""requirements/lock.txt, what `make install` and CI install: it must cover pyproject.toml.

A dependency added to pyproject.toml without `make lock` would be missing from CI's environment
(the project is installed with ``--no-deps``); a bound changed without it would leave the lock
outside the bound. Both fail here, naming the package and the command that fixes it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
FIX = "run `make lock` after changing pyproject.toml's dependencies"


def _locked() -> dict[str, list[tuple[str, str]]]:
    """name -> [(version, environment marker or '')]."""
    found: dict[str, list[tuple[str, str]]] = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)\s*(?:;\s*(.*))?$", line)
        if m:
            found.setdefault(canonicalize_name(m[1]), []).append((m[2], m[3] or ""))
    return found


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = [*project["dependencies"], *extras["dev"], *extras["sim"]]
    return [r for r in map(Requirement, names) if canonicalize_name(r.name) != "tessera"]


def test_the_lock_pins_every_dependency_within_its_bounds():
    locked = _locked()
    for requirement in _declared():
        versions = locked.get(canonicalize_name(requirement.name))
        assert versions, f"{requirement.name} is not in requirements/lock.txt: {FIX}"
        for version, _ in versions:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{requirement.name}=={version} in the lock is outside {requirement.specifier}: {FIX}"
            )


def test_the_lock_says_how_to_regenerate_it():
    head = (ROOT / "requirements" / "lock.txt").read_text().splitlines()[:3]
    assert any("make lock" in line for line in head)

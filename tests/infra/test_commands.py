"""The newcomer's commands: the README opens with them, and the Makefile and CI run what it says."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make_dry_run(target: str) -> str:
    # A stamp newer than pyproject.toml would hide the install step; -B shows every step.
    # Under `make test` the parent make's variables would make this one print "Entering directory".
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    argv = ["make", "--no-print-directory", "-n", "-B", target, "PYTEST_ARGS="]
    result = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_readme_opens_with_make_demo_and_make_test():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:sh|bash)?\n(.*?)```", readme, re.S)
    assert first_block is not None
    assert readme.index(first_block.group(0)) < readme.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]


def test_make_test_installs_the_project_then_runs_the_whole_suite_with_pytest():
    steps = make_dry_run("test").splitlines()
    assert any("-m venv .venv" in s for s in steps)
    # the exact versions of the lock (dev and sim extras included), then the project itself
    assert any("pip install" in s and "-r requirements/lock.txt" in s for s in steps)
    assert any("pip install" in s and "--no-deps -e ." in s for s in steps)
    assert steps[-1].strip() == ".venv/bin/pytest"


def test_make_demo_runs_the_launcher_after_installing():
    steps = make_dry_run("demo").splitlines()
    assert any("pip install" in s for s in steps)
    assert steps[-1].strip() == ".venv/bin/python scripts/demo.py"


def test_ci_script_is_valid_bash_and_runs_the_readmes_test_command():
    script = ROOT / ".ci" / "run"
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    text = script.read_text()
    assert "set -euo pipefail" in text
    assert "TESSERA_REQUIRE_SERVICES=1" in text
    assert "make test" in (ROOT / "README.md").read_text()
    # run_make_test runs it under each environment: `"$@" make test` (env -u ... or env), behind
    # its leftover mark and time bound, in an uncommented line
    assert re.search(r'^[^#\n]*"\$@" make test\b', text, re.M)
    assert re.search(r"^run_make_test .*TESSERA_REQUIRE_SERVICES=1", text, re.M)

"""Test helpers are imported one way (CONTRIBUTING.md, "Habits"): a static from-import of
``tests.support`` or of a helper module, never through importlib, a conftest or a test module."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_test_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``tests.*`` module ``path`` imports, however it does it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests"):
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if a.name.startswith("tests"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("tests")
        ):
            found.append((node.lineno, f"importlib:{node.args[0].value}"))
    return sorted(found)


def test_no_test_imports_a_helper_through_importlib_a_conftest_or_a_test_module():
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, module in imported_test_modules(path):
            parts = module.split(".")
            if (
                module.startswith("importlib:")
                or "conftest" in parts
                or any(p.startswith("test_") for p in parts)
            ):
                wrong.append(f"{path.relative_to(TESTS.parent)}:{line}: {module}")
    assert wrong == [], "import test helpers from tests.support or a helper module:\n" + "\n".join(wrong)


def test_the_check_sees_each_wrong_way(tmp_path: Path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import importlib\n"
        "from tests.api.conftest import submit\n"
        "from tests.sim.test_check import run\n"
        "h = importlib.import_module('tests.agent.helpers')\n"
        "from tests.support import free_port\n"
    )
    modules = [m for _, m in imported_test_modules(sample)]
    assert modules == [
        "tests.api.conftest.submit",
        "tests.sim.test_check.run",
        "importlib:tests.agent.helpers",
        "tests.support.free_port",
    ]

"""The docs point at what exists: every relative link and #anchor in the README, CONTRIBUTING.md
and docs/ resolves, and the README's configuration table and the settings' environment reads
name the same variables, both ways."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
SETTINGS = [ROOT / "controlplane" / "settings.py", ROOT / "controlplane" / "celery.py"]
# Where the table's other variables are read: the agent, and the launcher behind `make demo`.
READERS = [ROOT / "controlplane", ROOT / "scheduling", ROOT / "monitoring", ROOT / "agent", ROOT / "scripts"]
VARIABLE = re.compile(r"^TESSERA_[A-Z0-9_]*[A-Z0-9]$")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            name = slug(heading.group(1))
            found.add(f"{name}-{seen[name]}" if name in seen else name)
            seen[name] = seen.get(name, 0) + 1
        found.update(re.findall(r'<a (?:name|id)="([^"]+)"', line))
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no such heading)")
    return broken


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    broken = {str(p.relative_to(ROOT)): b for p in PAGES if (b := broken_links(p))}
    assert broken == {}


def test_the_anchor_of_a_heading_is_githubs():
    assert slug("Joining a node") == "joining-a-node"
    assert slug("`make eval`: the policies, compared") == "make-eval-the-policies-compared"


def variables_read_by(paths: list[Path]) -> tuple[set[str], set[str]]:
    """The TESSERA_* names in the string literals of ``paths``' Python files, and the prefixes of
    the f-strings that build one (``f"TESSERA_IDLE_BOUNDS_{name.upper()}"``)."""
    names: set[str] = set()
    prefixes: set[str] = set()
    files = [f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])]
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE.match(node.value):
                names.add(node.value)
            elif isinstance(node, ast.JoinedStr) and node.values:
                first = node.values[0]
                if isinstance(first, ast.Constant) and str(first.value).startswith("TESSERA_"):
                    prefixes.add(str(first.value))
    return names, prefixes


def configuration_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Configuration")
    return readme[start : readme.index("\n## ", start + 1)]


def configuration_table() -> set[str]:
    """The variables the table's rows are about (their first column)."""
    rows = [line for line in configuration_section().splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(TESSERA_[A-Z0-9_<>]+)`", row.split(" | ")[0])}


def test_every_variable_the_settings_read_is_in_the_readmes_configuration_table():
    # Named anywhere in the section: TESSERA_REDIS_*_DB are described in REDIS_URL's row.
    described = set(re.findall(r"`(TESSERA_[A-Z0-9_<>]+)", configuration_section()))
    names, prefixes = variables_read_by(SETTINGS)
    assert sorted(names - described) == []
    assert sorted(p for p in prefixes if not any(d.startswith(p) for d in described)) == []


def test_every_variable_in_the_readmes_configuration_table_is_read_by_the_code():
    names, prefixes = variables_read_by(READERS)
    unread = [
        name
        for name in sorted(configuration_table())
        if name not in names and not any(name.startswith(p) for p in prefixes) and "<" not in name
    ]
    assert unread == []


def test_every_alert_of_deploy_alerts_yml_is_named_in_docs_metrics_md():
    alerts = re.findall(r"^\s*- alert: (\w+)", (ROOT / "deploy" / "alerts.yml").read_text(), re.M)
    page = (ROOT / "docs" / "metrics.md").read_text()
    assert alerts and [a for a in alerts if f"`{a}`" not in page] == []

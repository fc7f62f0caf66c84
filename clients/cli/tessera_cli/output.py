"""``-o json|yaml|table``: the same data for scripts (JSON, YAML) and for people (a table)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import click
import yaml

FORMATS = ("table", "json", "yaml")

Column = tuple[str, Callable[[dict[str, Any]], Any]]

# What a job's output may not send to the terminal of whoever reads it (its owner, an operator):
# every control character but a newline, a tab and a carriage return. ESC starts the sequences
# that set the window's title, write the clipboard (OSC 52), move the cursor, clear the screen or
# answer back into the terminal's input; C1's CSI (U+009B) does the same on some terminals.
CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


# In a table's cell: every control character (a carriage return or a tab would move the cursor
# over the table). JSON escapes C0 in its strings itself, not DEL and C1.
CELL_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
JSON_CONTROLS = re.compile(r"[\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with each control character a terminal would act on written out (``\\x1b``)."""
    return CONTROLS.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def as_json(data: Any, indent: int | None = None) -> str:
    """JSON with no control character left raw (DEL and C1 as ``\\u00XX``: the same JSON)."""
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    return JSON_CONTROLS.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def emit(
    data: Any, fmt: str, columns: Sequence[Column] | None = None, rows: list[dict] | None = None
) -> None:
    """Print ``data`` as JSON or YAML; as a table, print ``rows`` (default: ``data``) by
    ``columns``, or ``data``'s keys and values when there are no columns."""
    if fmt == "json":
        click.echo(as_json(data, indent=2))
    elif fmt == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip())
    elif columns is not None:
        click.echo(table(rows if rows is not None else data, columns))
    else:
        click.echo(pairs(data))


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | dict):
        return as_json(value)
    text = str(value).replace("\n", " ")
    return CELL_CONTROLS.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def table(rows: list[dict[str, Any]], columns: Sequence[Column]) -> str:
    head = [name for name, _ in columns]
    body = [[cell(get(row)) for _, get in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def pairs(data: Any) -> str:
    if not isinstance(data, dict):
        return cell(data)
    width = max((len(k) for k in data), default=0)
    return "\n".join(f"{k + ':':<{width + 1}} {cell(v)}" for k, v in data.items())

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


def visible(text: str) -> str:
    """``text`` with each control character a terminal would act on written out (``\\x1b``)."""
    return CONTROLS.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def emit(
    data: Any, fmt: str, columns: Sequence[Column] | None = None, rows: list[dict] | None = None
) -> None:
    """Print ``data`` as JSON or YAML; as a table, print ``rows`` (default: ``data``) by
    ``columns``, or ``data``'s keys and values when there are no columns."""
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
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
        return json.dumps(value, ensure_ascii=False)
    return str(value).replace("\n", " ")


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

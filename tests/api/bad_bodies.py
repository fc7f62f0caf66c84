"""The hostile job bodies: each a 400 naming a field (or ``detail``), or a 413.

Shared by the API's table test (``test_bad_input.py``) and the portal's form test
(``tests/frontend/test_portal.py``), which must refuse the same bodies.
"""

from __future__ import annotations

from typing import Any

from tests.api.helpers import valid_body

OK = valid_body()


def raw(text: str) -> bytes:
    """A body written as JSON text by hand (for escapes ``json.dumps`` would never produce)."""
    return text.encode("utf-8")


def with_(**fields: Any) -> dict[str, Any]:
    return valid_body(**fields)


def without(field: str) -> dict[str, Any]:
    body = valid_body()
    body.pop(field)
    return body


# (case id, body: dict/list/... sent as JSON, or bytes sent as they are, expected status, the key
# the error must name)
CASES: list[tuple[str, Any, int, str]] = [
    ("missing-name", without("name"), 400, "name"),
    ("missing-kind", without("kind"), 400, "kind"),
    ("missing-command", without("command"), 400, "command"),
    ("empty-name", with_(name=""), 400, "name"),
    ("long-name", with_(name="n" * 129), 400, "name"),
    ("name-with-newline", with_(name="a\nb"), 400, "name"),
    ("name-a-number", with_(name=5), 400, "name"),
    ("unknown-kind", with_(kind="gaming"), 400, "kind"),
    ("unknown-topology", with_(topology="galaxy"), 400, "topology"),
    ("command-a-string", with_(command="python train.py"), 400, "command"),
    ("command-of-numbers", with_(command=[1, 2]), 400, "command"),
    ("command-empty", with_(command=[]), 400, "command"),
    ("command-blank-program", with_(command=["", "train.py"]), 400, "command"),
    ("command-whitespace-program", with_(command=[" \t"]), 400, "command"),
    ("command-100000-items", with_(command=["x"] * 100_000), 400, "command"),
    ("command-over-256KiB", with_(command=["x" * 300_000]), 400, "command"),
    ("gpus-negative", with_(gpus=-1), 400, "gpus"),
    ("gpus-huge", with_(gpus=10**6), 400, "gpus"),
    (
        "gpus-enormous-integer",
        raw('{"name":"a","kind":"batch","command":["x"],"gpus":' + "9" * 400 + "}"),
        400,
        "gpus",
    ),
    ("gpus-overflowing-float", raw('{"name":"a","kind":"batch","command":["x"],"gpus":1e400}'), 400, "gpus"),
    ("gpus-fraction-above-1", with_(gpus=1.5), 400, "gpus"),
    ("gpus-too-small-fraction", with_(gpus=0.0001), 400, "gpus"),
    ("gpus-a-string", with_(gpus="2"), 400, "gpus"),
    ("gpus-a-boolean", with_(gpus=True), 400, "gpus"),
    ("fraction-with-replicas", with_(gpus=0.5, replicas=2), 400, "replicas"),
    ("gpus-not-divisible", with_(gpus=3, replicas=2), 400, "replicas"),
    ("replicas-zero", with_(replicas=0), 400, "replicas"),
    ("replicas-a-float", with_(replicas=1.0), 400, "replicas"),
    ("min-available-above-replicas", with_(gpus=2, replicas=2, min_available=3), 400, "min_available"),
    ("min-available-zero", with_(min_available=0), 400, "min_available"),
    ("elastic-excludes-gpus", with_(gpus=8, elastic={"min_gpus": 2, "max_gpus": 6}), 400, "elastic"),
    ("elastic-min-above-max", with_(gpus=8, elastic={"min_gpus": 9, "max_gpus": 4}), 400, "elastic"),
    (
        "elastic-not-multiple",
        with_(gpus=4, replicas=2, elastic={"min_gpus": 3, "max_gpus": 8}),
        400,
        "elastic",
    ),
    (
        "elastic-disagrees-with-min-available",
        with_(gpus=4, replicas=2, min_available=2, elastic={"min_gpus": 2, "max_gpus": 8}),
        400,
        "min_available",
    ),
    ("elastic-unknown-key", with_(elastic={"min_gpus": 2, "max_gpus": 8, "step": 2}), 400, "elastic"),
    ("elastic-a-list", with_(elastic=[2, 8]), 400, "elastic"),
    ("priority-a-string", with_(priority="high"), 400, "priority"),
    ("priority-huge", with_(priority=10**12), 400, "priority"),
    ("preemptible-a-string", with_(preemptible="yes"), 400, "preemptible"),
    ("preemptible-an-integer", with_(preemptible=1), 400, "preemptible"),
    ("grace-negative", with_(grace_seconds=-1), 400, "grace_seconds"),
    ("checkpoint-zero", with_(checkpoint_seconds=0), 400, "checkpoint_seconds"),
    ("time-limit-a-float", with_(time_limit_seconds=1.5), 400, "time_limit_seconds"),
    ("cpus-negative", with_(cpus=-1), 400, "cpus"),
    ("memory-a-string", with_(memory_gib="lots"), 400, "memory_gib"),
    ("env-a-list", with_(env=["A=1"]), 400, "env"),
    ("env-value-a-number", with_(env={"A": 1}), 400, "env"),
    ("env-300-entries", with_(env={f"K{i}": "v" for i in range(300)}), 400, "env"),
    ("env-1MB", with_(env={"BIG": "x" * 1_000_000}), 400, "env"),
    ("node-selector-value-a-number", with_(node_selector={"rack": 1}), 400, "node_selector"),
    ("prefer-labels-value-a-number", with_(prefer_labels={"data": 1}), 400, "prefer_labels"),
    ("prefer-labels-a-list", with_(prefer_labels=["data:eu"]), 400, "prefer_labels"),
    ("prefer-labels-naming-rack", with_(prefer_labels={"rack": "r1"}), 400, "prefer_labels"),
    (
        "prefer-labels-100-entries",
        with_(prefer_labels={f"k{i}": "v" for i in range(100)}),
        400,
        "prefer_labels",
    ),
    ("max-retries-above-100", with_(max_retries=101), 400, "max_retries"),
    ("accelerators-a-string", with_(accelerators="H100"), 400, "accelerators"),
    ("accelerators-empty-name", with_(accelerators=[""]), 400, "accelerators"),
    ("unknown-field", with_(colour="blue"), 400, "colour"),
    ("nul-in-name", raw('{"name":"a\\u0000b","kind":"batch","command":["x"]}'), 400, "name"),
    ("surrogate-in-name", raw('{"name":"a\\ud800b","kind":"batch","command":["x"]}'), 400, "name"),
    (
        "nul-in-env-value",
        raw('{"name":"a","kind":"batch","command":["x"],"env":{"A":"\\u0000"}}'),
        400,
        "env",
    ),
    (
        "surrogate-in-env-key",
        raw('{"name":"a","kind":"batch","command":["x"],"env":{"\\udfff":"v"}}'),
        400,
        "env",
    ),
    ("nul-in-command", raw('{"name":"a","kind":"batch","command":["x\\u0000"]}'), 400, "command"),
    (
        "surrogate-in-accelerator",
        raw('{"name":"a","kind":"batch","command":["x"],"accelerators":["\\ud800"]}'),
        400,
        "accelerators",
    ),
    (
        "surrogate-in-unknown-field-name",
        raw('{"name":"a","kind":"batch","command":["x"],"\\ud800":1}'),
        400,
        "\\ud800",
    ),
    ("body-a-list", [OK], 400, "detail"),
    ("body-a-string", "job", 400, "detail"),
    ("body-a-number", 3, 400, "detail"),
    ("body-null", None, 400, "detail"),
    ("body-not-utf8", b'{"name": "\xff\xfe", "kind": "batch", "command": ["x"]}', 400, "detail"),
    ("body-empty", b"", 400, "detail"),
    ("body-not-json", b'{"name": ', 400, "detail"),
    # {"gpus": 8, ..., "gpus": 1}: which one was meant? (a client's merge gone wrong); and in a map
    (
        "body-duplicate-key",
        raw('{"name":"a","kind":"batch","command":["x"],"gpus":8,"gpus":1}'),
        400,
        "detail",
    ),
    (
        "env-duplicate-key",
        raw('{"name":"a","kind":"batch","command":["x"],"env":{"A":"1","A":"2"}}'),
        400,
        "detail",
    ),
    ("body-nan", raw('{"name":"a","kind":"batch","command":["x"],"gpus":NaN}'), 400, "detail"),
    ("body-deeply-nested", raw("[" * 100_000 + "]" * 100_000), 400, "detail"),
    ("body-over-size-limit", with_(env={"BIG": "x" * 2_000_000}), 413, "detail"),
]

"""The cyclic garbage collector, paused for the length of a pass.

A pass allocates a few hundred thousand long-lived objects (replica requests, allocations,
groups, memo entries) and almost no reference cycles; each full collection CPython runs meanwhile
walks every live object, and the number of full collections grows with the pass, so on a large
cluster they made the pass grow faster than the work (docs/benchmarks/scheduling-pass.md).
Reference counting still frees everything as usual; cycles made during the pass wait for
the next collection after it. Re-entrant and thread-safe: the collector is enabled again when the last
pass running in the process ends, and only if it was enabled when the first one began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()

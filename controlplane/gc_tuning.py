"""Python's garbage collector, set for a long-running server process (web, Celery worker).

After start-up, every object that exists (Django's apps, models, URL patterns, DRF's field
templates, the engine's modules) lives as long as the process: ``gc.freeze()`` moves them out of
the collector's sight, so a full collection no longer walks them all. The youngest generation is
collected every 20,000 allocations instead of 700: a submit or an exit report allocates a few
thousand objects, almost none of them in reference cycles, and each collection cost time on the
request path. Cyclic garbage is still collected, by the older generations' collections.

Under ``make bench-e2e`` the p99 submit→running was lower with these settings than with Python's
defaults in every pair run back to back (the figures: docs/benchmarks/e2e.md).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
MIDDLE_THRESHOLD = 50
OLD_THRESHOLD = 100


def tune_for_server() -> None:
    """Call once the process has loaded what it keeps (the end of its start-up)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)

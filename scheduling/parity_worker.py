"""A scheduling-pass worker for the parity harness (``scheduling/parity.py``): one pass per line
read, at the simulated time the line gives, answered with what it bound, preempted and resized.

Run as ``python -m scheduling.parity_worker`` with the harness's ``DATABASE_URL``. The harness
kills it (SIGKILL) between passes and starts another to show that a pass in a fresh process
decides as the one before would have: nothing a pass needs lives in its process.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from scheduling.parity import Clock, live_settings
    from scheduling.services import passes

    clock = Clock()
    with live_settings(clock):
        for line in sys.stdin:
            clock.t = float(line)
            result = passes.run_pass(clock.now(), max_rounds=1)
            answer = (
                {"bound": result.bound, "preempted": result.preempted, "resized": result.resized}
                if result
                else None
            )
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()

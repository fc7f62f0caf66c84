"""``manage.py parity``: replay a trace through the live control plane and through the simulator,
and print how many of their decisions differ (``scheduling/parity.py``).

The live side runs on a throwaway database made for the run (``test_<name>_parity`` on
PostgreSQL, in memory on SQLite) and dropped after it, so it never touches the cluster's own.
The last line printed is ``{"jobs": N, "decisions": D, "differing_decisions": K}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.test.utils import setup_databases, teardown_databases

from scheduling.parity import run_parity
from scheduling.sim.generate import generate
from scheduling.sim.traces import TraceError, read_jobs, read_nodes, read_quotas


class Command(BaseCommand):
    help = "Replay a trace through the live services and the simulator; print the differing decisions."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--nodes", help="NODES.csv (with --jobs; default: a generated trace)")
        parser.add_argument("--jobs", help="JOBS.csv")
        parser.add_argument("--quotas", help="QUOTAS.csv (optional)")
        parser.add_argument("--days", type=float, default=2.0, help="generated trace: arrival span (days)")
        parser.add_argument("--seed", type=int, default=1, help="generated trace: seed")
        parser.add_argument("--load", type=float, default=1.0, help="generated trace: offered load")
        parser.add_argument("--gpus", type=int, default=160, help="generated trace: cluster size")
        parser.add_argument("--out", default="var/parity", help="where a generated trace is written")

    def handle(self, *args, **o) -> None:
        if bool(o["nodes"]) != bool(o["jobs"]):
            raise CommandError("--nodes and --jobs go together")
        if o["nodes"]:
            paths = (Path(o["nodes"]), Path(o["jobs"]), Path(o["quotas"]) if o["quotas"] else None)
        else:
            if not (0 < o["days"] <= 30 and 0 < o["load"] <= 5 and 8 <= o["gpus"] <= 100_000):
                raise CommandError("--days must be in (0, 30], --load in (0, 5], --gpus in [8, 100000]")
            out = Path(o["out"]) / f"seed{o['seed']}-{o['days']:g}d-{o['load']:g}-{o['gpus']}"
            generate(out, seed=o["seed"], days=o["days"], load=o["load"], gpus=o["gpus"])
            paths = (out / "nodes.csv", out / "jobs.csv", out / "quotas.csv")
        try:
            nodes, jobs = read_nodes(paths[0]), read_jobs(paths[1])
            quotas = read_quotas(paths[2]) if paths[2] else []
        except (OSError, TraceError) as exc:
            raise CommandError(str(exc)) from None
        db = settings.DATABASES["default"]
        if db["ENGINE"].endswith("postgresql"):
            db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_parity"
        logging.getLogger("tessera").setLevel(logging.WARNING)
        began = time.perf_counter()
        # django-stubs says a Mapping; Django iterates the aliases (its runner passes a set).
        old = setup_databases(verbosity=0, interactive=False, aliases={"default"})  # type: ignore[arg-type]
        try:
            result = run_parity(nodes, jobs, quotas)
        finally:
            teardown_databases(old, verbosity=0)
        self.stderr.write(
            f"{len(jobs)} jobs, {result.live_passes} passes each way, {time.perf_counter() - began:.0f} s; "
            f"passes whose pending codes differ: {result.pending_codes_differing}"
        )
        if result.first_difference is not None:
            self.stderr.write(f"first differing decision (simulated, live): {result.first_difference}")
        for note in result.notes[:5]:
            self.stderr.write(note)
        self.stdout.write(json.dumps(result.line()))
        sys.stdout.flush()

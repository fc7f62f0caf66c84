"""CPU of a pass with its start estimates, and the size of the engine's memory after it.

``PYTHONPATH=<checkout> python scripts/bench_eta_cost.py`` builds ``scheduling.bench``'s saturated
cluster (1,000 nodes × 8 GPUs, 90% allocated, 1,000 pending) and runs ``from_snapshot`` →
``decide`` → ``estimate`` three times, with every class of the estimates' record
(``engine/eta_learnt.py``) filled with its 200 ratios where the checkout has one. Prints one JSON
line: the median CPU seconds, each run's, the memory document's bytes and the estimates made.
History: docs/benchmarks/eta.md.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections import deque

from scheduling.bench import FALLBACK, cluster, pending_jobs, quotas, saturate
from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, Snapshot

CLASSES = [f"{shape}/{order}" for shape in ("part", "node", "gang") for order in range(3)] + ["all"]


def main() -> int:
    rng = random.Random(0)
    nodes = cluster(1000)
    now = 100_000.0
    running = saturate(nodes, 0.9, rng, now)
    pending = [
        JobRequest(
            **{
                **{f: getattr(j, f) for f in j.__dataclass_fields__},
                "submitted_at": now - 600 + j.submitted_at * 0.01,
            }
        )
        for j in pending_jobs(1000, rng, FALLBACK, inference_share=0.15)
    ]
    snap = Snapshot(now, tuple(nodes), tuple(running), tuple(pending), tuple(quotas(8000)))
    cpus, size, made = [], 0, 0
    for _ in range(3):
        c0 = time.process_time()
        engine = TesseraScheduler.from_snapshot(snap, EngineConfig())
        learnt = getattr(engine, "eta_learnt", None)  # absent before the record existed
        if learnt is not None:
            r = random.Random(1)
            for cls in CLASSES:
                learnt.seen[cls] = deque((round(r.gauss(0.3, 1.0), 4) for _ in range(200)), maxlen=200)
        d = engine.decide(now)
        made = len(engine.estimate(d, now))
        cpus.append(time.process_time() - c0)
        size = len(json.dumps(engine.memory().to_json()))
    out = {"cpu_s_median": round(statistics.median(cpus), 3), "cpu_s": [round(c, 3) for c in cpus]}
    print(json.dumps({**out, "memory_bytes": size, "estimates": made}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

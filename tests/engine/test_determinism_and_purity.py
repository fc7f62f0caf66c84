"""Same state, same decisions whatever PYTHONHASHSEED; the engine imports no Django."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = r"""
import json, random
from scheduling.engine.registry import POLICIES, make_scheduler
from scheduling.engine.types import JobRequest, NodeSpec, QuotaSpec
rng = random.Random(7)
nodes = [NodeSpec(f"n{i:02d}", f"r{i // 4}", ["H100", "A100", "T4"][i % 3], [8, 4, 2][i % 3],
                  nvlink_domain=[8, 4, 1][i % 3], cpus=64, memory_gib=256,
                  labels=(("rack", f"r{i // 4}"), ("zone", "ab"[i % 2]))) for i in range(16)]
quotas = [QuotaSpec(t, "*", 16, 48) for t in ("vision", "nlp", "speech")]
jobs = []
for i in range(120):
    g = rng.choice([0, 0.25, 0.5, 1, 1, 2, 4, 8])
    r = rng.choice([1, 1, 2]) if g >= 1 else 1
    jobs.append(JobRequest(f"j{i}", rng.choice(["vision", "nlp", "speech"]),
                           rng.choice(["inference", "training", "finetune", "batch"]),
                           g * r, replicas=r, priority=rng.randint(0, 2), submitted_at=i,
                           topology=rng.choice(["any", "rack", "node"]) if g >= 1 else "any",
                           time_limit_s=rng.choice([None, 900.0]), cpus=rng.choice([0, 4])))
out = {}
for name in POLICIES:
    s = make_scheduler(name, nodes, quotas, seed=3)
    for j in jobs:
        s.submit(j)
    log = []
    for step in range(6):
        d = s.decide(step * 600.0)
        log.append([[b.job_id, [[p.node, list(p.gpus), p.share] for p in b.placements]]
                    for b in d.bindings])
        log.append(sorted((k, v.code, v.message) for k, v in d.pending.items()))
        log.append([[p.job_id, p.reason] for p in d.preemptions])
        log.append([[r.job_id, len(r.placements)] for r in d.resizes])
        for b in d.bindings[::2]:
            s.release(b.job_id, step * 600.0 + 300)
        for p in d.preemptions:
            s.release(p.job_id, step * 600.0 + 300)
    out[name] = log
print(json.dumps(out, sort_keys=True))
"""


def _run(code: str, hashseed: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(ROOT))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return proc.stdout


def test_decisions_are_identical_under_two_hash_seeds():
    first = _run(SCENARIO, "1")
    second = _run(SCENARIO, "4242")
    assert first == second
    assert '"n' in first  # something was actually placed


def test_importing_every_engine_module_imports_no_django():
    code = (
        "import importlib, pkgutil, sys, scheduling.engine as e\n"
        "names = [m.name for m in pkgutil.iter_modules(e.__path__)]\n"
        "for n in names: importlib.import_module('scheduling.engine.' + n)\n"
        "import scheduling.sim.pack\n"
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "print(len(names), bad)\n"
    )
    out = _run(code, "0")
    count, bad = out.split(" ", 1)
    assert int(count) >= 15
    assert bad.strip() == "[]"

"""The scheduling-pass benchmark beside a reference commit: is the engine as fast as it was?

``python scripts/bench_reference.py [--ref f8c873f] [--rounds 3] [--only cold --only growth]``
takes the reference's ``scheduling`` package out of git (``git archive``) into a temporary folder,
then runs ``python -m scheduling.bench`` there and in this tree by turns (the order swapped each
round, one pass a run), and prints a table of the medians: CPU seconds (steadier than wall time on
a shared machine) and wall seconds, the ratio tree ÷ reference, and the verdicts: the cold and the
5,000-node passes no slower than the reference's, and growth from 1,000 to 5,000 nodes at most
5.5×. Both draw request sizes from the same place: ``$TESSERA_TRACES/openb/jobs.csv`` when that is
set (the reference is shown it where it looked for it), else the same built-in mix.

Exit status: 0 when every verdict holds, 1 when one does not, 2 when the reference cannot be had.
Method and history: docs/benchmarks/scheduling-pass.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "f8c873f"  # the end of the engine work (docs/benchmarks/scheduling-pass.md)
GROWTH_LIMIT = 5.5


def extract(ref: str, into: Path) -> Path:
    """The reference's ``scheduling`` package under ``into/ref`` (and its traces where it looks)."""
    try:
        tar = subprocess.run(["git", "archive", ref, "scheduling"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        why = exc.stderr.decode().strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
        raise SystemExit(f"error: cannot take {ref} out of git ({why}); a full clone is needed") from None
    tree = into / "ref"
    tree.mkdir()
    with tarfile.open(fileobj=BytesIO(tar.stdout)) as archive:
        archive.extractall(tree, filter="data")
    traces = os.environ.get("TESSERA_TRACES")
    if traces:  # the reference read ROOT/../shared/traces
        (into / "shared").mkdir()
        (into / "shared" / "traces").symlink_to(Path(traces).resolve())
    return tree


def one_run(tree: Path, only: list[str]) -> dict[tuple[str, int], dict]:
    """One pass of each scenario, by (scenario, nodes)."""
    args = [sys.executable, "-m", "scheduling.bench", "--repeat", "1"]
    for name in only:
        args += ["--only", name]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {(r["scenario"], r["nodes"]): r for r in rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref", default=REFERENCE)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", choices=["cold", "saturated", "growth"], action="append")
    args = p.parse_args(argv)
    only = args.only or ["cold", "growth"]
    runs: dict[str, list[dict]] = {"reference": [], "tree": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"reference": extract(args.ref, Path(tmp)), "tree": ROOT}
        for i in range(args.rounds):
            for label in ("reference", "tree") if i % 2 == 0 else ("tree", "reference"):
                runs[label].append(one_run(trees[label], only))
                print(f"round {i + 1}/{args.rounds}: {label} done", file=sys.stderr, flush=True)
    keys = sorted(set(runs["tree"][0]) & set(runs["reference"][0]))

    def median(label: str, key: tuple[str, int], field: str) -> float:
        return statistics.median(r[key][field] for r in runs[label])

    print(f"| pass | reference {args.ref} CPU / wall (s) | this tree CPU / wall (s) | CPU ratio |")
    print("| --- | --- | --- | --- |")
    ratio = {}
    for key in keys:
        ref_cpu, tree_cpu = median("reference", key, "cpu_s"), median("tree", key, "cpu_s")
        ratio[key] = tree_cpu / ref_cpu
        print(
            f"| {key[0]} {key[1]} nodes | {ref_cpu:.3f} / {median('reference', key, 'pass_s'):.3f} "
            f"| {tree_cpu:.3f} / {median('tree', key, 'pass_s'):.3f} | {ratio[key]:.2f}× |"
        )
    verdicts = []
    for key in [k for k in keys if k == ("cold", 1000) or k == ("growth", 5000)]:
        verdicts.append((f"{key[0]} {key[1]} nodes no slower than the reference", ratio[key] <= 1.0))
    if ("growth", 1000) in ratio and ("growth", 5000) in ratio:
        growth = median("tree", ("growth", 5000), "cpu_s") / median("tree", ("growth", 1000), "cpu_s")
        verdicts.append(
            (f"growth 1,000 → 5,000 nodes {growth:.2f}× ≤ {GROWTH_LIMIT}×", growth <= GROWTH_LIMIT)
        )
    print()
    for text, ok in verdicts:
        print(f"- {'met' if ok else 'MISSED'}: {text}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())

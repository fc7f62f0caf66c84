"""``make bench-e2e`` beside a reference commit, interleaved: is the whole stack as fast as it was?

``python scripts/bench_e2e_reference.py [--ref b7f674b] [--tree COMMIT] [--rounds 5] [-- ARGS...]``
checks the reference out (``git worktree add --detach``) under ``var/bench-ref/<commit>`` with a
virtual environment of its own (the packages of this tree's ``requirements/lock.txt``, so only
the code differs), then runs each tree's own ``scripts/bench_e2e.py`` (this checkout's, or
``--tree``'s, checked out the same way: a fixed commit while this checkout changes) by turns,
``--rounds`` times each, the order swapped every round (reference, tree; tree, reference; ...), so a change in
the machine's load falls on both. Arguments after ``--`` go to every run (``--db``, ``--redis``,
``--jobs``...); ``--tree-args`` go to the tree's runs only. It prints every run's figures as
they come, then the medians of each side and the ratios tree ÷ reference, and, last, one JSON line with them.
``--runs-out FILE`` appends each run's whole JSON line (``cpu_seconds`` per process and the rest)
to FILE, with its round and code.

The default reference is b7f674b, the commit before the engine's memory was kept across passes
(issue 16: "no slower" is the median of 5 runs interleaved with the code before that work).

Exit status: 0 when the tree's median throughput is at least 90% of the reference's and its median
p99 at most 110%; 1 when not; 2 when a run could not be made. History: docs/benchmarks/e2e.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "b7f674b"  # the parent of 3d7dedf, the first commit of the engine-memory work
TOLERANCE = 0.10
FIGURES = ("submissions_per_s", "p50_submit_to_running_ms", "p99_submit_to_running_ms", "pass_p50_ms")


def checkout(ref: str) -> Path:
    """``ref`` checked out with its own venv (made once, reused by later runs)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if sha.returncode != 0:
        raise SystemExit(f"error: {ref}: not a commit here ({sha.stderr.strip()}); a full clone is needed")
    tree = ROOT / "var" / "bench-ref" / sha.stdout.strip()[:12]
    if not (tree / ".git").exists():
        tree.parent.mkdir(parents=True, exist_ok=True)
        add = ["git", "worktree", "add", "--detach", str(tree), sha.stdout.strip()]
        subprocess.run(add, cwd=ROOT, check=True)
    python = tree / ".venv" / "bin" / "python"
    if not (tree / ".venv" / ".bench-ready").exists():
        subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True)
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "-r", str(ROOT / "requirements" / "lock.txt")], check=True)
        subprocess.run([*pip, "--no-deps", "-e", str(tree)], check=True)
        (tree / ".venv" / ".bench-ready").touch()
    return tree


def one_run(tree: Path, bench_args: list[str]) -> dict[str, Any] | None:
    """One ``bench_e2e.py`` run in ``tree``: its JSON line, or None when it could not run."""
    python = tree / ".venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), "scripts/bench_e2e.py", *bench_args], cwd=tree, stdout=subprocess.PIPE, text=True
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 2 or not lines:
        return None
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    bench_args: list[str] = []
    if "--" in argv:
        bench_args = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref", default=REFERENCE)
    p.add_argument("--tree", help="a commit to measure instead of this checkout (checked out as --ref is)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--tree-args",
        default="",
        help="more bench_e2e.py arguments for the tree's runs only (an option the reference lacks: "
        "--agent-args '--single-tenant' leaves the node isolation, newer than b7f674b, out)",
    )
    p.add_argument("--runs-out", type=Path, help="write every run's whole JSON line here (one per line)")
    args = p.parse_args(argv)
    trees = {"reference": checkout(args.ref), "tree": checkout(args.tree) if args.tree else ROOT}
    runs: dict[str, list[dict[str, Any]]] = {"reference": [], "tree": []}
    for i in range(args.rounds):
        for label in ("reference", "tree") if i % 2 == 0 else ("tree", "reference"):
            extra = shlex.split(args.tree_args) if label == "tree" else []
            result = one_run(trees[label], [*bench_args, *extra])
            if result is None:
                print(f"error: round {i + 1}: the {label}'s run could not be made", file=sys.stderr)
                return 2
            runs[label].append(result)
            if args.runs_out:
                with args.runs_out.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"round": i + 1, "code": label, **result}) + "\n")
            shown = ", ".join(f"{f} {result.get(f)}" for f in FIGURES)
            load = result.get("load_avg_1m")
            print(f"round {i + 1}/{args.rounds} {label}: {shown}, load {load}", flush=True)

    medians = {
        label: {f: statistics.median(float(r[f]) for r in rs if r.get(f) is not None) for f in FIGURES}
        for label, rs in runs.items()
    }
    ratios = {f: round(medians["tree"][f] / medians["reference"][f], 3) for f in FIGURES}
    print(f"\n{'median':<28} {'reference':>10} {'tree':>10} {'tree/ref':>9}")
    for f in FIGURES:
        print(f"{f:<28} {medians['reference'][f]:>10.1f} {medians['tree'][f]:>10.1f} {ratios[f]:>9.3f}")
    ok = ratios["submissions_per_s"] >= 1 - TOLERANCE and ratios["p99_submit_to_running_ms"] <= 1 + TOLERANCE
    tree = args.tree or "this checkout"
    summary = {"reference": args.ref, "tree": tree, "tree_args": args.tree_args, "rounds": args.rounds}
    summary["medians"] = medians
    print(json.dumps({**summary, "ratios": ratios, "no_slower": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

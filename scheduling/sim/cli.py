"""``python -m scheduling.sim replay|pack|generate|check`` (docs/formats.md).

Bad arguments or bad files end with one clear line on stderr (``error: FILE:LINE: ...``) and a
non-zero exit (2), never a traceback; ``check`` exits 1 when it finds violations.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scheduling.sim import plots, policies, runner
from scheduling.sim.check import check
from scheduling.sim.events import EventsError, read_events
from scheduling.sim.generate import Scenario, generate
from scheduling.sim.pack import PackError
from scheduling.sim.replay import ReplayError
from scheduling.sim.traces import TraceError, read_jobs, read_nodes, read_quotas

SHOWN = 50  # violations printed in full; the rest are counted by kind

COMPARE_HELP = "run these policies side by side into OUT/<policy>/, plus OUT/compare.md and .png"


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not math.isfinite(value):  # inf would draw jobs for ever
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    return parse


def _policy_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one policy name")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scheduling.sim",
        description="Tessera's simulator: replay a workload, run the packing benchmark, "
        "generate a workload, or check an events file.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("replay", help="run a workload through simulated time under a policy")
    p.add_argument("--nodes", required=True, type=Path, help="NODES.csv")
    p.add_argument("--jobs", required=True, type=Path, help="JOBS.csv")
    p.add_argument("--quotas", type=Path, help="QUOTAS.csv (default: no quotas)")
    p.add_argument("--policy", default="tessera", help="policy name (default tessera)")
    p.add_argument("--compare", type=_policy_list, metavar="P1,P2,...",
                   help=COMPARE_HELP)  # fmt: skip
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--seed", type=int, default=0, help="the policy's seed (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--eta", action="store_true", help="score the start estimates (slower; summary eta_*)")
    p.add_argument(
        "--adjust", choices=("on", "off"), default="off",
        help="run the adjustment pass on the jobs' utilisation (default off; docs/formats.md)",
    )  # fmt: skip
    p.add_argument(
        "--exclusive-gpu-shares", action="store_true",
        help="fractions of different tenants never share a GPU (tessera only; checked)",
    )  # fmt: skip

    p = sub.add_parser("pack", help="the FGD packing benchmark (docs/evaluation.md)")
    p.add_argument("--nodes", required=True, type=Path, help="NODES.csv")
    p.add_argument("--jobs", required=True, type=Path, help="JOBS.csv (the pod list)")
    p.add_argument("--policy", default="tessera", help="policy name (default tessera)")
    p.add_argument("--compare", type=_policy_list, metavar="P1,P2,...",
                   help=COMPARE_HELP)  # fmt: skip
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--seeds", type=_positive(int), default=10, help="seeds 42, 43, ... (default 10)")
    p.add_argument("--processes", type=_positive(int), default=2, help="worker processes (default 2)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser("generate", help="write nodes.csv, jobs.csv and quotas.csv")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--seed", type=int, required=True, help="random seed")
    p.add_argument("--days", type=_positive(float), required=True, help="arrival span in days")
    p.add_argument("--load", type=_positive(float), required=True, help="offered load (1.0 = full)")
    p.add_argument("--gpus", type=_positive(int), default=600, help="cluster size (default ~600)")
    p.add_argument("--skew", metavar="TENANT:MODEL:K", help="TENANT's training asks K× its MODEL guarantee")
    p.add_argument(
        "--steady-share", type=float, default=0.0, help="share of training/fine-tunes not preemptible"
    )
    p.add_argument("--tightness", type=float, default=1.0, help="Σ guarantees ÷ capacity (default 1)")
    p.add_argument("--gang-share", type=float, default=0.25, help="share of training that are gangs")
    p.add_argument("--limit-over", default="1.2,5", metavar="LO,HI", help="time limit ÷ runtime range")
    p.add_argument("--burst", type=float, default=0.0, help="chance a job arrives with the one before")
    p.add_argument(
        "--recurring",
        type=float,
        default=0.0,
        help="share of jobs rerunning a user's earlier job (user, name)",
    )

    p = sub.add_parser("check", help="check an events file against its inputs")
    p.add_argument("nodes", type=Path, metavar="NODES.csv")
    p.add_argument("jobs", type=Path, metavar="JOBS.csv")
    p.add_argument("events", type=Path, metavar="EVENTS.jsonl")
    p.add_argument("quotas", type=Path, nargs="?", metavar="QUOTAS.csv")
    p.add_argument(
        "--adjust", choices=("on", "off"), default="off",
        help="the events come from replay --adjust on (progress at up to real time, idle reclaims)",
    )  # fmt: skip
    p.add_argument(
        "--exclusive-gpu-shares", action="store_true",
        help="also a violation: a GPU holding fractions of two tenants at once",
    )  # fmt: skip
    p.add_argument(
        "--unfinished-ok",
        action="store_true",
        help="the events are a live cluster's history so far (manage.py export_trace while jobs "
        "still run): jobs pending or running after the last event are no violation",
    )
    return parser


def _known_policies(requested: Sequence[str]) -> None:
    policies.check_names(requested, policies.names())


def _replay(args: argparse.Namespace) -> int:
    names = args.compare or [args.policy]
    _known_policies(names)
    others = [n for n in names if n != "tessera"]
    if args.exclusive_gpu_shares and others:
        raise policies.PolicyError(f"--exclusive-gpu-shares is tessera's option; {others[0]!r} has none")
    plots.require()
    if args.compare:
        summaries = runner.compare_replay(
            args.nodes,
            args.jobs,
            args.quotas,
            names,
            args.out,
            args.seed,
            show_progress=not args.quiet,
            adjust=args.adjust == "on",
            exclusive_gpu_shares=args.exclusive_gpu_shares,
        )
        print((args.out / "compare.md").read_text(encoding="utf-8"))
        return 0 if all(s["check"]["ok"] for s in summaries.values()) else 1
    s = runner.run_replay(
        args.nodes, args.jobs, args.quotas, args.policy, args.out, args.seed,
        show_progress=not args.quiet, estimates=args.eta, adjust=args.adjust == "on",
        exclusive_gpu_shares=args.exclusive_gpu_shares,
    )  # fmt: skip
    print(runner.replay_table({args.policy: s}))
    print(f"wrote {args.out}/events.jsonl, summary.json and plots")
    return 0


def _pack(args: argparse.Namespace) -> int:
    names = args.compare or [args.policy]
    _known_policies(names)
    plots.require()
    if args.compare:
        runner.compare_pack(
            args.nodes, args.jobs, names, args.out, args.seeds, args.processes, not args.quiet
        )
        print((args.out / "compare.md").read_text(encoding="utf-8"))
        return 0
    s = runner.run_pack_policy(
        args.nodes, args.jobs, args.policy, args.out, args.seeds, args.processes, not args.quiet
    )
    print(runner.pack_table({args.policy: s}))
    return 0


def _generate(args: argparse.Namespace) -> int:
    try:
        scenario = _scenario(args)
        info = generate(args.out, args.seed, args.days, args.load, args.gpus, scenario)
    except ValueError as exc:  # bounds the parser cannot see (e.g. too small a span)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info))
    return 0


def _scenario(args: argparse.Namespace) -> Scenario:
    """The generate command's scenario knobs; ValueError names the bad one."""
    skew = ("", "", 0.0)
    if args.skew:
        parts = args.skew.split(":")
        try:
            skew = (parts[0], parts[1], float(parts[2]))
        except (IndexError, ValueError):
            raise ValueError(f"--skew {args.skew!r}: expected TENANT:MODEL:K, e.g. vision:H100:2") from None
    try:
        lo, hi = (float(x) for x in args.limit_over.split(","))
    except ValueError:
        raise ValueError(f"--limit-over {args.limit_over!r}: expected LO,HI, e.g. 1.2,5") from None
    return Scenario(
        *skew, args.steady_share, args.tightness, args.gang_share, (lo, hi), args.burst, args.recurring
    )


def _check(args: argparse.Namespace) -> int:
    nodes = read_nodes(args.nodes)
    jobs = read_jobs(args.jobs)
    quotas = read_quotas(args.quotas) if args.quotas else None
    report = check(
        nodes, jobs, read_events(args.events), quotas, unfinished_ok=args.unfinished_ok,
        adjust=args.adjust == "on", exclusive_gpu_shares=args.exclusive_gpu_shares,
    )  # fmt: skip
    for line in report.violations[:SHOWN]:
        print(line)
    if len(report.violations) > SHOWN:
        kinds = Counter(_kind(v) for v in report.violations)
        print(f"... and {len(report.violations) - SHOWN} more; by kind:")
        for kind, n in kinds.most_common():
            print(f"  {n:6d}  {kind}")
    a = report.avoidable
    if a.get("jobs_with_avoidable_wait"):
        by_kind = ", ".join(f"{k} {v:g} h" for k, v in a["avoidable_wait_by_kind_h"].items() if v)
        print(
            f"avoidable wait (pending while it could have started at once): "
            f"{a['avoidable_wait_total_h']:g} h over {a['jobs_with_avoidable_wait']} jobs ({by_kind}); "
            f"longest {a['avoidable_wait_max_h']:g} h (job {a['avoidable_wait_max_job']})"
        )
    verdict = "OK" if report.ok else f"{len(report.violations)} violation(s)"
    print(f"check: {report.jobs} jobs, {report.events} events: {verdict}")
    return 0 if report.ok else 1


def _kind(violation: str) -> str:
    """A violation's message without its place and numbers, to count violations by kind."""
    why = violation.split("): ", 1)[-1] if violation.startswith("line ") else violation.split(": ", 1)[-1]
    return re.sub(r"\S*\d\S*", "#", why.split(" (")[0])


COMMANDS = {"replay": _replay, "pack": _pack, "generate": _generate, "check": _check}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (
        TraceError,
        EventsError,
        ReplayError,
        PackError,
        policies.PolicyError,
        plots.PlotsUnavailable,
        csv.Error,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except (OSError, UnicodeDecodeError) as exc:
        where = getattr(exc, "filename", None)
        why = getattr(exc, "strerror", None) or str(exc)
        print(f"error: {where}: {why}" if where else f"error: {why}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 2

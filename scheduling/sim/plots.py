"""PNG plots of replays (matplotlib, Agg backend: no display needed).

One run: ``allocation.png`` (GPU allocation and fragmentation over time), ``queue.png`` (jobs
waiting, by kind — the queue levels), ``jct.png`` (JCT distribution by kind). Several policies:
``compare.png`` with all of them side by side on the same axes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduling.engine.types import KINDS

HOUR = 3600.0


INSTALL_HINT = "pip install -e '.[sim]'"


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed: the simulator's plots need the ``sim`` extra."""


def require() -> None:
    """Raise :class:`PlotsUnavailable` (with how to install it) unless matplotlib can be imported;
    called before a run that ends in plots, so that none is run only to fail at its end."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotsUnavailable(
            f"the simulator's plots need matplotlib, which is in Tessera's 'sim' extra: {INSTALL_HINT}"
        ) from None


def pyplot():  # noqa: ANN201 - matplotlib's pyplot module
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    require()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _hours(ts: list[float]) -> list[float]:
    return [t / HOUR for t in ts]


def _cdf(ax: Any, values: list[float], label: str) -> None:
    xs = sorted(v / HOUR for v in values if v > 0)
    if not xs:
        return
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})", linewidth=1.1)


def plot_run(out: Path, series: Mapping[str, Any], title: str) -> list[Path]:
    """Write the three plots of one replay into ``out``; return their paths."""
    plt = pyplot()
    hours = _hours(series["t"])
    paths = []

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(hours, [100 * a for a in series["allocation"]], label="GPU allocation", linewidth=1)
    frag = [(h, 100 * f) for h, f in zip(hours, series["fragmentation"], strict=True) if f is not None]
    if frag:
        ax.plot(*zip(*frag, strict=True), label="fragmentation of free capacity", linewidth=0.8, alpha=0.7)
    ax.set(xlabel="simulated time (h)", ylabel="%", ylim=(0, 101), title=f"{title}: allocation")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    paths.append(out / "allocation.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    for kind in KINDS:
        ax.plot(hours, series["queue"][kind], label=kind, linewidth=1)
    ax.set(xlabel="simulated time (h)", ylabel="jobs waiting", title=f"{title}: queue by level")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "queue.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    for kind in KINDS:
        _cdf(ax, series["jct"][kind], kind)
    ax.set_xscale("log")
    ax.set(xlabel="job completion time (h, log)", ylabel="fraction of jobs", title=f"{title}: JCT")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    paths.append(out / "jct.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def plot_compare(path: Path, runs: Mapping[str, Mapping[str, Any]], title: str) -> Path:
    """Allocation over time, jobs waiting, and JCT distribution, one line per policy."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for policy, series in runs.items():
        hours = _hours(series["t"])
        axes[0].plot(hours, [100 * a for a in series["allocation"]], label=policy, linewidth=0.9)
        waiting = [sum(series["queue"][k][i] for k in KINDS) for i in range(len(hours))]
        axes[1].plot(hours, waiting, label=policy, linewidth=0.9)
        _cdf(axes[2], [x for k in KINDS for x in series["jct"][k]], policy)
    axes[0].set(xlabel="simulated time (h)", ylabel="GPU allocation (%)", ylim=(0, 101))
    axes[1].set(xlabel="simulated time (h)", ylabel="jobs waiting")
    axes[2].set_xscale("log")
    axes[2].set(xlabel="JCT (h, log)", ylabel="fraction of jobs")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_pack_compare(path: Path, results: Mapping[str, Mapping[str, Any]], title: str) -> Path:
    """Allocation at 100% and 130% arrived demand per policy (mean over seeds), as bars."""
    plt = pyplot()
    names = list(results)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4.5))
    width = 0.38
    for i, (key, label) in enumerate(
        (("gpu_allocation_rate_at_100", "at 100% arrived"), ("gpu_allocation_rate_at_130", "at 130%"))
    ):
        values = [100 * (results[n].get(key) or 0.0) for n in names]
        xs = [j + (i - 0.5) * width for j in range(len(names))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=6)
    ax.set_xticks(range(len(names)), names)
    low = min((100 * (r.get("gpu_allocation_rate_at_100") or 0)) for r in results.values())
    ax.set(ylabel="GPU allocation rate (%)", ylim=(max(0, low - 10), 100), title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2, frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

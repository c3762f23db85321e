"""The fleet benchmark's figure (matplotlib, a dev extra): one PNG with the devices on
each version over time, concurrent downloads around the production release, and the
servers' requests, bytes and CPU per idle poll, refresh and update, git against gitless.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib as mpl

mpl.use("Agg")  # files only: no display on a benchmark machine

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter, ScalarFormatter

from benchmarks._fleet_repo import NEW, OLD

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from benchmarks.fleet import Size

_COLOURS = {"git": "tab:red", "artifacts": "tab:blue"}
_KINDS = ("idle_poll", "refresh", "update")


def _style(run: dict[str, Any]) -> dict[str, Any]:
    params = run["params"]
    return {
        "color": _COLOURS[params["mode"]],
        "linestyle": "-" if params["jitter"] else ":",
        "label": run["label"],
    }


def _versions(ax: Axes, runs: dict[str, dict[str, Any]], devices: int) -> None:
    for run in runs.values():
        timeline, poll = run["timeline"], run["params"]["poll_s"]
        zero = timeline["releases_s"]["canary"]
        times = [0.0, *((t - zero) / poll for t in timeline["installs_s"])]
        end = (timeline["end_s"] - zero) / poll
        on_new = list(range(len(times)))
        style = _style(run)
        ax.step([*times, end], [*on_new, on_new[-1]], where="post", **style)
        ax.step([*times, end], [devices - n for n in [*on_new, on_new[-1]]], where="post",
                **{**style, "label": None, "alpha": 0.4})  # fmt: skip
        production = (timeline["releases_s"]["production"] - zero) / poll
        ax.axvline(production, color=style["color"], alpha=0.3, linewidth=0.8)
    ax.axvline(0, color="black", alpha=0.5, linewidth=0.8)
    ax.set_xlabel("poll intervals since the canary release (thin lines: production releases)")
    ax.set_ylabel(f"devices on {NEW} (bold), on {OLD} (pale)")
    ax.set_title("Devices on each version")
    ax.set_ylim(0, devices * 1.02)
    ax.legend(fontsize="small")


def _downloads(ax: Axes, runs: dict[str, dict[str, Any]]) -> None:
    for run in runs.values():
        timeline = run["timeline"]
        zero = timeline["releases_s"]["production"]
        edges = sorted(
            [(s - zero, 1) for s, _ in timeline["downloads_s"] if s >= zero]
            + [(e - zero, -1) for s, e in timeline["downloads_s"] if s >= zero]
        )
        xs, ys, now = [0.0], [0], 0
        for t, step in edges:
            now += step
            xs.append(t)
            ys.append(now)
        ax.step(xs, ys, where="post", **_style(run))
    ax.set_xlabel("seconds since the production release")
    ax.set_ylabel("concurrent downloads")
    ax.set_title("Downloads in flight (emulated device link)")
    ax.legend(fontsize="small")


def _costs(axes: list[Axes], runs: dict[str, dict[str, Any]]) -> None:
    chosen = [r for r in runs.values() if r["params"]["jitter"]] or list(runs.values())
    width = 0.8 / max(len(chosen), 1)
    metrics = (("requests", "requests"), ("bytes", "bytes"), ("cpu_ms", "server CPU ms"))
    for ax, (key, title) in zip(axes, metrics, strict=True):
        for i, run in enumerate(chosen):
            values = [max(run["costs"][kind][key], 1e-3) for kind in _KINDS]
            xs = [k + (i - (len(chosen) - 1) / 2) * width for k in range(len(_KINDS))]
            style = _style(run)
            bars = ax.bar(xs, values, width, color=style["color"], label=style["label"])
            ax.bar_label(bars, [f"{v:.3g}" for v in values], fontsize="x-small")
        ax.set_xticks(range(len(_KINDS)), ["idle poll", "refresh", "update"])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{title} per device poll (both servers)")
        ax.legend(fontsize="small")


def plot_runs(runs: dict[str, dict[str, Any]], size: Size, path: Path) -> Path:
    """Draw the runs of one benchmark into ``path`` (PNG); returns it."""
    fig = plt.figure(figsize=(15, 9), layout="constrained")
    grid = fig.add_gridspec(2, 3)
    _versions(fig.add_subplot(grid[0, :2]), runs, size.devices)
    _downloads(fig.add_subplot(grid[0, 2]), runs)
    _costs([fig.add_subplot(grid[1, i]) for i in range(3)], runs)
    fig.suptitle(
        f"Fleet simulation: {size.devices} devices, poll interval {size.poll_s:g} s "
        "(servers on loopback; git daemon and HTTP artifact server)"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

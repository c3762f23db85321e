"""``fleet status`` for people: tables of versions and rollouts, then the devices that
need a look (failed, stale, unreadable).  Long lists are cut; ``--json`` has them all."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet.reports import LoadedReports
from fleet.summary import ChannelProgress, FleetSummary

__all__ = ["age_text", "render_json", "render_text"]

SHOWN: Final = 10
"""Devices listed per kind of problem before "... and N more"."""


def age_text(seconds: float) -> str:
    """``45s``, ``16m``, ``2h 03m``, ``3d 04h``: how long ago, to a useful precision."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _cut(lines: list[str], what: str) -> list[str]:
    if len(lines) <= SHOWN:
        return lines
    return [*lines[:SHOWN], f"  ... and {len(lines) - SHOWN} more {what} (--json lists all)"]


def _cells(*values: object) -> list[Text]:
    # Text, not str: rich would read "[...]" in a value as markup
    return [Text("-" if v is None else str(v)) for v in values]


def render_json(
    summary: FleetSummary,
    loaded: LoadedReports,
    *,
    now: datetime,
    stale_after_s: float,
    repository: Path | None,
) -> dict[str, Any]:
    """The machine report of ``fleet status --json``."""
    return {
        "source": loaded.source,
        "repository": None if repository is None else str(repository),
        "now": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "stale_after_s": stale_after_s,
        "devices": summary.devices,
        "versions": [
            {
                "model": model,
                "version": version,
                "devices": n,
                "approvers": summary.approvers.get(model, {}).get(version or ""),
            }
            for model, counts in summary.versions.items()
            for version, n in counts.items()
        ],
        "channels": [c.to_json() for c in summary.channels],
        "undeclared": [{"model": m, "channel": c, "devices": n} for m, c, n in summary.undeclared],
        "stale": [
            {
                "device": s.device,
                "reported": s.reported.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "age_s": round(s.age_s, 3),
            }
            for s in summary.stale
        ],
        "trust_stale": summary.trust_stale,
        "stopped": summary.stopped,
        "unreadable": [{"source": u.source, "reason": u.reason} for u in loaded.unreadable],
        "skipped": loaded.skipped,
        "authenticated": loaded.authenticated,
        "untrusted": [{"source": u.source, "reason": u.reason} for u in loaded.untrusted],
    }


def _report_lines(loaded: LoadedReports, repository: bool) -> list[str]:
    """The reports that were not read or do not count, and whether any was checked."""
    lines = _cut([f"unreadable: {u.source}: {u.reason}" for u in loaded.unreadable], "reports")
    lines += _cut([f"not counted: {u.source}: {u.reason}" for u in loaded.untrusted], "reports")
    if repository and not loaded.authenticated:
        lines.append(
            "reports are not authenticated: the repository enrolls no device "
            "(modelreg fleet enroll DEVICE --public-key FILE)"
        )
    if loaded.skipped:
        lines.append(f"not read: {loaded.skipped} more reports (over the limit)")
    return lines


def _behaviour_lines(c: ChannelProgress) -> list[str]:
    """The channel's current wave as its cohort's shadow comparisons saw it: the figures
    judged, then those against another previous version (shown, not judged)."""
    lines = []
    for i, found in enumerate(c.comparisons):
        head = "behaviour" if i == 0 else "behaviour, not judged"
        still = " (still comparing)" if found.open else ""
        lines.append(
            f"{head}: {c.model}@{c.channel} {c.version} against {found.against}: "
            f"{found.text()}{still}"
        )
    return _cut(lines, "comparisons")


def render_text(
    summary: FleetSummary,
    loaded: LoadedReports,
    *,
    stale_after_s: float,
    repository: Path | None,
    color: bool = False,
    width: int = 120,
) -> str:
    """The human report of ``fleet status``."""
    out = io.StringIO()
    console = Console(
        file=out, width=width, force_terminal=color, no_color=not color,
        color_system="standard" if color else None, highlight=False,
    )  # fmt: skip
    head = f"{summary.devices} device{'s' if summary.devices != 1 else ''} reporting"
    console.print(Text(f"{head} in {loaded.source}"), style="bold")
    versions = Table(
        "model", "version", "devices", "approved by", title="Versions", title_justify="left"
    )
    for model, counts in summary.versions.items():
        for version, n in counts.items():
            approved = summary.approvers.get(model, {})
            who = approved.get(version or "")
            shown = "-" if version not in approved else ", ".join(who or []) or "no one"
            if version in approved and who is None:
                shown = "not counted"
            versions.add_row(*_cells(model, version or "(nothing yet)", n, shown))
    if summary.versions:
        console.print(versions)
    if summary.channels:
        rollouts = Table(
            "model", "channel", "target", "percent", "following", "cohort", "on target",
            "pending", "failed", "stale", title="Rollouts", title_justify="left",
        )  # fmt: skip
        for c in summary.channels:
            percent = "100" if c.percent is None else f"{c.percent:g}"
            rollouts.add_row(*_cells(
                c.model, c.channel, c.version, percent, c.subscribed, c.cohort, c.on_target,
                len(c.pending), len(c.failed), len(c.stale),
            ))  # fmt: skip
        console.print(rollouts)
    lines: list[str] = []
    for c in summary.channels:
        where = f"{c.model}@{c.channel} {c.version}"
        if c.hold:
            lift = f"modelreg fleet resume {c.model} -c {c.channel}"
            lines.append(f"held: {where}: {c.hold} ({lift})")
        lines += _behaviour_lines(c)
        lines += _cut([f"failed: {where} on {d}: {why}" for d, why in c.failed], "failures")
        waiting = [f"waiting: {where} on {d}: {why}" for d, why in c.pending if why]
        lines += _cut(waiting, "waiting devices")
    for model, channel, n in summary.undeclared:
        lines.append(f"not declared: {model}@{channel} is followed by {n} device(s)")
    lines += _cut(
        [f"stale: {s.device} (last report {age_text(s.age_s)} ago)" for s in summary.stale],
        "stale devices",
    )
    lines += _cut(
        [f"trust metadata expired on {d}: it installs nothing new" for d in summary.trust_stale],
        "devices",
    )
    lines += _cut(
        [f"stopped: {d} (its daemon stopped: it serves nothing now)" for d in summary.stopped],
        "stopped devices",
    )
    lines += _report_lines(loaded, repository is not None and summary.devices > 0)
    if repository is None and summary.devices:
        lines.append("no rollout progress: no model repository here (give --repo)")
    for line in lines:
        console.print(Text(line))
    console.print(Text(f"(stale: no report for over {age_text(stale_after_s)})"), style="dim")
    # rich pads a table's title to the table's width
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())

"""``modelreg fleet advance``: commit the next rollout wave when the fleet allows it.

Exit codes: 0 when every channel advanced, waits, is done or was already on hold;
1 when a stop condition tripped (the rollout is put on hold, committed, and each line
says why) or on any domain error; 2 on a usage error.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from modelreg.cli._output import detail, emit_json, error_lines, ok

if TYPE_CHECKING:
    from fleet.advance import ChannelStep
    from fleet.reports import LoadedReports
    from fleet.summary import ChannelProgress

REPORTS_ENV = "MODELREG_FLEET_REPORTS"
_SHOWN_FAILURES = 5
"""Failed devices listed under a stop (the JSON lists them all)."""


def _step_json(step: ChannelStep, seen: dict[tuple[str, str], ChannelProgress]) -> dict[str, Any]:
    out = step.to_json()
    found = seen.get((step.target.model, step.target.channel))
    if found is not None:
        out["progress"] |= {
            "failed_devices": [{"device": d, "reason": r} for d, r in found.failed],
            "stale": len(found.stale),
        }
    return out


@click.command("advance")
@click.option(
    "--reports",
    "reports_url",
    required=True,
    envvar=REPORTS_ENV,
    show_envvar=True,
    metavar="URL",
    help="Where the devices' reports are: a folder, file://, s3://bucket/prefix/ or an "
    "http(s):// listing.",
)
@click.option(
    "--repo",
    "repo_path",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A folder inside the model repository (default: the current one).",
)
@click.option("--model", "model", default=None, help="Only this model's channels.")
@click.option("--channel", "-c", "channel", default=None, help="Only channels of this name.")
@click.option("--dry-run", is_flag=True, help="Decide and report; write and commit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON.")
def advance(
    reports_url: str,
    repo_path: Path | None,
    model: str | None,
    channel: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Commit the next wave of each staged rollout the device reports allow.

    A channel whose rollout lists waves moves to the next wave's percent (one commit
    of its model.yaml, on the model's promotion branch) once its current wave has been
    released for at least its soak time, no more than stop.failure_share of the
    wave's devices failed the version, and at least stop.min_reports of them run it;
    with behaviour conditions (stop.min_agreement, max_output_drift, max_p99_ratio),
    once the wave's devices compared stop.min_compared requests with the previous
    version (the channel's shadow) and the answers agree enough.  When too many
    failed, or the answers do not agree enough, the rollout is put on hold
    (rollout.hold, committed, exit code 1); it never goes back by itself: lift the
    hold, or roll back.
    """
    from fleet.advance import advance as do_advance
    from fleet.advance import progress_from_reports
    from fleet.reports import load_reports
    from fleet.trust import repository_trust
    from registry.errors import RepositoryError

    now = datetime.now(UTC)
    try:
        root, trust = repository_trust(repo_path or Path.cwd(), required=True)
    except RepositoryError as e:
        if repo_path is not None or "not inside a modelreg repository" not in str(e):
            raise
        # the rollouts live in the model repository: run it there, or name it
        raise RepositoryError(
            f"{Path.cwd()}: not inside a modelreg repository (the rollouts are in the "
            "model repository's manifests): run it there, or give --repo PATH"
        ) from None
    assert root is not None  # noqa: S101 - required=True
    # only reports signed by enrolled devices move a wave (when the repository enrolls any)
    loaded = load_reports(reports_url, trust=trust)
    seen: dict[tuple[str, str], ChannelProgress] = {}
    steps = do_advance(
        root,
        progress_from_reports(loaded.reports, now, seen),
        model=model,
        channel=channel,
        now=now,
        dry_run=dry_run,
    )
    stopped = [s for s in steps if s.action == "stop"]
    if as_json:
        emit_json(
            {
                "ok": not stopped,
                "dry_run": dry_run,
                "reports": {
                    "source": loaded.source,
                    "read": len(loaded.reports),
                    "unreadable": len(loaded.unreadable),
                    "skipped": loaded.skipped,
                    "authenticated": loaded.authenticated,
                    "not_counted": [
                        {"source": u.source, "reason": u.reason} for u in loaded.untrusted
                    ],
                },
                "channels": [_step_json(s, seen) for s in steps],
            }
        )
    else:
        _print(steps, seen, loaded, dry_run)
    if stopped:
        raise SystemExit(1)


def _print(
    steps: list[ChannelStep],
    seen: dict[tuple[str, str], ChannelProgress],
    loaded: LoadedReports,
    dry_run: bool,
) -> None:
    if loaded.unreadable or loaded.skipped:
        detail(
            f"reports: {len(loaded.reports)} read from {loaded.source}, "
            f"{len(loaded.unreadable)} unreadable, {loaded.skipped} over the limit (not counted)"
        )
    for untrusted in loaded.untrusted:
        detail(f"not counted: {untrusted.source}: {untrusted.reason}")
    if not steps:
        detail("no channel has rollout waves")
    for step in steps:
        line = step.text()
        if dry_run and step.action in ("advance", "stop"):
            line += " (dry run: nothing committed)"
        if step.action == "stop":
            found = seen.get((step.target.model, step.target.channel))
            failed = found.failed if found is not None else ()
            error_lines([f"modelreg: {line}"])
            error_lines(f"  {device}: {reason}" for device, reason in failed[:_SHOWN_FAILURES])
            if len(failed) > _SHOWN_FAILURES:
                error_lines([f"  ... and {len(failed) - _SHOWN_FAILURES} more (--json lists all)"])
        elif step.action == "advance":
            ok(line)
        else:
            detail(line)


def attach(root: click.Group) -> None:
    """Add ``advance`` to the ``fleet`` group of ``root`` (made if it has none yet)."""
    group = root.commands.get("fleet")
    if not isinstance(group, click.Group):
        group = click.Group("fleet", help="What the fleet runs, and its rollout waves.")
        root.add_command(group)
    group.add_command(advance)

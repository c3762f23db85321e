"""``modelreg fleet status`` (what every device runs, from the reports devices send) and
``fleet hold``/``fleet resume`` (a staged rollout held by hand, staged like promote)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from modelreg.cli._output import emit_json, error_lines, is_tty

_REPORTS = click.option(
    "--reports",
    "url",
    required=True,
    metavar="URL",
    help="Where devices send their reports (edge.yaml's report.url): a folder, file://, "
    "s3://bucket/prefix/ or an http(s):// folder with a JSON listing.",
)
_STALE_AFTER = click.option(
    "--stale-after",
    default="15m",
    show_default=True,
    metavar="DURATION",
    help="A device whose last report is older than this is stale (30s, 15m, 1h).",
)


def _stale_after_s(text: str) -> float:
    from edge_sync.config import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--stale-after") from None


def _exit_when_unread(loaded: Any, as_json: bool) -> None:
    """As every fleet command ends: exit 1 when no report could be read at all (every
    one listed and unreadable: access refused, say); say so when the source holds none."""
    if loaded.unreadable and not loaded.reports:
        n = len(loaded.unreadable)
        error_lines([f"modelreg: none of the {n} reports in {loaded.source} could be read"])
        sys.exit(1)
    if not loaded.reports and loaded.untrusted and not as_json:
        n = len(loaded.untrusted)
        said = (
            f"modelreg: none of the {n} reports in {loaded.source} counts (not signed by an "
            "enrolled device, or replayed)"
        )
        error_lines([said])
    elif not loaded.reports and not as_json:
        error_lines([f"modelreg: no device reports in {loaded.source}"])


_REPO = click.option(
    "--repo",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The model repository (default: the one around the current folder, if any): its "
    "enrolled devices are the only ones whose signed reports count.",
)


@click.group()
def fleet() -> None:
    """The fleet as its devices report it."""


@fleet.command("status")
@_REPORTS
@click.option(
    "--repo",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The model repository whose channels give each rollout's target and percent "
    "(default: the one around the current folder, if any).",
)
@_STALE_AFTER
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def fleet_status(url: str, repo: Path | None, stale_after: str, as_json: bool) -> None:
    """Devices per model and version, each channel's rollout progress (cohort, on the
    target, failures and why, how the wave's answers compare with the previous
    version's), stale devices, and reports that could not be read.

    Exit code 0 when the reports were read (some may be unreadable: they are listed),
    1 when they cannot be read at all (the source, or every report in it).
    """
    from datetime import UTC, datetime

    from fleet.channels import declared_channels
    from fleet.render import render_json, render_text
    from fleet.reports import load_reports
    from fleet.summary import ChannelTarget, summarize
    from fleet.trust import repository_trust

    stale_after_s = _stale_after_s(stale_after)
    root, trust = repository_trust(repo or Path.cwd(), required=repo is not None)
    loaded = load_reports(url, trust=trust)
    models = {name for r in loaded.reports for name in r.models}
    channels: dict[str, dict[str, ChannelTarget]] = {}
    if root is not None:
        root, channels = declared_channels(root, models)
    now = datetime.now(UTC)
    summary = summarize(loaded.reports, channels, now=now, stale_after_s=stale_after_s)
    if as_json:
        emit_json(render_json(summary, loaded, now=now, stale_after_s=stale_after_s,
                              repository=root))  # fmt: skip
    else:
        text = render_text(summary, loaded, stale_after_s=stale_after_s, repository=root,
                           color=is_tty())  # fmt: skip
        click.echo(text, nl=False)
    _exit_when_unread(loaded, as_json)


@fleet.command("devices")
@_REPORTS
@click.option("--model", default=None, help="Only this model's rows.")
@click.option(
    "--label", "labels", multiple=True, metavar="KEY=VALUE",
    help="Only devices with this label (repeatable: all of them).",
)  # fmt: skip
@_STALE_AFTER
@_REPO
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def fleet_devices(
    url: str,
    model: str | None,
    labels: tuple[str, ...],
    stale_after: str,
    repo: Path | None,
    as_json: bool,
) -> None:
    """One row per device and model: labels, channel, version served, last update and
    why, last seen (stale or not), trust expiry; sorted by device.

    Exit code 0 when the reports were read (unreadable ones are listed), 1 when they
    cannot be read at all, as fleet status.
    """
    from datetime import UTC, datetime

    from fleet.devices import device_rows, render_rows
    from fleet.reports import load_reports
    from fleet.trust import repository_trust

    stale_after_s = _stale_after_s(stale_after)
    wanted = {}
    for label in labels:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{label!r} is not KEY=VALUE", param_hint="--label")
        wanted[key] = value
    _, trust = repository_trust(repo or Path.cwd(), required=repo is not None)
    loaded = load_reports(url, trust=trust)
    rows = device_rows(loaded.reports, now=datetime.now(UTC), stale_after_s=stale_after_s,
                       model=model, labels=wanted)  # fmt: skip
    unreadable = [{"report": u.source, "reason": u.reason} for u in loaded.unreadable]
    untrusted = [{"report": u.source, "reason": u.reason} for u in loaded.untrusted]
    if as_json:
        emit_json({"source": loaded.source, "devices": [r.to_json() for r in rows],
                   "unreadable": unreadable, "untrusted": untrusted,
                   "authenticated": loaded.authenticated})  # fmt: skip
    elif rows:
        click.echo(render_rows(rows), nl=False)
    if not as_json:
        error_lines([f"unreadable: {u['report']}: {u['reason']}" for u in unreadable])
        error_lines([f"not counted: {u['report']}: {u['reason']}" for u in untrusted])
    _exit_when_unread(loaded, as_json)


@fleet.command("hold")
@click.argument("name")
@click.option("--channel", "-c", required=True, help="The channel whose rollout to hold.")
@click.option("--reason", required=True, help="Why (one line): shown wherever the hold is.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def fleet_hold(name: str, channel: str, reason: str, as_json: bool) -> None:
    """Hold the staged rollout of CHANNEL of model NAME: `fleet advance` takes no next
    wave until `fleet resume` (devices keep what the current wave gives them).

    Edits model.yaml and stages it, as promote does: commit it and open a pull request.
    """
    _hold(name, channel, reason, as_json)


@fleet.command("resume")
@click.argument("name")
@click.option("--channel", "-c", required=True, help="The channel whose rollout to resume.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def fleet_resume(name: str, channel: str, as_json: bool) -> None:
    """Lift the hold on the staged rollout of CHANNEL of model NAME (`fleet advance`
    takes the next wave again when it is due). Staged like promote."""
    _hold(name, channel, None, as_json)


def _hold(name: str, channel: str, reason: str | None, as_json: bool) -> None:
    from modelreg.cli._output import detail, ok
    from registry.promote import hold

    result = hold(Path.cwd(), name, channel, reason)
    if as_json:
        emit_json({
            "model": name, "channel": result.channel, "version": result.version,
            "hold": result.reason, "previous_hold": result.previous,
            "changed": result.changed, "manifest": result.file,
        })  # fmt: skip
        return
    if not result.changed:
        state = f"on hold ({result.reason})" if result.reason else "not on hold"
        ok(f"{name} {channel} is already {state}; nothing changed")
        return
    what = f"held ({result.reason})" if result.reason else "resumed"
    ok(f"{name} {channel} rollout of {result.version} {what} in {result.file}; "
       "commit it and open a pull request")  # fmt: skip
    if result.reason is None:
        detail(f"  the hold was: {result.previous}")


@fleet.command("enroll")
@click.argument("device", required=False)
@click.option(
    "--public-key",
    "public_key",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The device's public key (PEM: `modelreg edge key` prints it on the device).",
)
@click.option(
    "--from",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    help="Enroll every <device-id>.pub of this folder (a factory line's collection).",
)
@click.option("--replace", is_flag=True, help="Replace the key of a device enrolled before.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def fleet_enroll(
    device: str | None,
    public_key: Path | None,
    folder: Path | None,
    replace: bool,
    as_json: bool,
) -> None:
    """Enroll DEVICE (its public key into the repository's devices folder): from then
    on, only reports signed by enrolled devices count in fleet status, fleet devices and
    fleet advance.

    Writes devices/<DEVICE>.pub and stages it, as promote does: commit it and open a
    pull request (it needs the approvals of the strictest policy).
    """
    from fleet.enrollment import enroll, keys_in_folder
    from modelreg.cli._output import detail, ok
    from registry.errors import UsageError
    from registry.safe_io import read_regular
    from signing.device_reports import MAX_KEY_BYTES

    if (folder is None) == (device is None or public_key is None):
        raise UsageError("give DEVICE with --public-key FILE, or --from FOLDER")
    if folder is not None:
        keys = keys_in_folder(folder)
    else:
        assert device is not None  # noqa: S101 - checked above
        assert public_key is not None  # noqa: S101 - checked above
        try:
            keys = {device: read_regular(public_key, max_bytes=MAX_KEY_BYTES)}
        except (OSError, ValueError) as e:
            raise UsageError(f"{public_key}: cannot read it ({e})") from None
    result = enroll(Path.cwd(), keys, replace=replace)
    if as_json:
        emit_json({"added": result.added, "replaced": result.replaced,
                   "unchanged": result.unchanged,
                   "files": [str(f) for f in result.files]})  # fmt: skip
        return
    changed = len(result.added) + len(result.replaced)
    if not changed:
        ok(f"already enrolled with these keys: {', '.join(result.unchanged)}; nothing changed")
        return
    ok(f"enrolled {changed} device(s); commit the key files and open a pull request")
    for what, devices in (("added", result.added), ("replaced", result.replaced)):
        if devices:
            detail(f"  {what}: {', '.join(devices)}")


@fleet.command("revoke")
@click.argument("device")
def fleet_revoke(device: str) -> None:
    """Revoke DEVICE: remove its key from the repository's devices folder (staged: commit
    it and open a pull request); its reports stop counting once merged."""
    from fleet.enrollment import revoke
    from modelreg.cli._output import ok

    path = revoke(Path.cwd(), device)
    ok(f"revoked {device} ({path} removed); commit it and open a pull request")

"""Mirroring into MLflow: ``register`` (and ``register --check`` for drift)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from modelreg.cli._output import detail, emit_json, error_lines, ok

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pipelines.register import Drift, ReleaseExtras


def _per_version(values: tuple[str, ...], option: str) -> dict[tuple[str, str], str]:
    """Parse repeated ``MODEL@VERSION=VALUE`` options."""
    out: dict[tuple[str, str], str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        model, at, version = key.partition("@")
        if not (sep and at and model and version and value):
            raise click.BadParameter(f"{raw!r} is not MODEL@VERSION=VALUE", param_hint=option)
        out[(model, version)] = value
    return out


def _extras(
    bundles: tuple[str, ...], reports: tuple[str, ...], summaries: tuple[str, ...]
) -> dict[tuple[str, str], ReleaseExtras]:
    from pipelines.register import ReleaseExtras

    bundle = _per_version(bundles, "--bundle")
    report = _per_version(reports, "--diff-report")
    summary = _per_version(summaries, "--diff-summary")
    return {
        key: ReleaseExtras(
            bundle=Path(bundle[key]) if key in bundle else None,
            diff_report=Path(report[key]) if key in report else None,
            diff_summary=summary.get(key),
        )
        for key in sorted({*bundle, *report, *summary})
    }


def _advice(drifts: Sequence[Drift]) -> str | None:
    """How to repair the drift ``register --check`` found (Git decides)."""
    if not drifts:
        return None
    parts = []
    if any(d.fixable for d in drifts):
        parts.append(
            "to fix: run `modelreg register` (Git decides: it sets tags, descriptions, "
            "metrics and aliases back and registers missing versions)"
        )
    if any(d.kind == "version-unknown" for d in drifts):
        parts.append(
            "MLflow versions that no manifest declares are never deleted by modelreg: "
            "delete them in MLflow, or declare them with `modelreg version add`"
        )
    if any(not d.fixable and d.kind != "version-unknown" for d in drifts):
        parts.append("the others need the change each line names")
    return "; ".join(parts)


@click.command()
@click.option(
    "--check", is_flag=True, help="Report drift from Git and exit 1 if any; change nothing."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--tracking-uri",
    metavar="URI",
    help="MLflow to mirror into (default: MLFLOW_TRACKING_URI, modelreg.yaml mlflow.uri, "
    "else .modelreg/mlflow.db).",
)
@click.option(
    "--bundle",
    "bundles",
    multiple=True,
    metavar="MODEL@VERSION=PATH",
    help="OMS bundle of a version: attached, its digest tagged.",
)
@click.option(
    "--diff-report",
    "reports",
    multiple=True,
    metavar="MODEL@VERSION=PATH",
    help="Markdown diff report of a version: attached.",
)
@click.option(
    "--diff-summary",
    "summaries",
    multiple=True,
    metavar="MODEL@VERSION=TEXT",
    help="One-line diff summary of a version: tagged.",
)
def register(
    check: bool,
    as_json: bool,
    tracking_uri: str | None,
    bundles: tuple[str, ...],
    reports: tuple[str, ...],
    summaries: tuple[str, ...],
) -> None:
    """Mirror released versions and channels into MLflow (Git is the source of truth).

    Every committed ModelVersion becomes an MLflow model version (ONNX flavor, tagged
    with its commit, digests and lineage); every channel becomes an alias. Running it
    again changes only what differs. With --check, prints one line per difference
    (aliases or versions changed by hand in MLflow) and exits 1 if there are any.
    """
    from pipelines.register import check_drift, drift_json
    from pipelines.register import register as mirror

    extras = _extras(bundles, reports, summaries)
    if check:
        drifts = check_drift(Path.cwd(), tracking_uri=tracking_uri, extras=extras)
        advice = _advice(drifts)
        if as_json:
            emit_json({"ok": not drifts, "drift": [drift_json(d) for d in drifts], "fix": advice})
        elif drifts:
            error_lines(str(d) for d in drifts)
            error_lines([advice or ""])
        else:
            ok("MLflow mirrors Git: no drift")
        if drifts:
            sys.exit(1)
        return
    report = mirror(Path.cwd(), tracking_uri=tracking_uri, extras=extras)
    if as_json:
        emit_json(report.to_json())
    else:
        for change in report.changes:
            detail(str(change))
        for model, version in report.unreleased:
            detail(f"{model} {version}: skipped, manifest not committed")
        if report.drifts:
            error_lines(str(d) for d in report.drifts)
        else:
            count = len(report.versions)
            ok(
                f"MLflow at {report.tracking_uri} mirrors Git: {count} version"
                f"{'' if count == 1 else 's'}, {len(report.changes)} change"
                f"{'' if len(report.changes) == 1 else 's'}"
            )
    if report.drifts:
        sys.exit(1)

"""``modelreg ci pr`` and ``modelreg ci release``: what the GitHub workflows call."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from modelreg.cli._output import emit_json, error_lines, ok, warning_lines


@click.group()
def ci() -> None:
    """Pull-request checks and main-branch releases (GitHub Actions aware)."""


@ci.command("pr")
@click.option("--base", metavar="REF", help="Compare against REF (default: the PR's base commit).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def ci_pr(base: str | None, as_json: bool) -> None:
    """Validate, check promotion policy, build and diff what a pull request changes.

    Writes the PR comment to .modelreg/ci/pr-comment.md (and the job summary when
    GITHUB_STEP_SUMMARY is set); exits 1 with one line per problem if any.
    """
    from pipelines.ci import ci_pr as run

    report = run(Path.cwd(), base=base)
    uncommitted = report.data.get("uncommitted") or []
    if uncommitted and not as_json:
        from pipelines.ci import uncommitted_note

        warning_lines([f"warning: {uncommitted_note(uncommitted)}"])
    if as_json:
        emit_json({"ok": report.ok, "problems": report.problems, **report.data})
    elif report.ok:
        ok("pull request checks passed; comment in .modelreg/ci/pr-comment.md")
    if not report.ok:
        if not as_json:
            error_lines(report.problems)
        sys.exit(1)


@ci.command("release")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def ci_release(as_json: bool) -> None:
    """Build unreleased versions, publish them signed, commit the metadata ([skip ci])."""
    from pipelines.ci import ci_release as run

    report = run(Path.cwd())
    if as_json:
        emit_json({"ok": report.ok, "problems": report.problems, **report.data})
    elif report.ok:
        added = report.data.get("published") or []
        commit = report.data.get("commit")
        ok(f"released {len(added)} target(s)" + (f"; committed {commit[:8]}" if commit else ""))
    if not report.ok:
        if not as_json:
            error_lines(report.problems)
        sys.exit(1)

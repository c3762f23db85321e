"""``modelreg build``: build and test changed (or all, or one) model versions."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from modelreg.cli._output import emit_json, error_lines, ok

if TYPE_CHECKING:  # pipelines loads ONNX/DVC helpers: only when the command runs
    from pipelines.build import BuildRecord, BuildReport


@click.command()
@click.argument("name", required=False)
@click.argument("version_", metavar="[VERSION]", required=False)
@click.option(
    "--base",
    metavar="REF",
    help="Build only the versions changed since this git ref (e.g. origin/main).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def build(name: str | None, version_: str | None, base: str | None, as_json: bool) -> None:
    """Fetch, check, load, test and build engines for model versions.

    With NAME VERSION, builds that version; with --base, the versions changed since
    REF; otherwise every version. Records go to .modelreg/build/<model>/<version>/.
    Every problem is printed, one line each; the exit code is 1 if there are any.
    """
    from pipelines.build import build as run_build
    from pipelines.errors import BuildError

    if name is not None and version_ is None:
        raise click.UsageError("give both NAME and VERSION, or neither")
    if name is not None and base is not None:
        raise click.UsageError("NAME VERSION and --base exclude each other")
    versions = [(name, version_)] if name is not None and version_ is not None else None
    try:
        report = run_build(Path.cwd(), base=base, versions=versions)
    except BuildError as e:
        _show(e.report, as_json)
        if not as_json:
            error_lines(str(p) for p in e.problems)
        sys.exit(1)
    _show(report, as_json)


def _show(report: BuildReport, as_json: bool) -> None:
    if as_json:
        emit_json(report.to_json())
        return
    if not report.records:
        since = f" since {report.base}" if report.base else ""
        ok(f"nothing to build: no version changed{since}")
        return
    click.echo(render_table(report.records), nl=False)
    if report.ok:
        built = len(report.records)
        ok(f"built {built} version{'' if built == 1 else 's'}; records in .modelreg/build/")


def render_table(records: list[BuildRecord]) -> str:
    from pipelines.build import STAGES

    """Versions by stage timings (ms; ``-`` for a stage that did not run), the median
    run time against the parent's, and the targets, as text."""
    header = ["model", "version", "result", *(f"{s} ms" for s in STAGES), "p50 vs parent",
              "targets"]  # fmt: skip
    rows = [header]
    for r in records:
        timings = [f"{r.timings_ms[s]:.1f}" if s in r.timings_ms else "-" for s in STAGES]
        ratio = r.latency.ratio_p50 if r.latency is not None else None
        engines = ", ".join(f"{e.target}: {e.status}" for e in r.engines) or "-"
        rows.append([r.model, r.version, "ok" if r.ok else "FAILED", *timings,
                     f"{ratio:.2f}x" if ratio is not None else "-", engines])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    numeric = range(3, 4 + len(STAGES))
    lines = [
        "  ".join(
            cell.rjust(w) if i in numeric else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    return "\n".join(lines) + "\n"

"""``modelreg diff``: the semantic diff of two model versions (the PR comment)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from modelreg.cli._output import emit_json, ok


def _existing_parent(value: Path | None) -> Path | None:
    if value is not None and not value.parent.is_dir():
        raise click.BadParameter(f"folder {value.parent} does not exist", param_hint="--output")
    return value


@click.command()
@click.argument("name", required=False)
@click.argument("old", required=False)
@click.argument("new", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the diff as JSON instead of markdown.")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=lambda ctx, param, value: _existing_parent(value),
    help="Write the markdown report to FILE (e.g. the PR comment body).",
)
@click.option(
    "--base",
    metavar="REF",
    help="Diff every version whose manifest changed against git REF with its parent.",
)
def diff(
    name: str | None,
    old: str | None,
    new: str | None,
    as_json: bool,
    output: Path | None,
    base: str | None,
) -> None:
    """Show what changed between versions OLD and NEW of model NAME.

    Compares the ONNX artifacts in the workspace (run `dvc pull` first): opsets, I/O
    signature (breaking or compatible), nodes by op type, weights, file size, metric
    deltas and golden output drift. Prints markdown, or JSON with --json. With
    --base REF, diffs every version changed against REF instead. Inside GitHub
    Actions the markdown is also appended to the job summary.
    """
    from pipelines.diff import (
        append_step_summary,
        base_json,
        base_markdown,
        diff_against_base,
        diff_versions,
        to_json,
        to_markdown,
    )
    from registry.atomic import write_atomic
    from registry.repository import display_path

    given = [a for a in (name, old, new) if a is not None]
    if base is not None:
        if given:
            raise click.UsageError("give either NAME OLD NEW or --base REF, not both")
        result = diff_against_base(Path.cwd(), base)
        markdown = base_markdown(result)
        data = base_json(result)
    elif len(given) == 3 and name and old and new:
        one = diff_versions(Path.cwd(), name, old, new)
        markdown = to_markdown(one)
        data = to_json(one)
    else:
        raise click.UsageError("expected NAME OLD NEW (or --base REF)")
    append_step_summary(markdown, os.environ)
    if output is not None:
        write_atomic(output, markdown.encode())
    if as_json:
        emit_json(data)
    elif output is None:
        click.echo(markdown, nl=False)
    else:
        ok(f"wrote {display_path(output.absolute())}")

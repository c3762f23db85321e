"""Checking and reporting: ``validate``, ``schema``, ``status``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from modelreg.cli._output import (
    emit_json,
    error_lines,
    is_tty,
    ok,
    problem_json,
    warning_lines,
)
from registry.errors import ManifestError, Problem

if TYPE_CHECKING:
    from registry.status import VersionStatus


def _standalone(paths: list[Path]) -> tuple[list[Problem], int]:
    """Schema-check files that are not inside a modelreg repository."""
    from registry.loader import load_manifest
    from registry.repository import display_path
    from registry.yamlsrc import read_yaml

    problems: list[Problem] = []
    files = [f for p in paths for f in ([p] if not p.is_dir() else sorted(p.rglob("*.yaml")))]
    for file in files:
        try:
            load_manifest(read_yaml(file, display_path(file.absolute())))
        except ManifestError as e:
            problems.extend(e.problems)
    return problems, len(files)


def _released_problems(start: Path, *, cache: bool) -> list[Problem]:
    """What ``ci pr`` says of released versions the work tree changed (an artifact
    swapped and ``dvc add``-ed, a signed deprecation taken back), when the repository
    has trust metadata; metadata that does not load is left to ``ci pr`` and
    ``keys status``."""
    from pipelines.publish import released_changes, released_deprecations
    from registry.errors import RegistryError
    from registry.repository import load_repository
    from signing.tuf_repo import TrustRepo
    from signing.workspace import trust_paths

    repo = load_repository(start, cache=cache)
    where = trust_paths(repo.root, repo.config)
    if not (where.metadata / "1.root.json").is_file():
        return []
    try:
        trust = TrustRepo.load(where.metadata, expiry=where.expiry)
    except RegistryError:
        return []
    return released_changes(repo, trust) + released_deprecations(repo, trust)


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--jobs", "-j", type=click.IntRange(1, 256), help="Parser processes (default: one per core)."
)
@click.option(
    "--no-cache",
    is_flag=True,
    help="Parse and check every file again (ignore .modelreg/cache, the parse cache and "
    "the result of an unchanged tree).",
)
def validate(paths: tuple[Path, ...], as_json: bool, jobs: int | None, no_cache: bool) -> None:
    """Check manifests: schema, cross-references and policy.

    With no PATHS, checks the whole repository. Every problem is printed, one line
    each (file:line:col: field: message); the exit code is 1 if there are any.
    """
    from registry.errors import RepositoryError
    from registry.root import find_root
    from registry.validation import validate_repository

    missing = [p for p in paths if not p.exists()]
    existing = [p for p in paths if p.exists()]
    problems = [Problem(str(p), "no such file or directory") for p in missing]
    warnings: list[Problem] = []
    models = versions = files = 0
    start = existing[0] if existing else Path.cwd()
    try:
        find_root(start if start.is_dir() else start.parent)
        in_repo = True
    except RepositoryError:
        if not paths:
            raise
        in_repo = False
    if in_repo and not paths:
        whole = validate_repository(start, jobs=jobs, cache=not no_cache)
        problems += whole.problems
        warnings = whole.warnings
        models, versions, files = whole.models, whole.versions, whole.files
        if not whole.problems:
            problems += _released_problems(start, cache=not no_cache)
    elif in_repo:
        from registry.checks import authoring_warnings, in_paths, validate_paths
        from registry.repository import load_repository

        repo = load_repository(
            start if start.is_dir() else start.parent, jobs=jobs, cache=not no_cache
        )
        problems += validate_paths(repo, existing)
        warnings = in_paths(authoring_warnings(repo), existing)
        models, versions, files = (
            len(repo.models),
            sum(len(v) for v in repo.versions.values()),
            len(repo.files),
        )
    elif existing:
        found, files = _standalone(existing)
        problems += found
    problems.sort(key=Problem.sort_key)
    warnings = sorted(warnings, key=Problem.sort_key)
    if as_json:
        emit_json(
            {
                "ok": not problems,
                "files": files,
                "models": models,
                "versions": versions,
                "exit_code": 1 if problems else 0,
                "problems": [problem_json(p) for p in problems],
                "warnings": [problem_json(w) for w in warnings],
                # the shape every command's --json gives its errors (modelreg.cli.main)
                "errors": [
                    {k: v for k, v in problem_json(p).items() if k != "text"} for p in problems
                ],
            }
        )
    elif problems:
        error_lines(str(p) for p in problems)
        if is_tty(sys.stderr):
            bad = len({p.file for p in problems})
            click.secho(f"{len(problems)} problem(s) in {bad} file(s)", fg="red", err=True)
    else:
        ok(f"valid: {_n(files, 'file')} ({_n(models, 'model')}, {_n(versions, 'version')})")
    if not as_json:
        warning_lines(str(w) for w in warnings)
    if problems:
        sys.exit(1)


@click.command()
@click.option(
    "--kind",
    type=click.Choice(["model", "version", "config", "any"]),
    default="any",
    show_default=True,
    help="Which schema: RegisteredModel, ModelVersion, modelreg.yaml, or any manifest.",
)
def schema(kind: str) -> None:
    """Print the JSON Schema of the manifests (for editors and other tools)."""
    from registry.jsonschema import schema_text

    kinds = {"model": "RegisteredModel", "version": "ModelVersion", "config": "RegistryConfig"}
    click.echo(schema_text(kinds.get(kind)), nl=False)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print rows as JSON.")
@click.option("--model", "model_name", help="Only this model.")
@click.option(
    "--no-cache",
    is_flag=True,
    help="Parse every file again and ask git again (ignore .modelreg/cache).",
)
@click.option(
    "--mlflow", "with_mlflow", is_flag=True, help="Also ask MLflow for each version's number."
)
def status(as_json: bool, model_name: str | None, no_cache: bool, with_mlflow: bool) -> None:
    """Show every version: git commit, MLflow version, CI run, channels, signed, published.

    Manifests that do not load are printed one line each (file:line:col: message) after
    the table, and the exit code is then 1.
    """
    from registry.status_report import cached_status

    # With --mlflow the answer depends on a server: never stored, never reused.
    report, _ = cached_status(
        Path.cwd(),
        model=model_name,
        cache=not no_cache and not with_mlflow,
        fill=_with_release_state,
        packages=("registry", "signing"),
    )
    if model_name is not None and not report.rows and model_name not in report.models:
        known = ", ".join(sorted(report.models)) or "none"
        raise ManifestError.single(
            model_name, f"model {model_name!r} is not declared (declared: {known})"
        )
    rows = report.rows
    if with_mlflow:
        import dataclasses

        from pipelines.register import mlflow_versions

        numbers = mlflow_versions(report.root)
        rows = [
            dataclasses.replace(r, mlflow_version=numbers.get((r.model, r.version))) for r in rows
        ]
    if as_json:
        emit_json(
            {
                "root": str(report.root),
                "versions": [r.to_json() for r in rows],
                "problems": [problem_json(p) for p in report.problems],
            }
        )
    else:
        from registry.status import render_table

        if is_tty():
            _rich_table(rows)
        else:
            click.echo(render_table(rows), nl=False)
        if rows and not with_mlflow:  # beside the table, not in it (scripts read stdout)
            click.echo(
                "(mlflow: - without --mlflow: MLflow is not asked unless you say so)", err=True
            )
        if report.problems:
            # The table shows what loaded; a file that did not is a failure of the
            # command, named where it is (a stray versions/v1.2.yaml has no row).
            error_lines(str(p) for p in sorted(report.problems, key=Problem.sort_key))
    if report.problems:
        sys.exit(1)


def _with_release_state(root: Path, rows: list[VersionStatus]) -> list[VersionStatus]:
    """Fill the signed/published columns from the repository's signed TUF targets."""
    import dataclasses

    from registry.config import has_trust_metadata, load_config

    config = load_config(root)
    if not has_trust_metadata(root, config):
        return rows  # never released: nothing to fill, and no TUF to import
    from signing.workspace import ReleaseState, release_state

    state = release_state(root, config)
    if state is None:
        return rows
    out = []
    for r in rows:
        release = state.get((r.model, r.version), ReleaseState())
        out.append(
            dataclasses.replace(
                r, signed=release.signed, published=release.published, ci_run=release.ci_run
            )
        )
    return out


def _rich_table(rows: list[VersionStatus]) -> None:
    from rich.console import Console
    from rich.table import Table

    from registry.status import COLUMNS

    table = Table(*COLUMNS, header_style="bold")
    for row in rows:
        table.add_row(*row.cells())
    Console().print(table)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"

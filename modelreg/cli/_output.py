"""How the CLI talks: results to stdout, problems to stderr, JSON when asked.

Everything these functions print is redacted first (:func:`registry.redact.redact`):
CI logs are public, and messages from DVC, MLflow, git or the OS quote URLs with
credentials and secret values verbatim.  Control characters are dropped too
(:func:`registry.errors.printable`): a commit's author or a remote's message must not
drive the terminal that shows it.  Commands print through here, never with a
bare ``print``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from registry.errors import Problem, printable
from registry.redact import redact


def _shown(text: str) -> str:
    return printable(redact(text))


def is_tty(stream: Any = None) -> bool:
    """Whether ``stream`` (stdout by default) is an interactive terminal."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)())


def emit_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout (redacted; it stays valid JSON)."""
    click.echo(redact(json.dumps(data, indent=2, sort_keys=False, default=str)))


def problem_json(problem: Problem) -> dict[str, Any]:
    """A problem as a JSON object."""
    return {
        "file": problem.file,
        "line": problem.line,
        "col": problem.col,
        "field": problem.field,
        "message": problem.message,
        "text": str(problem),
    }


def error_lines(lines: Iterable[str]) -> None:
    """One line per problem on stderr, red on a terminal; secrets redacted."""
    color = is_tty(sys.stderr)
    for line in lines:
        click.secho(_shown(line), fg="red" if color else None, err=True)


def warning_lines(lines: Iterable[str]) -> None:
    """One line per warning on stderr, yellow on a terminal; secrets redacted."""
    color = is_tty(sys.stderr)
    for line in lines:
        click.secho(_shown(line), fg="yellow" if color else None, err=True)


def ok(message: str) -> None:
    """A success line on stdout; secrets redacted."""
    click.secho(_shown(message), fg="green" if is_tty() else None)


def detail(message: str) -> None:
    """A plain line on stdout (details under a result), secrets redacted."""
    click.echo(_shown(message))


def error_text(text: str) -> None:
    """Text written to stderr as it is (usage help, a traceback), secrets redacted."""
    click.echo(_shown(text), err=True, nl=False)


def display_path(path: Path) -> str:
    """``path`` as messages name it (imported on use: the repository loader is heavy)."""
    from registry.repository import display_path as shown

    return shown(path)
